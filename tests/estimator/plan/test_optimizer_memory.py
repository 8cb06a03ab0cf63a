"""plan's optimizer memory is counted from the slot variables the optimizer of the built step made, for a model_fn
job as for a builder: model.optimizer.name (default adam) says nothing of a model_fn's own optimizer. An optimizer
the step cannot be counted for is an assumption, and the plan says so."""

from __future__ import annotations

import textwrap

import pytest

from memory_cases import plan_memory
from tpulaunch.engine.core.step_tensors import StepTensors
from tpulaunch.job.schema import Job
from tpulaunch.plan import memory

MODEL_FNS = textwrap.dedent('''\
    import tensorflow as tf


    def _model_fn(make_optimizer):
        def model_fn(features, labels, mode, params):
            net = tf.keras.Sequential([tf.keras.layers.Conv2D(8, 3, padding="same", activation="relu"),
                                       tf.keras.layers.GlobalAveragePooling2D(), tf.keras.layers.Dense(10)])
            logits = net(features["image"], training=mode == tf.estimator.ModeKeys.TRAIN)
            loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True))
            optimizer = make_optimizer()
            if params["use_tpu"]:
                optimizer = tf.compat.v1.tpu.CrossShardOptimizer(optimizer)
            train_op = optimizer.minimize(loss, global_step=tf.compat.v1.train.get_or_create_global_step(),
                                          var_list=net.trainable_variables)
            return tf.compat.v1.estimator.tpu.TPUEstimatorSpec(mode, loss=loss, train_op=train_op)
        return model_fn


    momentum = _model_fn(lambda: tf.compat.v1.train.MomentumOptimizer(0.01, 0.9))  # RetinaNet's
    adam = _model_fn(lambda: tf.compat.v1.train.AdamOptimizer(1e-3))
    sgd = _model_fn(lambda: tf.compat.v1.train.GradientDescentOptimizer(0.01))
''')


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    root = tmp_path_factory.mktemp("model_fns")
    (root / "model_fns.py").write_text(MODEL_FNS)
    out = {}
    for name in ("momentum", "adam", "sgd"):
        job = Job.model_validate({  # no model.optimizer: its default (adam) is not what the model_fn uses
            "name": name, "model": {"model_fn": f"model_fns:{name}"},
            "data": {"features": {"image": {"shape": [32, 32, 3]}}, "labels": {"label": {"shape": [], "dtype": "int64"}}},
            "tpu": {"type": "v3-8"}, "train": {"batch_size": 64, "steps": 10}, "run": {"model_dir": "gs://bucket/run"},
        }).located_at(str(root))
        out[name] = plan_memory(job)
    return out


def test_a_model_fn_jobs_optimizer_memory_is_its_optimizers_slots(plans):
    trainable = 3 * 3 * 3 * 8 + 8 + 8 * 10 + 10
    for name, slots in (("momentum", 1), ("adam", 2), ("sgd", 0)):
        plan = plans[name]
        assert plan.reason is None and plan.per_core_bytes, (name, plan.reason)
        assert plan.optimizer_source == memory.COUNTED, name
        assert plan.optimizer_slots == slots, (name, plan.optimizer_slots)
        assert plan.breakdown["optimizer"] == slots * trainable * 4, (name, plan.breakdown)
        assert plan.breakdown["gradients"] == trainable * 4, name


def test_an_optimizer_that_cannot_be_counted_is_said_to_be_assumed():
    job = Job.model_validate({"name": "x", "model": {"builder": "a.b:c", "optimizer": {"name": "momentum"}},
                              "data": {"features": {"image": {"shape": [4]}}}, "run": {"model_dir": "/tmp/x"}})
    optimizer, slots, source = memory.optimizer_memory(job, StepTensors((4,), 10, 10, ()))
    assert (optimizer, slots) == (40, 1) and source.startswith("assumed from model.optimizer.name 'momentum'")
    counted = memory.optimizer_memory(job, StepTensors((4,), 10, 10, (), optimizer_bytes=80))
    assert counted == (80, 2, memory.COUNTED)
