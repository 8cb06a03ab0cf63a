"""What `tpulaunch explain` does: the job checked under the engine's rules, as `train` would check it on that engine,
the engine's standalone program for it, and the program written as an executable file."""

from __future__ import annotations

import dataclasses
import os
from typing import Optional, Sequence

from tpulaunch.errors import TpuLaunchError


def program(job_file: str, overrides: Sequence[str], engine: Optional[str] = None) -> str:
    """The program of `engine` (None: the job's own) for the job; a job with keys only another engine runs is
    refused naming them."""
    from tpulaunch.app.gate import JobRefused, load_checked

    # The job is checked under the engine's rules, as `tpulaunch train` would check it on that engine.
    sets = [*overrides, f"run.engine={engine}"] if engine else list(overrides)
    try:
        checked = load_checked(job_file, sets, verb="explaining")
    except JobRefused as exc:
        if engine:
            _refuse_other_engines_keys(job_file, engine, exc)
        raise
    return checked.engine.program(checked.loaded, checked.plan)


def write_program(path: str, script: str) -> None:
    """The program written to `path`, executable as `chmod +x` makes it."""
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(script)
    _make_executable(path)


def _make_executable(path: str) -> None:
    """`chmod +x` as the shell does it: executable where the umask lets a new file be (0700 under umask 077,
    0755 under 022), never opened wider than the umask would make it."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, os.stat(path).st_mode | (0o111 & ~umask))


def _refuse_other_engines_keys(job_file: str, engine: str, refused: TpuLaunchError) -> None:
    """--engine ENGINE on a job with keys only another engine runs (`EngineAbout.own_keys`: TPUEstimator's own
    functions): those keys, what to do, exit 1."""
    from tpulaunch.checks.engine_rules import owner_of

    owners = {id(p): owner_of(p) for p in refused.problems}
    only = [p for p in refused.problems if owners[id(p)]]
    if not only:
        return
    problems = [dataclasses.replace(p, hint=f"explain it with --engine {owners[id(p)][0]} (its program), or "
                                            f"{owners[id(p)][1].instead}") if owners[id(p)] else p
                for p in refused.problems]
    keys = " and ".join(p.path for p in only)
    owner = owners[id(only[0])][0]
    raise TpuLaunchError(
        f"no {engine} program for {job_file}: {keys} {'is' if len(only) == 1 else 'are'} the {owner} engine's own "
        "(only it runs them)",
        hint=f"drop --engine {engine} (or use --engine {owner}) for the {owner} engine's program", problems=problems)
