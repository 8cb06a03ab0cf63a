"""Keras 3 (`import keras`) model styles for the jax engine's rows of benchmarks/xla_vs_estimate.py: a CNN (the
quickstart's), a Transformer encoder and a UNet3D-style segmenter, as builders a job's model.builder names."""

from __future__ import annotations

from typing import Sequence

import keras


def cnn(input_shape: Sequence[int] = (32, 32, 3), num_classes: int = 10, filters: int = 32) -> keras.Model:
    """The quickstart CNN (tpulaunch.models.cnn) in Keras 3: three conv/pool stages, pooled, a dense classifier."""
    inputs = keras.Input(shape=tuple(input_shape), name="image")
    x = inputs
    for stage in range(3):
        x = keras.layers.Conv2D(filters * 2 ** stage, 3, padding="same", activation="relu")(x)
        x = keras.layers.MaxPooling2D(2, padding="same")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(num_classes)(x))


def transformer(input_shape: Sequence[int] = (512, 256), layers: int = 4, heads: int = 8,
                num_classes: int = 10) -> keras.Model:
    """A pre-norm Transformer encoder over [tokens, width] embeddings, mean-pooled into a classifier (as
    benchmarks/models/xla_styles.py's, in Keras 3)."""
    tokens, width = input_shape
    inputs = keras.Input(shape=(tokens, width), name="tokens")
    x = inputs
    for _ in range(layers):
        y = keras.layers.LayerNormalization()(x)
        y = keras.layers.MultiHeadAttention(heads, width // heads)(y, y)
        x = x + y
        y = keras.layers.LayerNormalization()(x)
        y = keras.layers.Dense(4 * width, activation="gelu")(y)
        x = x + keras.layers.Dense(width)(y)
    x = keras.layers.GlobalAveragePooling1D()(x)
    return keras.Model(inputs, keras.layers.Dense(num_classes)(x))


def unet3d(input_shape: Sequence[int] = (64, 64, 64, 1), num_classes: int = 3, filters: int = 16,
           depth: int = 3) -> keras.Model:
    """A UNet3D-style segmenter: per level two 3x3x3 convolutions with batch norm and ReLU, max-pooled down,
    transposed convolutions up with skip connections, per-voxel logits."""
    def block(x, channels):
        for _ in range(2):
            x = keras.layers.Conv3D(channels, 3, padding="same", use_bias=False)(x)
            x = keras.layers.BatchNormalization()(x)
            x = keras.layers.ReLU()(x)
        return x

    inputs = keras.Input(shape=tuple(input_shape), name="image")
    x, skips = inputs, []
    for level in range(depth):
        x = block(x, filters * 2 ** level)
        skips.append(x)
        x = keras.layers.MaxPooling3D(2)(x)
    x = block(x, filters * 2 ** depth)
    for level in reversed(range(depth)):
        x = keras.layers.Conv3DTranspose(filters * 2 ** level, 2, strides=2)(x)
        x = block(keras.layers.Concatenate()([x, skips[level]]), filters * 2 ** level)
    return keras.Model(inputs, keras.layers.Conv3D(num_classes, 1)(x))
