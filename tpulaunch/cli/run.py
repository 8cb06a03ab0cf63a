"""`tpulaunch train`, `evaluate` and `export`: each parses its options, calls `app/run.py` (the job checked, the run
recorded, the engine's call) with the renderer for the run's lines (`cli/render/`), and says what comes back.

`train` and `evaluate` leave a run record in model_dir (`app/recorded.py`, `run/run_record.py`).
"""

from __future__ import annotations

import os
from typing import Optional

import click

from tpulaunch.app import run as app_run
from tpulaunch.cli.base import (Context, checkpoint_option, command, cpu_replicas_option, job_argument, local_option,
                                pass_obj, set_option, wait_option, warnings_to)


def _renderer(obj: Context):
    """The run's renderer for its recorder, on stdout: fixed-format lines when the output is not a terminal or under
    CI, a live display otherwise. Made when the run starts: a job the gate refuses loads no rich."""
    def made(recorder):
        console = obj.out
        if not console.is_terminal or os.environ.get("CI"):
            from tpulaunch.cli.render.run_plain import PlainRenderer

            return PlainRenderer(console)
        from tpulaunch.cli.render.run_live import LiveRenderer

        return LiveRenderer(console, get_time=recorder.get_time)

    return made


def _tellers(obj: Context, job_file: str) -> dict:
    """What the application layer hands its lines to: the run's renderer on stdout, notes and the job's warnings on
    stderr, and TensorFlow's log level."""
    return {"renderer": _renderer(obj), "say": obj.say, "warn": warnings_to(obj.text_out(stderr=True), job_file),
            "verbose": obj.verbose}


class StepRange(click.ParamType):
    """START-END: global steps, both included, 1 <= START <= END (a single N means N-N)."""

    name = "START-END"

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        first, _, last = str(value).partition("-")
        try:
            steps = (int(first), int(last or first))
        except ValueError:
            self.fail(f"{value!r} is not START-END, e.g. 10-15 (global steps, both included)", param, ctx)
        if not 1 <= steps[0] <= steps[1]:
            self.fail(f"{value!r}: START must be at least 1 and END at least START, e.g. 10-15", param, ctx)
        return steps


take_lease_option = click.option(
    "--take-lease", is_flag=True,
    help="Take model_dir's lease even when another live run holds it (only when that run is surely stopped). "
         "Without it a run whose lease was not renewed for $TPULAUNCH_LEASE_STALE_S seconds (default 180; renewed "
         "every $TPULAUNCH_LEASE_RENEW_S, default 30) is taken over, and a live one refuses this run.")


@command()
@job_argument
@local_option
@set_option
@click.option("--model-dir", type=click.Path(file_okay=False, path_type=str),
              help="Checkpoints here instead of run.model_dir (relative to the current directory).")
@click.option("--force", is_flag=True, help="Resume even if model_dir holds a job with another model or data spec.")
@take_lease_option
@wait_option
@click.option("--watch-interval", type=click.FloatRange(min=0.01), default=60, show_default=True, metavar="SECONDS",
              help="Poll the TPU node's state and health this often while training.")
@click.option("--auto-resume", type=click.IntRange(min=0), default=0, show_default=True, metavar="N",
              help="When the TPU is lost (preempted, unhealthy, unreachable), wait for it to be READY again and "
                   "resume from the last complete checkpoint, at most N times. 0: stop with exit code 3.")
@click.option("--resume-wait", type=click.FloatRange(min=0), default=3600, show_default=True, metavar="SECONDS",
              help="With --auto-resume, how long to wait each time for the node to be READY and HEALTHY.")
@click.option("--recreate", is_flag=True,
              help="With --auto-resume: when the TPU is preempted, terminated or deleted, delete what is left of it, "
                   "create it again as `tpulaunch up` does, and resume. Creating TPUs costs money: off by default.")
@click.option("--watch-node", is_flag=True,
              help="With --local: watch the job's TPU node anyway and stop/resume when it is lost (a rehearsal "
                   "of the TPU recovery path, e.g. against an emulated TPU API via $TPULAUNCH_TPU_API_ENDPOINT).")
@click.option("--profile", type=StepRange(), default=None, metavar="START-END",
              help="Capture a TensorBoard profile of these global steps into model_dir "
                   "(tensorboard --logdir MODEL_DIR, Profile tab). Skip the first steps: they include start-up.")
