"""Users' own TPUEstimator programs the estimator suite runs under tpulaunch and explains: tensorflow/tpu's
mnist_tpu.py unmodified with its records and job file (`write_project`), and a probe program recording what
params TPUEstimator hands its model_fn and input_fn (`PROBE`, `PROBE_JOB`)."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import numpy as np
import tensorflow as tf

from paths import PROGRAMS


MNIST_TPU = PROGRAMS / "tensorflow_tpu" / "models" / "official" / "mnist" / "mnist_tpu.py"

JOB = textwrap.dedent('''
    name: mnist-tpu
    model:
      model_fn: mnist_tpu:model_fn
      params: {data_dir: DATA_DIR}
    data:
      input_fn: {train: mnist_tpu:train_input_fn, eval: mnist_tpu:eval_input_fn}
      features: {image: {shape: [28, 28, 1], dtype: float32}}
      labels: {label: {shape: [], dtype: int64}}
    train: {batch_size: 32, steps: 120}
    eval: {batch_size: 32, steps: 2}
    run: {model_dir: runs/mnist, save_checkpoints_steps: 60, log_every_steps: 60}
    flags: {learning_rate: 0.05, use_tpu: false}
''')


def write_digits(path: Path, count: int, seed: int) -> None:
    """MNIST records as the program reads them (image_raw: 784 pixel bytes, label: int64); the digit is where a bar is."""
    rng = np.random.default_rng(seed)
    with tf.io.TFRecordWriter(str(path)) as writer:
        for _ in range(count):
            label = int(rng.integers(10))
            image = rng.integers(0, 60, size=(28, 28))
            image[label * 2:label * 2 + 6, 4:24] = 255
            writer.write(tf.train.Example(features=tf.train.Features(feature={
                "image_raw": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image.astype(np.uint8).tobytes()])),
                "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
            })).SerializeToString())


def write_project(root: Path) -> Path:
    """tensorflow/tpu's mnist_tpu.py, its records (the file names it reads) and its job file in `root`."""
    shutil.copy(MNIST_TPU, root / "mnist_tpu.py")
    (root / "data").mkdir()
    write_digits(root / "data" / "train.tfrecords", 256, seed=1)
    write_digits(root / "data" / "validation.tfrecords", 64, seed=2)
    (root / "job.yaml").write_text(JOB.replace("DATA_DIR", str(root / "data")))
    return root


PROBE = textwrap.dedent('''
    """Records what params (and mode) TPUEstimator hands its model_fn and input_fn."""
    import json

    import tensorflow as tf


    def _record(params, who, mode):
        with open(params["record_to"], "a") as handle:
            handle.write(json.dumps({"who": who, "mode": str(mode), "keys": sorted(params),
                                     "batch_size": params.get("batch_size"), "use_tpu": params.get("use_tpu")}) + "\\n")


    def input_fn(params, mode):
        _record(params, "input_fn", mode)
        return tf.data.Dataset.from_tensors((tf.ones([4]), tf.constant(1))).repeat().batch(
            params["batch_size"], drop_remainder=True)


    def model_fn(features, labels, mode, params):
        _record(params, "model_fn", mode)
        logits = tf.matmul(features, tf.compat.v1.get_variable("w", [4, 2])) * params["scale"]
        spec = tf.compat.v1.estimator.tpu.TPUEstimatorSpec
        if mode == tf.estimator.ModeKeys.PREDICT:
            return spec(mode, predictions={"logits": logits})
        loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
        if mode == tf.estimator.ModeKeys.EVAL:
            return spec(mode, loss=loss)
        step = tf.compat.v1.train.get_global_step()
        return spec(mode, loss=loss, train_op=tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, step))


    class Inputs:
        """An input_fn as a method of an object built with arguments (tensorflow/tpu's ImageNetInput has this form)."""

        def __init__(self, is_training, size=4):
            self.is_training, self.size = is_training, size

        def input_fn(self, params):
            _record(params, "input_fn", "train" if self.is_training else "eval")
            return tf.data.Dataset.from_tensors((tf.ones([self.size]), tf.constant(1))).repeat().batch(
                params["batch_size"], drop_remainder=True)


    def serving_input_receiver_fn():
        """Serving takes half the features and repeats them: not what data.features declares."""
        half = tf.compat.v1.placeholder(tf.float32, [None, 2], name="half")
        return tf.estimator.export.TensorServingInputReceiver(tf.concat([half, half], axis=1), {"half": half})
''')

PROBE_JOB = textwrap.dedent('''
    name: probe
    model:
      model_fn: probe:model_fn
      params: {record_to: RECORD, scale: 2.0}
    data:
      input_fn: probe:input_fn
      features: {x: {shape: [4]}}
      labels: {label: {shape: [], dtype: int32}}
    train: {batch_size: 8, steps: 2}
    eval: {batch_size: 4, steps: 1}
    run: {model_dir: runs/probe}
''')
