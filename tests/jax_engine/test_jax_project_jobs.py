"""One job file, every engine: the project's own jobs (configs/) train on the jax engine with `run.engine: jax` and
nothing else changed, their reference models (tpulaunch/models) built with the Keras the engine runs (Keras 3 on JAX
here; tf.keras on the others). Small shapes through --set (the configs' full shapes need a TPU) and one step."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from paths import REPO

pytestmark = pytest.mark.slow  # long end-to-end runs: its worker starts it first

TPULAUNCH = [sys.executable, "-m", "tpulaunch"]


@pytest.fixture(scope="module")
def records(tmp_path_factory) -> Path:
    """The examples' records (`tpulaunch data synth`'s writer), small: 16 quickstart images, 8 volumes of 16^3, 8
    RetinaNet images of 128^2 with their anchor targets."""
    from tpulaunch.data.synth import write_example

    root = tmp_path_factory.mktemp("project_jobs")
    write_example("quickstart", str(root / "quickstart"), records=16, shards=1)
    write_example("unet3d", str(root / "unet3d"), records=8, shards=1, size=16)
    write_example("retinanet", str(root / "retinanet"), records=8, shards=1, size=128)
    return root


def _train(config: str, root: Path, name: str, *sets: str, devices: int = 1) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "KERAS_BACKEND")}
    env.update(PYTHONUNBUFFERED="1", CI="1", XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
               PYTHONPATH=os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p))
    data = root / name
    args = ["train", str(REPO / "configs" / config), "--local", "--set", "run.engine=jax",
            "--set", f"data.train={data}/train-*.tfrecord", "--set", f"data.eval={data}/eval-*.tfrecord",
            "--set", f"run.model_dir={root / 'runs' / name}", "--set", "train.steps=1", "--set", "eval.steps=1",
            "--set", "eval.batch_size=1", *[w for s in sets for w in ("--set", s)]]
    return subprocess.run([*TPULAUNCH, *args], capture_output=True, text=True, env=env, timeout=900, cwd=root)


def test_the_quickstart_trains_on_the_jax_engine_with_only_its_engine_changed(records):
    done = _train("quickstart.yaml", records, "quickstart", "train.batch_size=8")
    said = done.stdout + done.stderr
    assert done.returncode == 0, said[-3000:]
    assert "train | step 1/1" in said and "Traceback" not in said, said[-3000:]
    assert (records / "runs" / "quickstart" / "model.ckpt-1.index").is_file()


def test_the_unet3d_job_trains_on_the_jax_engine_split_16_ways_in_bfloat16(records):
    # The job as written: bfloat16, Adam, its 16-way split [1, 4, 2, 2, 1] over 16 devices (this CPU split in 16).
    shape = ["data.features.image.shape=[16,16,16,1]", "data.labels.mask.shape=[16,16,16]",
             "model.params.input_shape=[16,16,16,1]", "model.params.depth=2", "model.params.base_filters=2"]
    done = _train("unet3d_ct.yaml", records, "unet3d", *shape, "train.batch_size=1", devices=16)
    said = done.stdout + done.stderr
    assert done.returncode == 0, said[-3000:]
    assert "train | step 1/1" in said and "Traceback" not in said, said[-3000:]
    assert (records / "runs" / "unet3d" / "model.ckpt-1.index").is_file()


def test_the_retinanet_job_trains_on_the_jax_engine_with_its_two_labels_and_one_loss_split_8_ways(records):
    # The job as written: two labels (class and box targets) scored together by its one loss, bfloat16, momentum,
    # its 8-way split [1, 4, 2, 1] over 8 devices; a ResNet-18 of narrow heads on 128^2 images.
    from tpulaunch.models.retinanet import anchor_count

    anchors = anchor_count((128, 128))
    shape = ["data.features.image.shape=[128,128,3]", f"data.labels.cls_targets.shape=[{anchors}]",
             f"data.labels.box_targets.shape=[{anchors},4]", "model.params.input_shape=[128,128,3]",
             "model.params.resnet_depth=18", "model.params.fpn_features=8", "model.params.head_convs=1"]
    done = _train("retinanet_2560.yaml", records, "retinanet", *shape, "train.batch_size=2", devices=8)
    said = done.stdout + done.stderr
    assert done.returncode == 0, said[-3000:]
    assert "train | step 1/1" in said and "Traceback" not in said, said[-3000:]
    assert re.search(r"eval \| step 1 \| loss [0-9.]+", said), said[-3000:]
    assert (records / "runs" / "retinanet" / "model.ckpt-1.index").is_file()
