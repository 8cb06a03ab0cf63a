"""A `tpulaunch` process exits without the garbage collector's walk over what it still holds (seconds of every
TensorFlow process's exit: benchmarks/exit_time.py), and loses nothing for it: the walk is spared by `gc.freeze()`
run first among the exit handlers, and every other handler still runs after it, every file still reaches its disk."""

import subprocess
import sys

from paths import REPO

# An exit handler registered before the CLI's runs after it (last registered, first run), and a file left open with
# its text in Python's buffer, as a careless module leaves one: both must be seen through at exit.
PROCESS = """
import atexit, gc, sys
atexit.register(lambda: open(sys.argv[1], "w").write(f"frozen {gc.get_freeze_count()}"))
left_open = open(sys.argv[2], "w")
left_open.write("buffered, never flushed by hand")
from tpulaunch.cli.app import main
main(["schema"])
"""


def test_the_collector_is_spared_at_exit_and_every_handler_and_buffered_file_still_finishes(tmp_path):
    handler, buffered = tmp_path / "handler.txt", tmp_path / "buffered.txt"
    done = subprocess.run([sys.executable, "-c", PROCESS, str(handler), str(buffered)], capture_output=True,
                          text=True, cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, timeout=60)
    assert done.returncode == 0, done.stderr
    assert '"run"' in done.stdout  # the schema, printed as ever
    frozen = int(handler.read_text().split()[1])
    assert frozen > 0, "the CLI's exit handler did not run before the others"
    assert buffered.read_text() == "buffered, never flushed by hand"
