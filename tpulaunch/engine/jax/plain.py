"""The boundary to the jax engine's `standalone.py`: the plain values `JaxTraining` runs with, converted from a Job
in one place. `tpulaunch explain` writes the same values into the program. Pure Python: neither TensorFlow nor
Keras is imported here."""

from __future__ import annotations

from tpulaunch.engine.jax.rules import OPTIMIZERS
from tpulaunch.job.schema import Job


def training_settings(job: Job) -> dict:
    """Keywords of `standalone.JaxTraining`, besides the builder, its arguments and the job's own loss."""
    spec = job.model.optimizer
    name, defaults = OPTIMIZERS[spec.name]
    loss = job.model.loss
    loss = dict(loss) if isinstance(loss, dict) else loss if isinstance(loss, str) and ":" not in loss else None
    metrics = job.model.metrics or []
    metrics = {label: list(names) for label, names in metrics.items()} if isinstance(metrics, dict) else list(metrics)
    settings = {"optimizer": name, "learning_rate": spec.learning_rate,
                "optimizer_args": {**defaults, **dict(spec.args)}, "loss": loss, "metrics": metrics,
                "seed": job.run.seed, "model_dir": job.run.model_dir,
                "keep_checkpoint_max": job.run.keep_checkpoint_max, "example_shapes": example_shapes(job),
                "given": list(job.model.set_in_job())}
    if len(job.data.labels) > 1:  # several: each scored by its own output (one label: the model's one output)
        settings["label_names"] = list(job.data.labels)
    return settings


def example_shapes(job: Job) -> tuple:
    """`standalone.example_batch`'s arguments: the features' and the label's shapes and dtypes, as plain values
    (several labels: by name)."""
    labels = {name: (list(spec.shape), spec.dtype) for name, spec in job.data.labels.items()}
    return ({name: (list(spec.shape), spec.dtype) for name, spec in job.data.features.items()},
            next(iter(labels.values())) if len(labels) == 1 else labels)
