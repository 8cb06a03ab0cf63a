"""What every command shares: the context object, exceptions mapped to exit codes (one place), options.

A command is a few lines over this: `@command()` (or a `Group`), the shared options, `@pass_obj`,
then one call into the package. Errors are raised, never exited on: `Command.invoke` turns a
`TpuLaunchError` into its message (and located problems) and exit code, anything else into one line
(the traceback with `--debug`).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Optional, Union

import click

from tpulaunch.cli.render.problems import FORMATS, PIPE_WIDTH, PlainText, plain_text, write_line
from tpulaunch.errors import (AlreadyReported, ExitCode, TpuLaunchError, first_line, is_graph_error,
                             resource_limit_error, storage_error, tpu_unavailable)

if TYPE_CHECKING:
    from rich.console import Console


def console(stderr: bool = False) -> "Console":
    """A rich console for stdout (or stderr): no colour under CI or NO_COLOR, PIPE_WIDTH columns when not a
    terminal (unless COLUMNS says otherwise), and no `:name:` emoji codes (`job.yaml:100:3` is a place)."""
    from rich.console import Console

    plain = bool(os.environ.get("CI")) or os.environ.get("NO_COLOR") is not None
    kwargs = {"no_color": True} if plain else {}
    made = Console(stderr=stderr, highlight=False, emoji=False, **kwargs)
    if not made.is_terminal and not os.environ.get("COLUMNS"):
        made.width = PIPE_WIDTH
    return made


class Context:
    """The object every command receives (`@pass_obj`); made with defaults when a command runs on its own.

    Its consoles are made on first use: importing rich costs about as much as all of `validate --static`'s
    own work, and a report into a pipe needs no rich (`text_out`).
    """

    def __init__(self, debug: bool = False, verbose: int = 0):
        self.debug = debug
        self.verbose = verbose
        self._out: Optional["Console"] = None
        self._err: Optional["Console"] = None

    @property
    def out(self) -> "Console":
        if self._out is None:
            self._out = console(stderr=False)
        return self._out

    @property
    def err(self) -> "Console":
        if self._err is None:
            self._err = console(stderr=True)
        return self._err

    def text_out(self, stderr: bool = False) -> Union["Console", PlainText]:
        """Where a text report goes: plain lines when rich would add nothing (a pipe, a file), else the console."""
        rich_console = (lambda: self.err) if stderr else (lambda: self.out)
        return plain_text(stderr, rich_console) or rich_console()

    def say(self, text: str) -> None:
        """One line on stderr, as written (no markup, no highlighting): what the application layer tells as it goes."""
        self.err.print(text, highlight=False, markup=False, soft_wrap=True)

    def show(self, text: str) -> None:
        """One line on stdout, as written: what the application layer hands a command to show as it goes."""
        self.out.print(text, highlight=False, markup=False, soft_wrap=True)


def warnings_to(console, job_file: str):
    """What the gate (`app/gate.py`) calls with a job's warnings: printed on `console`, located in `job_file`."""
    from tpulaunch.cli.render.problems import render_text

    return lambda warnings: render_text(console, warnings, file=job_file)


pass_obj = click.make_pass_decorator(Context, ensure=True)


def _may_be_storage(exc: BaseException) -> bool:
    """OSErrors, TensorFlow's errors, and the RuntimeError TensorFlow's event writer raises for a failed flush."""
    return isinstance(exc, (OSError, RuntimeError)) or is_graph_error(exc)


def storage_errors_in_threads_said_in_one_line() -> None:
    """A background writer of TensorFlow's (the summary writer's thread) that fails for a full disk or a refused
    permission prints one line naming it, not a thread traceback; other thread failures keep Python's report."""
    import sys
    import threading

    previous = threading.excepthook

    def hook(args) -> None:
        storage = storage_error(args.exc_value) if _may_be_storage(args.exc_value) else None
        if storage is None:
            previous(args)
            return
        print(f"{args.thread.name if args.thread else 'a thread'}: {storage.text()}", file=sys.stderr, flush=True)

    threading.excepthook = hook