@cpu_replicas_option
@pass_obj
def train(obj: Context, job_file: str, local: bool, overrides, model_dir: Optional[str], force: bool, take_lease: bool,
          wait_s: float, watch_interval: float, auto_resume: int, resume_wait: float, recreate: bool, watch_node: bool,
          profile,
          cpu_replicas: Optional[int]):
    """Train the job: resume from model_dir's latest complete checkpoint, evaluate as eval: says, show progress.

    One writer per model_dir: the run holds model_dir/tpulaunch.lease while it lives; a second run on the
    same model_dir is refused (exit 1) naming the holder, unless the holder stopped renewing it (then it
    is taken over) or --take-lease.

    Ctrl-C (or SIGTERM, SIGHUP) finishes the current step, saves a checkpoint there and exits 130 (143,
    129); running the same command again continues from that step. A step that does not return within 30 s
    of the signal ($TPULAUNCH_STOP_GRACE_S: its input, a store or a collective never answers), or a second
    Ctrl-C, stops the run where it is: its record written, its lease released, no checkpoint at the stop
    (the last one stays the one to resume from). A run whose lease another run took
    over (it was frozen past the stale time, or --take-lease) stops before its next write there, exit 5. A checkpoint that a preemption cut
    in half is skipped: training resumes from the one before it.

    Each phase shows as it begins and ends (loading TensorFlow, building the graph, the first step,
    evaluations); one far past its usual time says so. Each run appends its record (phases adding
    up to the wall time, goodput, whether the steps waited for input) to
    model_dir/tpulaunch-runs.jsonl.

    On a TPU the node is watched while training: when it is PREEMPTED, STOPPED, TERMINATED or
    UNHEALTHY (or TensorFlow loses it), training stops cleanly and exits 3; with --auto-resume N it
    waits for the node to be READY again and resumes, at most N times; with --recreate as well, a
    preempted, terminated or deleted node is deleted and created again (as `tpulaunch up` does).

    \b
    Examples:
      tpulaunch train job.yaml                       # on the TPU named in tpu:
      tpulaunch train job.yaml --local               # same job on this machine's CPU/GPU
      tpulaunch train job.yaml --local --set train.steps=20 --set train.batch_size=8   # CI smoke run
      tpulaunch train job.yaml --model-dir runs/try2 # a fresh run next to the first
      tpulaunch train job.yaml --auto-resume 5       # survive up to 5 preemptions
      tpulaunch train job.yaml --auto-resume 5 --recreate   # and create a preempted spot TPU again
      tpulaunch train job.yaml --local --profile 20-25   # a TensorBoard profile of steps 20 to 25
      tpulaunch train job.yaml --local --cpu-replicas 2  # keras engine: two replicas on this CPU
    """
    app_run.train(job_file, overrides, local=local, model_dir=model_dir, force=force, take_lease=take_lease,
                  wait_s=wait_s, watch_interval=watch_interval, auto_resume=auto_resume, resume_wait=resume_wait,
                  recreate=recreate, watch_node=watch_node, profile=profile, cpu_replicas=cpu_replicas,
                  **_tellers(obj, job_file))


@command()
@job_argument
@local_option
@set_option
@checkpoint_option
@wait_option
@cpu_replicas_option
@take_lease_option
@pass_obj
def evaluate(obj: Context, job_file: str, local: bool, overrides, checkpoint: Optional[str], wait_s: float,
             cpu_replicas: Optional[int], take_lease: bool):
    """Evaluate the latest checkpoint in run.model_dir on data.eval for eval.steps batches.

    It writes into model_dir (its run record; TensorBoard eval summaries on the estimator engine), so it
    holds model_dir's lease like train: refused while a train of that model_dir runs.

    \b
    Examples:
      tpulaunch evaluate job.yaml --local
      tpulaunch evaluate job.yaml --local --checkpoint runs/cnn/model.ckpt-300
    """
    app_run.evaluate(job_file, overrides, local=local, checkpoint=checkpoint, wait_s=wait_s, cpu_replicas=cpu_replicas,
                     take_lease=take_lease, **_tellers(obj, job_file))


@command()
@job_argument
@click.argument("out_dir", metavar="OUT_DIR", type=click.Path(file_okay=False, path_type=str))
@set_option
@checkpoint_option
@pass_obj
def export(obj: Context, job_file: str, out_dir: str, overrides, checkpoint: Optional[str]):
    """Write a SavedModel of the latest checkpoint, with a serving signature from data.features.

    The SavedModel lands in a timestamped directory under OUT_DIR; it serves on CPU/GPU and takes
    the features by name, with a free batch dimension. Export only reads model_dir, so it takes no
    lease and may run beside a train of the same model_dir.

    \b
    Examples:
      tpulaunch export job.yaml exported/
      saved_model_cli show --dir exported/<timestamp> --all
    """
    path = app_run.export(job_file, overrides, out_dir, checkpoint=checkpoint, **_tellers(obj, job_file))
    obj.out.print(f"exported {path}", highlight=False, markup=False, soft_wrap=True)
