"""Loading job files: marks, duplicates, ${VAR}, --set, schema problems located in the file."""

import os
import textwrap

import pytest

from tpulaunch.errors import JobFileError
from tpulaunch.job.load import load_job, parse_override

GOOD = textwrap.dedent("""\
    name: demo
    model:
      builder: tpulaunch.models.cnn:build
      params: {num_classes: 10}
      loss: sparse_categorical_crossentropy
      optimizer: {name: adam, learning_rate: 0.001}
      metrics: [accuracy]
    data:
      train: /data/train-*.tfrecord
      eval: /data/eval-*.tfrecord
      features:
        image: {shape: [32, 32, 3], dtype: float32}
      labels:
        label: {shape: [], dtype: int64}
    train: {batch_size: 64, steps: 300}
    eval: {batch_size: 64, steps: 10}
    run: {model_dir: /tmp/runs/demo}
    """)


def write(tmp_path, text, name="job.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def summary(problems):
    return [(p.code, p.path, p.line, p.column) for p in problems]


def test_good_job_loads_with_defaults(tmp_path):
    loaded = load_job(write(tmp_path, GOOD), env={})
    assert loaded.problems == []
    job = loaded.job
    assert job.train.steps == 300
    assert job.model.optimizer.learning_rate == 0.001
    assert job.tpu is None and not job.on_tpu
    assert job.data.features["image"].stored_as == "float_list"
    assert job.data.labels["label"].stored_as == "int64_list"
    assert job.run.save_checkpoints_steps == 1000


def test_marks_point_at_key_and_value(tmp_path):
    loaded = load_job(write(tmp_path, GOOD), env={})
    file, mark = loaded.marks.locate(("train", "steps"))
    assert (mark.line, mark.column) == (15, 32)
    file, mark = loaded.marks.locate(("data", "features", "image"), at_key=True)
    assert (mark.line, mark.column) == (12, 5)


def test_every_schema_problem_at_once(tmp_path):
    text = GOOD.replace("optimizer:", "optimiser:").replace("dtype: float32", "dtype: float23") \
        .replace("steps: 300", "steps: many").replace("batch_size: 64, steps: 10", "batch_size: 0, steps: 10")
    loaded = load_job(write(tmp_path, text), env={})
    assert summary(loaded.problems) == [
        ("unknown-key", "model.optimiser", 6, 3),
        ("invalid-value", "data.features.image.dtype", 12, 40),
        ("wrong-type", "train.steps", 15, 32),
        ("out-of-range", "eval.batch_size", 16, 20),
    ]
    hints = [p.hint for p in loaded.problems]
    assert hints[0] == "did you mean 'optimizer'?"
    assert hints[1] == "did you mean 'float32'?"
    assert loaded.job is None
    # sections that validated on their own stay usable for the other checks
    assert loaded.usable("run") and not loaded.usable("model")
    assert loaded.section("run").model_dir == "/tmp/runs/demo"


def test_duplicate_key_is_an_error_not_last_wins(tmp_path):
    text = GOOD.replace("run: {model_dir: /tmp/runs/demo}", "run: {model_dir: /tmp/runs/demo}\nrun: {model_dir: /tmp/other}")
    loaded = load_job(write(tmp_path, text), env={})
    assert summary(loaded.problems) == [("duplicate-key", "run", 18, 1)]
    assert "first at line 17" in loaded.problems[0].message


def test_a_merge_key_given_a_scalar_is_located(tmp_path):
    """`<<: *anchor` where the anchor is not a mapping: one located problem, never YAML's internal error."""
    text = "defaults: &lr 0.1\n" + GOOD.replace("run: {model_dir: /tmp/runs/demo}",
                                                 "run:\n  <<: *lr\n  model_dir: /tmp/runs/demo")
    loaded = load_job(write(tmp_path, text), env={})
    merge = text.splitlines().index("  <<: *lr") + 1
    assert ("yaml-bad-merge", "run", merge, 3) in summary(loaded.problems)
    assert loaded.data["run"] == {"model_dir": "/tmp/runs/demo"}  # the rest of the section is kept


def test_env_interpolation_resolves_types_and_defaults(tmp_path):
    text = GOOD.replace("steps: 300}", "steps: 1}").replace(
        "train: {batch_size: 64, steps: 1}", "train:\n  batch_size: ${BATCH:-32}\n  steps: ${STEPS}")
    loaded = load_job(write(tmp_path, text), env={"STEPS": "500"})
    assert loaded.problems == []
    assert loaded.job.train.steps == 500 and loaded.job.train.batch_size == 32


def test_unset_env_var_is_located_once(tmp_path):
    text = GOOD.replace("train: {batch_size: 64, steps: 300}", "train:\n  batch_size: 8\n  steps: ${STEPS}")
    loaded = load_job(write(tmp_path, text), env={})
    assert summary(loaded.problems) == [("env-var-unset", "train.steps", 17, 10)]
    assert loaded.problems[0].hint == "export STEPS=..., or give a default: ${STEPS:-value}"


def test_overrides_apply_and_unknown_paths_name_the_override(tmp_path):
    path = write(tmp_path, GOOD)
    loaded = load_job(path, ["train.steps=20", "model.params.filters=8", "tpu.type=v3-8"], env={})
    assert loaded.problems == []
    assert loaded.job.train.steps == 20
    assert loaded.job.model.params == {"num_classes": 10, "filters": 8}
    assert loaded.job.tpu.type == "v3-8"

    loaded = load_job(path, ["train.stepz=20", "data.features.imag.shape=[1]"], env={})
    assert summary(loaded.problems) == [
        ("override-unknown-path", "train.stepz", 1, 1),
        ("override-unknown-path", "data.features.imag.shape", 2, 1),
    ]
    assert [p.file for p in loaded.problems] == ["--set", "--set"]
    assert [p.hint for p in loaded.problems] == ["did you mean 'steps'?", "did you mean 'image'?"]


def test_override_value_errors_point_at_the_override(tmp_path):
    loaded = load_job(write(tmp_path, GOOD), ["train.batch_size=-4"], env={})
    assert summary(loaded.problems) == [("out-of-range", "train.batch_size", 1, 1)]
    assert loaded.problems[0].file == "--set"


@pytest.mark.parametrize("text", ["train", "=3", "a..b=1"])
def test_malformed_override(text):
    with pytest.raises(JobFileError) as info:
        parse_override(text, 1)
    assert info.value.problems[0].code == "override-form"


def test_python_tags_are_never_constructed(tmp_path):
    text = GOOD.replace("name: demo", "name: !!python/object/apply:os.system ['echo pwned']")
    loaded = load_job(write(tmp_path, text), env={})
    assert summary(loaded.problems)[0] == ("yaml-unsupported-tag", "name", 1, 7)


def test_relative_paths_are_relative_to_the_job_file(tmp_path):
    (tmp_path / "sub").mkdir()
    text = GOOD.replace("/data/train-*.tfrecord", "data/train-*.tfrecord").replace("/tmp/runs/demo", "runs/demo")
    loaded = load_job(write(tmp_path / "sub", text), env={})
    assert loaded.job.data.train == str(tmp_path / "sub" / "data" / "train-*.tfrecord")
    assert loaded.job.run.model_dir == str(tmp_path / "sub" / "runs" / "demo")
    # from --set: relative to the current directory
    loaded = load_job(str(tmp_path / "sub" / "job.yaml"), ["run.model_dir=elsewhere"], env={})
    assert loaded.job.run.model_dir == os.path.join(os.getcwd(), "elsewhere")


@pytest.mark.parametrize("content, code, line, column", [
    (b"", "file-empty", 1, 1),
    (b"name: x\n\tmodel: 1\n", "yaml-syntax", 2, 1),
    (b"name: [unclosed\n", "yaml-syntax", 2, 1),
    (b"\x00\x01\x02binary", "file-binary", 1, 1),
    (b"name: caf\xe9\n", "file-not-utf8", 1, 10),
    (b"- just\n- a list\n", "wrong-type", 1, 1),
    (b"a: &a [*a]\n", "yaml-too-deep", 1, 4),
])
def test_unreadable_files_are_located(tmp_path, content, code, line, column):
    path = tmp_path / "job.yaml"
    path.write_bytes(content)
    try:
        problems = load_job(str(path), env={}).problems
    except JobFileError as exc:
        problems = exc.problems
    assert (problems[0].code, problems[0].line, problems[0].column) == (code, line, column)


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(JobFileError) as info:
        load_job(str(tmp_path / "nope.yaml"))
    assert info.value.problems[0].code == "file-not-found"
    with pytest.raises(JobFileError) as info:
        load_job(str(tmp_path))
    assert info.value.problems[0].code == "file-is-directory"


def test_alias_bomb_is_refused_quickly(tmp_path):
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 9):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i-1}"] * 10) + "]")
    path = write(tmp_path, "\n".join(lines) + "\n")
    with pytest.raises(JobFileError) as info:
        load_job(path, env={})
    assert info.value.problems[0].code == "yaml-too-large"


def test_deep_nesting_is_located(tmp_path):
    path = write(tmp_path, "name: " + "[" * 200 + "]" * 200 + "\n")
    try:
        problems = load_job(path, env={}).problems
    except JobFileError as exc:
        problems = exc.problems
    assert problems[0].code == "yaml-too-deep"
