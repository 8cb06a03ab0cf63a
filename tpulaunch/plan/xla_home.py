"""Where XLA's TPU compiler lives: a Python environment of its own with jax and libtpu (`requirements/xla.txt`).

jax with libtpu needs numpy 2; TensorFlow 2.15 (the estimator engine) pins numpy below 2, so the compiler
cannot share its environment. tpulaunch runs it as a separate interpreter, found here, and never installs
anything at plan time: without it `plan` and `validate` answer with the analytic estimate and say how to get
XLA's answer.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

# The interpreter of the compiler's environment; "off" (or "") turns asking XLA off.
ENV_VAR = "TPULAUNCH_XLA_PYTHON"
HOME_AS_WRITTEN = "~/.tpulaunch/xla"
DEFAULT_HOME = Path(HOME_AS_WRITTEN).expanduser()
# The versions it was checked on (requirements/xla.txt holds the same pins; tests/estimator/plan/test_xla_tpu.py keeps them so).
PINS = ("jax[tpu]==0.10.2", "jaxlib==0.10.2", "libtpu==0.0.42.1")
INSTALL = (f"python3 -m venv {HOME_AS_WRITTEN} && {HOME_AS_WRITTEN}/bin/pip install "
           + " ".join(f"'{pin}'" for pin in PINS))


def compiler_python() -> Optional[str]:
    """The compiler environment's interpreter: $TPULAUNCH_XLA_PYTHON, else ~/.tpulaunch/xla's; None when there
    is none (or the variable says "off")."""
    named = os.environ.get(ENV_VAR)
    if named is not None:
        if named.strip().lower() in ("", "off", "none", "0"):
            return None
        return named if os.path.isfile(named) else None
    default = DEFAULT_HOME / "bin" / "python"
    return str(default) if default.is_file() else None


def how_to_install() -> str:
    """One line: how to get XLA's own answer."""
    return f"for XLA's own answer (no TPU needed): {INSTALL} (or set {ENV_VAR})"


def not_found_reason() -> str:
    named = os.environ.get(ENV_VAR)
    if named is not None and named.strip().lower() not in ("", "off", "none", "0"):
        return f"{ENV_VAR}={named} is not a file"
    if named is not None:
        return f"asking XLA is off ({ENV_VAR}={named!r})"
    return "XLA's TPU compiler is not installed"


# Where XLA's answers are kept between runs (`plan/xla_tpu.py`): $TPULAUNCH_CACHE, else $XDG_CACHE_HOME/tpulaunch,
# else ~/.cache/tpulaunch; never the job's folder or the repository.
CACHE_ENV_VAR = "TPULAUNCH_CACHE"


def cache_dir() -> Path:
    """The folder XLA's answers are cached in (made when first written)."""
    named = os.environ.get(CACHE_ENV_VAR)
    if named:
        return Path(named).expanduser() / "xla"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path("~/.cache").expanduser())
    return Path(base) / "tpulaunch" / "xla"
