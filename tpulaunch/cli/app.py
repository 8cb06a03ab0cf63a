"""The `tpulaunch` command line. Thin: parse, call one function, render.

TensorFlow is never imported here at module level: `--help`, `schema`, `plan` and
`validate --static` must answer in a fraction of a second.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Optional, Union

import click

from tpulaunch import __version__
from tpulaunch.errors import ExitCode, TpuLaunchError
from tpulaunch.cli.render.problems import (FORMATS, PIPE_WIDTH, PlainText, plain_text, render_text, to_github,
                                           to_json, write_line)

if TYPE_CHECKING:
    from rich.console import Console


class Context:
    """The global flags, and the stdout/stderr consoles, made on first use: importing rich costs
    about as much as all of `validate --static`'s own work, and a report into a pipe needs no rich."""

    def __init__(self, debug: bool, verbose: int, out: Optional["Console"] = None, err: Optional["Console"] = None):
        self.debug = debug
        self.verbose = verbose
        self._out, self._err = out, err

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


def console(stderr: bool = False) -> "Console":
    """A console for stdout (or stderr): no colour under CI or NO_COLOR, PIPE_WIDTH columns when not a
    terminal (unless COLUMNS says otherwise), and no `:name:` emoji codes (`job.yaml:100:3` is a place)."""
    from rich.console import Console

    plain = bool(os.environ.get("CI")) or os.environ.get("NO_COLOR") is not None
    kwargs = {"no_color": True} if plain else {}
    made = Console(stderr=stderr, highlight=False, emoji=False, **kwargs)
    if not made.is_terminal and not os.environ.get("COLUMNS"):
        made.width = PIPE_WIDTH
    return made


def consoles() -> tuple["Console", "Console"]:
    """(stdout, stderr) consoles."""
    return console(stderr=False), console(stderr=True)


# Commands that live in their own modules, imported only when named (keeps `--help` fast).
LAZY_COMMANDS = {
    "train": "tpulaunch.cli.run:train",
    "evaluate": "tpulaunch.cli.run:evaluate",
    "export": "tpulaunch.cli.run:export",
    "status": "tpulaunch.cli.status:status",
    "data": "tpulaunch.cli.data:data",
    "explain": "tpulaunch.cli.explain:explain",
}


class TpuLaunchGroup(click.Group):
    """Maps exceptions to exit codes in one place; tracebacks only with --debug."""

    def list_commands(self, ctx: click.Context):
        import importlib.util

        present = [name for name, target in LAZY_COMMANDS.items()
                   if importlib.util.find_spec(target.split(":")[0]) is not None]
        return sorted(set(super().list_commands(ctx)) | set(present))

    def get_command(self, ctx: click.Context, name: str):
        if name in LAZY_COMMANDS and name not in self.commands:
            import importlib

            module_name, attr = LAZY_COMMANDS[name].split(":")
            try:
                module = importlib.import_module(module_name)
            except ModuleNotFoundError as exc:
                if exc.name != module_name:
                    raise
                return None
            return getattr(module, attr)
        return super().get_command(ctx, name)

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except TpuLaunchError as exc:
            obj: Optional[Context] = ctx.obj
            err = (obj or Context(debug=False, verbose=0)).text_out(stderr=True)
            if obj and obj.debug:
                import traceback

                traceback.print_exc()
            if exc.problems:
                render_text(err, exc.problems, file=exc.problems[0].file, snippets=True)
            else:
                write_line(err, [("error:", "bold red"), f" {exc.message}"])
                if exc.hint:
                    write_line(err, ["  ", ("hint:", "cyan"), f" {exc.hint}"])
            ctx.exit(int(exc.exit_code))
        except (click.exceptions.Exit, click.ClickException, click.exceptions.Abort):
            raise
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            ctx.exit(int(ExitCode.INTERRUPTED))
        except Exception as exc:  # a bug in tpulaunch or an unexpected library error
            obj = ctx.obj
            if obj and obj.debug:
                raise
            click.echo(f"error: unexpected {type(exc).__name__}: {exc} (rerun with --debug for the traceback)", err=True)
            ctx.exit(int(ExitCode.PROBLEMS))


set_option = click.option(
    "--set", "overrides", multiple=True, metavar="KEY.PATH=VALUE",
    help="Override a job value (parsed as YAML), e.g. --set train.steps=20. Repeatable.",
)
format_option = click.option("--format", "fmt", type=click.Choice(FORMATS), default="text", show_default=True,
                             help="text for people, json for tools, github for Actions annotations.")
job_argument = click.argument("job_file", metavar="JOB.yaml", type=click.Path(dir_okay=True, path_type=str))


