"""Every extra resolves against the package index with this machine's Python (pip's own resolver, --dry-run),
and [keras-tpu] resolves to a TensorFlow that can drive a TPU: tensorflow-tpu with libtpu, no `tensorflow`
or tf-keras wheel beside it (one `tensorflow` folder, one owner)."""

import configparser
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tpulaunch.tpu import stack

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def extras() -> list:
    config = configparser.ConfigParser()
    config.read(os.path.join(ROOT, "setup.cfg"))
    return sorted(config["options.extras_require"])


# What pip prints when it could not read the index (a proxy refusing a page, no network): pip then resolves
# from the local wheels alone, and "no matching distribution" says nothing about the extras.
UNREACHABLE = ("ProxyError", "Cannot connect to proxy", "NewConnectionError", "Could not fetch URL",
               "Read timed out", "Temporary failure in name resolution")


def resolve(extra: str, tmp_dir) -> dict:
    """What pip resolves `.[extra]` to (name -> version). An index that could not be read is asked again, after a
    growing pause (pip's own retries give up on a proxy's refusal at once); still unread, the test fails saying
    so: `.ci/run` installs from that index, so this test runs wherever CI does."""
    report = os.path.join(tmp_dir, f"{extra}.json")
    for pause in (0, 10, 30, 60):  # a proxy that refused a page may serve it a little later
        time.sleep(pause)
        done = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--ignore-installed",
                               "--retries", "2", "--timeout", "30", "--report", report, f".[{extra}]"],
                              cwd=ROOT, capture_output=True, text=True, timeout=900)
        unread = [line.strip() for line in done.stderr.splitlines() if any(sign in line for sign in UNREACHABLE)]
        if done.returncode == 0 or not unread:
            break
    assert not (done.returncode and unread), f"[{extra}]: the package index could not be read: {unread[-1]}"
    assert done.returncode == 0, done.stderr[-3000:]
    with open(report, encoding="utf-8") as file:
        installs = json.load(file)["install"]
    return {item["metadata"]["name"].lower().replace("_", "-"): item["metadata"]["version"] for item in installs}


@pytest.fixture(scope="module")
def resolved(tmp_path_factory):
    tmp_dir = str(tmp_path_factory.mktemp("pip-reports"))
    names = extras()
    with ThreadPoolExecutor(max_workers=3) as pool:
        return dict(zip(names, pool.map(lambda extra: resolve(extra, tmp_dir), names)))


def test_every_extra_resolves_and_keras_tpu_is_a_tpu_build(resolved):
    assert set(resolved) >= {"cpu", "tpu", "keras", "keras-tpu", "test"}
    for extra, found in resolved.items():
        assert "tpulaunch" in found, extra
    tpu_build = resolved["keras-tpu"]
    assert tpu_build["tensorflow-tpu"] == "2.19.1"
    assert "libtpu" in tpu_build
    assert not {"tensorflow", "tensorflow-cpu", "tf-keras"} & set(tpu_build)
    assert stack.version_tuple(resolved["keras"]["tensorflow"]) >= (2, 16)
    # The same verdict `up` and `status` give this machine, fed the resolution instead of the installed metadata.
    assert stack.installed_verdict(tpu_build, "pjrt") is None
    assert stack.installed_verdict(resolved["keras"], "pjrt").code == "tensorflow-without-tpu"
    assert stack.installed_verdict(resolved["cpu"], "se") is None  # TPUEstimator: the node's TensorFlow runs it
