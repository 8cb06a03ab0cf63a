"""Synthetic example records, `inspect`, and the `data` CLI group, against real TFRecords."""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest
import tensorflow as tf
from click.testing import CliRunner

from paths import REPO
from tpulaunch.data import synth
from tpulaunch.cli.data import data
from tpulaunch.engine.pipeline import make_dataset_fn
from tpulaunch.errors import TpuLaunchError
from tpulaunch.data.inspect_records import inspect
from tpulaunch.job.load import load_job

TEMPLATES = str(REPO / "tpulaunch" / "templates")
SMALL = {"quickstart": dict(records=16, shards=2), "unet3d": dict(records=4, size=16), "retinanet": dict(records=4, size=128)}


def template_job(tmp_path, name, out_dir, size=None, overrides=()):
    """The starter template, its ${VAR:-default}s filled with the defaults, pointed at `out_dir`."""
    with open(os.path.join(TEMPLATES, f"{name}.yaml")) as f:
        text = re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", f.read())
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    loaded = load_job(str(path), synth.template_overrides(name, str(out_dir), size) + list(overrides))
    assert loaded.problems == []
    return loaded.job


def first_batch(job, mode, batch_size=2):
    return next(iter(make_dataset_fn(job, mode, use_tpu=False)(batch_size)))


@pytest.mark.parametrize("name", list(SMALL))
def test_synth_records_parse_under_their_template(tmp_path, name):
    out = tmp_path / "records"
    files = synth.write_example(name, str(out), seed=3, **SMALL[name])
    job = template_job(tmp_path, name, out, SMALL[name].get("size"))
    features, labels = first_batch(job, "train")
    if name == "quickstart":
        assert (features.shape, features.dtype, labels.shape, labels.dtype) == ((2, 32, 32, 3), tf.float32, (2,), tf.int64)
        assert [os.path.basename(f) for f in files] == [
            "train-00000-of-00002.tfrecord", "train-00001-of-00002.tfrecord",
            "eval-00000-of-00002.tfrecord", "eval-00001-of-00002.tfrecord"]
    elif name == "unet3d":
        assert (features.shape, features.dtype, labels.shape, labels.dtype) == ((2, 16, 16, 16, 1), tf.float32, (2, 16, 16, 16), tf.uint8)
        assert sorted(np.unique(labels.numpy()).tolist()) == [0, 1, 2]
        # The organ is brighter than its surroundings: intensity carries the segmentation.
        image = features.numpy()[..., 0]
        assert image[labels.numpy() == 2].mean() > image[labels.numpy() == 1].mean() > image[labels.numpy() == 0].mean()
    else:
        from tpulaunch.models.retinanet import anchor_count

        anchors = anchor_count((128, 128))
        assert (features.shape, features.dtype) == ((2, 128, 128, 3), tf.uint8)
        assert (labels["cls_targets"].shape, labels["cls_targets"].dtype) == ((2, anchors), tf.int32)
        assert (labels["box_targets"].shape, labels["box_targets"].dtype) == ((2, anchors, 4), tf.float32)
        classes = set(np.unique(labels["cls_targets"].numpy()).tolist())
        assert classes <= {-1, 0, 1, 2, 3}  # ignore, background, the three object classes
        assert 0 in classes and classes & {1, 2, 3}
    eval_features, _ = first_batch(job, "eval", batch_size=1)
    assert eval_features.shape[1:] == features.shape[1:]


def test_quickstart_classes_differ_in_colour(tmp_path):
    synth.write_example("quickstart", str(tmp_path), records=200, shards=1)
    job = template_job(tmp_path, "quickstart", tmp_path)
    images, labels = first_batch(job, "train", batch_size=200)
    means = np.stack([images.numpy()[labels.numpy() == c].mean(axis=(0, 1, 2)) for c in range(10)])
    # Every pair of class mean colours is clearly apart: a classifier has something to learn.
    gaps = [np.abs(means[a] - means[b]).max() for a in range(10) for b in range(a + 1, 10)]
    assert min(gaps) > 0.03


def _bytes(files):
    return [open(f, "rb").read() for f in files]


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path):
    first = synth.write_example("unet3d", str(tmp_path / "a"), records=2, size=8, seed=7)
    again = synth.write_example("unet3d", str(tmp_path / "b"), records=2, size=8, seed=7)
    other = synth.write_example("unet3d", str(tmp_path / "c"), records=2, size=8, seed=8)
    assert _bytes(first) == _bytes(again)
    assert _bytes(first)[0] != _bytes(other)[0]


def test_bad_example_arguments():
    with pytest.raises(TpuLaunchError) as info:
        synth.write_example("mnist", "/tmp/unused")
    assert (info.value.message, info.value.hint) == ("unknown example 'mnist'", "choose one of quickstart, unet3d, retinanet")
    with pytest.raises(TpuLaunchError) as info:
        synth.write_example("retinanet", "/tmp/unused", size=200)
    assert info.value.message.startswith("retinanet images need a side that is a multiple of 128")


