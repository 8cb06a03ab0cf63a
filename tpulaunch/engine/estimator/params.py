"""The `params` dict a job's own model_fn and input_fns receive.

TPUEstimator hands one dict to model_fn and to every input_fn: a deep copy of the `params=` it was
built with, plus keys it sets itself (tpu_estimator.py `_call_model_fn`, `_call_input_fn`):

| key | model_fn | input_fn |
|---|---|---|
| `batch_size` | train/eval: the per-replica batch on a TPU, the global batch locally; absent in export | the batch one call must yield: per replica on a TPU (PER_HOST_V2), the global batch locally |
| `use_tpu` | True on a TPU, False locally and in export | absent |
| `context` | a `TPUContext` on a TPU only | a `TPUContext` on a TPU only |

On a `model.model_fn` job, `model.params` are the `params=`: each key reaches model_fn and the
input_fns as is; in the graphs that do not train (evaluation, export's serving graph) `eval.params` go over
them, key by key, as a TPUEstimator program makes its evaluation estimator with other params. A builder job's `model.params` are the builder's keyword arguments and stay out of
this dict. An input_fn also gets `mode` ("train", "eval", "predict") and `config` (the RunConfig)
when it names them, and model_fn `config` (TensorFlow's rule).

Pure Python: no TensorFlow.
"""

from __future__ import annotations

from typing import Optional

from tpulaunch.engine.estimator.about import ABOUT
from tpulaunch.job.schema import Job

SET_BY_TENSORFLOW = ABOUT.params_set_by_tensorflow


def estimator_params(job: Job) -> Optional[dict]:
    """TPUEstimator's `params=` for the job: `model.params` on a model_fn job, else None."""
    if job.model.model_fn:
        return dict(job.model.params)
    return None


# TensorFlow's mode names (tf.estimator.ModeKeys' values) of the graphs that do not train.
NOT_TRAINING = ("eval", "infer", "predict")


def mode_params(job: Job, mode) -> dict:
    """What goes over `model.params` in the graphs of `mode` ("train", "eval", "infer"): `eval.params` in those that
    do not train, else nothing."""
    if not job.model.model_fn or job.eval is None or str(mode) not in NOT_TRAINING:
        return {}
    return dict(job.eval.params)
