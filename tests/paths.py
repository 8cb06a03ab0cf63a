"""Where the suite's files are, for a test module in any folder of tests/."""

from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
MODELS = TESTS / "models"  # the user-written models of the corpus
PROGRAMS = TESTS / "programs"  # the unmodified reference programs
BENCHMARKS = REPO / "benchmarks"
