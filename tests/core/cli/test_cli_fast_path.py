"""The CLI's fast path never imports TensorFlow nor the TPU API clients, and the README's commands are the ones CI runs."""

import os
import re
import subprocess
import sys

import pytest

from paths import REPO

ROOT = str(REPO)
GOOD = os.path.join(ROOT, "tests", "jobs", "good", "tpu_ct.yaml")

PROBE = """
import sys
from tpulaunch.cli.app import main
try:
    main(sys.argv[1:])
except SystemExit as exit:
    code = exit.code or 0
loaded = sorted(m for m in ("tensorflow", "numpy", "tensorflow_estimator", "cloud_tpu_client", "google.cloud.tpu_v2",
                            "googleapiclient", "google.api_core") if m in sys.modules)
print("LOADED=" + ",".join(loaded))
sys.exit(code)
"""


@pytest.mark.parametrize("args", [
    ["--help"], ["validate", "--help"], ["train", "--help"], ["data", "--help"], ["status", "--help"],
    ["up", "--help"], ["down", "--help"],
    ["schema"], ["validate", "--static", GOOD], ["plan", "--no-memory", GOOD],
])
def test_no_tensorflow_on_the_fast_path(args):
    proc = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "LOADED="


def readme_block(title):
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    section = text.split(f"## {title}\n", 1)[1]
    return re.search(r"```sh\n(.+?)\n```", section, re.S).group(1).strip()


def test_ci_runs_the_readme_test_command():
    ci = open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8").read()
    assert readme_block("Tests") in ci


def test_quickstart_names_files_that_exist():
    command = readme_block("Quickstart")
    assert "tpulaunch train configs/quickstart.yaml" in command
    assert os.path.exists(os.path.join(ROOT, "configs", "quickstart.yaml"))


@pytest.mark.parametrize("name", ["quickstart.yaml", "unet3d_ct.yaml", "retinanet_2560.yaml"])
def test_example_jobs_validate_clean(name):
    from tpulaunch.checks.validate import validate_job

    result = validate_job(os.path.join(ROOT, "configs", name), static=True)
    assert [(p.severity, p.code) for p in result.problems] == []


def _imported_by(args):
    """The modules a `tpulaunch ...` process imported, with its stdout going into a pipe."""
    probe = PROBE.replace('("tensorflow", "numpy", "tensorflow_estimator", "cloud_tpu_client")', "sys.modules")
    child_env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE")}
    proc = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True, cwd=ROOT,
                          env=child_env)
    return proc, set(proc.stdout.strip().splitlines()[-1][len("LOADED="):].split(","))


@pytest.mark.parametrize("args", [["--help"], ["validate", "--static", GOOD],
                                  ["validate", "--static", os.path.join(ROOT, "tests", "jobs", "bad", "46_several_mistakes.yaml")]])
def test_reports_into_a_pipe_do_not_import_rich(args):
    proc, loaded = _imported_by(args)
    assert proc.returncode in (0, 1), proc.stderr
    assert not {m for m in loaded if m == "rich" or m.startswith("rich.")}


def test_help_imports_neither_pydantic_nor_yaml():
    proc, loaded = _imported_by(["--help"])
    assert proc.returncode == 0, proc.stderr
    assert "pydantic" not in loaded and "yaml" not in loaded


# --------------------------------------------------------------- plain text == what rich prints there

def _bad_job_problems():
    import glob

    from tpulaunch.checks.validate import validate_job

    for path in sorted(glob.glob(os.path.join(ROOT, "tests", "jobs", "bad", "*.yaml"))):
        yield path, validate_job(path, static=True, env={"BUCKET": "ct-bucket"}).problems


def _awkward_problems(tmp_path):
    """Lines that rich changes or wraps: tabs, control and wide characters, markup-like and emoji-like
    text, a caret past the width, long lines with trailing blanks."""
    from tpulaunch.errors import Problem

    path = tmp_path / "awkward.yaml"
    lines = ["name: x\t# a tab", "key: caf\u00e9 \u5bbd\u5b57", "a: [bold]not markup[/bold] :100: :smile: \\[x]",
             "b: " + "v" * 150 + "   ", "c: bell\x07here", "d: " + "w " * 80]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    file = str(path)
    return file, [
        Problem("error", file, 1, 5, "name", "x-tab", "a tab\there", "hint with\ta tab"),
        Problem("warning", file, 2, 6, "key", "x-wide", "caf\u00e9 \u5bbd\u5b57 is wide", None),
        Problem("error", file, 3, 4, "a", "x-markup", "[bold]not markup[/bold] at :100: and :smile:", "\\[x] stays"),
        Problem("error", file, 4, 140, "b", "x-long", "a caret past the width", "h " * 70 + "   "),
        Problem("info", file, 5, 4, "c", "x-bell", "bell\x07here", None),
        Problem("error", file, 6, 3, "d", "x-wrapped", "w " * 70, None),
        Problem("error", "--set", 1, 1, "(file)", "x-document", "about the whole file", None),
    ]


@pytest.mark.parametrize("columns", [None, "200", "40"])
def test_plain_text_is_what_rich_prints_into_a_pipe(tmp_path, capsys, monkeypatch, columns):
    from tpulaunch.cli.base import console
    from tpulaunch.cli.render.problems import plain_text, render_text

    for name in ("FORCE_COLOR", "TTY_COMPATIBLE", "COLUMNS"):
        monkeypatch.delenv(name, raising=False)
    if columns:
        monkeypatch.setenv("COLUMNS", columns)
    cases = list(_bad_job_problems()) + [_awkward_problems(tmp_path)]
    for file, problems in cases:
        for checked in ((), ("schema", "slice")):
            render_text(console(), problems, file=file, checked=checked)
            by_rich = capsys.readouterr().out
            plain = plain_text(False, console)
            assert plain is not None and plain.width == int(columns or 120)
            render_text(plain, problems, file=file, checked=checked)
            assert capsys.readouterr().out == by_rich, file


def test_a_terminal_or_forced_colour_keeps_rich(monkeypatch):
    from tpulaunch.cli.base import console
    from tpulaunch.cli.render.problems import plain_text

    monkeypatch.setenv("FORCE_COLOR", "1")
    assert plain_text(False, console) is None
    monkeypatch.delenv("FORCE_COLOR")
    monkeypatch.setenv("COLUMNS", "wide")
    assert plain_text(False, console) is None


def test_places_are_never_read_as_emoji_codes(tmp_path):
    """rich turns `:100:` into an emoji: a problem on line 100 must still read FILE:100:COL, in a pipe and in colour."""
    job = tmp_path / "long.yaml"
    job.write_text("# padding\n" * 99 + "name: x\n", encoding="utf-8")
    for extra in ({}, {"FORCE_COLOR": "1"}):
        env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE")}
        proc = subprocess.run([sys.executable, "-m", "tpulaunch", "validate", "--static", str(job)],
                              capture_output=True, text=True, cwd=ROOT, env={**env, **extra})
        assert proc.returncode == 1
        assert f"{job}:100:1:" in re.sub(r"\x1b\[[0-9;]*m", "", proc.stdout), proc.stdout
