"""What the checkpoint-keeping tests of every engine share (tests/estimator/run/test_keep_checkpoints.py: the estimator engine;
tests/keras_engine/test_keep_checkpoints_keras.py: the keras and jax engines): a tiny job, `tpulaunch` processes,
checkpoints damaged the way a preemption or a disk leaves them, and what a model_dir holds, byte for byte.

Every case starts from a copy of one model_dir trained by the module (training is the expensive part): 4 steps,
a checkpoint at each."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Dict

import numpy as np
import yaml

from paths import REPO
from records import write_examples

STEPS = 4

TF_KERAS_MODELS = textwrap.dedent('''
    import tensorflow as tf

    def classifier(num_classes=2, **unused):
        image = tf.keras.Input(shape=(8, 8, 1), name="image")
        return tf.keras.Model(image, tf.keras.layers.Dense(num_classes)(tf.keras.layers.Flatten()(image)))
''')

KERAS3_MODELS = textwrap.dedent('''
    import keras

    def classifier(num_classes=2, **unused):
        image = keras.Input(shape=(8, 8, 1), name="image")
        return keras.Model(image, keras.layers.Dense(num_classes)(keras.layers.Flatten()(image)))
''')


def make_project(root: Path, engine: str) -> Path:
    """A linear classifier of 8x8 images on 32 records, for `engine`; returns the job file."""
    rng = np.random.default_rng(1)
    for name, count in (("train", 32), ("eval", 16)):
        labels = [int(rng.integers(2)) for _ in range(count)]
        write_examples(root / f"{name}.tfrecord",
                       [{"image": rng.normal(size=64).astype(np.float32) + (2 * label - 1), "label": label}
                        for label in labels])
    (root / "ckpt_models.py").write_text(KERAS3_MODELS if engine == "jax" else TF_KERAS_MODELS)
    model = {"builder": "ckpt_models:classifier", "params": {"num_classes": 2},
             "optimizer": {"name": "sgd", "learning_rate": 0.05}}
    if engine != "estimator":
        model["loss"] = "sparse_categorical_crossentropy"
    job = {
        "name": f"keep-{engine}",
        "model": model,
        "data": {"train": "train.tfrecord", "eval": "eval.tfrecord", "features": {"image": {"shape": [8, 8, 1]}},
                 "labels": {"label": {"shape": [], "dtype": "int64"}}, "shuffle_buffer": 0},
        "train": {"batch_size": 8, "steps": STEPS},
        "eval": {"batch_size": 8, "steps": 1},
        "run": {"model_dir": "runs/m", "save_checkpoints_steps": 1, "log_every_steps": 1, "seed": 3,
                "engine": engine},
    }
    path = root / "job.yaml"
    path.write_text(yaml.safe_dump(job, sort_keys=False))
    return path


def tpulaunch(verb: str, job: Path, model_dir: Path, *args: str) -> subprocess.CompletedProcess:
    """`tpulaunch VERB job` on `model_dir` (`--local` but for export, which always builds here), as a process of
    its own (Keras picks its backend once per process)."""
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "KERAS_BACKEND")}
    env.update(PYTHONUNBUFFERED="1", CI="1",
               PYTHONPATH=os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p))
    local = [] if verb == "export" else ["--local"]
    return subprocess.run([sys.executable, "-m", "tpulaunch", verb, str(job), *local, "--set",
                           f"run.model_dir={model_dir}", *args], capture_output=True, text=True, env=env,
                          timeout=600, cwd=job.parent)


def train(job: Path, model_dir: Path, steps: int) -> subprocess.CompletedProcess:
    return tpulaunch("train", job, model_dir, "--set", f"train.steps={steps}", "--set", "eval=null")


def said(result: subprocess.CompletedProcess) -> str:
    return f"exit {result.returncode}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"


def checkpoint_steps(model_dir: Path) -> list:
    return sorted(int(re.search(r"-(\d+)\.index$", p.name).group(1)) for p in model_dir.glob("model.ckpt-*.index"))


def contents(folder: Path) -> Dict[str, bytes]:
    """Every file under `folder`, by its path there: what "left byte-identical" compares."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def checkpoint_files(folder: Path) -> Dict[str, bytes]:
    return {name: data for name, data in contents(folder).items() if name.startswith("model.ckpt-")}


