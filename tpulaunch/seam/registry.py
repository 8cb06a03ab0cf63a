"""The engines, by name: the one place that lists them. Each engine is a folder under engine/ whose
about.py declares what it is and can do (`EngineAbout`, read without its library); a new engine is a folder
and one line in ENGINES. Everything else asks an engine's `about` instead of testing its name.

Which engine trains a job: its `run.engine`, else the first engine here whose framework is installed in a
version it runs on (TensorFlow 2.15 and earlier: estimator; 2.16, which removed tf.estimator, and later:
keras; none at all: the first, so `validate --static` checks for it unless the job pins one).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Optional, Tuple

from tpulaunch.seam.about import EngineAbout, load_attribute
from tpulaunch.seam.installed import installed_module, installed_version

if TYPE_CHECKING:
    from tpulaunch.seam.engine import Engine

ENGINES = {
    "estimator": "tpulaunch.engine.estimator.about:ABOUT",
    "keras": "tpulaunch.engine.keras.about:ABOUT",
    "jax": "tpulaunch.engine.jax.about:ABOUT",
}


def names() -> Tuple[str, ...]:
    return tuple(ENGINES)


@functools.lru_cache(maxsize=None)
def about(name: str) -> EngineAbout:
    """What engine `name` is and can do (KeyError for a name that is not an engine)."""
    return load_attribute(ENGINES[name])


def engine(name: str) -> Engine:
    """Engine `name`'s implementation (imports its module; its library itself is loaded by `Engine.load`)."""
    return load_attribute(about(name).engine)()


def runs_on(name: str, version: Optional[Tuple[int, int]]) -> bool:
    """Engine `name` runs on version `version` of its framework (None: not installed)."""
    first, first_without = about(name).versions
    return version is not None and (first is None or version >= first) and (first_without is None or version < first_without)


def installed(name: str) -> Optional[Tuple[int, int]]:
    """The version of engine `name`'s framework installed here (None: not installed)."""
    return installed_version(about(name).framework)


def runnable(name: str) -> bool:
    """This machine has engine `name`'s framework in a version it runs on."""
    return runs_on(name, installed(name))


def default_name() -> str:
    """The first engine this machine's installed framework runs (the first engine when none fits)."""
    return next((name for name in ENGINES if runnable(name)), next(iter(ENGINES)))


def engine_for(job) -> Engine:
    """The engine that runs `job`: its `run.engine`, else the one the installed framework has."""
    return engine(engine_name(job.run))


def engine_name(run_section) -> str:
    """The engine for a job's `run:` section (None: the default)."""
    return getattr(run_section, "engine", None) or default_name()


def missing_for(name: str) -> Optional[str]:
    """Why this machine cannot run engine `name`, or None when it can."""
    framework = about(name).framework
    version = installed(name)
    if version is None:
        return f"{framework.name} is not installed"
    if not runs_on(name, version):
        first, first_without = about(name).versions
        needs = (f"{framework.name} {first[0]}.{first[1]} or later" if first_without is None
                 else f"{framework.name} before {first_without[0]}.{first_without[1]}")
        return f"the {about(name).display} needs {needs}; {framework.name} {version[0]}.{version[1]} is installed"
    for module, what in about(name).packages:
        if not installed_module(module):
            return f"the {about(name).display} needs {what}, which is not installed"
    return None


def require(name: str) -> None:
    """Raise (before anything is built or written) when this machine cannot run engine `name`."""
    missing = missing_for(name)
    if missing:
        from tpulaunch.errors import TpuLaunchError

        others = ", ".join(other for other in ENGINES if other != name)
        raise TpuLaunchError(f"run.engine is {name}, but {missing}",
                             hint=f"{about(name).install_hint}; or set run.engine: {others}")


def set_environment() -> None:
    """Before any framework is imported: what the engines this machine runs need in the environment (the keras
    engine's TF_USE_LEGACY_KERAS, which TensorFlow 2.15 would misread: set only where it runs, and where tf-keras,
    which it names, is installed: `EngineAbout.environment_needs`)."""
    import os

    for name in ENGINES:
        needs = about(name).environment_needs
        if runnable(name) and (needs is None or installed_module(needs)):
            for key, value in about(name).environment.items():
                os.environ.setdefault(key, value)
