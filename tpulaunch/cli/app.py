"""The `tpulaunch` command group: global options, and each verb imported only when it is named.

TensorFlow is never imported here: `--help`, `schema`, `plan --no-memory` and `validate --static`
must answer in a fraction of a second. Each verb group lives in its own module (`LAZY_COMMANDS`);
what they share (context, options, error mapping) is in `cli/base.py`, the job gate in `app/gate.py`.
"""

from __future__ import annotations

import click

from tpulaunch import __version__
from tpulaunch.cli.base import Context, Group

# Verb -> "module:attribute", imported only when named (keeps `--help` fast).
LAZY_COMMANDS = {
    "validate": "tpulaunch.cli.validate:validate",
    "plan": "tpulaunch.cli.plan:plan",
    "train": "tpulaunch.cli.run:train",
    "evaluate": "tpulaunch.cli.run:evaluate",
    "export": "tpulaunch.cli.run:export",
    "status": "tpulaunch.cli.status:status",
    "up": "tpulaunch.cli.lifecycle:up",
    "down": "tpulaunch.cli.lifecycle:down",
    "run": "tpulaunch.cli.remote:run",
    "rehearse": "tpulaunch.cli.remote:rehearse",
    "logs": "tpulaunch.cli.remote:logs",
    "cancel": "tpulaunch.cli.remote:cancel",
    "data": "tpulaunch.cli.data:data",
    "explain": "tpulaunch.cli.explain:explain",
    "schema": "tpulaunch.cli.project:schema",
    "init": "tpulaunch.cli.project:init",
}


class LazyGroup(Group):
    """The main group: commands come from `LAZY_COMMANDS` on demand."""

    def list_commands(self, ctx: click.Context):
        return sorted(set(super().list_commands(ctx)) | set(LAZY_COMMANDS))

    def get_command(self, ctx: click.Context, name: str):
        if name in LAZY_COMMANDS and name not in self.commands:
            import importlib

            module_name, attr = LAZY_COMMANDS[name].split(":")
            return getattr(importlib.import_module(module_name), attr)
        return super().get_command(ctx, name)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
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


def main(argv=None):
    """Console-script entry point."""
    import sys
    import warnings

    from tpulaunch.cli.base import storage_errors_in_threads_said_in_one_line
    from tpulaunch.run.signals import Terminated, forget_stray_interrupt, handle_from_start
    from tpulaunch.run.started import mark_program_start
    from tpulaunch.tf_env import skip_collection_at_exit

    # First: a SIGTERM or SIGHUP from here on unwinds the run (lease released, record written) instead of killing it.
    handle_from_start()
    storage_errors_in_threads_said_in_one_line()
    mark_program_start()  # a run's wall time starts with the process
    skip_collection_at_exit()  # seconds of a TensorFlow process's exit, after its last line
    # google-api-core (under the Cloud TPU and Cloud Storage clients) warns at import about Google's support
    # dates for the running Python: nothing a job can act on, and it would stand between tpulaunch's lines.
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"google\.api_core\..*")
    try:
        cli.main(args=argv, prog_name="tpulaunch", standalone_mode=True)
    except Terminated as stopped:  # outside training (which saves a checkpoint and says so itself)
        print(f"stopped by {stopped.name}", file=sys.stderr, flush=True)
        sys.exit(int(stopped.exit_code))
    finally:
        forget_stray_interrupt()  # the exit code is the one chosen here, not a SIGINT CPython remembers


if __name__ == "__main__":
    main()
