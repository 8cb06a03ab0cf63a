"""What an engine declares about itself: `EngineAbout`, read by the job's schema, the checks, the plan, the TPU's
lifecycle and the CLI without importing the library the engine trains with. Each engine's folder has an about.py
with its `ABOUT`; `seam/registry.py` lists them.

Nothing here names a library: an engine says which one it trains with (`Framework`), which of its versions it
runs on, what else it needs, and how it reaches a TPU; tpulaunch's shared code asks these questions instead of
testing an engine's name.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Optional, Tuple

Version = Tuple[int, int]


@dataclass(frozen=True)
class Framework:
    """The library an engine trains with, as this machine has it installed (found without importing it)."""

    name: str  # as messages say it ("TensorFlow")
    module: str  # the package it is imported as ("tensorflow")
    distributions: Tuple[str, ...]  # the distributions that install that package (their *.dist-info says the version)


@dataclass(frozen=True)
class OwnKey:
    """A job key only this engine runs (its framework's own functions): every other engine refuses a job that sets
    it, at the key (`checks/engine_rules.py`), and `explain --engine OTHER` names the way out."""

    key: str  # dotted, as the job file writes it: "model.model_fn"
    what: str  # what the key holds, as messages say it: "a TPUEstimator model_fn"
    instead: str  # what the other engines take instead, as a fix: "give model.builder (...)"


@dataclass(frozen=True)
class RefusedKey:
    """A job key this engine does not honour (yet): a job that sets it is refused at the key, with the fix."""

    key: str  # dotted: "data.skip_corrupt"
    message: str
    hint: str


@dataclass(frozen=True)
class Layout:
    """How an engine lays a job over devices: what the plan, the checks of partition: and the run options ask."""

    even_splits: bool = False  # spatial splits must be even (uneven ones are errors; partition: auto picks even)
    # partition: splits inputs over this machine's devices too (no tpu:, or --local): a replica is as many devices as
    # the largest product of the partition dims (else partition: applies on a TPU only)
    partition_on_devices: bool = False
    # "module:function() -> (count, platform)": the devices its framework finds on this machine, for an engine that
    # shards each batch over them itself (partition_on_devices): a local Plan's replicas are what they take
    # (`plan/build.on_devices`), as its run takes them
    devices_here: Optional[str] = None
    device_assignment: bool = False  # a replica is a block of the slice's topology (plan: its DeviceAssignment)
    batches_per_replica: bool = False  # its input pipeline batches per replica (else per input_fn call)
    batches_per_host: bool = False  # one input pipeline per host, batched to the host's share of the global batch
    cpu_replicas: bool = False  # can split this machine's CPU into replicas (--cpu-replicas)
    multislice: bool = False  # trains across several slices over the data-center network (tpu.slices > 1)


@dataclass(frozen=True)
class OnTpu:
    """How an engine reaches a TPU and runs on a slice's hosts: what the TPU's lifecycle, `run`'s stage and startup
    script, the GKE JobSet and validate's cadence warnings ask."""

    # How it reaches a TPU, as its stack facts name it (TensorFlow's, `tpu/stack.py`: the "se" or "pjrt" runtime of
    # tpu-vm-tf-X.Y.Z-{se|pjrt}, cloud.google.com/tpu/docs/runtimes)
    runtime: str = "pjrt"
    extra: str = ""  # tpulaunch's extra (setup.cfg) that runs it on a TPU VM (`tpulaunch run` installs it there)
    # Which hosts of a multi-host TPU VM slice run `tpulaunch train` (`tpulaunch run`'s startup script asks):
    # "chief": worker 0 alone, its framework driving every host's chips; "every": each host runs it, worker 0 the
    # chief (the lease, model_dir's shared files). On a one-host slice both are worker 0 alone.
    hosts: str = "chief"
    # Whether it runs tpu.iterations_per_loop steps per host round trip on a TPU (TPUEstimator's loop, Keras's
    # steps_per_execution), so that checkpoints and evaluations fall between loops; validate's cadence warnings ask.
    loops: bool = True
    # The container image a GKE pod runs its jobs in (`gke:`, docs/gke.md): a stock image with its framework for
    # TPUs, and that image's Python; None: its TPU runtime exists only as TPU VM images, so it refuses gke:
    container_image: Optional[str] = None
    container_python: str = "python3"


@dataclass(frozen=True)
class EngineAbout:
    """What an engine is and can do, read by the checks, the plan and the CLI without its library.

    The rest of tpulaunch asks these questions instead of testing an engine's name.
    """

    name: str  # run.engine's value
    engine: str  # "package.module:Class" of its Engine, imported when its training work starts
    title: str  # what trains, as `plan` says it (on a TPU slice)
    local_title: str  # ... and on this machine
    install_hint: str  # how to install what it needs
    framework: Framework  # the library it trains with
    versions: Tuple[Optional[Version], Optional[Version]]  # [first, first without) of its framework's versions it runs on
    # The module of its framework's TPU stack facts and their verdicts (`tpu/stack.py` for TensorFlow), read by the
    # checks of the job's TPU stack and by `up`: installed_distributions(), framework_distributions(installed),
    # version_tuple(text), installed_verdict, generation_verdict, runtime_verdict, default_runtime. None: it runs on
    # no TPU (its own rules refuse tpu:), and the stack checks pass it by.
    tpu_stack: Optional[str]
    packages: Tuple[Tuple[str, str], ...] = ()  # (module, what it is) it needs beside its framework
    environment: Dict[str, str] = field(default_factory=dict)  # set before its framework is imported
    environment_needs: Optional[str] = None  # a module without which `environment` is not set (it would break it)
    # Set only in a process that runs a job on this engine, before the job's code or the framework loads (by
    # validate before the code checks, by its own load()): what would change another engine's job if set for every
    # engine this machine runs, as `environment` is (a Keras 3 on JAX engine's KERAS_BACKEND=jax).
    process_environment: Dict[str, str] = field(default_factory=dict)
    # The job keys only it runs, and those it does not honour: its one declaration of them, read by validate (every
    # other engine refuses its own keys, it refuses its refused ones: `checks/engine_rules.py`), explain and the docs
    own_keys: Tuple[OwnKey, ...] = ()
    refused_keys: Tuple[RefusedKey, ...] = ()
    static_rules: Optional[str] = None  # "module:function(loaded) -> problems": its other rules, pure Python
    # (stage, "module:function(loaded, search_path) -> problems"): its checks of the job's own code that need
    # its framework but build nothing, after the flags and the model's import paths
    code_checks: Tuple[Tuple[str, str], ...] = ()
    layout: Layout = field(default_factory=Layout)  # how it lays a job over devices
    on_tpu: OnTpu = field(default_factory=OnTpu)  # how it reaches a TPU and runs on its hosts
    params_set_by_tensorflow: Tuple[str, ...] = ()  # model.params keys its framework sets itself (TPUEstimator's)
    # "module:function(request) -> exported": an engine that lowers its own training step for XLA's TPU compiler
    # (`plan/xla_tpu.py`), run in `plan/memory.py`'s step child; None: the step is exported through TensorFlow
    # (`plan/xla_export.py`)
    step_exporter: Optional[str] = None

    @property
    def display(self) -> str:
        return f"{self.name} engine"

    def stack(self) -> Any:
        """Its TPU stack facts and verdicts (`tpu_stack`, imported now)."""
        return importlib.import_module(self.tpu_stack)

    def rules(self) -> Callable:
        """Its own static rules (none: no problems)."""
        if not self.static_rules:
            return lambda loaded: []
        return load_attribute(self.static_rules)


def load_attribute(path: str) -> Any:
    """The object a "package.module:attribute.sub" path names (imported now)."""
    module, _, attribute = path.partition(":")
    return functools.reduce(getattr, attribute.split("."), importlib.import_module(module))