def truncate(model_dir: Path, step: int, part: str) -> Path:
    """Cut checkpoint `step`'s `.index` or its (first) `.data` shard to a third, as a full disk leaves it."""
    (path,) = model_dir.glob(f"model.ckpt-{step}.index" if part == "index" else f"model.ckpt-{step}.data-00000-of-*")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 3])
    return path


def copy_of(model_dir: Path, where: Path) -> Path:
    shutil.copytree(model_dir, where, symlinks=True)
    return where


def state_entries(model_dir: Path) -> list:
    """The paths the `checkpoint` state file names, as written."""
    return re.findall(r'^\w+: "(.*)"$', (model_dir / "checkpoint").read_text(), re.MULTILINE)


# ------------------------------------------------------------------------------------------ the cases

def a_copied_repaired_model_dir_leaves_the_original_alone_and_a_moved_one_resumes(job: Path, trained: Path,
                                                                                   tmp: Path) -> None:
    last = checkpoint_steps(trained)[-1]
    original = copy_of(trained, tmp / "original")
    truncate(original, last, "index")
    # The repair: the newest checkpoint is passed over (and the engine's own restore never reads it).
    repaired = train(job, original, last - 1)
    assert repaired.returncode == 0, said(repaired)
    assert f"skipping incomplete checkpoint {original / f'model.ckpt-{last}'}: unreadable" in repaired.stdout, \
        said(repaired)
    assert f"resuming from {original / f'model.ckpt-{last - 1}'} (step {last - 1})" in repaired.stdout, said(repaired)
    before = contents(original)

    copy = copy_of(original, tmp / "copy")
    trained_copy = train(job, copy, last + 4)  # more saves than keep_checkpoint_max: the oldest are deleted
    assert trained_copy.returncode == 0, said(trained_copy)
    assert f"resumed from step {last - 1} ({copy})" in trained_copy.stdout, said(trained_copy)
    assert contents(original) == before, "training the copy changed the original"
    for folder in (original, copy):  # each names its checkpoints relative to itself
        assert all("/" not in entry for entry in state_entries(folder)), (folder / "checkpoint").read_text()
    # The copy keeps its own newest 5 (run.keep_checkpoint_max): it deletes only inside itself.
    assert checkpoint_steps(copy) == list(range(last, last + 5)), checkpoint_steps(copy)

    moved = tmp / "moved"
    os.rename(original, moved)
    resumed = train(job, moved, last + 1)
    assert resumed.returncode == 0, said(resumed)
    assert f"resumed from step {last - 1} ({moved})" in resumed.stdout, said(resumed)


def a_state_naming_only_a_deleted_step_resumes_from_the_newest_complete_checkpoint(job: Path, trained: Path,
                                                                                    tmp: Path) -> None:
    last = checkpoint_steps(trained)[-1]
    model_dir = copy_of(trained, tmp / "m")
    (model_dir / "checkpoint").write_text('model_checkpoint_path: "model.ckpt-90"\n'
                                          'all_model_checkpoint_paths: "model.ckpt-90"\n')
    # Training from step 0 would write them again (the resumed run may save its first step anew).
    older = {name: data for name, data in checkpoint_files(model_dir).items()
             if int(re.match(r"model\.ckpt-(\d+)\.", name).group(1)) < last}
    result = train(job, model_dir, last + 1)
    assert result.returncode == 0, said(result)
    assert f"skipping incomplete checkpoint {model_dir / 'model.ckpt-90'}: no .index file" in result.stdout, \
        said(result)
    assert f"resumed from step {last} ({model_dir})" in result.stdout, said(result)
    assert {name: data for name, data in checkpoint_files(model_dir).items() if name in older} == older


