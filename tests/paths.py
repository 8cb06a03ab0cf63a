"""Where the suite's files are, for a test module in any folder of tests/."""

import os

from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
MODELS = TESTS / "models"  # the user-written models of the corpus
PROGRAMS = TESTS / "programs"  # the unmodified reference programs
BENCHMARKS = REPO / "benchmarks"
# XLA's TPU compiler (jax with libtpu), in an environment of its own made by the `xla` session (noxfile.py) from
# requirements/xla.txt; the sessions that test `plan`'s XLA answer name it in $TPULAUNCH_SUITE_XLA_PYTHON.
SUITE_XLA_PYTHON = os.environ.get("TPULAUNCH_SUITE_XLA_PYTHON") or str(REPO / ".venv-xla" / "bin" / "python")
