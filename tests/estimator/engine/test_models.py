"""Reference models: shapes, published sizes, anchors and targets, and that each one can learn."""

import math

import numpy as np
import pytest
import tensorflow as tf

from tpulaunch.models import cnn, retinanet, unet3d


# ------------------------------------------------------------------------------------------- cnn
def test_cnn_outputs_float32_logits_per_class():
    model = cnn.build(num_classes=4, input_shape=(16, 16, 1), filters=4, dropout=0.5)
    logits = model(np.zeros((3, 16, 16, 1), np.float32), training=False)
    assert (tuple(logits.shape), logits.dtype) == ((3, 4), tf.float32)


def test_cnn_learns_bright_versus_dark_images():
    tf.keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, size=64)
    images = (rng.uniform(0.0, 0.3, size=(64, 8, 8, 1)) + 0.7 * labels[:, None, None, None]).astype(np.float32)
    model = cnn.build(num_classes=2, input_shape=(8, 8, 1), filters=8)
    optimizer = tf.keras.optimizers.Adam(0.01)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    for _ in range(60):
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(images, training=True))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
    predictions = np.argmax(model(images, training=False).numpy(), axis=1)
    assert (predictions == labels).mean() == 1.0


# ---------------------------------------------------------------------------------------- unet3d
def _unet3d_parameter_count(num_classes, channels, base, depth):
    """Count by hand from the published architecture.

    conv(k, i, o) = k^3*i*o + o (weights + bias); batch norm = 4*o (gamma, beta, moving mean/var).
    Encoder level l (f = base*2^l): conv(3, in, f) + bn(f) + conv(3, f, 2f) + bn(2f), where `in` is
    the input channels at l=0 and the previous level's 2*base*2^(l-1) = f after.
    Decoder level l (skip s = 2*base*2^l, incoming c = 2s): transposed conv 2^3*c*c + c, then
    conv(3, c+s, s) + bn(s) + conv(3, s, s) + bn(s). Final conv(1, 2*base, num_classes).
    """
    def conv(k, i, o):
        return k ** 3 * i * o + o

    total = 0
    for level in range(depth):
        f = base * 2 ** level
        cin = channels if level == 0 else f
        total += conv(3, cin, f) + 4 * f + conv(3, f, 2 * f) + 4 * 2 * f
    for level in range(depth - 2, -1, -1):
        s = 2 * base * 2 ** level
        c = 2 * s
        total += 8 * c * c + c + conv(3, c + s, s) + 4 * s + conv(3, s, s) + 4 * s
    return total + conv(1, 2 * base, num_classes)


def test_unet3d_published_defaults_parameter_count_and_shapes():
    model = unet3d.build()
    assert model.count_params() == _unet3d_parameter_count(3, 1, 32, 4) == 19_078_467
    assert model.output_shape == (None, 128, 128, 128, 3)
    # 256^3 CT volumes (the partitioned published case) build symbolically with the same weights.
    big = unet3d.build(input_shape=(256, 256, 256, 1))
    assert (big.output_shape, big.count_params()) == ((None, 256, 256, 256, 3), 19_078_467)


def test_unet3d_forward_pass_per_voxel_logits():
    model = unet3d.build(num_classes=2, input_shape=(8, 8, 8, 2), base_filters=2, depth=3)
    logits = model(np.ones((1, 8, 8, 8, 2), np.float32), training=False)
    assert (tuple(logits.shape), logits.dtype) == ((1, 8, 8, 8, 2), tf.float32)
    assert model.count_params() == _unet3d_parameter_count(2, 2, 2, 3)


def test_unet3d_upsampling_without_weights_and_without_batch_norm():
    model = unet3d.build(num_classes=2, input_shape=(8, 8, 8, 1), base_filters=2, depth=2,
                         batch_norm=False, upsampling="upsampling")
    # Encoder: conv(1->2), conv(2->4), conv(4->4), conv(4->8); decoder: conv(8+4->4), conv(4->4); final 4->2.
    expected = sum(27 * i * o + o for i, o in [(1, 2), (2, 4), (4, 4), (4, 8), (12, 4), (4, 4)]) + 4 * 2 + 2
    assert (model.output_shape, model.count_params()) == ((None, 8, 8, 8, 2), expected)


@pytest.mark.parametrize("kwargs", [
    {"input_shape": (12, 16, 16, 1)},        # 12 is not a multiple of 2**3
    {"input_shape": (16, 16, 16)},           # no channel axis
    {"upsampling": "bilinear"},
    {"depth": 0},
])
def test_unet3d_rejects_unusable_configurations(kwargs):
    with pytest.raises(ValueError):
        unet3d.build(**kwargs)


