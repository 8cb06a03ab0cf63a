"""The suite's sessions. `nox` runs them all (CI runs exactly that), `nox -s estimator` one, `nox -l` lists them;
arguments after `--` go to pytest (`nox -s core -- -k secret -x`).

Each session tests in the environment a user installs for what it tests (setup.cfg's extras), a virtualenv at the
repository root made on the first run and reused while what it is made from (setup.cfg, the requirement files, the
install arguments) is unchanged:

    session     environment   made from                                      tests
    core        .venv-core    .[test]: no TensorFlow                          tests/core
    xla         .venv-xla     requirements/xla.txt (jax + libtpu)             tests/xla
    estimator   .venv         .[cpu,test] + the reference programs' packages  tests/estimator
    keras       .venv-keras   .[keras,jax,test] + KerasHub                     tests/keras_engine
    jax         .venv-keras   (the keras session's: one TensorFlow for both)  tests/jax_engine

Every session but xla also uses XLA's TPU compiler (`plan`'s answer from it, libtpu's own words on a host with no TPU):
the xla session's environment ($TPULAUNCH_SUITE_XLA_PYTHON), made first.
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import shutil
import sys
import tempfile
from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent
nox.options.sessions = ["core", "xla", "estimator", "keras", "jax"]
nox.options.default_venv_backend = "none"  # the environments below are made and kept by `_environment`
nox.options.error_on_missing_interpreters = True

# --durations: each session's slowest tests, where a contributor (and CI's log) sees where the time goes
PYTEST = ("-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "auto", "--dist", "loadfile", "--durations", "15")
XLA = (("-r", "requirements/xla.txt", "pytest"),)
KERAS = (("-e", ".[keras,jax,test]", "-r", "tests/keras_engine/requirements.txt"),)


def _install(python: Path) -> tuple:
    """The command that installs into the environment of `python`: uv (the README's test command installs it beside
    nox), which fetches and unpacks in parallel (the estimator's environment: 7 s, where pip took 74 s with its cache
    warm), else that environment's own pip. Both resolve the same pins from the same index; the environment keeps its
    own pip, which the tests that run pip (a TPU VM's startup script) use."""
    uv = Path(sys.executable).parent / "uv"
    if uv.is_file():
        return str(uv), "pip", "install", "--python", str(python)
    return str(python), "-m", "pip", "install"


def _environment(session: nox.Session, name: str, installs: tuple) -> str:
    """The virtualenv `name` at the repository root with each of `installs` (pip install's arguments) done in it: made
    when missing, installed again when what it is made from changed since (a stamp of those files and arguments),
    else used as it is. Returns its Python."""
    venv = ROOT / name
    python = venv / "bin" / "python"
    made_from = [ROOT / "setup.cfg"] + [ROOT / arg for step in installs for arg in step if arg.endswith(".txt")]
    stamp = hashlib.sha256(repr(installs).encode() + b"".join(path.read_bytes() for path in made_from)).hexdigest()
    stamp_file = venv / ".suite-stamp"
    if not python.exists():
        session.run("python3", "-m", "venv", str(venv), external=True)
    if not stamp_file.exists() or stamp_file.read_text() != stamp:
        for step in installs:
            session.run(*_install(python), "-q", *step, external=True)
        stamp_file.write_text(stamp)
    else:
        session.log(f"{name}: up to date with setup.cfg and its requirement files")
    _spare_exit_collection(venv)
    return str(python)


def _spare_exit_collection(venv: Path) -> None:
    """Every Python process of the environment exits as `tpulaunch` does (`tf_env.skip_collection_at_exit`): without
    the collector's walk over all it holds, seconds of each exit of a process that loaded TensorFlow. The suite
    starts hundreds that `tpulaunch` does not: its workers, Keras's own fit in the oracles, the programs it runs as
    written. A .pth file's import line runs at each start; nothing else about a process changes."""
    for site_packages in venv.glob("lib/python3*/site-packages"):
        (site_packages / "tpulaunch_suite_exit.pth").write_text("import atexit, gc; atexit.register(gc.freeze)\n")


@functools.cache
def _jax_compiles() -> dict:
    """JAX's persistent compilation cache, one per `nox` invocation, shared by the keras and jax sessions' test
    processes and every child they start: the many runs of the same small models compile each step once, not once
    per process (a jax `train` of the quickstart: 14 s to 7.5 s). Compiled executables are keyed by their program,
    so what runs is unchanged; a size limit makes jax lock the cache, so concurrent workers never read a half-written
    entry. Made empty for each invocation, so a session's time never rests on an earlier run's compiles."""
    cache = tempfile.mkdtemp(prefix="tpulaunch-suite-jax-compiles-")
    atexit.register(shutil.rmtree, cache, ignore_errors=True)
    return {"JAX_COMPILATION_CACHE_DIR": cache, "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
            "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0", "JAX_COMPILATION_CACHE_MAX_SIZE": str(4 * 1024 ** 3)}


def _pytest(session: nox.Session, python: str, folder: str, xla: bool = False, jax_compiles: bool = False) -> None:
    env = {"TPULAUNCH_SUITE_XLA_PYTHON": str(ROOT / ".venv-xla" / "bin" / "python")} if xla else {}
    if jax_compiles:
        env.update(_jax_compiles())
    named = any(arg.startswith("tests/") for arg in session.posargs)  # `-- tests/...`: those, not the whole folder
    # The package's and the suite's bytecode, written once here: where PYTHONDONTWRITEBYTECODE is set (as on the
    # machines this suite runs on) each test process and child would otherwise compile again every module it imports
    # (0.17 s of each `train`'s start, in hundreds of processes). compileall writes whatever that variable says.
    session.run(python, "-m", "compileall", "-q", "tpulaunch", "tests", external=True, silent=True)
    session.run(python, *PYTEST, *(() if named else (folder,)), *session.posargs, external=True, env=env)


@nox.session
def core(session: nox.Session) -> None:
    """What runs without TensorFlow: the job file, the static checks, `plan --no-memory`, the CLI's fast path, the
    TPU's lifecycle against the local Cloud TPU API, `run`'s JobSets and startup script."""
    _environment(session, ".venv-xla", XLA)  # libtpu's own words on a host with no TPU (tests/core/cli/test_exit_codes.py)
    _pytest(session, _environment(session, ".venv-core", (("-e", ".[test]"),)), "tests/core", xla=True)


@nox.session
def xla(session: nox.Session) -> None:
    """XLA's TPU compiler (jax with libtpu, compile-only: no TPU) as `plan` drives it, against jax's own compile."""
    python = _environment(session, ".venv-xla", XLA)
    # Its own conftest only: the suite's (tests/conftest.py) brings servers this environment has no packages for.
    session.run(python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--confcutdir", "tests/xla", "tests/xla",
                *session.posargs, external=True, env={"PYTHONPATH": str(ROOT)})


@nox.session
def estimator(session: nox.Session) -> None:
    """The estimator engine under TensorFlow 2.15: TPUEstimator on the CPU, the reference programs, `run` rehearsed."""
    _environment(session, ".venv-xla", XLA)
    python = _environment(session, ".venv", (("-e", ".[cpu,test]"),
                                             ("--no-deps", "-r", "tests/programs/requirements.txt")))
    _pytest(session, python, "tests/estimator", xla=True)


@nox.session
def keras(session: nox.Session) -> None:
    """The keras engine under current TensorFlow with tf-keras."""
    _environment(session, ".venv-xla", XLA)
    _pytest(session, _environment(session, ".venv-keras", KERAS), "tests/keras_engine", xla=True, jax_compiles=True)


@nox.session
def jax(session: nox.Session) -> None:
    """The jax engine (Keras 3 on JAX), in the keras session's environment: `.[jax]` needs current TensorFlow too."""
    _environment(session, ".venv-xla", XLA)
    _pytest(session, _environment(session, ".venv-keras", KERAS), "tests/jax_engine", xla=True, jax_compiles=True)
