"""The startup script a `tpulaunch run` TPU VM runs on every host when it boots: `startup.sh` (the one template)
with the stage's places and what to install filled in. The same script on every VM of a run (a recreated one
too): what differs per VM (its number in the run) and per host (its worker number) it reads from the metadata.
"""

from __future__ import annotations

import os
import shlex
from typing import Optional

from tpulaunch.remote import layout
from tpulaunch.remote.stage import Stage

TEMPLATE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "startup.sh")


def startup_script(stage: Stage, *, rehearsal_python: Optional[str] = None) -> str:
    """The script for `stage`; `rehearsal_python` (a rehearsal) reuses this machine's Python instead of a venv."""
    with open(TEMPLATE) as handle:
        text = handle.read()
    values = {
        "@STAGE@": shlex.quote(stage.url),
        "@PACKAGE@": shlex.quote(stage.blob_url(stage.manifest["tpulaunch"]["blob"])),
        "@ATTEMPTS@": shlex.quote(layout.attempts(stage.model_dir)),
        "@PYTHON@": shlex.quote(rehearsal_python or ""),
        "@REQUIREMENTS@": " ".join(shlex.quote(r) for r in _requirements(stage, rehearsal_python)),
    }
    for key, value in values.items():
        text = text.replace(key, value)
    return text


def _requirements(stage: Stage, rehearsal_python: Optional[str]):
    """What the VM installs; a rehearsal installs nothing and checks that this machine's Python has tpulaunch's own
    requirements (the engine's extra is a TPU image's: its VM trains on this CPU with what is installed here)."""
    if rehearsal_python is None:
        return stage.manifest["install"]["requirements"]
    from tpulaunch.remote.stage import install_requirements

    return install_requirements("") or []