# ------------------------------------------------------------------------------------- retinanet
@pytest.mark.parametrize("image_size, config, expected", [
    ((2560, 2560), {}, (320 ** 2 + 160 ** 2 + 80 ** 2 + 40 ** 2 + 20 ** 2) * 9),
    ((640, 640), {}, (80 ** 2 + 40 ** 2 + 20 ** 2 + 10 ** 2 + 5 ** 2) * 9),
    (1280, {}, (160 ** 2 + 80 ** 2 + 40 ** 2 + 20 ** 2 + 10 ** 2) * 9),
    ((512, 768), {}, (64 * 96 + 32 * 48 + 16 * 24 + 8 * 12 + 4 * 6) * 9),
    (256, {"max_level": 5, "num_scales": 1, "aspect_ratios": (1.0,)}, 32 ** 2 + 16 ** 2 + 8 ** 2),
])
def test_anchor_count(image_size, config, expected):
    assert retinanet.anchor_count(image_size, **config) == expected
    assert retinanet.anchor_boxes(image_size, **config).shape == (expected, 4)


def test_anchor_count_of_the_published_2560_job():
    assert retinanet.anchor_count((2560, 2560)) == 1_227_600


def test_anchor_count_rejects_sizes_the_pyramid_cannot_tile():
    with pytest.raises(ValueError, match="multiple of 2\\*\\*max_level = 128"):
        retinanet.anchor_count((640, 600))


def test_encode_targets_marks_the_anchors_a_box_overlaps():
    # One anchor per cell (32x32 on level 3, 64x64 on level 4) on a 64x64 image: 8*8 + 4*4 anchors.
    config = {"min_level": 3, "max_level": 4, "num_scales": 1, "aspect_ratios": (1.0,)}
    # Exactly the level-3 anchor of cell (row 2, col 3): centre (20, 28), side 32.
    box = np.array([[4.0, 12.0, 36.0, 44.0]])
    cls_targets, box_targets = retinanet.encode_targets(box, np.array([7]), (64, 64), **config)
    # Cells one step away along a row or column overlap 24*32 / (2*1024 - 768) = 0.6 (positive);
    # diagonal neighbours 24*24 / (2048 - 576) = 0.39 (background); level-4 anchors at most 0.25.
    expected = np.zeros(80, np.int32)
    expected[[2 * 8 + 3, 1 * 8 + 3, 3 * 8 + 3, 2 * 8 + 2, 2 * 8 + 4]] = 7
    np.testing.assert_array_equal(cls_targets, expected)
    assert cls_targets.dtype == np.int32 and box_targets.dtype == np.float32
    np.testing.assert_array_equal(box_targets[19], [0.0, 0.0, 0.0, 0.0])
    # One cell below: the box centre is one quarter of the anchor height above the anchor centre.
    np.testing.assert_allclose(box_targets[27], [-0.25, 0.0, 0.0, 0.0])
    assert not box_targets[expected == 0].any()


def test_encode_targets_ignores_the_band_between_thresholds():
    config = {"min_level": 3, "max_level": 4, "num_scales": 1, "aspect_ratios": (1.0,)}
    # 4 px right of the cell (2, 3) anchor, so halfway between cells (2, 3) and (2, 4): IoU with
    # both 28*32 / (2048 - 896) = 0.78 (positive); with cells (2, 2) and (2, 5) 20*32 / (2048 - 640)
    # = 0.45, and with the four above and below them 24*28 / (2048 - 672) = 0.49 (both ignored).
    box = np.array([[4.0, 16.0, 36.0, 48.0]])
    cls_targets, _ = retinanet.encode_targets(box, np.array([1]), 64, **config)
    assert sorted(np.flatnonzero(cls_targets == 1).tolist()) == [2 * 8 + 3, 2 * 8 + 4]
    assert sorted(np.flatnonzero(cls_targets == -1).tolist()) == [11, 12, 18, 21, 27, 28]
    assert (cls_targets == 0).sum() == 80 - 8


