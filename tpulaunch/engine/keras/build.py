"""The model layer of `validate` for the keras engine: build what `train` builds, on this machine, and stop
before a step runs.

The job's KerasTraining under TensorFlow's default strategy (its builder in the strategy's scope, the
optimizer and its slots), then the training step and the evaluation's metrics traced on the
per-replica batch of the declared shapes: a loss that cannot score a label, a metric that does not
fit, an optimizer that refuses its arguments fail here as they would in `train`, located at the job
key their code comes from (`core/build_failures.py`). Nothing is read and nothing trains.
"""

from __future__ import annotations

import tempfile

from tpulaunch.engine.core.build_failures import ModeBuild, problems_of
from tpulaunch.engine.keras.locate import blame
from tpulaunch.engine.core.step_tensors import PROBE_BATCH, StepTensors, elements, kept_by_backward, state_bytes
from tpulaunch.errors import TpuLaunchError


def _training(job, plan, model_dir: str):
    from tpulaunch.engine.keras.runner import make_training

    return make_training(job, plan, use_tpu=False, search_path=job.search_path, model_dir=model_dir)


def _specs(job, batch: int):
    from tpulaunch.engine.keras.standalone import _tensor_specs
    from tpulaunch.engine.plain import tensor_specs

    features = _tensor_specs(tensor_specs(job.data.features), batch)
    labels = _tensor_specs(tensor_specs(job.data.labels), batch) if job.data.labels else None
    return features, labels


def build_modes(job, plan) -> list:
    """One ModeBuild per mode the job runs (train, eval), from one KerasTraining."""
    return _build(job, plan)[0]


def _build(job, plan) -> tuple:
    """(build_modes's list, whether the model is a Keras 3 one: None when it was not built)."""
    import tensorflow as tf

    modes = [m for m in ("train", "eval") if getattr(job, m, None) is not None]
    if not modes:
        return [], None
    stage = ("model", "builder")
    with tempfile.TemporaryDirectory() as scratch:
        try:
            training = _training(job, plan, scratch)
        except Exception as exc:  # noqa: BLE001 (the user's code, Keras or TensorFlow: the verdict)
            return [_failed(mode, exc, stage, job) for mode in modes], None
        out = []
        for mode in modes:
            batch = plan.batch(mode).per_replica
            try:
                features, labels = training.preprocessed_specs(*_specs(job, batch))
                if mode == "train":
                    tf.function(training.replica_train_step).get_concrete_function(features, labels)
                else:
                    training.make_eval_metrics(features)
                    tf.function(training.replica_eval_step).get_concrete_function(features, labels)
                out.append(ModeBuild(mode, True))
            except Exception as exc:  # noqa: BLE001
                out.append(_failed(mode, exc, stage, job))
        return out, training.keras3


def _failed(mode: str, exc: BaseException, stage: tuple, job) -> ModeBuild:
    key, message, hint = blame(exc, stage, job)
    return ModeBuild(mode, False, key, message, hint,
                     code=getattr(exc, "code", None) if isinstance(exc, TpuLaunchError) else None)


def build_problems(loaded, plan) -> list:
    """The failed builds as problems: one per job key and message, naming the steps that failed; and what a TPU
    target means for a Keras 3 model (keras3_tpu.py)."""
    from tpulaunch.engine.keras import keras3_tpu

    builds, keras3 = _build(loaded.job, plan)
    return problems_of(loaded, builds, "step") + keras3_tpu.problems(loaded, plan, bool(keras3))


def step_tensors(job, *, use_tpu: bool) -> StepTensors:
    """The keras engine's training step traced for PROBE_BATCH examples (the model's own train_step where it trains
    with it), what its backward pass reads, and the slot variables its optimizer made."""
    import tensorflow as tf

    from tpulaunch.plan.auto import main_feature
    from tpulaunch.plan.build import build_plan

    plan = build_plan(job, local=True)
    with tempfile.TemporaryDirectory() as scratch:
        training = _training(job, plan, scratch)
        features, labels = training.preprocessed_specs(*_specs(job, PROBE_BATCH))
        graph = tf.function(training.replica_train_step).get_concrete_function(features, labels).graph
        kept = kept_by_backward(graph)
        model = training.model
        params = sum(elements(v) for v in model.weights)
        trainable = sum(elements(v) for v in model.trainable_weights)
        variables = training.optimizer.variables
        optimizer = state_bytes(variables() if callable(variables) else variables)
    shape = tuple(job.data.features[main_feature(job.data.features)].shape)
    return StepTensors(shape, params, trainable, tuple(kept), optimizer)
