"""What `train`, `evaluate` and `export` do: the job through the gate for its target, the run recorder, model_dir's
lease, the TPU's resolver and the watch on its node, the engine's call, and what a stopped run says.

TensorFlow is imported only after the job has passed the static checks (and after its log level has been set), so
a broken job is refused in a fraction of a second. No printing here: a line to say goes to the `say` the command
hands in; the renderer of run events is the command's too (`cli/render/`), handed in as `renderer(recorder)`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
from typing import Callable, Optional, Sequence, Tuple

from tpulaunch.errors import AlreadyReported, ExitCode, TpuLaunchError, low_memory_limit_warning


def train(job_file: str, overrides: Sequence[str], *, renderer: Callable, say: Callable[[str], None], warn=None,
          verbose: int = 0, local: bool, model_dir: Optional[str], force: bool, take_lease: bool, wait_s: float,
          watch_interval: float, auto_resume: int, resume_wait: float, recreate: bool, watch_node: bool,
          profile: Optional[Tuple[int, int]], cpu_replicas: Optional[int]) -> None:
    """`tpulaunch train`: the job checked for its target, model_dir's lease taken, the run recorded and watched,
    the engine trains. A run stopped (a signal, its node lost, an evaluation stopped) says why and how to go on
    through `say` and raises `AlreadyReported` with its exit code. `renderer(recorder)`: the run's renderer;
    `warn`: called with the job's warnings; `verbose`: TensorFlow's log level (`tf_env.quiet_tensorflow`)."""
    from tpulaunch.seam.registry import require
    from tpulaunch.run.started import run_started

    began = run_started()
    sets = [*overrides, *_model_dir_override(model_dir)]
    checked = checked_to_run(job_file, sets, local=local, warn=warn, verbose=verbose)
    job, engine = checked.job, checked.engine
    require(engine.name)  # a run that cannot start takes no lease
    low_limit = low_memory_limit_warning()
    if low_limit:
        say(f"warning: {low_limit}")
    with model_dir_lease(job, "train", take=take_lease, say=say) as lease:
        _train(job_file, checked, engine, began, sets, lease, renderer=renderer, say=say, local=local, force=force,
               wait_s=wait_s, watch_node=watch_node, watch_interval=watch_interval, auto_resume=auto_resume,
               resume_wait=resume_wait, recreate=recreate, profile=profile, cpu_replicas=cpu_replicas)


def _train(job_file: str, checked, engine, began: float, sets, lease, *, renderer: Callable,
           say: Callable[[str], None], local: bool, force: bool, wait_s: float, watch_node: bool,
           watch_interval: float, auto_resume: int, resume_wait: float, recreate: bool, profile,
           cpu_replicas: Optional[int]) -> None:
    from tpulaunch.app.recorded import recorded_run
    from tpulaunch.data.input_help import input_help
    from tpulaunch.engine.plain import log_every_steps
    from tpulaunch.run.lease import LeaseLost
    from tpulaunch.run.signals import EvaluationStopped, TrainingStopped
    from tpulaunch.run.watchdog import NodeLost

    job = checked.job
    recorder = run_recorder(renderer, started_at=began, total_steps=job.train.steps if job.train else 0,
                            batch_size=job.train.batch_size if job.train else 0,
                            log_every_steps=log_every_steps(job), model_dir=job.run.model_dir,
                            input_help=input_help(job, on_tpu=checked.plan.on_tpu))
    with recorded_run(say, recorder, engine, checked, "train", lease=lease):
        with resolving(recorder, job, local=local, watch_node=watch_node):
            resolver = tpu_resolver(job, local, wait_s)
            watch = watch_plan(job, local=local, watch_node=watch_node, wait_s=wait_s, interval=watch_interval,
                               auto_resume=auto_resume, resume_wait=resume_wait, recreate=recreate,
                               job_file=job_file, engine=engine.name, say=say)
        try:
            engine.train(job, checked.plan, recorder=recorder, cluster_resolver=resolver, force=force, watch=watch,
                         profile=profile, cpu_replicas=_replicas(engine, cpu_replicas, checked.plan))
        except LeaseLost as lost:  # fenced: say where it stopped, and what it left
            if lost.step is not None:  # a save it stopped: TPUEstimator's saver runs before the progress hook sees it
                recorder.at_step(lost.step)
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
            say(stopped.message)
            if hint:
                say(f"hint: {hint}")
            raise AlreadyReported(stopped.exit_code) from None


def evaluate(job_file: str, overrides: Sequence[str], *, renderer: Callable, say: Callable[[str], None], warn=None,
             verbose: int = 0, local: bool, checkpoint: Optional[str], wait_s: float, cpu_replicas: Optional[int],
             take_lease: bool) -> None:
    """`tpulaunch evaluate`: the job checked for its target, model_dir's lease taken (evaluate writes its record
    there), the run recorded, the engine evaluates `checkpoint` (None: the latest)."""
    from tpulaunch.app.recorded import recorded_run
    from tpulaunch.seam.registry import require
    from tpulaunch.run.started import run_started

    began = run_started()
    checked = checked_to_run(job_file, overrides, local=local, warn=warn, verbose=verbose)
    job, engine = checked.job, checked.engine
    require(engine.name)  # a run that cannot start takes no lease
    with model_dir_lease(job, "evaluate", take=take_lease, say=say) as lease:
        recorder = run_recorder(renderer, started_at=began, model_dir=job.run.model_dir)
        with recorded_run(say, recorder, engine, checked, "evaluate", lease=lease):
            with resolving(recorder, job, local=local, watch_node=False):
                resolver = tpu_resolver(job, local, wait_s)
            engine.evaluate(job, checked.plan, recorder=recorder, checkpoint=checkpoint, cluster_resolver=resolver,
                            cpu_replicas=_replicas(engine, cpu_replicas, checked.plan))


def export(job_file: str, overrides: Sequence[str], out_dir: str, *, renderer: Callable,
           say: Callable[[str], None], warn=None, verbose: int = 0, checkpoint: Optional[str]) -> str:
    """`tpulaunch export`: a SavedModel of `checkpoint` (None: the latest) under `out_dir`; returns its path. It
    only reads model_dir: no lease, no run record."""
    from tpulaunch.app.recorded import recorded_run
    from tpulaunch.run import phases
    from tpulaunch.run.started import run_started

    began = run_started()
    checked = checked_to_run(job_file, overrides, local=True, warn=warn, verbose=verbose)  # a CPU serving graph
    engine = checked.engine
    recorder = run_recorder(renderer, started_at=began)
    with recorded_run(say, recorder, engine, checked, "export", record=False), recorder.phase(phases.EXPORT):
        return engine.export(checked.job, checked.plan, out_dir, checkpoint=checkpoint, say=recorder.note)


def _model_dir_override(model_dir: Optional[str]) -> list:
    # Relative to where the command runs (the job file's own paths are relative to the job file); a URL
    # (gs://bucket/dir) as given: abspath would turn it into a local ./gs:/bucket/dir.
    if not model_dir:
        return []
    return [f"run.model_dir={json.dumps(model_dir if '://' in model_dir else os.path.abspath(model_dir))}"]


def _evaluate_command(job_file: str, sets: Sequence[str], local: bool, checkpoint: Optional[str] = None) -> str:
    """The `tpulaunch evaluate` command line for the same job, settings and model_dir."""
    words = ["tpulaunch", "evaluate", job_file, *(["--local"] if local else [])]
    for value in sets:
        words += ["--set", value]
    return shlex.join(words + (["--checkpoint", checkpoint] if checkpoint else []))


def _replicas(engine, cpu_replicas: Optional[int], plan) -> Optional[int]:
    """`--cpu-replicas` for the engine, when asked (`checks/run_options.py` holds the rule)."""
    from tpulaunch.checks.run_options import cpu_replicas_for

    return cpu_replicas_for(engine.name, cpu_replicas, plan)


def checked_to_run(job_file: str, overrides: Sequence[str], *, local: bool, warn=None, verbose: int = 0):
    """The job through the one gate (static checks for this target); a TPU job also refused when this machine's
    TensorFlow cannot drive its TPU; then TensorFlow's log level set (`verbose`). `warn`: called with the job's
    warnings (`app/gate.py`)."""
    from tpulaunch.app.gate import load_checked
    from tpulaunch.tf_env import quiet_tensorflow

    checked = load_checked(job_file, list(overrides), local=local, warn=warn)
    if not local and checked.job.on_tpu:  # before the TPU is touched: can this machine's TensorFlow drive it?
        from tpulaunch.checks.stack import refuse_unless_runnable

        refuse_unless_runnable(checked.loaded, job_file, "running")
    quiet_tensorflow(verbose)  # again: the command may run outside the `tpulaunch` group
    return checked


def run_recorder(renderer: Callable, **settings):
    """A run recorder (`run/events.py`, `settings` its own) with `renderer(recorder)` subscribed to it, and a
    rehearsal's hold (`--preempt-at`, at the host's own step) after the renderer, so the step is shown first."""
    from tpulaunch.run import rehearsal_hold
    from tpulaunch.run.events import RunRecorder

    made = RunRecorder(**settings)
    made.subscribe(renderer(made))
    hold = rehearsal_hold.subscriber(made.total_steps)
    if hold is not None:
        made.subscribe(hold)
    return made


def model_dir_lease(job, command: str, *, take: bool, say: Callable[[str], None]):
    """The run's lease on model_dir (`run/model_dir_lease.py`), its changes said through `say`."""
    from tpulaunch.run.model_dir_lease import held_lease

    return held_lease(job.run.model_dir, command, take=take, say=say)


