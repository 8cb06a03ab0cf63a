"""Model styles for benchmarks/xla_vs_estimate.py that tpulaunch.models does not have: a ResNet and a Transformer
encoder, as Keras builders (what a job's model.builder names)."""

from __future__ import annotations

from typing import Sequence

import tensorflow as tf


def resnet(input_shape: Sequence[int] = (224, 224, 3), num_classes: int = 1000) -> tf.keras.Model:
    """Keras Applications' ResNet-50, untrained."""
    return tf.keras.applications.ResNet50(weights=None, input_shape=tuple(input_shape), classes=num_classes)


def transformer(input_shape: Sequence[int] = (512, 256), layers: int = 4, heads: int = 8,
                num_classes: int = 10) -> tf.keras.Model:
    """A pre-norm Transformer encoder over [tokens, width] embeddings, mean-pooled into a classifier."""
    tokens, width = input_shape
    inputs = tf.keras.Input(shape=(tokens, width), name="tokens")
    x = inputs
    for i in range(layers):
        y = tf.keras.layers.LayerNormalization(name=f"ln{i}a")(x)
        y = tf.keras.layers.MultiHeadAttention(heads, width // heads, name=f"attn{i}")(y, y)
        x = x + y
        y = tf.keras.layers.LayerNormalization(name=f"ln{i}b")(x)
        y = tf.keras.layers.Dense(4 * width, activation="gelu", name=f"up{i}")(y)
        x = x + tf.keras.layers.Dense(width, name=f"down{i}")(y)
    x = tf.keras.layers.GlobalAveragePooling1D()(x)
    return tf.keras.Model(inputs, tf.keras.layers.Dense(num_classes, dtype="float32")(x))
