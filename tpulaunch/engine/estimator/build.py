"""The model layer of `validate`: the graphs `train` builds, built by `train`'s own code and stopped before a step.

For each mode the job runs (train, eval), `stopped_run.build_stopped` makes the TPUEstimator `train --local`
makes and calls its own `train`/`evaluate` with the job's input_fn, stopping once the session exists,
before the first step: nothing is read and nothing trains, so a 256^3 volume costs what a small one
does. What fails there is what `train` would refuse, reported at the job key its code comes from
(`model.builder`, `model.loss`, `model.metrics`, `model.optimizer`, `data.features`, `model.model_fn`,
`data.input_fn`) with TensorFlow's (or the job's code's) message; `train` raises the same BuildErrors,
since the wrappers that locate them (`build_errors`, `located`) are in the code both run.

Also here: what one training step keeps for its backward pass (`step_tensors`, the memory plan's input),
read from the same stopped build. Locating a failure (`core/build_failures.py`) and reading what a step
keeps (`core/step_tensors.py`) are the same for every engine.
"""

from __future__ import annotations

from tpulaunch.engine.core.build_failures import BuildError, ModeBuild, problems_of
from tpulaunch.engine.estimator.locate import build_errors
from tpulaunch.engine.core.step_tensors import PROBE_BATCH, StepTensors, elements, kept_by_backward, state_bytes


def build_problems(loaded, plan) -> list:
    """The failed builds as problems: one per job key and message, naming the graphs that failed."""
    # validate builds what `train --local` builds (the TPU's graphs: validate --tf, verdict.py)
    return problems_of(loaded, build_modes(loaded.job, plan), "graph")


def build_modes(job, plan, modes=("train", "eval")) -> list:
    """One `ModeBuild` per mode the job runs: `train`'s and `evaluate`'s own calls, stopped before the first step."""
    return [_build(job, mode, plan) for mode in modes if _runs(job, mode)]


def _runs(job, mode: str) -> bool:
    """Whether the job runs `mode` (as the runner decides: a section, and data or the job's own input_fn)."""
    return (getattr(job, mode, None) is not None
            and (getattr(job.data, mode) is not None or bool(job.data.input_fn)))


def _build(job, mode: str, plan) -> ModeBuild:
    from tpulaunch.engine.estimator.stopped_run import build_stopped

    try:
        build_stopped(job, mode, plan)
        return ModeBuild(mode, True)
    except BuildError as exc:
        return ModeBuild(mode, False, exc.key, exc.detail, exc.hint, exc.code)


def step_tensors(job, *, use_tpu: bool) -> StepTensors:
    """Build the job's training step as `train --local` builds it (build_stopped: its real model_fn, TRAIN mode,
    loss, optimizer, input pipeline) for a global batch of PROBE_BATCH examples, and list what its gradient
    computation reads from the forward pass. `use_tpu` does not change what is kept: the TPU's CrossShardOptimizer
    sums gradients across replicas after they are computed, and bfloat16 is 2 bytes wherever it runs.

    Raises:
        TpuLaunchError, or whatever the job's code raises while building (the caller reports it).
    """
    import tensorflow as tf

    from tpulaunch.engine.estimator.stopped_run import build_stopped
    from tpulaunch.plan.auto import main_feature

    del use_tpu
    found = {}

    def measure(graph):
        variables = [v for v in graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
                     if "global_step" not in v.name]
        trainable = graph.get_collection(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES)
        model = _model_variables(trainable, variables)
        found.update(kept=kept_by_backward(graph), params=sum(elements(v) for v in model),
                     trainable=sum(elements(v) for v in trainable),
                     optimizer=state_bytes([v for v in variables if not any(v is m for m in model)]))

    probe = job.model_copy(update={"train": job.train.model_copy(update={"batch_size": PROBE_BATCH})})
    with build_errors(job, "train"):
        build_stopped(probe, "train", on_graph=measure, before_session=True)
    shape = tuple(job.data.features[main_feature(job.data.features)].shape)
    return StepTensors(shape, found["params"], found["trainable"], tuple(found["kept"]), found["optimizer"])


def _model_variables(trainable, variables) -> list:
    """The model's own weights: the trainable ones, and non-trainable ones beside them (batch-norm statistics).

    Optimizer slots are named after their variable ('.../kernel/Adam', '.../kernel/Momentum') and the
    optimizer's own state ('beta1_power') sits outside the model's scopes: neither is a weight. What is
    left besides the global step is the state the model_fn's optimizer made (`state_bytes` counts its slots).
    """
    names = {v.op.name for v in trainable}
    scopes = {n.split("/")[0] for n in names if "/" in n}
    model = list(trainable)
    for v in variables:
        name = v.op.name
        if name in names or any(name.startswith(n + "/") for n in names):
            continue
        if "/" in name and name.split("/")[0] in scopes:
            model.append(v)
    return model
