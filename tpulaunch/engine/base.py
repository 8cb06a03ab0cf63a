"""The engine seam: what the verbs ask of a way of training, whichever library does the training.

validate, plan, train, evaluate, export and explain reach the training library only through an `Engine`;
the job, its checks and its Plan (computed once, in plan/) are the same for every engine. TPUEstimator
(`engine/estimator/`) and Keras + tf.distribute (`engine/keras/`) implement it; each declares what it is
and can do in an `EngineAbout` (its folder's about.py, read without its library; the class is in
`seam/about.py`), and `seam/registry.py` finds both by name — the one place that lists the engines.

Every method takes the checked job and its Plan for the target (`plan.on_tpu` says TPU or this
machine); what a method needs beyond them comes as keyword arguments.
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Any, Callable, List, Optional, Tuple

if TYPE_CHECKING:
    from tpulaunch.job.load import LoadedJob
    from tpulaunch.job.schema import Job
    from tpulaunch.plan.build import Plan
    from tpulaunch.run.events import RunRecorder


class Engine(abc.ABC):
    """One way of building and running a job's training."""

    name: str

    @abc.abstractmethod
    def load(self) -> None:
        """Import the library the engine trains with (the first slow part of a run: its own phase)."""

    @abc.abstractmethod
    def check_build(self, loaded: "LoadedJob", plan: "Plan") -> list:
        """Build the graphs `train` builds for each mode the job runs, on this machine, and stop before a
        session; what fails is a problem located at the job key its code comes from."""

    @abc.abstractmethod
    def step_tensors(self, job: "Job", *, use_tpu: bool) -> Any:
        """Build one training step of the job (its real model, loss and optimizer) and list what the backward
        pass reads from the forward pass (`engine/estimator/build.py`'s StepTensors): the memory estimate's input."""

    @abc.abstractmethod
    def preflight(self, loaded: "LoadedJob", plan: "Plan") -> tuple:
        """Build the job's train/eval graphs for its declared TPU slice (`plan`, the job's TPU Plan), offline, and
        stop before a session.

        Returns:
            (problems located in the job file, what was built per mode).
        """

    @abc.abstractmethod
    def train(self, job: "Job", plan: "Plan", *, recorder: "RunRecorder", cluster_resolver: Any = None,
              force: bool = False, watch: Any = None, profile: Optional[Tuple[int, int]] = None) -> Any:
        """Train to `job.train.steps` (resuming), evaluating as the job says, telling `recorder` what happens
        (profiling global steps `profile` into model_dir when given); returns the run's summary."""

    @abc.abstractmethod
    def evaluate(self, job: "Job", plan: "Plan", *, recorder: "RunRecorder", checkpoint: Optional[str] = None,
                 cluster_resolver: Any = None) -> Any:
        """Evaluate the latest (or the given) checkpoint, telling `recorder`; returns the metrics."""

    @abc.abstractmethod
    def export(self, job: "Job", plan: "Plan", out_dir: str, *, checkpoint: Optional[str] = None,
               say: Optional[Callable[[str], None]] = None) -> str:
        """Write a SavedModel for serving of the given checkpoint, else model_dir's newest complete one (`say` told
        which when a newer one was skipped); returns its directory."""

    def append_run_record(self, model_dir: str, line: str) -> str:
        """Append one JSON line to model_dir's run record (`run.record`); returns the file's path. Written through
        TensorFlow's filesystem (gs:// too); an engine whose workers share one run overrides it."""
        from tpulaunch.engine.core.records import append_record

        return append_record(model_dir, line)

    def run_record_lines(self, model_dir: str) -> List[str]:
        """The lines of model_dir's run record; none when it has none."""
        from tpulaunch.engine.core.records import record_lines

        return record_lines(model_dir)

    @abc.abstractmethod
    def program(self, loaded: "LoadedJob", plan: "Plan") -> str:
        """The standalone program that does what this engine does for the job (`tpulaunch explain`)."""

    def log_every_steps(self, job: "Job") -> int:
        """How often the engine reports progress, in steps."""
        return job.run.log_every_steps or 100
