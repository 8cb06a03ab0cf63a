"""What cannot run is refused, by `validate` and by `train` alike, at its job key, before anything is allocated or
reported: sizes that cannot fit this machine's memory, an evaluation of no whole batch, a builder value that builds
no model, class ids a sparse categorical crossentropy cannot take. Real CLI processes on the estimator engine; every
child that could allocate without bound runs under an address-space limit (RLIMIT_AS)."""

import json
import os
import resource
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from records import write_examples

pytestmark = pytest.mark.slow  # long end-to-end runs: its worker starts it first

# Room for TensorFlow's own address space, far below what the refused sizes need.
ADDRESS_SPACE = 8 << 30


def _limited():
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def _records(count: int, labels=None, seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    return [{"image": rng.normal(size=64).astype(np.float32),
             "label": np.int64(labels[i] if labels is not None else rng.integers(0, 3))} for i in range(count)]


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A tiny classifier job (the reference cnn on 8x8x1 images, 3 classes) with 8 training and 6 evaluation
    records, plain and GZIP-compressed (whose record count validate cannot estimate from file sizes)."""
    root = tmp_path_factory.mktemp("limits")
    write_examples(root / "train.tfrecord", _records(8))
    write_examples(root / "eval.tfrecord", _records(6, seed=1))
    write_examples(root / "train.tfrecord.gz", _records(8), compression="GZIP")
    write_examples(root / "eval.tfrecord.gz", _records(6, seed=1), compression="GZIP")
    # One batch of the whole file, read in order: the first batch holds both bad ids.
    write_examples(root / "badlabels.tfrecord", _records(8, labels=[0, 1, 999, 2, -3, 1, 0, 1]))
    (root / "job.yaml").write_text(textwrap.dedent("""
        name: limits
        model:
          builder: tpulaunch.models.cnn:build
          params: {num_classes: 3, input_shape: [8, 8, 1], filters: 4}
          loss: sparse_categorical_crossentropy
          optimizer: {name: sgd, learning_rate: 0.05}
          metrics: [accuracy]
        data:
          train: train.tfrecord
          eval: eval.tfrecord
          shuffle_buffer: 0
          features: {image: {shape: [8, 8, 1]}}
          labels: {label: {shape: [], dtype: int64}}
        train: {batch_size: 4, steps: 2}
        eval: {batch_size: 2, steps: 1}
        run: {model_dir: runs/m, save_checkpoints_steps: 2}
    """))
    return root


def _run(project, verb: str, *sets: str, local: bool = True) -> subprocess.CompletedProcess:
    args = [sys.executable, "-m", "tpulaunch", verb, str(project / "job.yaml"), *(["--local"] if local else [])]
    for value in sets:
        args += ["--set", value]
    return subprocess.run(args, capture_output=True, text=True, cwd=project, preexec_fn=_limited, timeout=300,
                          env=dict(os.environ, CI="1"))


def _model_dir(project, name: str):
    return project / "runs" / name


@pytest.mark.parametrize("setting, key, code", [
    ("train.batch_size=1000000000", "train.batch_size", "batch-exceeds-memory"),
    ("data.features.image.shape=[100000, 100000, 3]", "data.features.image.shape", "input-exceeds-memory"),
])
@pytest.mark.parametrize("verb", ["validate", "train"])
def test_sizes_that_cannot_fit_this_machine_are_refused_at_their_key_before_anything_is_allocated(
        project, verb, setting, key, code):
    result = _run(project, verb, setting, f"run.model_dir=runs/{verb}-{code}", local=verb == "train")
    assert result.returncode == 1, result.stderr
    said = result.stdout + result.stderr
    assert f"{key}: " in said and f"[{code}]" in said, said
    assert "this process may address (RLIMIT_AS, ulimit -v)" in said  # the limit the child runs under
    assert not _model_dir(project, f"{verb}-{code}").exists()  # refused before the lease: nothing written


def test_an_eval_batch_larger_than_the_eval_set_is_refused_at_eval_batch_size_by_validate_and_train(project):
    for verb in ("validate", "train"):
        result = _run(project, verb, "eval.batch_size=10", "run.model_dir=runs/big-eval", local=verb == "train")
        assert result.returncode == 1, result.stdout + result.stderr
        assert "eval.batch_size: data.eval has about 6 records, fewer than one batch of 10" in (
            result.stdout + result.stderr)
    assert "eval |" not in result.stdout


def test_an_evaluation_of_no_whole_batch_is_an_error_never_metrics_of_0(project):
    """Compressed records: nothing tells their count before reading them all, so the run reaches the evaluation."""
    result = _run(project, "train", "data.train=train.tfrecord.gz", "data.eval=eval.tfrecord.gz",
                  "data.compression=GZIP", "eval.batch_size=10", "run.model_dir=runs/no-batch")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "error: eval.batch_size: data.eval holds fewer records than one batch" in result.stderr
    assert "eval |" not in result.stdout
    record = json.loads((_model_dir(project, "no-batch") / "tpulaunch-runs.jsonl").read_text().splitlines()[-1])
    assert record["evals"] == [] and record["outcome"].startswith("failed: eval.batch_size")


def test_num_classes_0_is_refused_at_its_key_by_validate_and_train(project):
    for verb in ("validate", "train"):
        result = _run(project, verb, "model.params.num_classes=0", "run.model_dir=runs/zero-classes",
                      local=verb == "train")
        assert result.returncode == 1, result.stdout + result.stderr
        assert "model.params.num_classes: " in result.stdout + result.stderr
        assert "num_classes must be at least 1, got 0" in result.stdout + result.stderr


def test_class_ids_outside_the_loss_range_stop_training_at_the_first_batch_naming_them(project):
    result = _run(project, "train", "data.train=badlabels.tfrecord", "train.batch_size=8", "run.model_dir=runs/ids")
    assert result.returncode == 1, result.stdout + result.stderr
    assert ("error: data.labels.label: a batch of data.train holds class ids from -3 to 999, but only ids in [0, 3) "
            "are classes") in result.stderr
    assert "checkpoint |" not in result.stdout  # the bad batch trained nothing
