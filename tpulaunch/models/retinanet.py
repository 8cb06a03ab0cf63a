"""RetinaNet (ResNet backbone + FPN + class and box heads), its anchors, target encoding and loss.

Follows the published Cloud TPU RetinaNet (tensorflow/tpu models/official/retinanet, after Lin et
al., "Focal Loss for Dense Object Detection"): anchors of `anchor_scale * 2**level * 2**(octave /
num_scales)` pixels centred on each feature-map cell of levels `min_level..max_level`; boxes encoded
as (ty, tx, th, tw) relative to their anchor; sigmoid focal loss normalized by the number of positive
anchors plus a Huber box loss weighted 50.

Anchors are flattened level by level, then row by row, column by column, and finally over the
anchors of one cell (scale octaves outer, aspect ratios inner): the same order in which the network
outputs are reshaped, so `encode_targets` and the model agree anchor for anchor.

The anchor and target functions use numpy only (the data synthesizer calls them without TensorFlow);
the model is built with the engine's Keras (`which_keras.py`) and the loss with TensorFlow (its fused sigmoid
crossentropy keeps less for the backward pass than the same written out), each imported inside the functions that
use them; on the jax engine (Keras 3 on JAX), which traces the loss with JAX, the same loss in Keras 3's ops.
"""

from __future__ import annotations

import math
from typing import Sequence, Tuple, Union

import numpy as np

from tpulaunch.models.which_keras import keras as _keras

ImageSize = Union[int, Sequence[int]]

ANCHOR_SCALE = 4.0
POSITIVE_IOU = 0.5
NEGATIVE_IOU = 0.4
FOCAL_ALPHA = 0.25
FOCAL_GAMMA = 1.5
HUBER_DELTA = 0.1
BOX_LOSS_WEIGHT = 50.0
# Published prior: the class logits start at p = 0.01 so the many background anchors do not swamp
# the first steps.
PRIOR_PROBABILITY = 0.01

_RESNET_BLOCKS = {18: (2, 2, 2, 2), 34: (3, 4, 6, 3), 50: (3, 4, 6, 3), 101: (3, 4, 23, 3), 152: (3, 8, 36, 3)}
_BACKBONE_TOP_LEVEL = 5  # the backbone gives C2..C5; higher levels are strided convolutions


# ---------------------------------------------------------------------------------------- anchors
def _image_hw(image_size: ImageSize) -> Tuple[int, int]:
    if isinstance(image_size, (int, np.integer)):
        return int(image_size), int(image_size)
    height, width = (int(v) for v in tuple(image_size)[:2])
    return height, width


def _check_levels(image_size: ImageSize, min_level: int, max_level: int) -> Tuple[int, int]:
    """(height, width); raises ValueError when the pyramid cannot tile the image exactly."""
    if not 2 <= min_level <= min(max_level, _BACKBONE_TOP_LEVEL):
        raise ValueError(f"levels must satisfy 2 <= min_level <= 5 and min_level <= max_level, "
                         f"got min_level={min_level}, max_level={max_level}")
    height, width = _image_hw(image_size)
    stride = 2 ** max_level
    if height <= 0 or width <= 0 or height % stride or width % stride:
        raise ValueError(f"image size {height}x{width} must be a positive multiple of 2**max_level = {stride}")
    return height, width


def anchor_count(image_size: ImageSize, min_level: int = 3, max_level: int = 7, num_scales: int = 3,
                 aspect_ratios: Sequence[float] = (1.0, 2.0, 0.5)) -> int:
    """Number of anchors the model predicts for one image.

    Args:
        image_size: (height, width) in pixels, or one int for a square image; each side must be a
            multiple of 2**max_level.
        min_level: finest pyramid level (stride 2**min_level).
        max_level: coarsest pyramid level.
        num_scales: anchor sizes per octave.
        aspect_ratios: width/height ratios of the anchors.

    Returns:
        Sum over levels of (height / 2**level) * (width / 2**level) * num_scales * len(aspect_ratios).

    Raises:
        ValueError: levels out of range or an image size the pyramid cannot tile.
    """
    height, width = _check_levels(image_size, min_level, max_level)
    per_cell = num_scales * len(tuple(aspect_ratios))
    return sum((height >> level) * (width >> level) for level in range(min_level, max_level + 1)) * per_cell