def test_inspect_quickstart_and_paste_its_yaml_into_a_job(tmp_path):
    out = tmp_path / "records"
    synth.write_example("quickstart", str(out), records=8, shards=1)
    result = inspect(str(out / "train-*.tfrecord"), records=3)
    assert (result.records_read, len(result.files)) == (3, 1)
    assert {k: (v.kind, v.min_length, v.max_length) for k, v in result.keys.items()} == {
        "image": ("float_list", 3072, 3072), "label": ("int64_list", 1, 1)}
    assert result.features_yaml() == (
        "  features:\n"
        "    image: {shape: [3072], dtype: float32}  # 3072 values: reshape, e.g. [H, W, C]\n"
        "    label: {shape: [], dtype: int64}\n")
    pasted = tmp_path / "pasted.yaml"
    pasted.write_text("name: pasted\nmodel: {builder: 'tpulaunch.models.cnn:build'}\nrun: {model_dir: runs}\n"
                      f"data:\n  eval: {out / 'train-*.tfrecord'}\n" + result.features_yaml())
    loaded = load_job(str(pasted))
    assert loaded.problems == []
    got, no_labels = first_batch(loaded.job, "eval", batch_size=8)
    assert no_labels is None
    # The same records, in file order: the flat float list is the template's image, flattened.
    template = template_job(tmp_path, "quickstart", out, overrides=[f"data.eval={out / 'train-*.tfrecord'}"])
    images, labels = first_batch(template, "eval", batch_size=8)
    np.testing.assert_array_equal(got["image"].numpy(), images.numpy().reshape(8, 3072))
    np.testing.assert_array_equal(got["label"].numpy(), labels.numpy())


def test_inspect_raw_bytes_and_pasted_yaml_reads_the_same_bytes(tmp_path):
    out = tmp_path / "ct"
    synth.write_example("unet3d", str(out), records=2, size=8, shards=1)
    result = inspect(str(out / "eval-*.tfrecord"))
    assert result.features_yaml() == (
        "  features:\n"
        "    image: {shape: [2048], dtype: uint8, encoding: raw}  # set shape and dtype: 2048 bytes\n"
        "    mask: {shape: [512], dtype: uint8, encoding: raw}  # set shape and dtype: 512 bytes\n")
    pasted = tmp_path / "pasted.yaml"
    pasted.write_text("name: pasted\nmodel: {builder: 'tpulaunch.models.cnn:build'}\nrun: {model_dir: runs}\n"
                      f"data:\n  eval: {out / 'eval-*.tfrecord'}\n" + result.features_yaml())
    raw, _ = first_batch(load_job(str(pasted)).job, "eval", batch_size=1)
    image, mask = first_batch(template_job(tmp_path, "unet3d", out, 8), "eval", batch_size=1)
    assert raw["image"].numpy().tobytes() == image.numpy().astype("<f4").tobytes()
    assert raw["mask"].numpy().tobytes() == mask.numpy().tobytes()


def _write(path, feature):
    with tf.io.TFRecordWriter(str(path)) as writer:
        writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    return str(path)


def test_inspect_recognises_png(tmp_path):
    png = tf.io.encode_png(np.zeros((6, 4, 3), np.uint8)).numpy()
    path = _write(tmp_path / "img.tfrecord", {"image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(value=[png]))})
    info = inspect(path).keys["image/encoded"]
    assert (info.kind, info.image_format, info.image_shape, info.min_bytes) == ("bytes_list", "png", [6, 4, 3], len(png))
    assert inspect(path).features_yaml() == (
        '  features:\n    image_encoded: {shape: [6, 4, 3], dtype: uint8, encoding: png, key: "image/encoded"}\n')


def test_inspect_errors_name_the_file(tmp_path):
    with pytest.raises(TpuLaunchError) as info:
        inspect(str(tmp_path / "nothing-*"))
    assert info.value.message == f"inspect: no files match {str(tmp_path / 'nothing-*')!r}"
    gz = tmp_path / "z.tfrecord"
    with tf.io.TFRecordWriter(str(gz), options="GZIP") as writer:
        writer.write(b"not used")
    with pytest.raises(TpuLaunchError) as info:
        inspect(str(gz))
    assert info.value.message.startswith(f"cannot read {gz}: ")
    assert info.value.hint == "the file starts like gzip: pass compression GZIP"
    text = tmp_path / "notes.txt"
    text.write_text("just some text, not a TFRecord file at all")
    with pytest.raises(TpuLaunchError) as info:
        inspect(str(text))
    assert info.value.message.startswith(f"cannot read {text}: ")


def test_cli_synth_then_inspect_json(tmp_path):
    runner = CliRunner()
    out = tmp_path / "q"
    result = runner.invoke(data, ["synth", "--example", "quickstart", str(out), "--records", "8", "--shards", "1", "--seed", "2"])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [str(out / "train-00000-of-00001.tfrecord"), str(out / "eval-00000-of-00001.tfrecord"),
                                          "wrote 9 records in 2 files"]
    assert "tpulaunch train JOB.yaml --local --set 'data.train=" in result.stderr
    result = runner.invoke(data, ["inspect", str(out / "train-*.tfrecord"), "--records", "2", "--format", "json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == inspect(str(out / "train-*.tfrecord"), records=2).to_dict()


def test_cli_errors_exit_1_without_traceback(tmp_path):
    runner = CliRunner()
    result = runner.invoke(data, ["inspect", str(tmp_path / "missing.tfrecord")])
    assert result.exit_code == 1
    assert result.stderr.splitlines()[0] == f"error: inspect: no files match '{tmp_path / 'missing.tfrecord'}'"
    assert "Traceback" not in result.output
    result = runner.invoke(data, ["synth", "--example", "retinanet", str(tmp_path), "--size", "100"])
    assert result.exit_code == 1
    assert result.stderr.startswith("error: retinanet images need a side that is a multiple of 128")
    result = runner.invoke(data, ["synth", "--example", "nope", str(tmp_path)])
    assert result.exit_code == 2


def test_data_group_has_only_its_own_commands():
    result = CliRunner().invoke(data, ["train"])
    assert result.exit_code == 2
    assert sorted(data.list_commands(None)) == ["bench", "inspect", "synth"]
