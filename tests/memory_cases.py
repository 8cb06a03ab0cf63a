"""The memory plans the suites compare (tests/estimator/plan/test_memory.py and the keras engine's memory tests):
`plan_memory` as `tpulaunch plan` computes it, the published configurations (`make_job`, `PUBLISHED`) and one small
network written every way (`NETWORKS`)."""

from __future__ import annotations

import textwrap

from tpulaunch.job.schema import Job
from tpulaunch.plan import memory
from tpulaunch.plan.build import build_plan
from tpulaunch.seam.registry import engine_for


def plan_memory(job):
    """The memory section `tpulaunch plan` shows: on the job's own Plan, built by its engine's step builder."""
    return memory.plan_memory(job, build_plan(job), engine_for(job).step_tensors)


def make_job(model: str, size: int, tpu_type: str = "v3-8", cores: int = 1, global_batch: int = 8,
             dims=None, optimizer: str = "momentum", precision: str = "bfloat16") -> Job:
    if model == "retinanet":
        from tpulaunch.models.retinanet import anchor_count

        builder, params, loss = "tpulaunch.models.retinanet:build", {"num_classes": 90}, "tpulaunch.models.retinanet:loss"
        features = {"image": {"shape": [size, size, 3], "dtype": "uint8", "encoding": "raw"}}
        anchors = anchor_count(size)
        labels = {"cls_targets": {"shape": [anchors], "dtype": "int32", "encoding": "raw"},
                  "box_targets": {"shape": [anchors, 4], "dtype": "float32", "encoding": "raw"}}
    else:
        builder, params, loss = "tpulaunch.models.unet3d:build", {"num_classes": 3}, "sparse_categorical_crossentropy"
        features = {"image": {"shape": [size, size, size, 1], "encoding": "raw"}}
        labels = {"mask": {"shape": [size, size, size], "dtype": "uint8", "encoding": "raw"}}
    job = {
        "name": f"{model}-{size}",
        "model": {"builder": builder, "params": params, "loss": loss, "optimizer": {"name": optimizer},
                  "precision": precision},
        "data": {"features": features, "labels": labels},
        "tpu": {"type": tpu_type, "cores_per_replica": cores},
        "train": {"batch_size": global_batch, "steps": 10},
        "run": {"model_dir": "gs://bucket/run"},
    }
    if dims is not None:
        job["partition"] = dims if dims == "auto" else {"features": {"image": dims}}
    return Job.model_validate(job)


# The published configurations (DESIGN.md "Memory model"), with the per-replica batch of the runs:
# name -> (job arguments, expected verdict, DESIGN's estimate in GiB or None where only the verdict is published)
PUBLISHED = {
    "retinanet-1280-x8-one-core": (("retinanet", 1280, "v3-8", 1, 64), "fits", 14.1),
    "retinanet-2560-x8-unpartitioned": (("retinanet", 2560, "v3-8", 1, 64), "does-not-fit", 55.0),
    "retinanet-2560-x8-8way": (("retinanet", 2560, "v3-64", 8, 64, [1, 4, 2, 1]), "fits", 7.4),
    "unet3d-128-x4-one-core": (("unet3d", 128, "v3-8", 1, 32), "fits", 13.9),
    "unet3d-256-x1-unpartitioned": (("unet3d", 256, "v3-8", 1, 8), "does-not-fit", 27.0),
    "unet3d-256-x1-16way": (("unet3d", 256, "v3-32", 16, 2, [1, 4, 2, 2, 1]), "fits", None),
}


NETWORKS = textwrap.dedent('''
    """One small conv net written the ways people write it: functional, Sequential without Input, subclassed,
    with a custom layer wrapping its convolutions, and as a hand-written TPUEstimator model_fn."""
    import tensorflow as tf

    def _layers():
        return [tf.keras.layers.Conv2D(16, 3, padding="same", activation="relu"), tf.keras.layers.MaxPool2D(),
                tf.keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
                tf.keras.layers.GlobalAveragePooling2D(), tf.keras.layers.Dense(10)]

    def functional(input_shape):
        inputs = tf.keras.Input(shape=tuple(input_shape))
        x = inputs
        for layer in _layers():
            x = layer(x)
        return tf.keras.Model(inputs, x)

    def sequential():
        return tf.keras.Sequential(_layers())

    class Net(tf.keras.Model):
        def __init__(self):
            super().__init__()
            self.stack = _layers()

        def call(self, x, training=False):
            for layer in self.stack:
                x = layer(x)
            return x

    def subclassed():
        return Net()

    class ConvBlock(tf.keras.layers.Layer):
        def __init__(self, filters, **kwargs):
            super().__init__(**kwargs)
            self.conv = tf.keras.layers.Conv2D(filters, 3, padding="same", activation="relu")

        def call(self, x):
            return self.conv(x)

    def custom_layer():
        return tf.keras.Sequential([ConvBlock(16), tf.keras.layers.MaxPool2D(), ConvBlock(32),
                                    tf.keras.layers.GlobalAveragePooling2D(), tf.keras.layers.Dense(10)])

    def model_fn(features, labels, mode, params):
        model = functional([64, 64, 3])
        logits = model(features["image"], training=mode == tf.estimator.ModeKeys.TRAIN)
        loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True))
        step = tf.compat.v1.train.get_or_create_global_step()
        train_op = tf.compat.v1.train.AdamOptimizer(1e-3).minimize(loss, global_step=step,
                                                                   var_list=model.trainable_variables)
        return tf.compat.v1.estimator.tpu.TPUEstimatorSpec(mode, loss=loss, train_op=train_op)
''')
