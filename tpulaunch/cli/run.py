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
        from tpulaunch.cli.app import consoles

        self.out, self.err = consoles()
        self.debug = False
        self.verbose = 0


def _streams():
    ctx = click.get_current_context()
    obj = ctx.find_root().obj
    if obj is None:
        obj = ctx.find_root().obj = _Streams()
    return obj


def _load(job_file: str, overrides: Sequence[str], extra: Sequence[str] = (), *, local: bool = False):
    """The validated job (static checks; TPU-only rules off for --local), or exit 1 after printing every located problem."""
    from tpulaunch.cli.render.problems import render_text
    from tpulaunch.checks.validate import validate_job

    obj = _streams()
    result = validate_job(job_file, [*overrides, *extra], static=True, local=local)
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
    from tpulaunch.tpu import node as cluster

    ref = cluster.resolve_node(job.tpu)
    cluster.check_node(ref, job.tpu, wait=wait_s).raise_if_unusable()
    return cluster.cluster_resolver(ref)


def _watch_plan(job, *, local: bool, watch_node: bool, wait_s: float, interval: float, auto_resume: int,
                resume_wait: float):
    """How the run watches its TPU node (after checking it is ready), or None when nothing is watched.

    A TPU run always watches its node. `--local --watch-node` watches the job's node while training
    on this machine: the whole stop/wait/resume path runs without a TPU (against an emulated TPU
    API, or to rehearse a preemption on a real node).
    """
    from tpulaunch.errors import TpuLaunchError

    if local and not watch_node:
        if auto_resume:
            _streams().err.print("--auto-resume has no effect on a --local run without --watch-node",
                                 highlight=False, markup=False, soft_wrap=True)
        return None
    if not job.on_tpu:
        if watch_node:
            raise TpuLaunchError("--watch-node needs the job's tpu: section (the node to watch)",
                                 hint="add tpu: {name: ..., zone: ..., project: ..., type: ...}, or drop --watch-node")
        return None
    from tpulaunch.tpu import node as cluster
    from tpulaunch.run.watchdog import WatchPlan

    ref = cluster.resolve_node(job.tpu)
    if local:  # a TPU run checked the node when building its resolver
        cluster.check_node(ref, job.tpu, wait=wait_s).raise_if_unusable()
    return WatchPlan(ref=ref, job_tpu=job.tpu, interval=interval, auto_resume=auto_resume, resume_wait=resume_wait,
                     discovery_url=cluster.discovery_url_for())


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
@click.option("--watch-interval", type=click.FloatRange(min=0.01), default=60, show_default=True, metavar="SECONDS",
              help="Poll the TPU node's state and health this often while training.")
@click.option("--auto-resume", type=click.IntRange(min=0), default=0, show_default=True, metavar="N",
              help="When the TPU is lost (preempted, unhealthy, unreachable), wait for it to be READY again and "
                   "resume from the last complete checkpoint, at most N times. 0: stop with exit code 3.")
@click.option("--resume-wait", type=click.FloatRange(min=0), default=3600, show_default=True, metavar="SECONDS",
              help="With --auto-resume, how long to wait each time for the node to be READY and HEALTHY.")
@click.option("--watch-node", is_flag=True,
              help="With --local: watch the job's TPU node anyway and stop/resume when it is lost (a rehearsal "
                   "of the TPU recovery path, e.g. against an emulated TPU API via $TPULAUNCH_TPU_DISCOVERY_URL).")
def train(job_file: str, local: bool, overrides, model_dir: Optional[str], force: bool, wait_s: float,
          watch_interval: float, auto_resume: int, resume_wait: float, watch_node: bool):
    """Train the job: resume from model_dir's latest complete checkpoint, evaluate as eval: says, show progress.

    Ctrl-C (or SIGTERM) finishes the current step, saves a checkpoint there and exits 130 (143);
    running the same command again continues from that step. A checkpoint that a preemption cut
    in half is skipped: training resumes from the one before it.

    On a TPU the node is watched while training: when it is PREEMPTED, STOPPED, TERMINATED or
    UNHEALTHY (or TensorFlow loses it), training stops cleanly and exits 3; with --auto-resume N it
    waits for the node to be READY again and resumes, at most N times.

    \b
    Examples:
      tpulaunch train job.yaml                       # on the TPU named in tpu:
      tpulaunch train job.yaml --local               # same job on this machine's CPU/GPU
      tpulaunch train job.yaml --local --set train.steps=20 --set train.batch_size=8   # CI smoke run
      tpulaunch train job.yaml --model-dir runs/try2 # a fresh run next to the first
      tpulaunch train job.yaml --auto-resume 5       # survive up to 5 preemptions
    """
    from tpulaunch.run.progress import TrainProgress
    from tpulaunch.run.signals import TrainingStopped
    from tpulaunch.run.watchdog import NodeLost

    obj = _streams()
    job = _load(job_file, overrides, _model_dir_override(model_dir), local=local)
    from tpulaunch.engine.estimator import runner

    resolver = _resolver(job, local, wait_s)
    watch = _watch_plan(job, local=local, watch_node=watch_node, wait_s=wait_s, interval=watch_interval,
                        auto_resume=auto_resume, resume_wait=resume_wait)
    progress = TrainProgress(obj.out, total_steps=job.train.steps if job.train else 0,
                             batch_size=job.train.batch_size if job.train else 0,
                             log_every_steps=runner.log_every_steps(job), model_dir=job.run.model_dir)
    try:
        runner.train(job, local=local, progress=progress, cluster_resolver=resolver,
                     search_path=_search_path(job_file), force=force, watch=watch)
    except (TrainingStopped, NodeLost) as stopped:
        obj.err.print(stopped.message, highlight=False, markup=False, soft_wrap=True)
        if stopped.hint:
            obj.err.print(f"hint: {stopped.hint}", highlight=False, markup=False, soft_wrap=True)
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
    from tpulaunch.run.progress import plain_output, render_eval

    obj = _streams()
    job = _load(job_file, overrides, local=local)
    from tpulaunch.engine.estimator import runner

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
    job = _load(job_file, overrides, local=True)  # export builds a CPU serving graph
    from tpulaunch.engine.estimator import runner

    path = runner.export(job, out_dir, checkpoint=checkpoint, search_path=_search_path(job_file))
    obj.out.print(f"exported {path}", highlight=False, markup=False, soft_wrap=True)

