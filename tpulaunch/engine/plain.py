"""The boundary to `portable.py` (the input pipeline, precision, heads and losses every engine runs): the
plain values it runs with, converted from a Job in one place, and its errors turned into TpuLaunchError.

Each engine's own plain.py adds its values; `tpulaunch explain` writes them all into the program, each
under the upper-case name of its keyword, commented with the job key in `SOURCES`. Pure Python:
TensorFlow is not imported here.
"""

from __future__ import annotations

import contextlib

from tpulaunch.errors import TpuLaunchError
from tpulaunch.job.schema import Job

# Plain progress lines on CPU/GPU when the job does not say; a TPU job uses iterations_per_loop.
DEFAULT_LOG_EVERY_STEPS = 100


def tensor_specs(group: dict) -> dict:
    """The job's tensor specs as standalone.py reads them: record key, stored form, shape, dtype."""
    return {name: {"key": spec.key or name, "stored_as": spec.stored_as, "shape": list(spec.shape),
                   "dtype": spec.dtype} for name, spec in group.items()}


def input_settings(job: Job) -> dict:
    """Keywords of `portable.make_dataset_fn`, besides the files, the mode and use_tpu."""
    data = job.data
    return {"features": tensor_specs(data.features), "labels": tensor_specs(data.labels),
            "compression": data.compression or "", "shuffle_buffer": data.shuffle_buffer, "cache": data.cache,
            "skip_corrupt": data.skip_corrupt, "features_as_dict": features_as_dict(job), "seed": job.run.seed}


def features_as_dict(job: Job) -> bool:
    """Whether tpulaunch's pipeline hands the features over as a dict by name whatever their count: to the
    job's own `model.model_fn`, which indexes them as TPUEstimator programs do (`features["image"]`).
    A builder's Keras model takes one declared feature as that tensor; a job's own input_fn decides for itself."""
    return bool(job.model.model_fn) and not job.data.input_fn


def optimizer_settings(job: Job) -> dict:
    """Keywords of `standalone.optimizer_factory`, besides the job's own constructor."""
    spec = job.model.optimizer
    return {"optimizer": spec.name, "learning_rate": spec.learning_rate, "optimizer_args": dict(spec.args)}


def log_every_steps(job: Job) -> int:
    if job.run.log_every_steps:
        return job.run.log_every_steps
    return job.tpu.iterations_per_loop if job.tpu else DEFAULT_LOG_EVERY_STEPS


# The job key each value above comes from.
SOURCES = {
    "features": ("data", "features"),
    "features_as_dict": ("model", "model_fn"),
    "labels": ("data", "labels"),
    "compression": ("data", "compression"),
    "shuffle_buffer": ("data", "shuffle_buffer"),
    "cache": ("data", "cache"),
    "skip_corrupt": ("data", "skip_corrupt"),
    "optimizer": ("model", "optimizer", "name"),
    "learning_rate": ("model", "optimizer", "learning_rate"),
    "optimizer_args": ("model", "optimizer", "args"),
    "log_every_steps": ("run", "log_every_steps"),
    "outputs": ("model", "outputs"),
    "loss": ("model", "loss"),
    "metrics": ("model", "metrics"),
    "model_dir": ("run", "model_dir"),
    "summary_steps": ("run", "log_every_steps"),
    "iterations_per_loop": ("tpu", "iterations_per_loop"),
    "save_checkpoints_steps": ("run", "save_checkpoints_steps"),
    "keep_checkpoint_max": ("run", "keep_checkpoint_max"),
    "seed": ("run", "seed"),
    "train_batch_size": ("train", "batch_size"),
    "eval_batch_size": ("eval", "batch_size"),
}


@contextlib.contextmanager
def spec_errors():
    """portable.SpecError (declared data or model settings that cannot work together) as a TpuLaunchError."""
    from tpulaunch.engine.portable import SpecError

    try:
        yield
    except SpecError as exc:
        raise TpuLaunchError(str(exc), hint=exc.hint) from None
