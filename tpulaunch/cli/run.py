"""`tpulaunch train`, `evaluate` and `export`: validate the job, then run it with TPUEstimator.

TensorFlow is imported only after the job has passed the static checks (and after its log level has
been set), so a broken job is refused in a fraction of a second. From there a run says which phase
it is in (the first line comes before TensorFlow loads) and `train`/`evaluate` leave a run record in
model_dir (`app/recorded.py`, `run/run_record.py`). What the commands do around the engine's call is
`app/run.py`'s; the run's lines are `cli/render/`'s.
"""

from __future__ import annotations

import json
import os
import shlex
from typing import Optional, Sequence

import click

from tpulaunch.app.run import model_dir_lease, resolving, tpu_resolver, watch_plan
from tpulaunch.cli.base import (Context, checkpoint_option, command, cpu_replicas_option, job_argument, local_option,
                                pass_obj, set_option, wait_option, warnings_to)
from tpulaunch.errors import AlreadyReported, TpuLaunchError, low_memory_limit_warning
from tpulaunch.tf_env import quiet_tensorflow


def _checked(obj: Context, job_file: str, overrides, extra=(), *, local: bool):
    """The job through the one gate (`app/run.py`), with TensorFlow's logging set."""
    from tpulaunch.app.run import checked_to_run

    checked = checked_to_run(job_file, [*overrides, *extra], local=local,
                             warn=warnings_to(obj.text_out(stderr=True), job_file))
    quiet_tensorflow(obj.verbose)  # again: the command may run outside the `tpulaunch` group
    return checked


def _recorder(console, **settings):
    """A run recorder with a renderer on `console`: fixed-format lines when the output is not a terminal
    or under CI, a live display otherwise."""
    from tpulaunch.app.run import run_recorder

    if not console.is_terminal or os.environ.get("CI"):
        from tpulaunch.cli.render.run_plain import PlainRenderer

        return run_recorder(lambda recorder: PlainRenderer(console), **settings)
    from tpulaunch.cli.render.run_live import LiveRenderer

    return run_recorder(lambda recorder: LiveRenderer(console, get_time=recorder.get_time), **settings)


def _evaluate_command(job_file: str, sets: Sequence[str], local: bool, checkpoint: Optional[str] = None) -> str:
    """The `tpulaunch evaluate` command line for the same job, settings and model_dir."""
    words = ["tpulaunch", "evaluate", job_file, *(["--local"] if local else [])]
    for value in sets:
        words += ["--set", value]
    return shlex.join(words + (["--checkpoint", checkpoint] if checkpoint else []))


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


def _model_dir_override(model_dir: Optional[str]) -> list:
    # Relative to where the command runs (the job file's own paths are relative to the job file); a URL
    # (gs://bucket/dir) as given: abspath would turn it into a local ./gs:/bucket/dir.
    if not model_dir:
        return []
    return [f"run.model_dir={json.dumps(model_dir if '://' in model_dir else os.path.abspath(model_dir))}"]


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
    from tpulaunch.seam.registry import require
    from tpulaunch.run.started import run_started

    began = run_started()
    sets = [*overrides, *_model_dir_override(model_dir)]
    checked = _checked(obj, job_file, sets, local=local)
    job, engine = checked.job, checked.engine
    require(engine.name)  # a run that cannot start takes no lease
    low_limit = low_memory_limit_warning()
    if low_limit:
        obj.err.print(f"warning: {low_limit}", highlight=False, markup=False, soft_wrap=True)
    with model_dir_lease(job, "train", take=take_lease, say=obj.say) as lease:
        _train(obj, job_file, checked, engine, began, sets, lease, local=local, force=force, wait_s=wait_s,
               watch_node=watch_node, watch_interval=watch_interval, auto_resume=auto_resume,
               resume_wait=resume_wait, recreate=recreate, profile=profile, cpu_replicas=cpu_replicas)