@click.group(cls=TpuLaunchGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="tpulaunch")
@click.option("--debug", is_flag=True, help="Show tracebacks for unexpected errors.")
@click.option("-v", "--verbose", count=True, help="More output (-vv: TensorFlow's own logs too).")
@click.pass_context
def cli(ctx: click.Context, debug: bool, verbose: int):
    """Validate, plan and launch TensorFlow TPUEstimator training from one YAML job file.

    \b
    tpulaunch init --example quickstart      write a starter job (quickstart.yaml)
    tpulaunch validate job.yaml              every mistake, with file:line:col, before a TPU is paid for
    tpulaunch plan job.yaml                  per-core tiles, replicas, batch arithmetic
    tpulaunch train job.yaml --local         the same job on this machine's CPU/GPU
    """
    from tpulaunch.tf_env import quiet_tensorflow

    quiet_tensorflow(verbose)
    ctx.obj = Context(debug=debug, verbose=verbose)


@cli.command()
@click.argument("job_files", metavar="JOB.yaml...", nargs=-1, required=True, type=click.Path(path_type=str))
@set_option
@format_option
@click.option("--static", is_flag=True, help="Only checks that need neither TensorFlow nor the network (fast; for pre-commit and editors).")
@click.option("--records", "records_per_file", type=click.IntRange(min=1), default=2, show_default=True,
              help="Records to sample per data file.")
@click.option("--all-records", is_flag=True, help="Read every record: exact counts and corruption across whole files (contents are checked on the --records sample of each file).")
@click.option("--tf", "use_tf", is_flag=True, help="Also build the TPU graph with TensorFlow's own TPUEstimator for the declared slice (offline).")
@click.pass_obj
def validate(obj: Context, job_files, overrides, fmt, static, records_per_file, all_records, use_tf):
    """Check job files: schema, partitioning, batch arithmetic, paths, model and data.

    Every problem is reported at once as FILE:LINE:COL: path: message, with a hint.
    Exit code 0 when there are no errors (warnings allowed), 1 when there are.

    \b
    Examples:
      tpulaunch validate configs/unet3d_ct.yaml
      tpulaunch validate jobs/*.yaml --static --format github   # in CI, as annotations
      tpulaunch validate job.yaml --set train.batch_size=48      # try a change without editing
    """
    from tpulaunch.tf_env import bound_gcs_retries
    from tpulaunch.checks.validate import validate_job

    bound_gcs_retries()
    results = []
    for job_file in job_files:
        status = None
        err = obj.text_out(stderr=True)
        if fmt == "text" and not isinstance(err, PlainText) and err.is_terminal:
            status = err.status(f"validating {job_file}")
            status.start()

        def on_stage(name: str, status=status, job_file=job_file):
            if status is not None:
                status.update(f"{job_file}: checking {name}")

        try:
            result = validate_job(job_file, overrides, static=static, records_per_file=records_per_file,
                                  all_records=all_records, use_tf=use_tf, on_stage=on_stage)
        finally:
            if status is not None:
                status.stop()
        results.append(result)
        if fmt == "text":
            _render_validation(obj, result)
    if fmt == "json":
        import json

        docs = [json.loads(to_json(r.problems, file=r.file, extra=_json_extra(r))) for r in results]
        click.echo(json.dumps(docs[0] if len(docs) == 1 else docs, indent=2))
    elif fmt == "github":
        for r in results:
            text = to_github(r.problems)
            if text:
                click.echo(text)
            click.echo(f"tpulaunch validate {r.file}: {'ok' if r.ok else 'errors found'}")
    ok = all(r.ok for r in results)
    sys.exit(int(ExitCode.OK if ok else ExitCode.PROBLEMS))


def _json_extra(result) -> dict:
    extra = {"checked": result.checked}
    if result.data_reports:
        extra["data"] = [_as_dict(r) for r in result.data_reports]
    extra.update(result.extra)
    return extra


def _render_validation(obj: Context, result) -> None:
    render_text(obj.text_out(), result.problems, file=result.file, checked=result.checked)
    if result.data_reports or result.extra.get("tensorflow"):
        from tpulaunch.cli.render.plan import render_data_report, render_tf_built

        for report in result.data_reports:
            render_data_report(obj.out, report)
        if result.extra.get("tensorflow"):
            render_tf_built(obj.out, result.extra["tensorflow"])


def _as_dict(obj):
    from dataclasses import asdict, is_dataclass

    return asdict(obj) if is_dataclass(obj) else obj


