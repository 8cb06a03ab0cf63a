"""The small CNN job the estimator engine's `train` tests run (tests/estimator/run/): its model builders (`MODELS`,
written as train_models.py), its job file (`JOB`) and the records it reads (`write_records`)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np

from records import write_examples

MODELS = textwrap.dedent('''
    import os
    import time

    import tensorflow as tf

    def classifier(num_classes=2, input_shape=(8, 8, 1), **unused):
        image = tf.keras.Input(shape=tuple(input_shape), name="image")
        x = tf.keras.layers.Conv2D(4, 3, padding="same", activation="relu")(image)
        x = tf.keras.layers.GlobalAveragePooling2D()(x)
        return tf.keras.Model(image, tf.keras.layers.Dense(num_classes)(x))

    class EvalWitness(tf.keras.layers.Layer):
        """Identity. Outside training (evaluation) each batch pauses 50 ms: a long evaluation to interrupt."""

        def call(self, x, training=None):
            if training:
                return x

            def pause(value):
                time.sleep(0.05)
                return value

            return tf.ensure_shape(tf.numpy_function(pause, [x], x.dtype), x.shape)

    def witnessed_classifier(num_classes=2, input_shape=(8, 8, 1), **unused):
        image = tf.keras.Input(shape=tuple(input_shape), name="image")
        return tf.keras.Model(image, classifier(num_classes, input_shape)(EvalWitness()(image)))
''')

JOB = textwrap.dedent('''
    name: tiny-cnn
    model:
      builder: train_models:classifier
      params: {num_classes: 2, service_api_key: hunter2}
      optimizer: {name: adam, learning_rate: 0.05}
      metrics: [accuracy]
    data:
      train: data/train.tfrecord
      eval: data/eval.tfrecord
      features: {image: {shape: [8, 8, 1]}}
      labels: {label: {shape: [], dtype: int64}}
      shuffle_buffer: 32
    train: {batch_size: 8, steps: 6}
    eval: {batch_size: 8, steps: 2, every_steps: 3}
    run: {model_dir: runs/cnn, save_checkpoints_steps: 100, log_every_steps: 2, seed: 1}
''')


def write_records(path: Path, count: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    labels = [int(rng.integers(2)) for _ in range(count)]
    write_examples(path, [{"image": rng.normal(size=64).astype(np.float32) * 0.5 + (2 * label - 1), "label": label}
                          for label in labels])
