"""The offline partition, batch and slice rules, against TensorFlow's own host-side code where it exists."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tpulaunch.plan.partition import (Finding, check_batch, check_tensor_dims, layout_padding, piece_shapes,
                                 slice_layout, split_sizes)
from tpulaunch.tpu.types import UnknownTpuType, parse_tpu_type


@pytest.mark.parametrize("name, devices, chips, hosts, usable_gib", [
    ("v2-8", 8, 4, 1, 8.00),
    ("v3-8", 8, 4, 1, 15.48),
    ("v3-32", 32, 16, 4, 15.48),
    ("v3-64", 64, 32, 8, 15.48),
    ("v4-8", 4, 4, 1, 30.75),      # megacore: one TensorFlow device per chip
    ("v4-32", 16, 16, 4, 30.75),
    ("v5litepod-8", 8, 8, 1, 15.75),  # the number counts chips; 8 chips on one host
    ("v5litepod-16", 16, 16, 4, 15.75),
    ("v5p-8", 4, 4, 1, 95.74),     # megacore, like v4
    ("v6e-4", 4, 4, 1, 31.25),
])
def test_tpu_type_geometry(name, devices, chips, hosts, usable_gib):
    tpu = parse_tpu_type(name)
    assert (tpu.name, tpu.devices, tpu.chips, tpu.hosts) == (name, devices, chips, hosts)
    assert round(tpu.usable_bytes_per_device / 1024 ** 3, 2) == usable_gib


def test_tpu_type_aliases_and_case():
    assert parse_tpu_type("V5E-8").name == "v5litepod-8"
    assert parse_tpu_type(" v3-8 ").name == "v3-8"


@pytest.mark.parametrize("name, message, hint_part", [
    ("v3-6", "v3-6 does not exist", "8, 32, 64"),
    ("v9-8", "unknown TPU generation 'v9'", "v2, v3, v4"),
    ("tpu-v3", "'tpu-v3' is not an accelerator type name", "v3-8"),
    ("v5litepod-2", "v5litepod-2 does not exist", "chips"),
])
def test_unknown_tpu_types(name, message, hint_part):
    with pytest.raises(UnknownTpuType) as info:
        parse_tpu_type(name)
    assert str(info.value) == message
    assert hint_part in info.value.hint


def test_slice_layout_single_and_multi_host():
    one = slice_layout(8, 1, 1)
    assert (one.replicas, one.replicas_per_host, one.input_fn_calls) == (8, 8, 1)
    ct = slice_layout(32, 4, 16)  # replicas span two hosts: input_fn runs once per replica
    assert (ct.replicas, ct.replicas_per_host, ct.input_fn_calls, ct.input_fn_calls_per_host) == (2, 0, 2, 1)
    det = slice_layout(64, 8, 8)
    assert (det.replicas, det.replicas_per_host, det.input_fn_calls) == (8, 1, 8)


def test_slice_layout_refusals():
    [too_large] = slice_layout(8, 1, 16)
    assert too_large.code == "cores-per-replica-too-large"
    assert too_large.message == "one replica needs 16 cores but the slice has 8"
    [uneven] = slice_layout(4, 1, 8)
    assert uneven.code == "cores-per-replica-too-large"


def test_batch_divisibility_names_nearby_sizes():
    assert check_batch("train", 64, 8) == []
    assert check_batch("train", 6, 8) == [Finding(
        "error", "batch-not-divisible", "train batch size 6 must be divisible by the number of replicas 8",
        "use 8 (a multiple of 8); batch_size is global, over all replicas")]
    [finding] = check_batch("eval", 36, 32)
    assert finding.hint.startswith("use 32 or 64")


def test_tensor_dims_follow_tf_order():
    # product is checked before rank, as tpu_feed._check_input_partition_dims does
    [f] = check_tensor_dims("image", [4, 32, 32, 3], [1, 2, 2], 8)
    assert f.code == "partition-product-mismatch"
    [f] = check_tensor_dims("image", [4, 32, 32, 3], [1, 2, 2], 4)
    assert f.code == "partition-rank-mismatch"
    [f] = check_tensor_dims("image", [4, 32, 32, 3], [1, 0, 2, 1], 4)
    assert (f.code, f.index) == ("partition-dim-below-one", 1)


def test_product_one_means_core_zero_and_skips_rank():
    assert check_tensor_dims("label", [4], [1], 8) == []
    assert check_tensor_dims("label", [4, 10], [1], 8) == []  # any rank: TF checks nothing
    assert check_tensor_dims("label", [4, 10], [1, 1], 8) == []
    [f] = check_tensor_dims("label", [4, 10, 3], [1, 1], 8)  # numpy cannot broadcast (3,) against (2,)
    assert f.code == "partition-rank-mismatch"


def test_uneven_and_empty_pieces_are_warnings():
    assert check_tensor_dims("image", [2, 321, 320, 3], [1, 2, 2, 1], 4) == []  # 161/160: negligible padding
    [f] = check_tensor_dims("image", [2, 6, 8, 3], [1, 4, 1, 1], 4)
    assert (f.severity, f.code, f.index) == ("warning", "partition-empty-pieces", 1)
    assert "[2, 2, 2, 0]" in f.message and f.hint.startswith("split that axis at most 3 ways")
    [f] = check_tensor_dims("image", [2, 9, 8, 3], [1, 4, 1, 1], 4)  # 3,3,3,0
    assert f.code == "partition-empty-pieces"
    [f] = check_tensor_dims("image", [2, 10, 8, 3], [1, 4, 1, 1], 4)  # 3,3,3,1 padded to 3: 17% waste
    assert (f.code, f.severity) == ("partition-uneven", "warning")


def test_layout_padding_models_8_by_128_tiles():
    # the least-padded layout: a channel of 1 need not be the minor dim, so only thin tiles inflate
    assert layout_padding([4, 64, 64, 64, 1], 4) == (4 * 64 ** 3 * 4, 4 * 64 * 64 * 128 * 4)
    assert layout_padding([8, 256], 2) == (8 * 256 * 2, 8 * 256 * 2)
    assert layout_padding([3, 100], 4) == (1200, 8 * 128 * 4)
    assert layout_padding([2, 4, 4, 1], 4) == (128, 2 * 8 * 128 * 4)


# --- against TensorFlow's own host split (tpu_feed.partition_or_replicate_on_host), run eagerly on CPU

@pytest.fixture(scope="module")
def tf_split():
    import tensorflow as tf
    from tensorflow.python.tpu import tpu_feed

    def split(shape, dims):
        pieces = tpu_feed.partition_or_replicate_on_host(tf.zeros(shape, tf.int8), dims)
        return [tuple(p.shape.as_list()) for p in pieces]
    return split


@pytest.mark.parametrize("shape, dims", [
    ((5, 14), (2, 4)), ((2, 321, 222, 1), (1, 2, 1, 1)), ((6,), (4,)), ((3, 8), (4, 1)),
    ((2, 16, 16, 16, 1), (1, 4, 2, 2, 1)), ((1, 7, 9, 3), (1, 2, 4, 1)),
])
def test_piece_shapes_match_tensorflow(tf_split, shape, dims):
    assert piece_shapes(shape, dims) == tf_split(shape, dims)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 40), st.sampled_from([1, 2, 4, 8])), min_size=1, max_size=4))
def test_split_agrees_with_tensorflow_generated(tf_split, axes):
    shape = tuple(size for size, _ in axes)
    dims = tuple(ways for _, ways in axes)
    assert piece_shapes(shape, dims) == tf_split(shape, dims)
    for size, ways in axes:
        assert sum(split_sizes(size, ways)) == size and len(split_sizes(size, ways)) == ways
