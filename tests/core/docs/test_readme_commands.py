"""The README's two commands are what CI and a new user run: `.ci/run` runs the test command verbatim."""

import re

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


def test_the_test_command_installs_nox_and_runs_every_session():
    command = _sh_block_after("Tests")
    assert command.startswith("python3 -m venv ") and "pip install -q nox" in command
    assert command.endswith("/bin/nox")  # no -s: every session of noxfile.py's list
    noxfile = (REPO / "noxfile.py").read_text()
    sessions = [line.split("def ", 1)[1].split("(", 1)[0] for line in noxfile.splitlines() if line.startswith("def ")
                and not line.startswith("def _")]
    assert f"nox.options.sessions = {sessions!r}".replace("'", '"') in noxfile


def test_every_test_folder_is_some_sessions():
    """A folder of test modules no session runs would be a suite that passes without having run them."""
    noxfile = (REPO / "noxfile.py").read_text()
    folders = {path.parent for path in (REPO / "tests").rglob("test_*.py")
               if "programs" not in path.parts and "models" not in path.parts}
    run = {REPO / folder for folder in re.findall(r'"(tests/[a-z_]+)"', noxfile)}
    assert all(any(run_folder in (folder, *folder.parents) for run_folder in run) for folder in folders), sorted(
        str(folder) for folder in folders if not any(r in (folder, *folder.parents) for r in run))


def test_the_quickstart_command_installs_before_it_trains():
    command = _sh_block_after("Quickstart")
    assert command.startswith("python3 -m venv .venv && .venv/bin/pip install")
    assert command.endswith("tpulaunch train configs/quickstart.yaml")
