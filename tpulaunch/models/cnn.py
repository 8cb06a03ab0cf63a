"""A small convolutional image classifier: the quickstart model that trains on a laptop CPU."""

from __future__ import annotations

from typing import Sequence

from tpulaunch.models.which_keras import keras as _keras


def build(num_classes: int = 10, input_shape: Sequence[int] = (32, 32, 3), filters: int = 32,
          dropout: float = 0.0):
    """Three conv/pool stages (filters, 2x, 4x), global average pooling and a dense classifier.

    Sized so that 300 steps at batch 64 on 32x32 images take about a minute on a CPU.

    Args:
        num_classes: number of classes; the model outputs one logit per class.
        input_shape: one image, (height, width, channels).
        filters: channels of the first stage; each later stage doubles them.
        dropout: dropout rate before the classifier (0 disables it).

    Returns:
        A functional Keras model (the engine's Keras: `which_keras.py`) mapping [B, *input_shape] images to float logits [B, num_classes].
    """
    if len(input_shape) != 3:
        raise ValueError(f"input_shape must be (height, width, channels), got {tuple(input_shape)}")
    if num_classes < 1:
        raise ValueError(f"num_classes must be at least 1, got {num_classes}")
    keras = _keras()
    inputs = keras.Input(shape=tuple(input_shape), name="image")
    x = inputs
    for stage in range(3):
        x = keras.layers.Conv2D(filters * 2 ** stage, 3, padding="same", activation="relu",
                                   name=f"conv{stage + 1}")(x)
        x = keras.layers.MaxPooling2D(2, padding="same", name=f"pool{stage + 1}")(x)
    x = keras.layers.GlobalAveragePooling2D(name="avg_pool")(x)
    if dropout:
        x = keras.layers.Dropout(dropout, name="dropout")(x)
    # float32 logits even under a mixed_bfloat16 policy: the loss needs full precision.
    logits = keras.layers.Dense(num_classes, dtype="float32", name="logits")(x)
    return keras.Model(inputs, logits, name="cnn")
