"""What every command shares: the context object, exceptions mapped to exit codes (one place), options.

A command is a few lines over this: `@command()` (or a `Group`), the shared options, `@pass_obj`,
then one call into the package. Errors are raised, never exited on: `Command.invoke` turns a
`TpuLaunchError` into its message (and located problems) and exit code, anything else into one line
(the traceback with `--debug`).
"""

from __future__ import annotations

import os
import traceback
from typing import Optional

import click

from tpulaunch.errors import AlreadyReported, ExitCode, TpuLaunchError

# Width of output that goes to a file or a CI log (rich would assume 80 columns and cut tensor names).
PIPE_WIDTH = 120

FORMATS = ("text", "json", "github")


def consoles():
    """(stdout, stderr) rich consoles: no colour under CI or NO_COLOR, and 120 columns when not a terminal
    (unless COLUMNS says otherwise)."""
    from rich.console import Console

    plain = bool(os.environ.get("CI")) or os.environ.get("NO_COLOR") is not None
    kwargs = {"no_color": True} if plain else {}
    pair = Console(highlight=False, **kwargs), Console(stderr=True, highlight=False, **kwargs)
    for console in pair:
        if not console.is_terminal and not os.environ.get("COLUMNS"):
            console.width = PIPE_WIDTH
    return pair


class Context:
    """The object every command receives (`@pass_obj`); made with defaults when a command runs on its own."""

    def __init__(self, debug: bool = False, verbose: int = 0):
        self.debug = debug
        self.verbose = verbose
        self._consoles = None

    def _pair(self):
        if self._consoles is None:
            self._consoles = consoles()
        return self._consoles

    @property
    def out(self):
        return self._pair()[0]

    @property
    def err(self):
        return self._pair()[1]


pass_obj = click.make_pass_decorator(Context, ensure=True)


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


def _invoke_mapped(ctx: click.Context, invoke):
    """Run a command; a TpuLaunchError becomes its message and exit code, an internal error one line."""
    try:
        return invoke(ctx)
    except AlreadyReported as exc:
        ctx.exit(int(exc.exit_code))
    except TpuLaunchError as exc:
        obj: Context = ctx.ensure_object(Context)
        if obj.debug:
            traceback.print_exc()
        if exc.problems:
            from tpulaunch.cli.render.problems import render_text

            render_text(obj.err, exc.problems, file=exc.problems[0].file, snippets=True)
        if exc.message and (exc.show_message or not exc.problems):
            prefix = "[bold red]error:[/] " if exc.show_message == "error" else ""
            obj.err.print(f"{prefix}{_escape(exc.message)}", highlight=False, soft_wrap=True)
            if exc.hint:
                obj.err.print(f"  [cyan]hint:[/] {_escape(exc.hint)}", highlight=False, soft_wrap=True)
        ctx.exit(int(exc.exit_code))
    except (click.exceptions.Exit, click.ClickException, click.exceptions.Abort):
        raise
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        ctx.exit(int(ExitCode.INTERRUPTED))
    except Exception as exc:  # a bug in tpulaunch or an unexpected library error
        if ctx.ensure_object(Context).debug:
            raise
        click.echo(f"error: unexpected {type(exc).__name__}: {exc} (rerun with --debug for the traceback)", err=True)
        ctx.exit(int(ExitCode.PROBLEMS))


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
wait_option = click.option(
    "--wait", "wait_s", type=click.FloatRange(min=0), default=0, show_default=True, metavar="SECONDS",
    help="Wait up to this long for a starting or repairing TPU to become ready.")
checkpoint_option = click.option(
    "--checkpoint", type=str, help="Use this checkpoint (model.ckpt-N) instead of the latest.")


def escape(text: Optional[str]) -> str:
    return _escape(text or "")