def test_encode_targets_decodes_back_to_the_boxes():
    boxes = np.array([[100.0, 50.0, 300.0, 200.0], [10.0, 400.0, 60.0, 500.0]])
    classes = np.array([3, 90])
    cls_targets, box_targets = retinanet.encode_targets(boxes, classes, (640, 640))
    anchors = retinanet.anchor_boxes((640, 640))
    assert cls_targets.shape == (76725,) and box_targets.shape == (76725, 4)
    for box, cls in zip(boxes, classes):
        positive = cls_targets == cls
        assert positive.sum() >= 1
        decoded = retinanet.decode_boxes(box_targets[positive], anchors[positive])
        np.testing.assert_allclose(decoded, np.repeat(box[None], positive.sum(), axis=0), atol=1e-3)


def test_encode_targets_gives_a_tiny_box_its_best_anchor():
    # 4x4 pixels overlaps every anchor below 0.4, yet still claims its best anchor.
    cls_targets, _ = retinanet.encode_targets(np.array([[20.0, 20.0, 24.0, 24.0]]), np.array([5]), 256)
    assert (cls_targets == 5).sum() == 1 and (cls_targets == -1).sum() == 0


def test_encode_targets_without_boxes_is_all_background():
    cls_targets, box_targets = retinanet.encode_targets(np.zeros((0, 4)), np.zeros((0,), int), 128)
    assert (cls_targets.tolist(), box_targets.any()) == ([0] * retinanet.anchor_count(128), False)


def test_retinanet_loss_by_hand():
    # Two classes, three anchors: positive (class 1), background, ignored; all logits 0 (p = 0.5).
    labels = {"cls_targets": np.array([[1, 0, -1]], np.int32),
              "box_targets": np.array([[[0.05, 1.0, 0.0, 0.0], [0, 0, 0, 0], [0, 0, 0, 0]]], np.float32)}
    outputs = {"cls_logits": tf.zeros((1, 3, 2)), "box_regression": tf.zeros((1, 3, 4))}
    focal_unit = 0.5 ** 1.5 * math.log(2.0)
    normalizer = 1 + 1.0
    cls_loss = (0.25 * focal_unit + 0.75 * focal_unit + 2 * 0.75 * focal_unit) / normalizer
    box_loss = (0.5 * 0.05 ** 2 + (0.1 * 1.0 - 0.5 * 0.1 ** 2)) / (normalizer * 4)
    assert float(retinanet.loss(labels, outputs)) == pytest.approx(cls_loss + 50 * box_loss, rel=1e-5)


@pytest.fixture(scope="module")
def tiny_retinanet():
    tf.keras.utils.set_random_seed(0)
    return retinanet.build(num_classes=3, input_shape=(128, 128, 3), resnet_depth=18, fpn_features=16, head_convs=1)


def test_retinanet_outputs_match_anchor_count(tiny_retinanet):
    outputs = tiny_retinanet(np.zeros((2, 128, 128, 3), np.float32), training=False)
    anchors = retinanet.anchor_count((128, 128))
    assert {k: (tuple(v.shape), v.dtype) for k, v in outputs.items()} == {
        "cls_logits": ((2, anchors, 3), tf.float32), "box_regression": ((2, anchors, 4), tf.float32)}


def test_retinanet_published_defaults_build():
    model = retinanet.build()
    assert {k: tuple(v.shape) for k, v in model.output.items()} == {
        "cls_logits": (None, 76725, 90), "box_regression": (None, 76725, 4)}
    assert model.count_params() == 38_270_222


def test_retinanet_rejects_unknown_backbone_depth():
    with pytest.raises(ValueError, match="resnet_depth"):
        retinanet.build(input_shape=(128, 128, 3), resnet_depth=42)


def test_retinanet_loss_falls_with_training(tiny_retinanet):
    rng = np.random.default_rng(0)
    images = rng.normal(size=(2, 128, 128, 3)).astype(np.float32)
    targets = [retinanet.encode_targets(np.array([[16.0, 16.0, 80.0, 64.0]]), np.array([2]), 128),
               retinanet.encode_targets(np.array([[40.0, 30.0, 120.0, 120.0]]), np.array([1]), 128)]
    labels = {"cls_targets": np.stack([t[0] for t in targets]), "box_targets": np.stack([t[1] for t in targets])}
    optimizer = tf.keras.optimizers.SGD(0.01, momentum=0.9)
    losses = []
    for _ in range(6):
        with tf.GradientTape() as tape:
            loss = retinanet.loss(labels, tiny_retinanet(images, training=True))
        variables = tiny_retinanet.trainable_variables
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        losses.append(float(loss))
    assert all(math.isfinite(value) for value in losses)
    assert losses[-1] < 0.8 * losses[0], losses
