"""XLA's own answer for a keras engine job (on v6e, which only the keras engine runs): its model's step exported under current TensorFlow and compiled for the
TPU type by XLA's TPU compiler (the suite's own: the `compiler` fixture)."""

from __future__ import annotations

import os

import xla_plans


def test_plan_answers_with_xla_for_a_keras_engine_job_on_v6e(tmp_path, compiler):
    job = xla_plans.cnn_job(tmp_path, batch=64, tpu_type="v6e-8")  # TPUEstimator has no v6e runtime; Keras has
    with open(job) as f:
        text = f.read().replace("run: {model_dir: gs://my-bucket/run}",
                                "run: {model_dir: gs://my-bucket/run, engine: keras}")
    with open(job, "w") as f:
        f.write(text)
    memory = xla_plans.plan_json(job, dict(os.environ))
    xla = memory["xla_tpu"]
    assert memory["answered_by"] == "xla" and xla["topology"] == "v6e:2x2" and xla["fits"]
    assert xla["per_replica_batch"] == 8 and xla["temporaries"] > 0
    assert xla["usable_bytes"] == int(31.25 * 1024 ** 3)
