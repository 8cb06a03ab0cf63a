"""The engine seam: what the verbs ask of a way of training, whichever library does the training.

validate, plan, train, evaluate, export and explain reach the training library only through an `Engine`; the job,
its checks and its Plan (computed once, in plan/) are the same for every engine. Each engine is a folder under
engine/ with a class of these methods (no base class to inherit: any class that has them is one) and an
`EngineAbout` of what it is and can do (`seam/about.py`, read without its library); `seam/registry.py` lists them.

Every method takes the checked job and its Plan for the target (`plan.on_tpu` says TPU or this machine); every
engine takes every option a verb passes, and what an engine cannot do it declares (`EngineAbout`: `cpu_replicas`)
so that the checks refuse it before the run (`checks/run_options.py`), or refuses itself, at the start of its
method. What the run shares beyond the engine (the run record, the progress cadence) is not here: it is the same
for every engine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol, Tuple

if TYPE_CHECKING:  # annotations only: the seam imports no folder above it
    from tpulaunch.job.load import LoadedJob
    from tpulaunch.job.schema import Job
    from tpulaunch.plan.build import Plan
    from tpulaunch.run.events import RunRecorder


class Engine(Protocol):
    """One way of building and running a job's training."""

    name: str  # run.engine's value (its `EngineAbout.name`)

    def load(self) -> None:
        """Import the library the engine trains with (the first slow part of a run: its own phase); refuse (a
        TpuLaunchError) when this machine cannot run it (`seam/registry.require`)."""

    def check_build(self, loaded: "LoadedJob", plan: "Plan") -> list:
        """Build what `train` builds for each mode the job runs, on this machine, and stop before the first step;
        what fails is a problem located at the job key its code comes from."""

    def step_tensors(self, job: "Job", *, use_tpu: bool) -> Any:
        """Build one training step of the job (its real model, loss and optimizer) and list what the backward
        pass reads from the forward pass (`engine/core/step_tensors.py`'s StepTensors): the memory estimate's
        input."""

    def preflight(self, loaded: "LoadedJob", plan: "Plan") -> tuple:
        """Ask the framework's own TPU code about the job's declared slice (`plan`, its TPU Plan), offline
        (`validate --tf`): (problems located in the job file, what was built per mode)."""

    def train(self, job: "Job", plan: "Plan", *, recorder: "RunRecorder", cluster_resolver: Any = None,
              force: bool = False, watch: Any = None, profile: Optional[Tuple[int, int]] = None,
              cpu_replicas: Optional[int] = None) -> Any:
        """Train to `job.train.steps` (resuming), evaluating as the job says, telling `recorder` what happens;
        returns the run's summary.

        `watch`: the TPU node's watch (`run/watchdog.WatchPlan`; None: none), `profile`: the global steps to
        profile into model_dir, `force`: resume over a job copy of another model, `cpu_replicas`: this machine's
        CPU as that many replicas (only for an engine whose `EngineAbout.layout.cpu_replicas` says it can; None
        otherwise)."""

    def evaluate(self, job: "Job", plan: "Plan", *, recorder: "RunRecorder", checkpoint: Optional[str] = None,
                 cluster_resolver: Any = None, cpu_replicas: Optional[int] = None) -> Any:
        """Evaluate the latest (or the given) checkpoint, telling `recorder`; returns the metrics."""

    def export(self, job: "Job", plan: "Plan", out_dir: str, *, checkpoint: Optional[str] = None,
               say: Optional[Callable[[str], None]] = None) -> str:
        """Write a SavedModel for serving of the given checkpoint, else model_dir's newest complete one (`say`
        told which when a newer one was skipped); returns its directory."""

    def program(self, loaded: "LoadedJob", plan: "Plan") -> str:
        """The standalone program that does what this engine does for the job (`tpulaunch explain`)."""
