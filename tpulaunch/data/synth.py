"""Synthetic TFRecords for the starter jobs, so every template trains without downloading a data set.

Each example writes `train-0000i-of-0000n.tfrecord` and `eval-...` files of `tf.train.Example`s laid out
exactly as the matching template in `tpulaunch/templates/` declares them (only the sizes shrink):

- ``quickstart``: 10 classes of 32x32 RGB images (float_list) whose colour and stripe direction depend
  on the class, plus noise: a small CNN's accuracy rises well above chance within 300 steps.
- ``unet3d``: CT-like phantoms [D, D, D, 1] float32 (raw): a body, an organ and a lesion as ellipsoids of
  different intensities plus noise; the mask [D, D, D] uint8 (raw) is 0 background, 1 organ, 2 lesion.
- ``retinanet``: [S, S, 3] uint8 images (raw) with coloured rectangles as objects (the colour gives the
  class); anchor targets from `tpulaunch.models.retinanet.encode_targets`.

The output depends only on the arguments: the same seed writes the same bytes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, List, Optional

from tpulaunch.errors import TpuLaunchError

QUICKSTART_CLASSES = 10
RETINANET_CLASSES = 3  # ids 1..3, one colour each; the template's 90-class head covers them


@dataclass(frozen=True)
class ExampleSet:
    """Defaults of one synthetic example set."""

    description: str
    records: int  # training records; eval gets records // 8 (at least one per shard)
    size: int  # image side / volume side
    shards: int  # files per split
    template: str  # the starter job these records fit


EXAMPLES: Dict[str, ExampleSet] = {
    "quickstart": ExampleSet("10-class 32x32 images with class-dependent colour and stripes", 2048, 32, 4, "quickstart"),
    "unet3d": ExampleSet("3D CT-like phantoms with organ/lesion masks", 32, 32, 2, "unet3d"),
    "retinanet": ExampleSet("images with coloured rectangles and RetinaNet anchor targets", 64, 256, 2, "retinanet"),
}


def shard_name(split: str, index: int, count: int) -> str:
    return f"{split}-{index:05d}-of-{count:05d}.tfrecord"


def eval_records(records: int, shards: int) -> int:
    return max(records // 8, shards)


def _check(name: str, records: Optional[int], shards: Optional[int], size: Optional[int]) -> ExampleSet:
    if name not in EXAMPLES:
        raise TpuLaunchError(f"unknown example {name!r}", hint=f"choose one of {', '.join(EXAMPLES)}")
    spec = EXAMPLES[name]
    if records is not None and records < 1:
        raise TpuLaunchError(f"--records must be at least 1, got {records}")
    if shards is not None and shards < 1:
        raise TpuLaunchError(f"--shards must be at least 1, got {shards}")
    if size is not None and size < 1:
        raise TpuLaunchError(f"--size must be at least 1, got {size}")
    if name == "retinanet" and size is not None and size % 128:
        raise TpuLaunchError(f"retinanet images need a side that is a multiple of 128 (the anchor pyramid's "
                             f"coarsest stride), got {size}")
    return spec


def _float_feature(values):
    import tensorflow as tf

    return tf.train.Feature(float_list=tf.train.FloatList(value=values.ravel().tolist()))


def _int64_feature(values):
    import tensorflow as tf

    return tf.train.Feature(int64_list=tf.train.Int64List(value=[int(v) for v in values.ravel()]))


def _bytes_feature(array):
    import numpy as np
    import tensorflow as tf

    little = array.astype(array.dtype.newbyteorder("<"), copy=False)  # raw records are little-endian
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=[np.ascontiguousarray(little).tobytes()]))


# ------------------------------------------------------------------------------------ quickstart
def _quickstart_records(rng, count: int, size: int) -> Iterator[dict]:
    import numpy as np

    # Fixed per-class colour and stripe direction: learnable, yet noise keeps it from being trivial.
    colours = np.array([[np.cos(2 * np.pi * (c / QUICKSTART_CLASSES + k / 3)) for k in range(3)]
                        for c in range(QUICKSTART_CLASSES)], dtype=np.float32) * 0.1
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)
    for _ in range(count):
        label = int(rng.integers(QUICKSTART_CLASSES))
        angle = np.pi * label / QUICKSTART_CLASSES
        phase = rng.uniform(0, 2 * np.pi)
        stripes = np.sin((np.cos(angle) * xx + np.sin(angle) * yy) * (2 * np.pi / 6) + phase)
        image = 0.5 + 0.2 * stripes[..., None] + colours[label] + rng.normal(0, 0.35, (size, size, 3))
        yield {"image": _float_feature(image.astype(np.float32)), "label": _int64_feature(np.array([label]))}


# ---------------------------------------------------------------------------------------- unet3d
def _ellipsoid(grid, center, radii):
    return sum(((g - c) / r) ** 2 for g, c, r in zip(grid, center, radii)) <= 1.0


def _unet3d_records(rng, count: int, size: int) -> Iterator[dict]:
    import numpy as np

    grid = np.meshgrid(*(np.linspace(-1, 1, size, dtype=np.float32),) * 3, indexing="ij")
    for _ in range(count):
        body = _ellipsoid(grid, rng.uniform(-0.05, 0.05, 3), rng.uniform(0.75, 0.9, 3))
        organ_center = rng.uniform(-0.2, 0.2, 3)
        organ = body & _ellipsoid(grid, organ_center, rng.uniform(0.35, 0.55, 3))
        lesion = organ & _ellipsoid(grid, organ_center + rng.uniform(-0.1, 0.1, 3), rng.uniform(0.1, 0.2, 3))
        # Hounsfield-like levels scaled to about [-1, 1]: air, soft tissue, organ, contrast-enhanced lesion.
        image = np.full((size,) * 3, -1.0, dtype=np.float32)
        image[body] = 0.0
        image[organ] = 0.35
        image[lesion] = 0.7
        image += rng.normal(0, 0.1, image.shape).astype(np.float32)
        mask = np.zeros((size,) * 3, dtype=np.uint8)
        mask[organ] = 1
        mask[lesion] = 2
        yield {"image": _bytes_feature(image[..., None].astype(np.float32)), "mask": _bytes_feature(mask)}


# ------------------------------------------------------------------------------------- retinanet
def _retinanet_records(rng, count: int, size: int) -> Iterator[dict]:
    import numpy as np

    from tpulaunch.models.retinanet import encode_targets

    colours = np.array([[220, 40, 40], [40, 200, 60], [50, 80, 230]], dtype=np.int16)
    for _ in range(count):
        image = rng.integers(0, 60, (size, size, 3)).astype(np.int16)  # dark textured background
        objects = int(rng.integers(1, 6))
        boxes, classes = [], []
        for _ in range(objects):
            h, w = rng.integers(size // 16, size // 3, 2)
            y0, x0 = int(rng.integers(0, size - h)), int(rng.integers(0, size - w))
            cls = int(rng.integers(1, RETINANET_CLASSES + 1))
            image[y0:y0 + h, x0:x0 + w] = colours[cls - 1] + rng.integers(-20, 20, 3)
            boxes.append([y0, x0, y0 + h, x0 + w])
            classes.append(cls)
        cls_targets, box_targets = encode_targets(np.array(boxes, np.float32), np.array(classes), (size, size))
        yield {"image": _bytes_feature(np.clip(image, 0, 255).astype(np.uint8)),
               "cls_targets": _bytes_feature(cls_targets.astype(np.int32)),
               "box_targets": _bytes_feature(box_targets.astype(np.float32))}


_GENERATORS: Dict[str, Callable] = {
    "quickstart": _quickstart_records,
    "unet3d": _unet3d_records,
    "retinanet": _retinanet_records,
}


def planned_records(name: str, records: Optional[int] = None, shards: Optional[int] = None) -> int:
    """How many records `write_example` writes over both splits."""
    spec = _check(name, records, shards, None)
    records = records or spec.records
    return records + eval_records(records, shards or spec.shards)


def write_example(name: str, out_dir: str, *, records: Optional[int] = None, shards: Optional[int] = None,
                  seed: int = 0, size: Optional[int] = None,
                  on_record: Optional[Callable[[], None]] = None) -> List[str]:
    """Write one example set's train and eval TFRecords into `out_dir` (local or gs://).

    Args:
        name: "quickstart", "unet3d" or "retinanet".
        out_dir: directory to write into (created if missing).
        records: training records (default per example); eval gets records // 8, at least one per shard.
        shards: files per split (default per example).
        seed: seed of numpy's Generator; the same arguments write the same bytes.
        size: image side (quickstart, retinanet: a multiple of 128) or volume side (unet3d).
        on_record: called after each record is written (progress display).

    Returns:
        The paths written, train files first.

    Raises:
        TpuLaunchError: unknown example or invalid counts/size.
    """
    import numpy as np
    import tensorflow as tf

    spec = _check(name, records, shards, size)
    records, shards, size = records or spec.records, shards or spec.shards, size or spec.size
    tf.io.gfile.makedirs(out_dir)
    written = []
    for split_index, (split, count) in enumerate((("train", records), ("eval", eval_records(records, shards)))):
        rng = np.random.default_rng([seed, split_index])  # eval never depends on the train count
        examples = _GENERATORS[name](rng, count, size)
        nshards = min(shards, count)
        for shard in range(nshards):
            path = os.path.join(out_dir, shard_name(split, shard, nshards))
            # Records are dealt out in blocks so every shard has count // nshards (+1) of them.
            in_shard = count // nshards + (1 if shard < count % nshards else 0)
            with tf.io.TFRecordWriter(path) as writer:
                for _ in range(in_shard):
                    example = tf.train.Example(features=tf.train.Features(feature=next(examples)))
                    writer.write(example.SerializeToString(deterministic=True))
                    if on_record:
                        on_record()
            written.append(path)
    return written


def template_overrides(name: str, out_dir: str, size: Optional[int] = None) -> List[str]:
    """`--set` overrides that point the example's template at records written by `write_example`."""
    spec = EXAMPLES[name]
    size = size or spec.size
    train = os.path.join(out_dir, "train-*.tfrecord")
    evals = os.path.join(out_dir, "eval-*.tfrecord")
    sets = [f"data.train={train}", f"data.eval={evals}"]
    if name == "quickstart" and size != 32:
        sets.append(f"data.features.image.shape=[{size},{size},3]")
        sets.append(f"model.params.input_shape=[{size},{size},3]")
    elif name == "unet3d":
        sets.append(f"data.features.image.shape=[{size},{size},{size},1]")
        sets.append(f"data.labels.mask.shape=[{size},{size},{size}]")
        sets.append(f"model.params.input_shape=[{size},{size},{size},1]")
    elif name == "retinanet":
        from tpulaunch.models.retinanet import anchor_count

        anchors = anchor_count((size, size))
        sets.append(f"data.features.image.shape=[{size},{size},3]")
        sets.append(f"data.labels.cls_targets.shape=[{anchors}]")
        sets.append(f"data.labels.box_targets.shape=[{anchors},4]")
        sets.append(f"model.params.input_shape=[{size},{size},3]")
    return sets
