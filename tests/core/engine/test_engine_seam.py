"""Every engine the registry lists takes what the verbs pass (`seam/engine.py`'s Engine): the same methods with the
same keyword options, so the CLI calls each engine the same way. Only the engines' classes are imported (no
framework)."""

import inspect

import pytest

from tpulaunch.seam.about import load_attribute
from tpulaunch.seam.engine import Engine
from tpulaunch.seam.registry import about, names

METHODS = [name for name, member in vars(Engine).items() if inspect.isfunction(member) and not name.startswith("_")]


def _parameters(function) -> list:
    return [(p.name, p.kind) for p in inspect.signature(function).parameters.values()]


@pytest.mark.parametrize("engine", names())
def test_each_engine_takes_every_option_the_verbs_pass(engine):
    implementation = load_attribute(about(engine).engine)
    assert implementation.name == engine
    for method in METHODS:
        assert _parameters(getattr(implementation, method)) == _parameters(getattr(Engine, method)), method
