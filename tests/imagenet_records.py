"""ImageNet's TFRecord format as tensorflow/tpu's imagenet_input parses it, for the reference programs that read it
(ResNet, EfficientNet): tiny JPEGs whose class shows in their colour."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tensorflow as tf

CLASSES = 10


def write_imagenet(path: Path, count: int, seed: int) -> None:
    """ImageNet's TFRecord format as imagenet_input parses it: a JPEG and a label from 1 to CLASSES."""
    rng = np.random.default_rng(seed)
    with tf.io.TFRecordWriter(str(path)) as writer:
        for _ in range(count):
            label = int(rng.integers(CLASSES))
            image = rng.integers(0, 40, (40, 40, 3)).astype(np.uint8)
            image[:, :, label % 3] += np.uint8(20 * (label + 1))
            writer.write(tf.train.Example(features=tf.train.Features(feature={
                "image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(value=[tf.io.encode_jpeg(image).numpy()])),
                "image/class/label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label + 1])),
            })).SerializeToString())
