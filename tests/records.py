"""TFRecords of tf.train.Examples, written by TensorFlow, for the tests: one writer for every test that needs
records of its own (the reference programs' own formats are written by their tests)."""

from __future__ import annotations

from typing import Iterable, Mapping

import numpy as np
import tensorflow as tf


def feature(value) -> tf.train.Feature:
    """bytes as a bytes_list; floating values as a float_list; integers as an int64_list (any shape, flattened)."""
    if isinstance(value, bytes):
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))
    array = np.asarray(value)
    if array.dtype.kind == "f":
        return tf.train.Feature(float_list=tf.train.FloatList(value=array.ravel().tolist()))
    return tf.train.Feature(int64_list=tf.train.Int64List(value=array.ravel().tolist()))


def example(record: Mapping) -> bytes:
    return tf.train.Example(features=tf.train.Features(
        feature={name: feature(value) for name, value in record.items()})).SerializeToString()


def write_examples(path, records: Iterable[Mapping], compression=None) -> str:
    """Write each record (name -> value) as a tf.train.Example; returns the path."""
    with tf.io.TFRecordWriter(str(path), options=compression) as writer:
        for record in records:
            writer.write(example(record))
    return str(path)
