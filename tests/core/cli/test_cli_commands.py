"""`init` and `schema`: what a new user runs first."""

import json

import pytest
from click.testing import CliRunner

from paths import REPO
from tpulaunch.cli.app import cli
from tpulaunch.checks.validate import validate_job


@pytest.mark.parametrize("example", ["quickstart", "unet3d", "retinanet"])
def test_init_writes_a_job_that_validates_and_never_overwrites(tmp_path, example, monkeypatch):
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    result = runner.invoke(cli, ["init", "--example", example])
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"wrote {example}.yaml; next: ")
    checked = validate_job(str(tmp_path / f"{example}.yaml"), static=True)
    assert [(p.severity, p.code) for p in checked.problems] == []

    (tmp_path / f"{example}.yaml").write_text("# mine\n")
    again = runner.invoke(cli, ["init", "--example", example])
    assert again.exit_code == 1
    assert (tmp_path / f"{example}.yaml").read_text() == "# mine\n"  # nothing lost
    assert "pass --force to overwrite" in again.output
    forced = runner.invoke(cli, ["init", "--example", example, "--force"])
    assert forced.exit_code == 0 and (tmp_path / f"{example}.yaml").read_text() != "# mine\n"


def test_schema_describes_every_section(tmp_path):
    out = tmp_path / "tpulaunch.schema.json"
    result = CliRunner().invoke(cli, ["schema", "-o", str(out)])
    assert result.exit_code == 0, result.output
    schema = json.loads(out.read_text())
    assert schema["title"] == "tpulaunch job"
    assert set(schema["properties"]) == {"name", "model", "data", "tpu", "gke", "partition", "train", "eval", "run", "flags",
                                         "python_path"}
    assert sorted(schema["required"]) == ["data", "model", "name", "run"]


def test_piped_output_keeps_whole_tensor_names():
    """Into a pipe or a CI log rich would assume 80 columns and cut names to `labels.c…`: 120 it is."""
    import os
    import subprocess
    import sys

    root = str(REPO)
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    child = subprocess.run([sys.executable, "-m", "tpulaunch", "plan", "configs/retinanet_2560.yaml", "--no-memory"],
                           cwd=root, env=env, capture_output=True, text=True, check=False)
    assert child.returncode == 0, child.stderr
    rows = {line.split()[0]: line for line in child.stdout.splitlines() if line.startswith("  labels.")}
    assert sorted(rows) == ["labels.box_targets", "labels.cls_targets"], child.stdout
    assert "[8, 1227600, 4]" in rows["labels.box_targets"]
    assert max(len(line) for line in child.stdout.splitlines()) <= 120
