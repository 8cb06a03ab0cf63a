"""Every extra's resolution, as pip's own resolver gave it against the package index on this Python
(requirements/extras-resolved.json, written by requirements/resolve_extras.py), checked without the network:
it answers setup.cfg as it is now, each resolution is complete and consistent (every requirement of every
package met by the versions chosen, for this Python), and [keras-tpu] is a TensorFlow that can drive a TPU:
tensorflow-tpu with libtpu, no `tensorflow` or tf-keras wheel beside it (one `tensorflow` folder, one owner).
`.ci/run` installs [cpu] and [keras] from the index itself, which proves those two still resolve today."""

import json
import os
import platform
import sys

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

from paths import REPO
from tpulaunch.tpu import stack

ROOT = str(REPO)
sys.path.insert(0, os.path.join(ROOT, "requirements"))
import resolve_extras  # noqa: E402  (the script that writes the record reads setup.cfg the same way)

REFRESH = "run `python requirements/resolve_extras.py` and commit requirements/extras-resolved.json"


@pytest.fixture(scope="module")
def record() -> dict:
    with open(resolve_extras.RECORD, encoding="utf-8") as file:
        return json.load(file)


def pins_of(record: dict, extra: str) -> dict:
    return dict(pin.split("==", 1) for pin in record["extras"][extra])


def unmet(record: dict, extra: str) -> list:
    """Walks the requirements from `tpulaunch[extra]` through the recorded packages, with each requested extra,
    and says which requirement no chosen version meets (and which chosen package nothing asked for)."""
    pins = pins_of(record, extra)
    env = default_environment()
    env.update(python_version=".".join(record["python"].split(".")[:2]), python_full_version=record["python"])
    declared = record["declared"]
    own = declared["install_requires"] + [f"{line.split(';')[0]}; {line.split(';')[1]} and extra == '{extra}'"
                                          if ";" in line else f"{line}; extra == '{extra}'"
                                          for line in declared["extras"][extra]]
    problems, seen, queue = [], set(), [("tpulaunch", frozenset({extra}))]
    while queue:
        name, extras = queue.pop()
        if (name, extras) in seen:
            continue
        seen.add((name, extras))
        if name == "tpulaunch":
            requires = own
        else:
            package = record["packages"][f"{name}=={pins[name]}"]
            requires = package["requires_dist"] or []
            if package["requires_python"] and not SpecifierSet(package["requires_python"]).contains(record["python"]):
                problems.append(f"{name}=={pins[name]} needs Python {package['requires_python']}")
        for text in requires:
            need = Requirement(text)
            if need.marker and not any(need.marker.evaluate({**env, "extra": e}) for e in {"", *extras}):
                continue
            dep = canonicalize_name(need.name)
            if dep not in pins:
                problems.append(f"{name} needs {text}: not in the resolution")
            elif not need.specifier.contains(pins[dep], prereleases=True):
                problems.append(f"{name} needs {text}: {dep}=={pins[dep]} chosen")
            else:
                queue.append((dep, frozenset(need.extras)))
    stray = set(pins) - {name for name, _ in seen}
    return problems + [f"{name} chosen, asked for by nothing" for name in sorted(stray)]


def test_the_record_answers_setup_cfg_as_it_is_now_on_this_python(record):
    assert record["declared"] == resolve_extras.declared(), f"setup.cfg's requirements changed: {REFRESH}"
    assert record["python"].split(".")[:2] == list(platform.python_version_tuple()[:2]), REFRESH
    assert set(record["extras"]) >= {"cpu", "tpu", "keras", "keras-tpu", "jax", "jax-tpu", "test"}


@pytest.mark.parametrize("extra", ["cpu", "tpu", "keras", "keras-tpu", "jax", "jax-tpu", "test"])
def test_each_resolution_is_complete_and_consistent(record, extra):
    assert unmet(record, extra) == []


def test_the_walk_finds_a_requirement_no_chosen_version_meets(record):
    broken = json.loads(json.dumps(record))
    broken["extras"]["keras-tpu"] = [pin for pin in broken["extras"]["keras-tpu"] if not pin.startswith("libtpu==")]
    assert any("libtpu" in problem and "not in the resolution" in problem for problem in unmet(broken, "keras-tpu"))
    # numpy 2 (resolved for [keras-tpu]) where the estimator's TensorFlow 2.15 needs numpy < 2
    broken["extras"]["cpu"] = ["numpy==2.1.3" if pin.startswith("numpy==") else pin for pin in broken["extras"]["cpu"]]
    assert any("numpy" in problem and "chosen" in problem for problem in unmet(broken, "cpu"))


def test_keras_tpu_is_a_tpu_build_and_the_stack_rule_says_so(record):
    tpu_build, keras, cpu = (pins_of(record, extra) for extra in ("keras-tpu", "keras", "cpu"))
    assert tpu_build["tensorflow-tpu"] == "2.19.1"
    assert "libtpu" in tpu_build
    assert not {"tensorflow", "tensorflow-cpu", "tf-keras"} & set(tpu_build)
    assert stack.version_tuple(keras["tensorflow"]) >= (2, 16)
    # The same verdict `up` and `status` give this machine, fed the resolution instead of the installed metadata.
    assert stack.installed_verdict(tpu_build, "pjrt") is None
    assert stack.installed_verdict(keras, "pjrt").code == "tensorflow-without-tpu"
    assert stack.installed_verdict(cpu, "se") is None  # TPUEstimator: the node's TensorFlow runs it


def test_jax_tpu_is_jax_with_libtpu_beside_a_tensorflow_without_a_tpu_runtime(record):
    from tpulaunch.engine.jax import stack as jax_stack

    tpu_build, here = pins_of(record, "jax-tpu"), pins_of(record, "jax")
    assert "libtpu" in tpu_build and tpu_build["jax"] == tpu_build["jaxlib"]
    # tf.data and the checkpoints only: TensorFlow's CPU wheel, nothing of TensorFlow's that would load libtpu
    assert "tensorflow-cpu" in tpu_build and not {"tensorflow", "tensorflow-tpu", "tf-keras"} & set(tpu_build)
    # The verdict validate gives this machine's JAX, fed the resolutions instead of the installed metadata.
    assert jax_stack.installed_verdict(tpu_build, "pjrt") is None
    assert jax_stack.installed_verdict(here, "pjrt").code == "jax-without-tpu"


def test_a_jax_jobs_tpu_vm_is_told_to_install_the_jax_tpu_extra_and_a_missing_extra_is_refused():
    """What `run`'s stage tells the VM to install (`stage.install_requirements`), from this installation's metadata."""
    from tpulaunch.errors import TpuLaunchError
    from tpulaunch.remote.stage import install_requirements
    from tpulaunch.seam.registry import about

    wanted = install_requirements(about("jax").on_tpu.extra, strict=True)
    assert "jax[tpu]>=0.4" in wanted and "tensorflow-cpu>=2.16" in wanted and "keras>=3" in wanted
    assert not any(line.startswith(("tensorflow>", "tf-keras", "jax[cpu]")) for line in wanted)
    with pytest.raises(TpuLaunchError, match=r"tpulaunch metadata has no \[no-such-extra\] extra") as refused:
        install_requirements("no-such-extra", strict=True)
    assert refused.value.hint.startswith("reinstall tpulaunch")
