"""Which models the estimator engine's model_fn trains, as its builder returns them: tf.keras (Keras 2) models,
trained with the job's loss and optimizer alone. A Keras 3 model, one with its own train_step, test_step or
compute_loss, or one its builder compile()d is refused at model.builder with the engine that trains it (the keras
engine runs a model's own step as fit() does, and replaces a compile()'s loss, optimizer and metrics with the
job's). Passed to `engine/job_code.job_builder` as its `accept`."""

from __future__ import annotations

from tpulaunch.errors import TpuLaunchError


def accept_model(builder: str, model) -> None:
    """Refuse (a TpuLaunchError) a model the estimator engine's model_fn would not train as its author wrote it."""
    from tpulaunch.engine.portable import is_keras3, keras_of

    if is_keras3(keras_of(model)):
        raise _keras3_model(builder, model)
    _refuse_own_training(builder, model)
    _refuse_compiled(builder, model)


def _installed_version(package: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def _keras3_model(builder: str, model) -> TpuLaunchError:
    import tensorflow as tf

    versions = (f"keras {_installed_version('keras')}, tf-keras {_installed_version('tf_keras')}, "
                f"TensorFlow {tf.__version__}")
    return TpuLaunchError(
        f"model builder {builder!r} returned {type(model).__name__}, a Keras 3 model ({type(model).__module__}); this "
        f"engine trains tf.keras (Keras 2) models. Installed: {versions}",
        hint="train it on the keras engine (run.engine: keras, TensorFlow 2.16 or later), or in the builder's module "
             "`import tf_keras as keras` instead of `import keras`")


def _refuse_own_training(builder: str, model) -> None:
    from tpulaunch.engine.portable import own_fit_methods

    for method in own_fit_methods(model)[:1]:
        raise TpuLaunchError(
            f"model builder {builder!r} returned {type(model).__name__}, which overrides {method}: the estimator "
            f"engine trains with the job's loss and optimizer in its model_fn and would never call it",
            hint="train it on the keras engine (run.engine: keras, TensorFlow 2.16 or later), which runs a model's "
                 "own step as fit() does; or move that logic into the job (model.loss as an import path "
                 "'pkg.mod:fn(labels, outputs)', model.optimizer, model.metrics) and drop the override, or train "
                 "the model with your own program (`tpulaunch explain` prints the one tpulaunch runs, to start from)")


def _loss_name(loss) -> str:
    if isinstance(loss, str):
        return repr(loss)
    if isinstance(loss, (dict, list, tuple)):
        return "per output"
    return getattr(loss, "__name__", type(loss).__name__)


def _compile_settings(model) -> str:
    """What compile() left on the model: 'optimizer Adam, loss SparseCategoricalCrossentropy'."""
    found = []
    if getattr(model, "optimizer", None) is not None:
        found.append(f"optimizer {type(model.optimizer).__name__}")
    loss = getattr(model, "loss", None)
    if loss:
        found.append(f"loss {_loss_name(loss)}")
    return ", ".join(found) or "no optimizer or loss"


def _refuse_compiled(builder: str, model) -> None:
    from tpulaunch.engine.portable import compiled_with

    if compiled_with(model) is not None:
        raise TpuLaunchError(
            f"model builder {builder!r} returned {type(model).__name__} already compiled ({_compile_settings(model)}): "
            f"the estimator engine trains with the job's model.loss and model.optimizer in its model_fn, so "
            f"compile()'s would be ignored",
            hint="train it on the keras engine (run.engine: keras), which trains a compiled model; or remove "
                 "compile() from the builder (a loaded model: load_model(path, compile=False)) and put its loss "
                 "in model.loss and its optimizer in model.optimizer")
