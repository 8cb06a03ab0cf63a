"""`validate`'s flag check: every key under `flags:` is a flag the job's modules define, and takes its value.

The same code as a run uses (`job.flags.set_flags`), so validate leaves the flags set
as the run will see them: the model and input checks that follow call the job's functions with them.
"""

from __future__ import annotations

from typing import Sequence

from tpulaunch.job.load import LoadedJob


def flag_problems(loaded: LoadedJob, search_path: Sequence[str] = ()) -> list:
    """Unknown flags (did-you-mean), values their flag does not parse, failing flag validators; located."""
    model, data = loaded.section("model"), loaded.section("data")
    if model is None or data is None or not loaded.usable("flags"):
        return []
    from tpulaunch.job.flags import set_flags

    run = loaded.section("run") if loaded.usable("run") else None
    findings = set_flags(model, data, loaded.section("flags") or {}, search_path, strict=False,
                         model_dir=run.model_dir if run is not None else None)
    return [loaded.problem(f.path, f.code, f.message, f.hint, at_key=f.code == "flag-unknown") for f in findings]
