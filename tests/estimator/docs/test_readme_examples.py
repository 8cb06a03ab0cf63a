"""Every `$ tpulaunch ...` transcript in the README and in docs/ runs as shown.

The pages are read in the order of DOCS, as one text. Each fenced block whose lines start with `$ ` is a
transcript: the commands, each followed by
what it prints. The commands run here, in a scene prepared as the README says (the repository itself; the
quickstart's synthesized data; the own-program job, whose job file is the README's own yaml block), and what
they print must be what the README shows: every line, in order, with `...` standing for lines left out.
Transcripts of runs (train, data bench, the explained program, export) are compared with their numbers
masked, since rates, timings and losses are the machine's; everything else (verdicts, problems, plans) is
compared exactly. A test also asserts that no transcript is left out.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import own_programs
from paths import REPO

pytestmark = pytest.mark.slow  # long end-to-end runs: its worker starts it first

# The README, then the docs pages; a page's transcripts find their yaml blocks on the same page, before them.
DOCS = ["README.md", *sorted(str(path.relative_to(REPO)) for path in (REPO / "docs").glob("*.md"))]
README = "\n".join((REPO / page).read_text() for page in DOCS)

# Which scene each transcript's command runs in (the README's own working directory for it).
REPOSITORY, CT, QUICKSTART, OWN_PROGRAM = "repository", "ct.yaml", "quickstart", "own program"
SCENES = {
    "tpulaunch validate --static ct.yaml": CT,
    "tpulaunch plan configs/unet3d_ct.yaml": REPOSITORY,
    "tpulaunch plan configs/retinanet_2560.yaml --set partition=null --set tpu.cores_per_replica=1 "
    "--set tpu.type=v3-8 --set train.batch_size=64": REPOSITORY,
    "tpulaunch validate configs/unet3d_ct.yaml --static --tf": REPOSITORY,
    "tpulaunch data bench configs/quickstart.yaml": QUICKSTART,
    "tpulaunch train configs/quickstart.yaml": QUICKSTART,
    "tpulaunch validate mnist.yaml": OWN_PROGRAM,
    "tpulaunch train mnist.yaml": OWN_PROGRAM,
    "tpulaunch export mnist.yaml exported": OWN_PROGRAM,
    "tpulaunch explain mnist.yaml -o mnist_program.py": OWN_PROGRAM,
    "python mnist_program.py evaluate 2>/dev/null": OWN_PROGRAM,
    "tpulaunch validate typo.yaml": OWN_PROGRAM,
    "tpulaunch validate stored.yaml": OWN_PROGRAM,
}
# Runs whose numbers are the machine's (rates, seconds, losses, timestamps): compared with numbers masked.
RUNS = ("tpulaunch train ", "tpulaunch data bench ", "tpulaunch export ", "python mnist_program.py")


def transcripts() -> list:
    """(command, expected lines) for every `$ ` line of the README's fenced blocks, in order."""
    found = []
    for block in fenced_blocks():
        command, lines = None, []
        for line in block:
            if line.startswith("$ "):
                if command is not None:
                    found.append((command, lines))
                command, lines = line[2:], []
            elif command is not None:
                lines.append(line)
        if command is not None:
            found.append((command, lines))
    return found


def fenced_blocks() -> list:
    """The lines of each fenced block of the README without a language (transcripts and plain text)."""
    blocks, lines, language = [], None, ""
    for line in README.splitlines():
        if not line.startswith("```"):
            if lines is not None:
                lines.append(line)
        elif lines is None:  # an opening fence
            lines, language = [], line[3:].strip()
        else:  # its closing fence
            if not language:
                blocks.append(lines)
            lines = None
    return blocks


def yaml_block_before(marker: str) -> str:
    """The yaml block that comes last before `marker`."""
    head = README[:README.index(marker)]
    return head[head.rindex("```yaml\n") + len("```yaml\n"):].split("```", 1)[0]


# ---------------------------------------------------------------------------------------------- scenes

@pytest.fixture(scope="module")
def ct(tmp_path_factory) -> Path:
    """ct.yaml: the bad-job corpus's job with the four mistakes the README shows."""
    root = tmp_path_factory.mktemp("ct")
    shutil.copy(REPO / "tests" / "jobs" / "bad" / "46_several_mistakes.yaml", root / "ct.yaml")
    return root


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory) -> Path:
    """The repository's configs beside the quickstart's data, as the README's Quickstart leaves them."""
    root = tmp_path_factory.mktemp("quickstart")
    shutil.copytree(REPO / "configs", root / "configs")
    tpulaunch(["data", "synth", "--example", "quickstart", "data/quickstart"], root, check=True)
    return root


@pytest.fixture(scope="module")
def own_program(tmp_path_factory) -> Path:
    """The README's mnist.yaml (its /tmp/mnist made a scratch directory), tests/programs/mnist_tpu.py and its
    records; typo.yaml and stored.yaml are mnist.yaml with the one mistake each transcript shows."""
    root = tmp_path_factory.mktemp("mnist")
    own_programs.write_project(root)
    job = yaml_block_before("$ tpulaunch validate mnist.yaml").replace("/tmp/mnist", str(root))
    (root / "mnist.yaml").write_text(job)
    (root / "typo.yaml").write_text(job.replace("learning_rate: 0.05", "learning_rte: 0.05"))
    (root / "stored.yaml").write_text(job.replace("dtype: float32}}", "dtype: uint8}}  "))  # the comment stays put
    return root


def scene_dir(scene: str, request) -> Path:
    if scene == REPOSITORY:
        return REPO
    return request.getfixturevalue({CT: "ct", QUICKSTART: "quickstart", OWN_PROGRAM: "own_program"}[scene])