def _invoke_mapped(ctx: click.Context, invoke):
    """Run a command; a TpuLaunchError becomes its message and exit code, an internal error one line."""
    # Imported before the command runs: a command that used up every file descriptor could not import it after.
    from tpulaunch.job.secrets import redact  # a message that quotes a secret of the job shows it masked

    try:
        return invoke(ctx)
    except AlreadyReported as exc:
        ctx.exit(int(exc.exit_code))
    except TpuLaunchError as exc:
        obj: Context = ctx.ensure_object(Context)
        if obj.debug:
            _print_traceback(redact)
        err = obj.text_out(stderr=True)
        from dataclasses import replace

        if exc.problems:
            from tpulaunch.cli.render.problems import render_text

            problems = [replace(p, message=redact(p.message), hint=redact(p.hint)) for p in exc.problems]
            render_text(err, problems, file=problems[0].file, snippets=True)
        if exc.message and (exc.show_message or not exc.problems):
            prefix = [("error:", "bold red"), " "] if exc.show_message == "error" else []
            write_line(err, [*prefix, redact(exc.message)])
            if exc.hint:
                write_line(err, ["  ", ("hint:", "cyan"), f" {redact(exc.hint)}"])
        ctx.exit(int(exc.exit_code))
    except (click.exceptions.Exit, click.ClickException, click.exceptions.Abort):
        raise
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        ctx.exit(int(ExitCode.INTERRUPTED))
    except Exception as exc:  # a bug in tpulaunch or an unexpected library error
        if ctx.ensure_object(Context).debug:  # then the line and exit code it has without --debug
            _print_traceback(redact)
        unavailable = tpu_unavailable(exc)
        if unavailable is not None:  # the host's chips missing or held: the infrastructure's, retried by `run`
            click.echo(f"error: this host's TPU cannot be used: {redact(unavailable)}", err=True)
            click.echo("  hint: another process may hold the chips (`sudo lsof -w /dev/accel*`, or /dev/vfio on v5e "
                       "and later), or the VM has no TPU attached; `tpulaunch run` recreates the VM (exit code 3)",
                       err=True)
            ctx.exit(int(ExitCode.CLUSTER))
        storage = storage_error(exc) if _may_be_storage(exc) else None
        if storage is not None:  # a full disk, a quota, a read-only filesystem, permissions: said so, with the path
            click.echo(f"error: {storage.text()}", err=True)
            click.echo(f"  hint: {storage.hint}", err=True)
            ctx.exit(int(ExitCode.PROBLEMS))
        limited = resource_limit_error(exc)
        if limited is not None:  # out of memory under ulimit -v, too many open files: the limit and the fix
            click.echo(f"error: {limited.message}", err=True)
            click.echo(f"  hint: {limited.hint}", err=True)
            ctx.exit(int(limited.exit_code))
        # One line: TensorFlow's messages carry the graph's stack frames, dozens of lines (--debug shows all).
        if is_graph_error(exc):  # the job's own graph failed while it ran: the job's to fix, like any problem
            click.echo(f"error: {type(exc).__name__} while the graph ran: {redact(first_line(exc))} (rerun with "
                       "--debug for the traceback)", err=True)
            ctx.exit(int(ExitCode.PROBLEMS))
        click.echo(f"error: unexpected {type(exc).__name__}: {redact(first_line(exc))} (an internal error, exit code "
                   f"{int(ExitCode.INTERNAL)}: rerun with --debug for the traceback and report it)", err=True)
        ctx.exit(int(ExitCode.INTERNAL))


def _print_traceback(redact) -> None:
    """The traceback of the exception being handled (`--debug`), every secret of the job in it masked."""
    import sys
    import traceback

    sys.stderr.write(redact(traceback.format_exc()))
    sys.stderr.flush()


class Command(click.Command):
    """A command whose errors are mapped to messages and exit codes, also when it runs on its own."""

    def invoke(self, ctx: click.Context):
        return _invoke_mapped(ctx, super().invoke)


class Group(click.Group):
    """A group whose callback errors are mapped like its commands'; its commands are `Command`s."""

    command_class = Command

    def invoke(self, ctx: click.Context):
        return _invoke_mapped(ctx, super().invoke)


def command(*args, **kwargs):
    kwargs.setdefault("cls", Command)
    return click.command(*args, **kwargs)


# ------------------------------------------------------------------------------- shared options
set_option = click.option(
    "--set", "overrides", multiple=True, metavar="KEY.PATH=VALUE",
    help="Override a job value (parsed as YAML), e.g. --set train.steps=20. Repeatable.")
format_option = click.option(
    "--format", "fmt", type=click.Choice(FORMATS), default="text", show_default=True,
    help="text for people, json for tools, github for Actions annotations.")
text_or_json_option = click.option(
    "--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True,
    help="text for people, json for tools.")
job_argument = click.argument("job_file", metavar="JOB.yaml", type=click.Path(dir_okay=True, path_type=str))
local_option = click.option(
    "--local", is_flag=True,
    help="Run on this machine's CPU/GPU (use_tpu=False) even when the job has a tpu: section.")
cpu_replicas_option = click.option(
    "--cpu-replicas", type=click.IntRange(min=1), default=None, metavar="N",
    help="keras engine, on this machine: split the CPU into N devices and run N replicas with MirroredStrategy "
         "(rehearses multi-replica batches and gradients in CI; the global batch must divide by N).")
wait_option = click.option(
    "--wait", "wait_s", type=click.FloatRange(min=0), default=0, show_default=True, metavar="SECONDS",
    help="Wait up to this long for a starting or repairing TPU to become ready.")
checkpoint_option = click.option(
    "--checkpoint", type=str, help="Use this checkpoint (model.ckpt-N) instead of the latest.")

