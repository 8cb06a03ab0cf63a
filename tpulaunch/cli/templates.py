"""Starter job files for `tpulaunch init`, shipped inside the package."""

from __future__ import annotations

import os

EXAMPLES = ("quickstart", "unet3d", "retinanet")
_HERE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "templates")


def template_text(example: str) -> str:
    if example not in EXAMPLES:
        raise ValueError(f"unknown example {example!r}; one of {', '.join(EXAMPLES)}")
    with open(os.path.join(_HERE, f"{example}.yaml"), encoding="utf-8") as handle:
        return handle.read()