@cli.command()
@job_argument
@set_option
@format_option
@click.option("--memory/--no-memory", "memory", default=True, show_default=True,
              help="Estimate per-core memory (builds the model's layer shapes with TensorFlow; "
                   "--no-memory keeps plan static and TensorFlow-free).")
@click.option("--xla", is_flag=True, help="Also compile one training step with XLA on the CPU and show its own "
                                          "buffer-assignment total (float32, no TPU tiling; minutes for big models).")
@click.option("--tf", "use_tf", is_flag=True, help="Also build the graphs with TensorFlow's own TPUEstimator for the "
                                                   "declared slice (offline) and show the pieces it cut.")
@click.pass_obj
def plan(obj: Context, job_file, overrides, fmt, memory, xla, use_tf):
    """Show how the job lands on the TPU: tiles per core, replicas, batch arithmetic, memory per core.

    \b
    Examples:
      tpulaunch plan configs/unet3d_ct.yaml
      tpulaunch plan job.yaml --set tpu.type=v3-32 --format json
      tpulaunch plan job.yaml --no-memory        # static only, no TensorFlow
      tpulaunch plan job.yaml --xla              # cross-check with XLA's buffer assignment
      tpulaunch plan job.yaml --tf               # and TensorFlow's own per-core pieces
    """
    from tpulaunch.plan.build import add_memory, build_plan
    from tpulaunch.cli.render.plan import render_plan, render_tf_built
    from tpulaunch.checks.validate import validate_job

    result = validate_job(job_file, overrides, static=True, use_tf=use_tf)
    if not result.ok:
        if fmt == "json":
            click.echo(to_json(result.problems, file=job_file))
        else:
            err = obj.text_out(stderr=True)
            render_text(err, result.problems, file=job_file)
            write_line(err, ["fix these first: the plan needs a valid job"], soft_wrap=False)
        sys.exit(int(ExitCode.PROBLEMS))
    the_plan = build_plan(result.loaded, result.problems)
    if memory or xla:
        add_memory(the_plan, result.loaded.job, xla=xla)
    built = result.extra.get("tensorflow")
    if fmt == "json":
        import json

        doc = the_plan.to_dict()
        if built is not None:
            doc["tensorflow"] = {mode: {k: v for k, v in info.items() if k != "traceback"} for mode, info in built.items()}
        click.echo(json.dumps(doc, indent=2))
    else:
        render_plan(obj.out, the_plan)
        if built:
            render_tf_built(obj.out, built)


@cli.command()
@click.option("--output", "-o", type=click.Path(dir_okay=False, writable=True), help="Write to a file instead of stdout.")
def schema(output):
    """Print the job file's JSON Schema (for editor completion and checks).

    \b
    Point your editor at it with a first line in the job file:
      # yaml-language-server: $schema=./tpulaunch.schema.json
    after: tpulaunch schema -o tpulaunch.schema.json
    """
    import json

    from tpulaunch.job.schema import json_schema

    text = json.dumps(json_schema(), indent=2)
    if output:
        with open(output, "w", encoding="utf-8") as handle:
            handle.write(text + "\n")
    else:
        click.echo(text)


@cli.command()
@click.argument("path", required=False, type=click.Path(dir_okay=False))
@click.option("--example", type=click.Choice(["quickstart", "unet3d", "retinanet"]), default="quickstart", show_default=True,
              help="Which starter job to write.")
@click.option("--force", is_flag=True, help="Overwrite an existing file.")
@click.pass_obj
def init(obj: Context, path, example, force):
    """Write a commented starter job file (default: <example>.yaml).

    \b
    Examples:
      tpulaunch init                       # quickstart.yaml: runs on this machine's CPU
      tpulaunch init --example unet3d ct.yaml
    """
    from tpulaunch.cli.templates import template_text

    path = path or f"{example}.yaml"
    if os.path.exists(path) and not force:
        raise TpuLaunchError(f"{path} exists", hint="pass --force to overwrite, or name another file")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(template_text(example))
    if example == "quickstart":
        step = (f"tpulaunch data synth --example quickstart {os.path.join(os.path.dirname(path), 'data', 'quickstart')}"
                f" && tpulaunch validate {path} && tpulaunch train {path}")
    else:
        step = f"tpulaunch validate {path} --static && tpulaunch plan {path}"
    obj.out.print(f"wrote {path}; next: {step}", highlight=False, soft_wrap=True)


def main(argv=None):
    """Console-script entry point."""
    try:
        cli.main(args=argv, prog_name="tpulaunch", standalone_mode=True)
    except SystemExit:
        raise


if __name__ == "__main__":
    main()