def _train(obj: Context, job_file: str, checked, engine, began: float, sets, lease, *, local: bool, force: bool,
           wait_s: float, watch_node: bool, watch_interval: float, auto_resume: int, resume_wait: float,
           recreate: bool, profile, cpu_replicas: Optional[int]):
    from tpulaunch.app.recorded import recorded_run
    from tpulaunch.data.input_help import input_help
    from tpulaunch.engine.plain import log_every_steps
    from tpulaunch.run.lease import LeaseLost
    from tpulaunch.run.signals import EvaluationStopped, TrainingStopped
    from tpulaunch.run.watchdog import NodeLost

    job = checked.job
    recorder = _recorder(obj.out, started_at=began, total_steps=job.train.steps if job.train else 0,
                         batch_size=job.train.batch_size if job.train else 0,
                         log_every_steps=log_every_steps(job), model_dir=job.run.model_dir,
                         input_help=input_help(job, on_tpu=checked.plan.on_tpu))
    with recorded_run(obj.say, recorder, engine, checked, "train", lease=lease):
        with resolving(recorder, job, local=local, watch_node=watch_node):
            resolver = tpu_resolver(job, local, wait_s)
            watch = watch_plan(job, local=local, watch_node=watch_node, wait_s=wait_s, interval=watch_interval,
                               auto_resume=auto_resume, resume_wait=resume_wait, recreate=recreate,
                               job_file=job_file, engine=engine.name, say=obj.say)
        try:
            engine.train(job, checked.plan, recorder=recorder, cluster_resolver=resolver, force=force, watch=watch,
                         profile=profile, cpu_replicas=_replicas(engine, cpu_replicas, checked.plan))
        except LeaseLost as lost:  # fenced: say where it stopped, and what it left
            lost.message += (f", at step {recorder.step} (its last checkpoint there: "
                             f"{recorder.last_checkpoint or 'none from this run'})")
            raise
        except (TrainingStopped, NodeLost) as stopped:
            hint = stopped.hint
            if isinstance(stopped, EvaluationStopped):
                # Only this command line knows how to name the same job, settings and model_dir again.
                if stopped.final:
                    hint = f"to evaluate that checkpoint: {_evaluate_command(job_file, sets, local)}"
                else:
                    hint = f"to evaluate it: {_evaluate_command(job_file, sets, local, stopped.checkpoint)}"
            obj.err.print(stopped.message, highlight=False, markup=False, soft_wrap=True)
            if hint:
                obj.err.print(f"hint: {hint}", highlight=False, markup=False, soft_wrap=True)
            raise AlreadyReported(stopped.exit_code) from None


def _replicas(engine, cpu_replicas: Optional[int], plan) -> Optional[int]:
    """`--cpu-replicas` for the engine, when asked (`checks/run_options.py` holds the rule)."""
    from tpulaunch.checks.run_options import cpu_replicas_for

    return cpu_replicas_for(engine.name, cpu_replicas, plan)


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
    from tpulaunch.app.recorded import recorded_run
    from tpulaunch.seam.registry import require
    from tpulaunch.run.started import run_started

    began = run_started()
    checked = _checked(obj, job_file, overrides, local=local)
    job, engine = checked.job, checked.engine
    require(engine.name)  # a run that cannot start takes no lease
    with model_dir_lease(job, "evaluate", take=take_lease, say=obj.say) as lease:
        recorder = _recorder(obj.out, started_at=began, model_dir=job.run.model_dir)
        with recorded_run(obj.say, recorder, engine, checked, "evaluate", lease=lease):
            with resolving(recorder, job, local=local, watch_node=False):
                resolver = tpu_resolver(job, local, wait_s)
            engine.evaluate(job, checked.plan, recorder=recorder, checkpoint=checkpoint, cluster_resolver=resolver,
                            cpu_replicas=_replicas(engine, cpu_replicas, checked.plan))


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
    from tpulaunch.app.recorded import recorded_run
    from tpulaunch.run import phases
    from tpulaunch.run.started import run_started

    began = run_started()
    checked = _checked(obj, job_file, overrides, local=True)  # export builds a CPU serving graph
    engine = checked.engine
    recorder = _recorder(obj.out, started_at=began)
    with recorded_run(obj.say, recorder, engine, checked, "export", record=False), recorder.phase(phases.EXPORT):
        path = engine.export(checked.job, checked.plan, out_dir, checkpoint=checkpoint, say=recorder.note)
    obj.out.print(f"exported {path}", highlight=False, markup=False, soft_wrap=True)