def checkpoints_none_of_which_restores_are_refused_not_trained_over(job: Path, trained: Path, tmp: Path) -> None:
    model_dir = copy_of(trained, tmp / "m")
    for step in checkpoint_steps(model_dir):
        truncate(model_dir, step, "data")
    before = contents(model_dir)
    result = train(job, model_dir, STEPS + 2)
    assert result.returncode == 1, said(result)
    assert f"error: no checkpoint in {model_dir} can be restored" in result.stderr, said(result)
    for step in checkpoint_steps(model_dir):
        assert f"{model_dir / f'model.ckpt-{step}'}: " in result.stderr, said(result)
    assert "Traceback" not in result.stderr and "unexpected" not in result.stderr, said(result)
    after = contents(model_dir)
    assert {name: after.get(name) for name in before if name.startswith("model.ckpt-") or name == "checkpoint"} == \
        {name: data for name, data in before.items() if name.startswith("model.ckpt-") or name == "checkpoint"}


def evaluate_and_export_fall_back_past_a_truncated_index_and_a_truncated_data_shard(job: Path, trained: Path,
                                                                                     tmp: Path) -> None:
    """The newest checkpoint's `.index` cut (TensorFlow: "not an sstable"), the one before's `.data` cut (its tensors
    read past the end): both are passed over, each said with why, and the one before them is read."""
    last = checkpoint_steps(trained)[-1]
    model_dir = copy_of(trained, tmp / "m")
    truncate(model_dir, last, "index")
    truncate(model_dir, last - 1, "data")
    read = model_dir / f"model.ckpt-{last - 2}"
    skipped = [f"skipping incomplete checkpoint {model_dir / f'model.ckpt-{last}'}: unreadable: ",
               f"skipping incomplete checkpoint {model_dir / f'model.ckpt-{last - 1}'}: "]

    evaluated = tpulaunch("evaluate", job, model_dir)
    assert evaluated.returncode == 0, said(evaluated)
    assert all(line in evaluated.stdout for line in skipped), said(evaluated)
    assert f"evaluating {read} (step {last - 2}), the newest complete checkpoint" in evaluated.stdout, said(evaluated)
    assert re.search(rf"^eval \| step {last - 2} \| ", evaluated.stdout, re.MULTILINE), said(evaluated)

    exported = tpulaunch("export", job, model_dir, str(tmp / "exported"))
    assert exported.returncode == 0, said(exported)
    assert all(line in exported.stdout for line in skipped), said(exported)
    assert f"exporting {read} (step {last - 2}), the newest complete checkpoint" in exported.stdout, said(exported)
    assert list((tmp / "exported").glob("*/saved_model.pb")), said(exported)


def evaluate_and_export_fall_back_past_a_data_shard_short_of_its_last_bytes(job: Path, trained: Path,
                                                                            tmp: Path) -> None:
    """The newest `.data` shard lacks only its last 4 bytes: its size can still pass for its variables' (a Keras
    checkpoint's shard also holds the object graph's text), so only reading the last tensor finds it short."""
    last = checkpoint_steps(trained)[-1]
    model_dir = copy_of(trained, tmp / "m")
    (shard,) = model_dir.glob(f"model.ckpt-{last}.data-00000-of-*")
    shard.write_bytes(shard.read_bytes()[:-4])
    read = model_dir / f"model.ckpt-{last - 1}"
    for verb, doing, args in (("evaluate", "evaluating", ()), ("export", "exporting", (str(tmp / "exported"),))):
        result = tpulaunch(verb, job, model_dir, *args)
        assert result.returncode == 0, said(result)
        assert f"skipping incomplete checkpoint {model_dir / f'model.ckpt-{last}'}: " in result.stdout, said(result)
        assert f"{doing} {read} (step {last - 1}), the newest complete checkpoint" in result.stdout, said(result)