def tpu_resolver(job, local: bool, wait_s: float):
    """The TPU's cluster resolver, after checking the node is ready for the job; None when local."""
    if local or not job.on_tpu:
        return None
    from tpulaunch.tpu import node as cluster

    ref = cluster.resolve_node(job.tpu)
    cluster.check_node(ref, job.tpu, wait=wait_s).raise_if_unusable()
    return cluster.cluster_resolver(ref)


def resolving(recorder, job, *, local: bool, watch_node: bool):
    """The "resolve the TPU" phase around finding and checking the node (none when no node is asked)."""
    from tpulaunch.run import phases

    if not job.on_tpu or (local and not watch_node):
        return contextlib.nullcontext()
    return recorder.phase(phases.RESOLVE)


def watch_plan(job, *, local: bool, watch_node: bool, wait_s: float, interval: float, auto_resume: int,
               resume_wait: float, recreate: bool = False, job_file: str = "JOB.yaml", engine: str = "",
               say: Callable[[str], None] = lambda text: None):
    """How the run watches its TPU node (after checking it is ready), or None when nothing is watched.

    A TPU run always watches its node. `--local --watch-node` watches the job's node while training
    on this machine: the whole stop/wait/resume path runs without a TPU (against an emulated TPU
    API, or to rehearse a preemption on a real node). `say`: where an option that has no effect is said.
    """
    if recreate and not auto_resume:
        raise TpuLaunchError("--recreate needs --auto-resume N: it says how many times a lost TPU is created again",
                             hint="e.g. --auto-resume 3 --recreate", exit_code=ExitCode.USAGE)
    if local and not watch_node:
        if auto_resume:
            say("--auto-resume has no effect on a --local run without --watch-node")
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
    if recreate:
        from tpulaunch.tpu.lifecycle import spec_for

        spec_for(job.tpu, engine)  # a job that cannot say what to create is refused now, not after a preemption
    return WatchPlan(ref=ref, job_tpu=job.tpu, interval=interval, auto_resume=auto_resume, resume_wait=resume_wait,
                     discovery_url=cluster.discovery_url_for(), api_endpoint=cluster.api.endpoint(),
                     recreate=recreate, job_file=job_file, engine=engine)
