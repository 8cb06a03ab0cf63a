"""The startup script a `tpulaunch run` TPU VM runs on every host when it boots: `startup.sh` (the one template)
with the stage's places and what to install filled in, and `boot_tools.py` (what it does in Python before anything
is installed) written into it. The same script on every VM of a run (a recreated one too): what differs per VM
(its number in the run) and per host (its worker number) it reads from the metadata.
"""

from __future__ import annotations

import os
import shlex
from typing import Optional, Sequence

from tpulaunch.remote import layout
from tpulaunch.remote.stage import Stage

HERE = os.path.dirname(os.path.abspath(__file__))
TEMPLATE = os.path.join(HERE, "startup.sh")
BOOT_TOOLS = os.path.join(HERE, "boot_tools.py")


def startup_script(stage: Stage, *, rehearsal_python: Optional[str] = None) -> str:
    """The script for `stage`; `rehearsal_python` (a rehearsal) reuses this machine's Python instead of a venv.
    Without it (a TPU VM, or `rehearse --install`) the hosts install the stage's requirements, which must be named."""
    if rehearsal_python is None and not stage.manifest["install"]["requirements"]:
        from tpulaunch.errors import ExitCode, TpuLaunchError

        raise TpuLaunchError("tpulaunch's package metadata is missing here, so the hosts cannot be told what to "
                             "install", hint="install tpulaunch with pip (pip install -e . in a checkout)",
                             exit_code=ExitCode.PROBLEMS)
    return render(stage=stage.url, package=stage.blob_url(stage.manifest["tpulaunch"]["blob"]),
                  model_dir=stage.model_dir, requirements=_requirements(stage, rehearsal_python),
                  rehearsal_python=rehearsal_python)


def render(*, stage: str, package: str, model_dir: str, requirements: Sequence[str],
           rehearsal_python: Optional[str] = None) -> str:
    """The template filled in: the stage's manifest and tpulaunch's package (their URLs), the run's model_dir,
    what to install."""
    with open(TEMPLATE) as handle:
        text = handle.read()
    with open(BOOT_TOOLS) as handle:
        tools = handle.read()
    values = {
        "@STAGE@": shlex.quote(stage),
        "@PACKAGE@": shlex.quote(package),
        "@ATTEMPTS@": shlex.quote(layout.attempts(model_dir)),
        "@WHEELHOUSE@": shlex.quote(layout.wheelhouse(model_dir)),
        "@PYTHON@": shlex.quote(rehearsal_python or ""),
        "@REQUIREMENTS@": " ".join(shlex.quote(r) for r in requirements),
    }
    for key, value in values.items():
        text = text.replace(key, value)
    return text.replace("@BOOT_TOOLS@\n", tools)  # last: its text is not the template's to fill


def _requirements(stage: Stage, rehearsal_python: Optional[str]):
    """What the VM installs; a rehearsal installs nothing and checks that this machine's Python has tpulaunch's own
    requirements (the engine's extra is a TPU image's: its VM trains on this CPU with what is installed here)."""
    if rehearsal_python is None:
        return stage.manifest["install"]["requirements"]
    from tpulaunch.remote.stage import install_requirements

    return install_requirements("") or []
