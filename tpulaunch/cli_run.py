"""`tpulaunch train`, `evaluate` and `export`: validate the job, then run it with TPUEstimator.

TensorFlow is imported only after the job has passed the static checks (and after its log level has
been set), so a broken job is refused in a fraction of a second.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Optional, Sequence

import click
from rich.console import Console

from tpulaunch.errors import ExitCode
from tpulaunch.tf_env import quiet_tensorflow

_set_option = click.option(
    "--set", "overrides", multiple=True, metavar="KEY.PATH=VALUE",
    help="Override a job value (parsed as YAML), e.g. --set train.steps=20. Repeatable.")
_local_option = click.option(
    "--local", is_flag=True,
    help="Run on this machine's CPU/GPU (use_tpu=False) even when the job has a tpu: section.")
_wait_option = click.option(
    "--wait", "wait_s", type=click.FloatRange(min=0), default=0, show_default=True, metavar="SECONDS",
    help="Wait up to this long for a starting or repairing TPU to become ready.")
_job_argument = click.argument("job_file", metavar="JOB.yaml", type=click.Path(dir_okay=False, path_type=str))


class _Streams:
    """The group's context object when a command is invoked on its own (outside `tpulaunch`)."""

    def __init__(self):
        plain = bool(os.environ.get("CI")) or os.environ.get("NO_COLOR") is not None
        kwargs = {"no_color": True} if plain else {}
        self.out = Console(highlight=False, **kwargs)
        self.err = Console(stderr=True, highlight=False, **kwargs)
        self.debug = False
        self.verbose = 0


def _streams():
    ctx = click.get_current_context()
    obj = ctx.find_root().obj
    if obj is None:
        obj = ctx.find_root().obj = _Streams()
    return obj


def _load(job_file: str, overrides: Sequence[str], extra: Sequence[str] = ()):
    """The validated job (static checks), or exit 1 after printing every located problem."""
    from tpulaunch.report import render_text
    from tpulaunch.validate import validate_job

    obj = _streams()
    result = validate_job(job_file, [*overrides, *extra], static=True)
    if result.problems:
        render_text(obj.err, result.problems, file=job_file)
    if not result.ok or result.loaded is None or result.loaded.job is None:
        obj.err.print(f"not running {job_file}: fix the problems above (tpulaunch validate {job_file})",
                      highlight=False, markup=False, soft_wrap=True)
        sys.exit(int(ExitCode.PROBLEMS))
    quiet_tensorflow(obj.verbose)  # again: the command may run outside the `tpulaunch` group
    return result.loaded.job


def _search_path(job_file: str) -> list:
    return [os.path.dirname(os.path.abspath(job_file))]


def _resolver(job, local: bool, wait_s: float):
    """The TPU's cluster resolver, after checking the node is ready for the job; None when local."""
    if local or not job.on_tpu:
        return None
    from tpulaunch import cluster

    ref = cluster.resolve_node(job.tpu)
    cluster.check_node(ref, job.tpu, wait=wait_s).raise_if_unusable()
    return cluster.cluster_resolver(ref)


def _model_dir_override(model_dir: Optional[str]) -> list:
    # Relative to where the command runs (the job file's own paths are relative to the job file).
    return [f"run.model_dir={json.dumps(os.path.abspath(model_dir))}"] if model_dir else []


@click.command()
@_job_argument
@_local_option
@_set_option
@click.option("--model-dir", type=click.Path(file_okay=False, path_type=str),
              help="Checkpoints here instead of run.model_dir (relative to the current directory).")
@click.option("--force", is_flag=True, help="Resume even if model_dir holds a job with another model or data spec.")
@_wait_option
def train(job_file: str, local: bool, overrides, model_dir: Optional[str], force: bool, wait_s: float):
    """Train the job: resume from model_dir's latest checkpoint, evaluate as eval: says, show progress.

    Ctrl-C (or SIGTERM) finishes the current step, saves a checkpoint there and exits 130 (143);
    running the same command again continues from that step.

    \b
    Examples:
      tpulaunch train job.yaml                       # on the TPU named in tpu:
      tpulaunch train job.yaml --local               # same job on this machine's CPU/GPU
      tpulaunch train job.yaml --local --set train.steps=20 --set train.batch_size=8   # CI smoke run
      tpulaunch train job.yaml --model-dir runs/try2 # a fresh run next to the first
    """
    from tpulaunch.progress import TrainProgress
    from tpulaunch.signals import TrainingStopped

    obj = _streams()
    job = _load(job_file, overrides, _model_dir_override(model_dir))
    from tpulaunch import runner

    resolver = _resolver(job, local, wait_s)
    progress = TrainProgress(obj.out, total_steps=job.train.steps if job.train else 0,
                             batch_size=job.train.batch_size if job.train else 0,
                             log_every_steps=runner.log_every_steps(job), model_dir=job.run.model_dir)
    try:
        runner.train(job, local=local, progress=progress, cluster_resolver=resolver,
                     search_path=_search_path(job_file), force=force)
    except TrainingStopped as stopped:
        obj.err.print(stopped.message, highlight=False, markup=False, soft_wrap=True)
        sys.exit(int(stopped.exit_code))


@click.command()
@_job_argument
@_local_option
@_set_option
@click.option("--checkpoint", type=str, help="Evaluate this checkpoint (model.ckpt-N) instead of the latest.")
@_wait_option
def evaluate(job_file: str, local: bool, overrides, checkpoint: Optional[str], wait_s: float):
    """Evaluate the latest checkpoint in run.model_dir on data.eval for eval.steps batches.

    \b
    Examples:
      tpulaunch evaluate job.yaml --local
      tpulaunch evaluate job.yaml --local --checkpoint runs/cnn/model.ckpt-300
    """
    from tpulaunch.progress import plain_output, render_eval

    obj = _streams()
    job = _load(job_file, overrides)
    from tpulaunch import runner

    resolver = _resolver(job, local, wait_s)
    result = runner.evaluate(job, local=local, checkpoint=checkpoint, cluster_resolver=resolver,
                             search_path=_search_path(job_file))
    render_eval(obj.out, result, plain=plain_output(obj.out))


@click.command()
@_job_argument
@click.argument("out_dir", metavar="OUT_DIR", type=click.Path(file_okay=False, path_type=str))
@_set_option
@click.option("--checkpoint", type=str, help="Export this checkpoint (model.ckpt-N) instead of the latest.")
def export(job_file: str, out_dir: str, overrides, checkpoint: Optional[str]):
    """Write a SavedModel of the latest checkpoint, with a serving signature from data.features.

    The SavedModel lands in a timestamped directory under OUT_DIR; it serves on CPU/GPU and takes
    the features by name, with a free batch dimension.

    \b
    Examples:
      tpulaunch export job.yaml exported/
      saved_model_cli show --dir exported/<timestamp> --all
    """
    obj = _streams()
    job = _load(job_file, overrides)
    from tpulaunch import runner

    path = runner.export(job, out_dir, checkpoint=checkpoint, search_path=_search_path(job_file))
    obj.out.print(f"exported {path}", highlight=False, markup=False, soft_wrap=True)

