"""Whole numbers beyond int64 are refused at their key (one schema rule for every count), and an echoed source
line is cut to a window around the problem's column (a 4 MB line is not echoed in full)."""

import json

import pytest
from click.testing import CliRunner

from tpulaunch.cli.app import cli
from tpulaunch.cli.render.problems import SNIPPET_WIDTH

JOB = """\
name: numbers
model:
  builder: tpulaunch.models.cnn:build
data:
  train: /data/train-*.tfrecord
  features:
    image: {shape: [32, 32, 3]}
  labels:
    label: {shape: [], dtype: int64}
train: {batch_size: 64, steps: 10}
run: {model_dir: /tmp/runs/numbers, seed: 1}
"""
ENV = {"NO_COLOR": "1", "COLUMNS": "200"}


def validate(tmp_path, text: str, *args: str):
    path = tmp_path / "job.yaml"
    path.write_text(text)
    return CliRunner().invoke(cli, ["validate", "--static", str(path), *args], env=ENV)


@pytest.mark.parametrize("before, after, key, line, column", [
    ("steps: 10}", "steps: 99999999999999999999999999999}", "train.steps", 10, 32),
    ("batch_size: 64", "batch_size: 9223372036854775808", "train.batch_size", 10, 21),
    ("seed: 1}", "seed: -9223372036854775809}", "run.seed", 11, 43),
    ("shape: [32, 32, 3]", "shape: [32, 18446744073709551616, 3]", "data.features.image.shape", 7, 20),
])
def test_a_number_beyond_int64_is_refused_at_its_key(tmp_path, before, after, key, line, column):
    result = validate(tmp_path, JOB.replace(before, after), "--format", "json")
    assert result.exit_code == 1, result.output
    (problem,) = json.loads(result.stdout)["problems"]
    assert (problem["path"], problem["code"], problem["line"], problem["column"]) == (key, "out-of-range", line, column)
    assert problem["message"].endswith("must be <= 9223372036854775807")


def test_the_largest_int64_is_a_count_like_any_other(tmp_path):
    result = validate(tmp_path, JOB.replace("steps: 10}", "steps: 9223372036854775807}"), "--format", "json")
    assert not [p for p in json.loads(result.stdout)["problems"] if p["code"] == "out-of-range"], result.output


def test_a_4_mb_line_is_echoed_as_a_window_around_the_column(tmp_path):
    text = JOB.replace("name: numbers", 'name: "' + "x" * 4_000_000 + '" trailing')
    result = validate(tmp_path, text)
    assert result.exit_code == 1
    assert len(result.output) < 2000, len(result.output)
    lines = result.output.splitlines()
    assert lines[0].startswith(f"{tmp_path / 'job.yaml'}:1:4000010: YAML syntax")
    shown, caret = lines[1], lines[2]
    assert shown.startswith("     1 | ...x") and shown.endswith('x" trailing')
    assert len(shown) <= len("     1 | ") + SNIPPET_WIDTH + 6
    assert shown[caret.index("^")] == "t"  # the caret stays under the column it names (`trailing`)
