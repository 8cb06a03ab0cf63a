"""Which engine trains a job: `run.engine`, else the one the installed TensorFlow has.

TensorFlow 2.16 removed tf.estimator, so TensorFlow 2.15 and earlier mean the estimator engine
(TPUEstimator) and 2.16 and later the keras engine (Keras 2 from tf-keras + tf.distribute). Read from
what is installed, without importing TensorFlow (the CLI's fast path uses this).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
from typing import Optional, Tuple

ENGINES = ("estimator", "keras")
# The distributions that install the `tensorflow` package.
TENSORFLOW_DISTRIBUTIONS = ("tensorflow", "tensorflow-cpu", "tensorflow-tpu", "tensorflow-macos", "tf-nightly")
FIRST_WITHOUT_ESTIMATOR = (2, 16)

INSTALL_HINT = {
    "estimator": "pip install 'tpulaunch[cpu]' (or [tpu]): TensorFlow 2.15 with tensorflow-estimator, Python 3.9-3.11",
    "keras": "pip install 'tpulaunch[keras]': current TensorFlow with tf-keras",
}


@functools.lru_cache(maxsize=None)
def installed_tensorflow() -> Optional[Tuple[int, int]]:
    """(major, minor) of the installed TensorFlow, or None when there is none.

    Read from the `*.dist-info` folder beside the `tensorflow` package, found without importing it:
    `importlib.metadata` alone costs more than the rest of `validate --static`'s imports together.
    """
    origin = _package_dir("tensorflow")
    if origin is None:
        return None
    names = {name.replace("-", "_") for name in TENSORFLOW_DISTRIBUTIONS}
    for entry in sorted(os.listdir(os.path.dirname(origin))):
        match = _DIST_INFO.match(entry)
        if match and match.group(1).lower() in names:
            return int(match.group(2)), int(match.group(3))
    return None


_DIST_INFO = re.compile(r"^([A-Za-z0-9_.]+)-(\d+)\.(\d+)[^-]*\.dist-info$")


def _package_dir(name: str) -> Optional[str]:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def _installed(package: str) -> bool:
    return importlib.util.find_spec(package) is not None


def default_engine() -> str:
    """The engine the installed TensorFlow has (estimator when none is installed: `validate --static` then
    checks a job for TPUEstimator unless it pins run.engine)."""
    version = installed_tensorflow()
    return "keras" if version is not None and version >= FIRST_WITHOUT_ESTIMATOR else "estimator"


def engine_name(run_section) -> str:
    """The engine for a job's `run:` section (None: the default)."""
    chosen = getattr(run_section, "engine", None)
    return chosen or default_engine()


def missing_for(engine: str) -> Optional[str]:
    """Why this machine cannot run `engine`, or None when it can."""
    version = installed_tensorflow()
    if version is None:
        return "TensorFlow is not installed"
    shown = f"{version[0]}.{version[1]}"
    if engine == "estimator":
        if version >= FIRST_WITHOUT_ESTIMATOR:
            return f"the estimator engine needs TensorFlow 2.15 or earlier (tf.estimator); TensorFlow {shown} is installed"
        if not _installed("tensorflow_estimator"):
            return "the estimator engine needs tensorflow-estimator, which is not installed"
        return None
    if version < FIRST_WITHOUT_ESTIMATOR:
        return f"the keras engine needs TensorFlow 2.16 or later; TensorFlow {shown} is installed"
    if not _installed("tf_keras"):
        return "the keras engine needs tf-keras (Keras 2), which is not installed"
    return None
