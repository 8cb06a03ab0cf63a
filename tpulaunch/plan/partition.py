"""TensorFlow 2.15's rules for spatial partitioning and batch arithmetic, offline and in pure Python.

Each function mirrors one check in TPUEstimator's sources (file:line in the installed
tensorflow_estimator 2.15.0 / tensorflow 2.15 given per function), reaching the same verdict before
any TPU exists. tests/estimator/checks/test_tf_agreement.py runs TensorFlow's own code on the same cases and fails
when the two disagree.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Optional, Sequence, Union

# tpu_config.py:215 (TPUConfig.__new__): the only values num_cores_per_replica may take.
VALID_CORES_PER_REPLICA = (1, 2, 4, 8, 16, 32, 64, 128)

# tpu_context.py `_NUM_CORES_TO_COMPUTATION_SHAPE`: the fixed core block one replica occupies.
COMPUTATION_SHAPES = {1: (1, 1, 1, 1), 2: (1, 1, 1, 2), 4: (1, 2, 1, 2), 8: (2, 2, 1, 2),
                      16: (4, 2, 1, 2), 32: (4, 4, 1, 2), 64: (8, 4, 1, 2), 128: (8, 8, 1, 2)}

# TPU memory tiles: the two minor dims of an array are padded to multiples of these.
TILE_SECOND_MINOR = 8
TILE_MINOR = 128

# An uneven split is legal; it is worth a warning when padding pieces to the largest wastes this much.
UNEVEN_WASTE_WARNING = 0.10


@dataclass(frozen=True)
class Finding:
    """One verdict of a rule, before it is given a place in the job file."""

    severity: str  # "error" or "warning"
    code: str
    message: str
    hint: Optional[str] = None
    index: Optional[int] = None  # which entry of the dims list it is about, when it is about one


@dataclass(frozen=True)
class SliceLayout:
    """How replicas sit on the slice (tpu_context.py:442-465, num_replicas and friends)."""

    devices: int
    hosts: int
    devices_per_host: int
    cores_per_replica: int
    replicas: int
    replicas_per_host: int  # can be 0 when one replica spans several hosts
    input_fn_calls_per_host: int  # PER_HOST_V2: once per host (its dataset is dequeued once per replica), or once per replica for multi-host replicas

    @property
    def input_fn_calls(self) -> int:
        if self.cores_per_replica > self.devices_per_host:
            return self.replicas
        return self.hosts


def slice_layout(devices: int, hosts: int, cores_per_replica: int) -> Union[SliceLayout, list]:
    """Replicas of `cores_per_replica` devices on a slice, or the findings that make it impossible.

    TF: tpu_context.py:442-465 (`num_replicas`), `num_of_replicas_per_host`, and for PER_HOST_V2 the
    per-replica input_fn calls of tpu_estimator.py:1084-1097.
    """
    if cores_per_replica > devices:
        return [Finding("error", "cores-per-replica-too-large",
                        f"one replica needs {cores_per_replica} cores but the slice has {devices}",
                        f"use a slice of at least {cores_per_replica} cores, or at most cores_per_replica: {_largest_valid(devices)}")]
    if devices % cores_per_replica:
        return [Finding("error", "cores-per-replica-does-not-divide",
                        f"{devices} cores do not divide into replicas of {cores_per_replica}",
                        f"use a cores_per_replica that divides {devices}")]
    devices_per_host = devices // hosts
    replicas = devices // cores_per_replica
    replicas_per_host = replicas // hosts
    # tpu_estimator.py generate_per_host_v2_enqueue_ops_fn_for_host: one input_fn call per host,
    # whose dataset is dequeued once for each replica on that host.
    calls_per_host = 1 if cores_per_replica <= devices_per_host else max(1, -(-replicas // hosts))
    return SliceLayout(devices, hosts, devices_per_host, cores_per_replica, replicas, replicas_per_host, calls_per_host)


def _largest_valid(devices: int) -> int:
    return max(c for c in VALID_CORES_PER_REPLICA if c <= devices)


def check_batch(kind: str, global_batch: int, replicas: int) -> list:
    """The global batch divides over the replicas (tpu_context.py `_validate_tpu_configuration`).

    TF divides by replicas, never by hosts, in every non-broadcast input mode.
    """
    if global_batch % replicas == 0:
        return []
    lower = (global_batch // replicas) * replicas
    upper = lower + replicas
    options = " or ".join(str(v) for v in (lower, upper) if v > 0)
    return [Finding("error", "batch-not-divisible",
                    f"{kind} batch size {global_batch} must be divisible by the number of replicas {replicas}",
                    f"use {options} (a multiple of {replicas}); batch_size is global, over all replicas")]


def shape_text(shape: Sequence[Optional[int]]) -> str:
    """[4, 128, ?, 3]: a shape as problems and tables print it (? for an unknown dim)."""
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def split_sizes(size: int, ways: int) -> list:
    """How TF splits one axis of `size` into `ways` pieces (tpu_feed.py:35-78, greedy ceil).

    >>> split_sizes(321, 2), split_sizes(6, 4)
    ([161, 160], [2, 2, 2, 0])
    """
    if ways <= 1:
        return [size]
    quotient, remainder = divmod(size, ways)
    if remainder == 0:
        return [quotient] * ways
    ceil = quotient + 1
    full, left_over = divmod(size, ceil)
    sizes = [ceil] * full + [left_over]
    return sizes + [0] * (ways - len(sizes))


def piece_shapes(shape: Sequence[int], dims: Sequence[int]) -> list:
    """The shape of the piece each logical core of a replica receives, in core order (row-major)."""
    per_axis = [split_sizes(size, ways) for size, ways in zip(shape, dims)]
    return [tuple(p) for p in itertools.product(*per_axis)]


def _product(values) -> int:
    return math.prod(int(v) for v in values)


def check_tensor_dims(name: str, shape: Sequence[Optional[int]], dims: Sequence[int], cores_per_replica: int,
                      cores_from: str = "tpu.cores_per_replica") -> list:
    """One tensor's partition dims against its shape (batch first) and the replica size (`cores_from`: where
    that number comes from, as the message names it).

    TF: tpu_feed.py `_check_input_partition_dims` (:905-941) in its order: dims >= 1, product == 1
    returns early (core 0 only), product == cores per replica, rank, fully defined shape; then the
    host split of `partition_or_replicate_on_host`, where uneven and zero-size pieces are legal.
    """
    dims = list(dims)
    rank = len(shape)
    shown = shape_text(shape)
    for i, d in enumerate(dims):
        if d < 1:
            return [Finding("error", "partition-dim-below-one", f"partition dim {d} for '{name}' is below 1",
                            "every dim is >= 1; 1 means that axis is not split", index=i)]
    product = _product(dims)
    if product == 1:
        # TF skips every other check and sends the tensor whole to core 0 of the replica. numpy still
        # has to broadcast the dims against the shape when the host splits it.
        if len(dims) not in (1, rank):
            return [Finding("error", "partition-rank-mismatch",
                            f"'{name}' has rank {rank} {shown} (batch first) but {len(dims)} partition dims are given",
                            f"give {rank} dims, or [1] to send it to core 0 only, or null to give every core a copy")]
        return []
    if product != cores_per_replica:
        return [Finding("error", "partition-product-mismatch",
                        f"partition dims {dims} of '{name}' multiply to {product}, but {cores_from} is {cores_per_replica}",
                        _product_hint(shape, dims, cores_per_replica))]
    if len(dims) != rank:
        return [Finding("error", "partition-rank-mismatch",
                        f"'{name}' has rank {rank} {shown} (batch first) but {len(dims)} partition dims are given",
                        f"give one dim per axis, batch first: {suggest(shape, cores_per_replica) or '[1, ...]'}")]
    if any(d is None for d in shape):
        return []  # reported once by the static-shape rule, at the shape's own line
    return _split_findings(name, shape, dims)


def _split_findings(name: str, shape: Sequence[int], dims: Sequence[int]) -> list:
    findings = []
    for axis, (size, ways) in enumerate(zip(shape, dims)):
        if ways <= 1:
            continue
        sizes = split_sizes(size, ways)
        axis_name = "the batch (per replica)" if axis == 0 else f"axis {axis}"
        if 0 in sizes:
            empty = sizes.count(0)
            findings.append(Finding(
                "warning", "partition-empty-pieces",
                f"{axis_name} of '{name}' has size {size}; split {ways} ways it gives pieces {sizes}: "
                f"{empty} of every {ways} cores get an empty tile on that axis",
                f"split that axis at most {_most_ways_without_empty(size, ways)} ways, or use a size divisible by {ways}",
                index=axis))
        elif len(set(sizes)) > 1:
            waste = 1 - size / (max(sizes) * ways)
            if waste >= UNEVEN_WASTE_WARNING:
                findings.append(Finding(
                    "warning", "partition-uneven",
                    f"{axis_name} of '{name}' has size {size}; split {ways} ways it gives pieces {sizes}, "
                    f"each padded to {max(sizes)} on the TPU ({waste:.0%} wasted)",
                    f"a size divisible by {ways} avoids the padding", index=axis))
    return findings


def uneven_axes(shape: Sequence[Optional[int]], dims: Sequence[int]) -> list:
    """(axis, size, ways) for each known axis that `ways` does not divide: the splits TF's
    `TPUStrategy.experimental_split_to_logical_devices` refuses (TPUEstimator pads them instead)."""
    return [(axis, size, ways) for axis, (size, ways) in enumerate(zip(shape, dims))
            if size is not None and ways > 1 and size % ways]


def _most_ways_without_empty(size: int, ways: int) -> int:
    return max(w for w in range(1, ways + 1) if 0 not in split_sizes(size, w))


def suggest(shape: Sequence[Optional[int]], cores: int, *, even: bool = False) -> Optional[list]:
    """A dims list that splits the largest non-batch, non-channel axes first, or None.

    `even`: only splits that divide their axis exactly (the keras engine's TPUStrategy refuses others).
    """
    rank = len(shape)
    if rank < 2 or any(d is None for d in shape):
        return None
    dims = [1] * rank
    spatial = list(range(1, rank - 1)) if rank >= 4 else list(range(1, rank))
    remaining = cores
    while remaining > 1:
        candidates = [a for a in spatial if shape[a] // dims[a] >= 2 and (not even or shape[a] % (dims[a] * 2) == 0)]
        if not candidates:
            return None
        axis = max(candidates, key=lambda a: (shape[a] / dims[a], -a))
        dims[axis] *= 2
        remaining //= 2
    return dims


def _product_hint(shape, dims, cores: int) -> str:
    suggestion = suggest(shape, cores)
    base = f"the dims' product must equal cores_per_replica ({cores}), or be 1 (core 0 only)"
    if suggestion and len(dims) == len(shape):
        return f"{base}; e.g. {suggestion}"
    return base


def padded_elements(shape: Sequence[int]) -> int:
    """Elements of `shape` in its least-padded TPU layout: one dim padded to 128, another to 8.

    XLA chooses the layout of a buffer, so a channel dim of 1 need not be the padded minor one; only
    thin tiles (every dim small) inflate.
    """
    dims = [int(d) for d in shape]
    n = math.prod(dims)
    if n == 0:
        return 0
    if len(dims) == 1:
        return _round_up(dims[0], TILE_MINOR)
    best = None
    for minor, second in itertools.permutations(range(len(dims)), 2):
        padded = n // (dims[minor] * dims[second])
        padded *= _round_up(dims[minor], TILE_MINOR) * _round_up(dims[second], TILE_SECOND_MINOR)
        best = padded if best is None else min(best, padded)
    return best


def layout_padding(tile_shape: Sequence[int], dtype_bytes: int) -> tuple:
    """(bytes, bytes in the least-padded layout of (8, 128) tiles)."""
    shape = [int(d) for d in tile_shape]
    unpadded = _product(shape) * dtype_bytes
    if not shape:
        return unpadded, unpadded
    return unpadded, padded_elements(shape) * dtype_bytes


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple if value else 0