# --------------------------------------------------------------------------------------------- running

def tpulaunch(args: list, cwd: Path, check: bool = False) -> subprocess.CompletedProcess:
    return run([sys.executable, "-m", "tpulaunch", *args], cwd, check)


def run(argv: list, cwd: Path, check: bool = False) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "200"}  # the width the README's transcripts were made at
    proc = subprocess.run(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    if check:
        assert proc.returncode == 0, proc.stdout
    return proc


def run_command(command: str, cwd: Path) -> subprocess.CompletedProcess:
    if command.startswith("tpulaunch "):
        return tpulaunch(command.split()[1:], cwd)
    program, mode = command.split()[1:3]  # python PROGRAM MODE 2>/dev/null: its stdout alone
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, program, mode], cwd=cwd, capture_output=True, text=True, env=env)
    return subprocess.CompletedProcess(proc.args, proc.returncode, proc.stdout)


# -------------------------------------------------------------------------------------------- matching

NUMBER = re.compile(r"\d+(\.\d+)?(e-?\d+)?")
# The input-wait verdict follows the measured share, which is the machine's (and its load's) too.
INPUT_VERDICT = re.compile(r"\| (not |partly )?input-bound( \| may help: .*)?$")


def masked(line: str) -> str:
    return NUMBER.sub("N", INPUT_VERDICT.sub("| (input verdict)", line))


def assert_shows(expected: list, printed: list, *, numbers_masked: bool) -> None:
    """`printed` is `expected`, line for line, where a `...` line stands for any lines."""
    if numbers_masked:
        expected = [line if line == "..." else masked(line) for line in expected]
        printed = [masked(line) for line in printed]
    chunks, chunk = [], []
    for line in expected:
        if line == "...":
            chunks.append(chunk)
            chunk = []
        else:
            chunk.append(line)
    chunks.append(chunk)
    shown = "\n".join(printed)
    at = 0
    for i, chunk in enumerate(chunks):
        if not chunk:
            continue
        if i == 0:
            assert printed[:len(chunk)] == chunk, "the README shows:\n" + "\n".join(chunk) + f"\nprinted:\n{shown}"
            at = len(chunk)
            continue
        starts = [j for j in range(at, len(printed) - len(chunk) + 1) if printed[j:j + len(chunk)] == chunk]
        assert starts, "the README shows:\n" + "\n".join(chunk) + f"\nnot printed in order:\n{shown}"
        at = starts[0] + len(chunk)
    if chunks[-1]:
        assert at == len(printed), f"printed more than the README shows:\n{shown}"


# ---------------------------------------------------------------------------------------------- tests

def test_every_transcript_has_a_scene():
    commands = [command for command, _ in transcripts()]
    assert sorted(commands) == sorted(SCENES)  # each once: a command names its transcript


def test_the_readme_job_validates(tmp_path):
    """The job file the README's first screen shows is a job validate accepts (its builder is the user's)."""
    (tmp_path / "job.yaml").write_text(yaml_block_before("| verb | what it does |"))
    proc = tpulaunch(["validate", "--static", "job.yaml"], tmp_path)
    assert proc.returncode == 0 and proc.stdout.startswith("OK job.yaml"), proc.stdout


def test_the_docs_links_lead_to_pages_that_exist():
    for page in DOCS:
        for target in re.findall(r"\]\(([^)#:]+\.md)(?:#[^)]*)?\)", (REPO / page).read_text()):
            assert (REPO / page).parent.joinpath(target).is_file(), f"{page} links to {target}"


# The quickstart's training transcript first: the bench transcript then compares with the run it recorded.
ORDER = sorted(SCENES, key=lambda command: command.startswith("tpulaunch data bench "))


@pytest.mark.parametrize("command", ORDER)
def test_the_readme_transcript_runs_as_shown(command, request):
    expected = dict(transcripts())[command]
    cwd = scene_dir(SCENES[command], request)
    if command.startswith("tpulaunch train "):  # the README's run starts from nothing
        shutil.rmtree(cwd / "runs", ignore_errors=True)
    if command == "tpulaunch data bench configs/quickstart.yaml" and not (cwd / "runs" / "quickstart").is_dir():
        tpulaunch(["train", "configs/quickstart.yaml"], cwd, check=True)  # it compares with the recorded run
    # What the README ran before it, unless the transcript of that command (earlier in ORDER, same scene) left it.
    after_training = ("tpulaunch export mnist.yaml exported", "tpulaunch explain mnist.yaml -o mnist_program.py",
                      "python mnist_program.py evaluate 2>/dev/null")
    if command in after_training and not (cwd / "runs" / "mnist" / "checkpoint").is_file():
        tpulaunch(["train", "mnist.yaml"], cwd, check=True)
    if command == "python mnist_program.py evaluate 2>/dev/null" and not (cwd / "mnist_program.py").is_file():
        tpulaunch(["explain", "mnist.yaml", "-o", "mnist_program.py"], cwd, check=True)
    proc = run_command(command, cwd)
    ok = not any(re.search(r"\d+ errors?, ", line) for line in expected)
    assert (proc.returncode == 0) == ok, proc.stdout
    printed = proc.stdout.replace(str(cwd), "/tmp/mnist" if SCENES[command] == OWN_PROGRAM else "/work/main")
    printed = printed.replace(str(REPO), "/work/main")
    printed_lines = [line.rstrip() for line in printed.rstrip("\n").splitlines()]  # tables pad their rows
    assert_shows(expected, printed_lines, numbers_masked=command.startswith(RUNS))
