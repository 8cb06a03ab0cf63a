"""What `train`, `evaluate` and `export` do before and around the engine's call: the job through the gate for
its target, the run recorder, model_dir's lease, the TPU's resolver and the watch on its node.

No printing here: a line to say goes to the `say` the command hands in; the renderer of run events is the
command's too (`cli/render/`), handed to `recorder` to subscribe.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Sequence

from tpulaunch.errors import ExitCode, TpuLaunchError


def checked_to_run(job_file: str, overrides: Sequence[str], *, local: bool, warn=None):
    """The job through the one gate (static checks for this target); a TPU job also refused when this machine's
    TensorFlow cannot drive its TPU. `warn`: called with the job's warnings (`app/gate.py`)."""
    from tpulaunch.app.gate import load_checked

    checked = load_checked(job_file, list(overrides), local=local, warn=warn)
    if not local and checked.job.on_tpu:  # before the TPU is touched: can this machine's TensorFlow drive it?
        from tpulaunch.checks.stack import refuse_unless_runnable

        refuse_unless_runnable(checked.loaded, job_file, "running")
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
