"""The README's two commands are what CI and a new user run: `.ci/run` runs the test command verbatim."""

from paths import REPO


def _sh_block_after(heading: str) -> str:
    text = (REPO / "README.md").read_text()
    section = text[text.index(f"## {heading}\n"):]
    return section.split("```sh\n", 1)[1].split("\n```", 1)[0].strip()


def test_ci_runs_the_readme_test_command_verbatim():
    command = _sh_block_after("Tests")
    ci_lines = [line for line in (REPO / ".ci" / "run").read_text().splitlines()
                if line and not line.startswith("#") and not line.startswith(("set ", "cd "))]
    assert ci_lines == [command]


def test_the_test_command_sets_up_and_tests_both_engines():
    command = _sh_block_after("Tests")
    # XLA's TPU compiler first: tests/plan/test_xla_tpu.py compiles with .venv-xla's jax and libtpu
    assert command.startswith("python3 -m venv .venv-xla && .venv-xla/bin/pip install -q -r requirements/xla.txt && ")
    assert "pip install -q -e '.[cpu,test]'" in command and "pip install -q -e '.[keras,jax,test]'" in command
    assert command.index(" .venv/bin/python -m pytest -q") < command.index(" .venv-keras/bin/python -m pytest -q")
    assert command.endswith("tests/keras_engine tests/checks/test_engine_rules.py")


def test_the_quickstart_command_installs_before_it_trains():
    command = _sh_block_after("Quickstart")
    assert command.startswith("python3 -m venv .venv && .venv/bin/pip install")
    assert command.endswith("tpulaunch train configs/quickstart.yaml")
