"""The 3D UNet of Cloud TPU's published CT segmentation results (tensorflow/tpu models/official/unet3d).

Same layout as the reference `unet3d_base`: at encoder level `l` two 3x3x3 convolutions with
`base_filters * 2**l` and then twice that many channels, each followed by batch norm and ReLU,
2x2x2 max pooling between levels; the decoder up-samples (2x2x2 stride-2 transposed convolution
keeping the channel count), concatenates the encoder's second convolution of the same level, and
applies two 3x3x3 convolutions with that level's channel count; a 1x1x1 convolution gives the logits.
"""

from __future__ import annotations

from typing import Sequence

from tpulaunch.models.which_keras import keras as _keras

UPSAMPLING_MODES = ("transposed", "upsampling")


def _conv_block(x, filters: int, batch_norm: bool, name: str):
    """3x3x3 convolution (with bias, as in the reference), optional batch norm, ReLU."""
    keras = _keras()
    x = keras.layers.Conv3D(filters, 3, padding="same", name=f"{name}_conv")(x)
    if batch_norm:
        x = keras.layers.BatchNormalization(axis=-1, name=f"{name}_bn")(x)
    return keras.layers.ReLU(name=f"{name}_relu")(x)


def _upsample(x, mode: str, name: str):
    """Doubles every spatial dimension; the transposed convolution keeps the channel count."""
    keras = _keras()
    if mode == "transposed":
        return keras.layers.Conv3DTranspose(x.shape[-1], 2, strides=2, name=name)(x)
    return keras.layers.UpSampling3D(2, name=name)(x)


def build(num_classes: int = 3, input_shape: Sequence[int] = (128, 128, 128, 1), base_filters: int = 32,
          depth: int = 4, batch_norm: bool = True, upsampling: str = "transposed"):
    """Builds the 3D UNet.

    Args:
        num_classes: labels per voxel; the model outputs one logit per class and voxel.
        input_shape: one volume, (depth, height, width, channels); each spatial size must be
            divisible by 2**(depth - 1).
        base_filters: channels of the first convolution; every level doubles them.
        depth: number of resolution levels (depth - 1 poolings).
        batch_norm: batch normalization after every 3x3x3 convolution.
        upsampling: "transposed" (learned, the published configuration) or "upsampling"
            (nearest-neighbour repeat, no weights, less memory).

    Returns:
        A functional Keras model (the engine's Keras: `which_keras.py`) mapping [B, D, H, W, C] volumes to float32 logits
        [B, D, H, W, num_classes].

    Raises:
        ValueError: on a malformed input shape, depth or upsampling mode.
    """
    input_shape = tuple(input_shape)
    if len(input_shape) != 4:
        raise ValueError(f"input_shape must be (depth, height, width, channels), got {input_shape}")
    if num_classes < 1:
        raise ValueError(f"num_classes must be at least 1, got {num_classes}")
    if depth < 1:
        raise ValueError(f"depth must be at least 1, got {depth}")
    if upsampling not in UPSAMPLING_MODES:
        raise ValueError(f"upsampling must be one of {UPSAMPLING_MODES}, got {upsampling!r}")
    factor = 2 ** (depth - 1)
    if any(size % factor for size in input_shape[:3]):
        raise ValueError(f"spatial sizes {input_shape[:3]} must be divisible by 2**(depth-1) = {factor}")

    keras = _keras()
    inputs = keras.Input(shape=input_shape, name="volume")
    skips = []
    x = inputs
    for level in range(depth):
        filters = base_filters * 2 ** level
        x = _conv_block(x, filters, batch_norm, f"down{level}_a")
        x = _conv_block(x, filters * 2, batch_norm, f"down{level}_b")
        if level < depth - 1:
            skips.append(x)
            x = keras.layers.MaxPool3D(2, strides=2, padding="valid", name=f"pool{level}")(x)

    for level in range(depth - 2, -1, -1):
        skip = skips[level]
        x = _upsample(x, upsampling, f"up{level}")
        x = keras.layers.Concatenate(axis=-1, name=f"concat{level}")([x, skip])
        x = _conv_block(x, skip.shape[-1], batch_norm, f"up{level}_a")
        x = _conv_block(x, skip.shape[-1], batch_norm, f"up{level}_b")

    # float32 logits even under a mixed_bfloat16 policy: the loss needs full precision.
    logits = keras.layers.Conv3D(num_classes, 1, padding="valid", dtype="float32", name="logits")(x)
    return keras.Model(inputs, logits, name="unet3d")
