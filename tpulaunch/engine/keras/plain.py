"""The boundary to the keras engine's `standalone.py`: the plain values and the job's own code it runs with,
converted from a Job and its Plan in one place. `tpulaunch explain --engine keras` writes the same values.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Dict, NamedTuple, Optional, Sequence

from tpulaunch.engine.plain import tensor_specs
from tpulaunch.errors import TpuLaunchError
from tpulaunch.job.imports import resolve
from tpulaunch.job.schema import OPTIMIZERS, Job

if TYPE_CHECKING:
    from tpulaunch.plan.build import Plan

# Where tf.train.Checkpoint(global_step=...) keeps the step: how a keras-engine checkpoint is told apart.
STEP_KEY = "global_step/.ATTRIBUTES/VARIABLE_VALUE"


class JobParts(NamedTuple):
    """The job's own code for KerasTraining: its builder and arguments, the policy, the optimizer, its functions."""

    builder: Callable
    builder_kwargs: dict
    policy: str
    make_optimizer: Callable
    whole_loss: Optional[Callable]
    custom_losses: Dict[str, Callable]
    custom_metrics: Dict[str, Callable]


def job_parts(job: Job, *, use_tpu: bool, search_path: Sequence[str] = ()) -> JobParts:
    """Resolve the job's code (after setting its flags), with failures located at their job key."""
    from tpulaunch.job.flags import apply_flags
    from tpulaunch.engine.job_code import apply_precision, job_builder, job_functions

    apply_flags(job, search_path=search_path)
    builder, kwargs = job_builder(job, search_path=search_path)
    whole_loss, custom_losses, custom_metrics = job_functions(job, search_path=search_path)
    return JobParts(builder, kwargs, apply_precision(job.model.precision, use_tpu=use_tpu),
                    keras_optimizer(job, search_path=search_path), whole_loss, custom_losses, custom_metrics)


def keras_optimizer(job: Job, *, search_path: Sequence[str] = ()) -> Callable[[Any], Any]:
    """`make(keras)`: the job's fresh optimizer of `keras`, the Keras the model is written with (KerasTraining
    calls it once the model is built, before anything trains), checked.

    Raises:
        TpuLaunchError: bad arguments, or an import path that does not return an optimizer of the model's Keras
            (a Keras 3 model's variables are updated only by a Keras 3 optimizer; tf-keras ones by tf-keras's).
    """
    from tpulaunch.engine.keras import standalone

    spec = job.model.optimizer
    make = resolve(spec.name, search_path=search_path, what="optimizer") if ":" in spec.name else None
    assert make is not None or spec.name in standalone.KERAS_OPTIMIZERS, OPTIMIZERS  # the schema allows no other
    factory = standalone.keras_optimizer_factory(spec.name, spec.learning_rate, dict(spec.args), make=make)

    def checked(keras):
        try:
            optimizer = factory(keras)
        except TypeError as exc:
            raise TpuLaunchError(f"optimizer {spec.name!r} rejected its arguments: {exc}",
                                 hint="check model.optimizer.args against the Keras optimizer's constructor") from None
        if not isinstance(optimizer, _optimizer_bases(keras)):
            raise _not_the_models_optimizer(spec.name, optimizer, keras)
        return optimizer

    return checked


def _optimizer_bases(keras) -> tuple:
    """The optimizer classes of `keras` (tf-keras has a legacy one besides)."""
    legacy = getattr(keras.optimizers, "legacy", None)
    return tuple(base for base in (keras.optimizers.Optimizer, getattr(legacy, "Optimizer", None)) if base is not None)


def _not_the_models_optimizer(name: str, optimizer, keras) -> TpuLaunchError:
    from tpulaunch.engine.portable import is_keras3, keras_of

    found = f"{type(optimizer).__name__} ({type(optimizer).__module__})"
    if is_keras3(keras):
        other = keras_of(optimizer)
        return TpuLaunchError(
            f"optimizer {name!r} returned {found}, not a Keras 3 optimizer: the model is a Keras 3 model, whose "
            f"variables only a Keras 3 optimizer updates" + (f" (this one is {other.__name__}'s)" if other else ""),
            hint="return keras.optimizers.<Name>(...) (`import keras`), or use a named optimizer (sgd, adam, ...)")
    return TpuLaunchError(
        f"optimizer {name!r} returned {found}, not a tf.keras optimizer (the model is a tf.keras model)",
        hint="the keras engine needs an optimizer of the model's Keras (tf.keras.optimizers.Adam, ...); a "
             "tf.compat.v1.train optimizer belongs to the estimator engine")


def strategy_settings(job: Job, plan: "Plan", *, use_tpu: bool) -> dict:
    """Keywords of `standalone.make_strategy` besides use_tpu and the resolver: the TPU's device assignment."""
    if not use_tpu:
        return {}
    from tpulaunch.plan.tpu_layout import strategy_layout

    layout = strategy_layout(job, plan)
    return {"computation_shape": list(layout.computation_shape), "num_replicas": layout.replicas}


def partition_settings(plan: "Plan", *, use_tpu: bool) -> dict:
    """`feature_dims` and `label_dims` of KerasTraining: the dims each tensor is split into over a replica's cores."""
    feed = plan.feed_partition if use_tpu and plan.cores_per_replica > 1 else None
    if feed is None:
        return {"feature_dims": None, "label_dims": None}
    return {"feature_dims": {n: (list(d) if d is not None else None) for n, d in feed.features.items()},
            "label_dims": {n: (list(d) if d is not None else None) for n, d in feed.labels.items()}}


def training_settings(job: Job, plan: "Plan", *, use_tpu: bool) -> dict:
    """Keywords of `standalone.KerasTraining` besides the builder, the strategy, the policy and the job's functions."""
    spec = job.model
    metrics = {k: list(v) for k, v in spec.metrics.items()} if isinstance(spec.metrics, dict) else list(spec.metrics)
    return {"loss": dict(spec.loss) if isinstance(spec.loss, dict) else spec.loss, "metrics": metrics,
            "labels": tensor_specs(job.data.labels), "features": tensor_specs(job.data.features),
            "model_dir": job.run.model_dir, "keep_checkpoint_max": job.run.keep_checkpoint_max,
            "save_checkpoints_steps": job.run.save_checkpoints_steps, **partition_settings(plan, use_tpu=use_tpu),
            "outputs": spec.outputs_by_label(job.data.labels), "given": list(spec.set_in_job())}
