"""A builder that loads its weights from a file (Keras's `model.load_weights`), the weights files it loads, its
records and its job file (`write_project`), and the variables its checkpoints hold (`values`, `MODEL_VARIABLES`):
what the estimator suite's weight-loading and warm-start tests train and explain."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import tensorflow as tf


MODELS = textwrap.dedent('''
    import numpy as np
    import tensorflow as tf


    def classifier(input_shape=(8, 8, 1), weights=None):
        image = tf.keras.Input(shape=tuple(input_shape), name="image")
        x = tf.keras.layers.Conv2D(4, 3, padding="same", activation="relu")(image)
        x = tf.keras.layers.BatchNormalization()(x)
        x = tf.keras.layers.GlobalAveragePooling2D()(x)
        model = tf.keras.Model(image, tf.keras.layers.Dense(2)(x))
        if weights:
            model.load_weights(weights)
        return model


    def save_constant_weights(path, value):
        model = classifier()
        model.set_weights([np.full(w.shape, value, np.float32) for w in model.get_weights()])
        model.save_weights(path)


    def pretrained(input_shape=(8, 8, 1)):
        """Fetches its weights file the way Keras Applications do (weights='imagenet')."""
        model = classifier(input_shape)
        model.load_weights(tf.keras.utils.get_file("classifier.h5", "https://weights.invalid/classifier.h5"))
        return model
''')

JOB = textwrap.dedent('''
    name: weights
    model:
      builder: weight_models:classifier
      params: {weights: WEIGHTS}
      optimizer: {name: sgd, learning_rate: 1.0e-12}
    data:
      train: train.tfrecord
      features: {image: {shape: [8, 8, 1]}}
      labels: {label: {shape: [], dtype: int64}}
      shuffle_buffer: 8
    train: {batch_size: 8, steps: 1}
    run: {model_dir: runs/loaded}
''')


def write_project(root: Path) -> Path:
    """The weight-loading builder, the weights files it loads, its records and its job file in `root`."""
    (root / "weight_models.py").write_text(MODELS)
    namespace: dict = {}
    exec(MODELS, namespace)  # the same builder writes the weights files the jobs load
    namespace["save_constant_weights"](str(root / "kernels-0.0123.h5"), 0.0123)
    namespace["save_constant_weights"](str(root / "kernels-0.5.h5"), 0.5)
    rng = np.random.default_rng(0)
    with tf.io.TFRecordWriter(str(root / "train.tfrecord")) as writer:
        for _ in range(32):
            label = int(rng.integers(2))
            writer.write(tf.train.Example(features=tf.train.Features(feature={
                "image": tf.train.Feature(float_list=tf.train.FloatList(value=(rng.normal(size=64) + label).tolist())),
                "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
            })).SerializeToString())
    (root / "job.yaml").write_text(JOB.replace("WEIGHTS", str(root / "kernels-0.0123.h5")))
    return root


def values(model_dir: Path, step: int) -> dict:
    reader = tf.train.load_checkpoint(str(model_dir / f"model.ckpt-{step}"))
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()
            if not name.startswith(("global_step", "tpu"))}


MODEL_VARIABLES = ["batch_normalization/beta", "batch_normalization/gamma", "batch_normalization/moving_mean",
                   "batch_normalization/moving_variance", "conv2d/bias", "conv2d/kernel", "dense/bias", "dense/kernel"]