def anchor_boxes(image_size: ImageSize, min_level: int = 3, max_level: int = 7, num_scales: int = 3,
                 aspect_ratios: Sequence[float] = (1.0, 2.0, 0.5), anchor_scale: float = ANCHOR_SCALE) -> np.ndarray:
    """All anchors, float32 [A, 4] as (ymin, xmin, ymax, xmax) pixels, in the model's output order.

    Args: as `anchor_count`, plus `anchor_scale`: anchor side over the level's stride (octave 0, ratio 1).
    """
    height, width = _check_levels(image_size, min_level, max_level)
    levels = []
    for level in range(min_level, max_level + 1):
        stride = 2 ** level
        # [K, 2] half sizes (y, x) of the anchors of one cell: octaves outer, aspect ratios inner.
        half = np.array([(anchor_scale * stride * 2 ** (octave / num_scales) / math.sqrt(ratio) / 2,
                          anchor_scale * stride * 2 ** (octave / num_scales) * math.sqrt(ratio) / 2)
                         for octave in range(num_scales) for ratio in aspect_ratios])
        cy, cx = np.meshgrid(np.arange(height // stride) * stride + stride / 2,
                             np.arange(width // stride) * stride + stride / 2, indexing="ij")
        centers = np.stack([cy.ravel(), cx.ravel()], axis=1)[:, None, :]  # [cells, 1, 2]
        boxes = np.concatenate([centers - half[None], centers + half[None]], axis=2)  # [cells, K, 4]
        levels.append(boxes.reshape(-1, 4))
    return np.concatenate(levels).astype(np.float32)


# ---------------------------------------------------------------------------------------- targets
def _iou_with(anchors: np.ndarray, box: np.ndarray) -> np.ndarray:
    """IoU of every anchor [A, 4] with one box [4]; O(A) memory so millions of anchors stay cheap."""
    inter_h = np.clip(np.minimum(anchors[:, 2], box[2]) - np.maximum(anchors[:, 0], box[0]), 0, None)
    inter_w = np.clip(np.minimum(anchors[:, 3], box[3]) - np.maximum(anchors[:, 1], box[1]), 0, None)
    inter = inter_h * inter_w
    area_a = (anchors[:, 2] - anchors[:, 0]) * (anchors[:, 3] - anchors[:, 1])
    area_b = (box[2] - box[0]) * (box[3] - box[1])
    return inter / np.maximum(area_a + area_b - inter, 1e-8)


def encode_boxes(boxes: np.ndarray, anchors: np.ndarray) -> np.ndarray:
    """(ty, tx, th, tw) of boxes relative to anchors (both [N, 4] ymin, xmin, ymax, xmax), unscaled."""
    ha, wa = anchors[:, 2] - anchors[:, 0], anchors[:, 3] - anchors[:, 1]
    ya, xa = anchors[:, 0] + ha / 2, anchors[:, 1] + wa / 2
    h, w = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
    y, x = boxes[:, 0] + h / 2, boxes[:, 1] + w / 2
    return np.stack([(y - ya) / ha, (x - xa) / wa, np.log(h / ha), np.log(w / wa)], axis=1).astype(np.float32)


def decode_boxes(codes: np.ndarray, anchors: np.ndarray) -> np.ndarray:
    """Inverse of `encode_boxes`: [N, 4] (ty, tx, th, tw) -> [N, 4] (ymin, xmin, ymax, xmax)."""
    ha, wa = anchors[:, 2] - anchors[:, 0], anchors[:, 3] - anchors[:, 1]
    ya, xa = anchors[:, 0] + ha / 2, anchors[:, 1] + wa / 2
    y, x = codes[:, 0] * ha + ya, codes[:, 1] * wa + xa
    h, w = np.exp(codes[:, 2]) * ha, np.exp(codes[:, 3]) * wa
    return np.stack([y - h / 2, x - w / 2, y + h / 2, x + w / 2], axis=1).astype(np.float32)


def encode_targets(boxes: np.ndarray, classes: np.ndarray, image_size: ImageSize, min_level: int = 3,
                   max_level: int = 7, num_scales: int = 3, aspect_ratios: Sequence[float] = (1.0, 2.0, 0.5),
                   anchor_scale: float = ANCHOR_SCALE) -> Tuple[np.ndarray, np.ndarray]:
    """Per-anchor training targets for one image.

    An anchor is positive (its box's class) when its best IoU with a ground-truth box is >= 0.5,
    background (0) below 0.4, ignored (-1) in between. As in the published labeler, every box also
    claims its best-overlapping anchor, so a box smaller than every anchor still trains something.

    Args:
        boxes: float [N, 4] (ymin, xmin, ymax, xmax) in pixels; N may be 0.
        classes: int [N], class ids 1..num_classes (0 is background).
        image_size: (height, width) or one int; see `anchor_count`.
        min_level, max_level, num_scales, aspect_ratios, anchor_scale: the anchor configuration.

    Returns:
        (cls_targets int32 [A], box_targets float32 [A, 4]); box targets are (ty, tx, th, tw)
        relative to the anchor on positives and 0 elsewhere.

    Raises:
        ValueError: mismatched boxes/classes, a class id below 1, or an empty box.
    """
    anchors = anchor_boxes(image_size, min_level, max_level, num_scales, aspect_ratios, anchor_scale)
    boxes = np.asarray(boxes, dtype=np.float32).reshape(-1, 4)
    classes = np.asarray(classes).reshape(-1)
    if len(classes) != len(boxes):
        raise ValueError(f"{len(boxes)} boxes but {len(classes)} classes")
    if len(classes) and classes.min() < 1:
        raise ValueError("class ids start at 1 (0 is background)")
    if np.any(boxes[:, 2] <= boxes[:, 0]) or np.any(boxes[:, 3] <= boxes[:, 1]):
        raise ValueError("every box needs ymax > ymin and xmax > xmin")

    best_iou = np.zeros(len(anchors), dtype=np.float32)
    best_box = np.zeros(len(anchors), dtype=np.int64)
    forced = []  # (anchor, box) pairs: each box's best anchor
    for index, box in enumerate(boxes):
        iou = _iou_with(anchors, box)
        better = iou > best_iou
        best_iou[better] = iou[better]
        best_box[better] = index
        best = int(np.argmax(iou))
        if iou[best] > 0:
            forced.append((best, index))

    # Between the thresholds: ignored; below: background; positives get their class below.
    cls_targets = np.where((best_iou >= NEGATIVE_IOU) & (best_iou < POSITIVE_IOU), -1, 0).astype(np.int32)
    positive = best_iou >= POSITIVE_IOU
    for anchor, index in forced:
        positive[anchor] = True
        best_box[anchor] = index
    box_targets = np.zeros((len(anchors), 4), dtype=np.float32)
    if len(boxes):
        cls_targets[positive] = classes[best_box[positive]]
        box_targets[positive] = encode_boxes(boxes[best_box[positive]], anchors[positive])
    return cls_targets, box_targets


# ------------------------------------------------------------------------------------------ model
def _conv_bn(x, filters: int, kernel: int, strides: int, name: str, relu: bool = True, zero_gamma: bool = False):
    """Bias-free convolution, batch norm, optional ReLU. Strided convolutions pad by the kernel only
    (independent of the input size), as the published ResNet does."""
    keras = _keras()

    padding = "same"
    if strides > 1:
        pad = kernel - 1
        if pad:
            x = keras.layers.ZeroPadding2D(((pad // 2, pad - pad // 2), (pad // 2, pad - pad // 2)),
                                              name=f"{name}_pad")(x)
        padding = "valid"
    x = keras.layers.Conv2D(filters, kernel, strides=strides, padding=padding, use_bias=False,
                               kernel_initializer="he_normal", name=f"{name}_conv")(x)
    x = keras.layers.BatchNormalization(momentum=0.997, epsilon=1e-4,
                                           gamma_initializer="zeros" if zero_gamma else "ones", name=f"{name}_bn")(x)
    return keras.layers.ReLU(name=f"{name}_relu")(x) if relu else x


def _residual_block(x, filters: int, strides: int, bottleneck: bool, name: str):
    keras = _keras()

    out_filters = filters * 4 if bottleneck else filters
    shortcut = x
    if strides > 1 or x.shape[-1] != out_filters:
        shortcut = _conv_bn(x, out_filters, 1, strides, f"{name}_proj", relu=False)
    if bottleneck:
        y = _conv_bn(x, filters, 1, 1, f"{name}_a")
        y = _conv_bn(y, filters, 3, strides, f"{name}_b")
        # Zero-initialised last gamma: each block starts as the identity, which trains more stably.
        y = _conv_bn(y, out_filters, 1, 1, f"{name}_c", relu=False, zero_gamma=True)
    else:
        y = _conv_bn(x, filters, 3, strides, f"{name}_a")
        y = _conv_bn(y, filters, 3, 1, f"{name}_b", relu=False, zero_gamma=True)
    y = keras.layers.Add(name=f"{name}_add")([y, shortcut])
    return keras.layers.ReLU(name=f"{name}_out")(y)


def _resnet(x, depth: int) -> dict:
    """ResNet v1 backbone; returns {level: feature} for C2..C5 (strides 4..32)."""
    keras = _keras()

    if depth not in _RESNET_BLOCKS:
        raise ValueError(f"resnet_depth must be one of {sorted(_RESNET_BLOCKS)}, got {depth}")
    bottleneck = depth >= 50
    x = _conv_bn(x, 64, 7, 2, "stem")
    x = keras.layers.MaxPool2D(3, strides=2, padding="same", name="stem_pool")(x)
    features = {}
    for stage, blocks in enumerate(_RESNET_BLOCKS[depth]):
        for block in range(blocks):
            strides = 2 if block == 0 and stage > 0 else 1
            x = _residual_block(x, 64 * 2 ** stage, strides, bottleneck, f"c{stage + 2}_block{block + 1}")
        features[stage + 2] = x
    return features


def _fpn(backbone: dict, min_level: int, max_level: int, features: int) -> dict:
    """Feature pyramid {level: [B, H/2**level, W/2**level, features]} for min_level..max_level."""
    layers = _keras().layers
    top = _BACKBONE_TOP_LEVEL
    lateral = {level: layers.Conv2D(features, 1, name=f"fpn_lateral{level}")(backbone[level])
               for level in range(min_level, top + 1)}
    merged = {top: lateral[top]}
    for level in range(top - 1, min_level - 1, -1):
        up = layers.UpSampling2D(2, interpolation="nearest", name=f"fpn_up{level}")(merged[level + 1])
        merged[level] = layers.Add(name=f"fpn_merge{level}")([lateral[level], up])
    pyramid = {level: layers.Conv2D(features, 3, padding="same", name=f"fpn_out{level}")(merged[level])
               for level in range(min_level, top + 1)}
    x = backbone[top]
    for level in range(top + 1, max_level + 1):
        if level > top + 1:
            x = layers.ReLU(name=f"fpn_relu{level}")(x)
        x = layers.Conv2D(features, 3, strides=2, padding="same", name=f"fpn_out{level}")(x)
        pyramid[level] = x
    return {level: pyramid[level] for level in range(min_level, max_level + 1)}


def _head(pyramid: dict, outputs_per_anchor: int, anchors_per_cell: int, features: int, convs: int,
          name: str, bias_init: float):
    """Convolutions shared across levels (batch norm per level), then [B, A, outputs_per_anchor]."""
    keras = _keras()
    layers = keras.layers

    def init():
        return keras.initializers.RandomNormal(stddev=0.01)

    shared = [layers.Conv2D(features, 3, padding="same", kernel_initializer=init(), name=f"{name}_conv{i}")
              for i in range(convs)]
    predict = layers.Conv2D(outputs_per_anchor * anchors_per_cell, 3, padding="same", kernel_initializer=init(),
                            bias_initializer=keras.initializers.Constant(bias_init), name=f"{name}_predict")
    per_level = []
    for level, x in pyramid.items():
        for i, conv in enumerate(shared):
            x = conv(x)
            x = layers.BatchNormalization(momentum=0.997, epsilon=1e-4, name=f"{name}_bn{i}_level{level}")(x)
            x = layers.ReLU(name=f"{name}_relu{i}_level{level}")(x)
        x = predict(x)
        per_level.append(layers.Reshape((-1, outputs_per_anchor), name=f"{name}_flat{level}")(x))
    x = layers.Concatenate(axis=1, name=f"{name}_concat")(per_level) if len(per_level) > 1 else per_level[0]
    # float32 outputs even under a mixed_bfloat16 policy: the loss needs full precision.
    return layers.Activation("linear", dtype="float32", name=name)(x)


def build(num_classes: int = 90, input_shape: Sequence[int] = (640, 640, 3), min_level: int = 3,
          max_level: int = 7, num_scales: int = 3, aspect_ratios: Sequence[float] = (1.0, 2.0, 0.5),
          resnet_depth: int = 50, fpn_features: int = 256, head_convs: int = 4):
    """Builds RetinaNet (random initial weights; nothing is downloaded).

    Args:
        num_classes: object classes (background is not a class: sigmoid outputs per class).
        input_shape: one image, (height, width, channels); height and width must be multiples
            of 2**max_level.
        min_level, max_level: pyramid levels with anchors (3..7 as published).
        num_scales, aspect_ratios: anchors per cell = num_scales * len(aspect_ratios).
        resnet_depth: 18, 34, 50, 101 or 152.
        fpn_features: channels of the pyramid and the heads.
        head_convs: 3x3 convolutions in each head before its prediction layer.

    Returns:
        A functional Keras model mapping [B, H, W, C] images to
        {"cls_logits": float32 [B, A, num_classes], "box_regression": float32 [B, A, 4]},
        A = anchor_count((H, W), ...), anchors in `anchor_boxes` order.

    Raises:
        ValueError: an input shape or level configuration the pyramid cannot tile.
    """
    keras = _keras()

    input_shape = tuple(input_shape)
    if len(input_shape) != 3:
        raise ValueError(f"input_shape must be (height, width, channels), got {input_shape}")
    if num_classes < 1:
        raise ValueError(f"num_classes must be at least 1, got {num_classes}")
    _check_levels(input_shape[:2], min_level, max_level)
    anchors_per_cell = num_scales * len(tuple(aspect_ratios))

    inputs = keras.Input(shape=input_shape, name="image")
    pyramid = _fpn(_resnet(inputs, resnet_depth), min_level, max_level, fpn_features)
    prior = -math.log((1 - PRIOR_PROBABILITY) / PRIOR_PROBABILITY)
    cls_logits = _head(pyramid, num_classes, anchors_per_cell, fpn_features, head_convs, "cls_logits", prior)
    box_regression = _head(pyramid, 4, anchors_per_cell, fpn_features, head_convs, "box_regression", 0.0)
    return keras.Model(inputs, {"cls_logits": cls_logits, "box_regression": box_regression}, name="retinanet")


# ------------------------------------------------------------------------------------------- loss
def loss(labels: dict, outputs: dict):
    """Published RetinaNet loss: focal loss + 50 * Huber box loss, both over the positive count.

    Args:
        labels: {"cls_targets": int [B, A] (-1 ignore, 0 background, 1..C class),
                 "box_targets": float [B, A, 4]}.
        outputs: the model's {"cls_logits": [B, A, C], "box_regression": [B, A, 4]}.

    Returns:
        float32 scalar. The classification part is the sigmoid focal loss (alpha 0.25, gamma 1.5)
        summed over non-ignored anchors and classes; the box part is the Huber loss (delta 0.1)
        summed over positive anchors, divided by 4; both divided by (positives in the batch + 1).
    """
    from tpulaunch.models.which_keras import keras3

    if keras3():  # the jax engine: JAX traces the loss, so it is written in Keras 3's ops
        return _keras3_loss(labels, outputs)
    import tensorflow as tf  # TensorFlow's fused sigmoid crossentropy: the written-out form keeps more for backward

    cls_targets = tf.cast(labels["cls_targets"], tf.int32)
    box_targets = tf.cast(labels["box_targets"], tf.float32)
    logits = tf.cast(outputs["cls_logits"], tf.float32)
    box_outputs = tf.cast(outputs["box_regression"], tf.float32)
    num_classes = tf.shape(logits)[-1]

    positive = tf.cast(cls_targets > 0, tf.float32)  # [B, A]
    valid = tf.cast(cls_targets >= 0, tf.float32)
    normalizer = tf.reduce_sum(positive) + 1.0

    # Class k is one-hot column k-1; background and ignored rows are all zeros.
    onehot = tf.one_hot(cls_targets - 1, num_classes, dtype=tf.float32)
    cross_entropy = tf.nn.sigmoid_cross_entropy_with_logits(labels=onehot, logits=logits)
    probs = tf.sigmoid(logits)
    p_t = onehot * probs + (1.0 - onehot) * (1.0 - probs)
    alpha_t = onehot * FOCAL_ALPHA + (1.0 - onehot) * (1.0 - FOCAL_ALPHA)
    focal = alpha_t * tf.pow(1.0 - p_t, FOCAL_GAMMA) * cross_entropy
    cls_loss = tf.reduce_sum(focal * valid[..., None]) / normalizer

    error = tf.abs(box_outputs - box_targets)
    huber = tf.where(error <= HUBER_DELTA, 0.5 * tf.square(error), HUBER_DELTA * error - 0.5 * HUBER_DELTA ** 2)
    box_loss = tf.reduce_sum(huber * positive[..., None]) / (normalizer * 4.0)
    return cls_loss + BOX_LOSS_WEIGHT * box_loss


def _keras3_loss(labels: dict, outputs: dict):
    """`loss` in Keras 3's ops (any backend: the jax engine's JAX), term for term: the sigmoid crossentropy written
    out as TensorFlow's fused one computes it, max(x, 0) - x * z + log(1 + exp(-|x|))."""
    ops = _keras().ops

    cls_targets = ops.cast(labels["cls_targets"], "int32")
    box_targets = ops.cast(labels["box_targets"], "float32")
    logits = ops.cast(outputs["cls_logits"], "float32")
    box_outputs = ops.cast(outputs["box_regression"], "float32")
    num_classes = logits.shape[-1]

    positive = ops.cast(cls_targets > 0, "float32")  # [B, A]
    valid = ops.cast(cls_targets >= 0, "float32")
    normalizer = ops.sum(positive) + 1.0

    # Class k is one-hot column k-1; background (-1 after the shift) and ignored (-2) rows are all zeros.
    onehot = ops.cast(ops.expand_dims(cls_targets - 1, -1) == ops.arange(num_classes, dtype="int32"), "float32")
    cross_entropy = ops.relu(logits) - logits * onehot + ops.log1p(ops.exp(-ops.abs(logits)))
    probs = ops.sigmoid(logits)
    p_t = onehot * probs + (1.0 - onehot) * (1.0 - probs)
    alpha_t = onehot * FOCAL_ALPHA + (1.0 - onehot) * (1.0 - FOCAL_ALPHA)
    focal = alpha_t * ops.power(1.0 - p_t, FOCAL_GAMMA) * cross_entropy
    cls_loss = ops.sum(focal * ops.expand_dims(valid, -1)) / normalizer

    error = ops.abs(box_outputs - box_targets)
    huber = ops.where(error <= HUBER_DELTA, 0.5 * ops.square(error), HUBER_DELTA * error - 0.5 * HUBER_DELTA ** 2)
    box_loss = ops.sum(huber * ops.expand_dims(positive, -1)) / (normalizer * 4.0)
    return cls_loss + BOX_LOSS_WEIGHT * box_loss
