"""A run's lease on model_dir from its first write to its end (`lease.py` is the lease itself): taken before
anything is written or the framework loads, renewed while the run goes on, released however it ends, and each
change said as it happens (`say`, one line each)."""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator, Optional

from tpulaunch.errors import first_line
from tpulaunch.run import lease as leases
from tpulaunch.run.freeze_points import LEASE_TAKEN, freeze_point
from tpulaunch.run.signals import deferred
from tpulaunch.run.stop_deadline import Ending
from tpulaunch.run.workers import is_chief_worker
from tpulaunch.store import reason


@contextlib.contextmanager
def held_lease(model_dir: str, command: str, *, take: bool, say: Callable[[str], None]) -> Iterator[Optional[object]]:
    """The run's lease on `model_dir` (`leases.Lease`) for the block; None for a worker that is not the chief (the
    chief holds it for all).

    A takeover is said before the run's first line. A lease lost to another run during this one is said at once;
    the engines stop before their next write to model_dir (`lease.ensure_held`, `lease.raise_if_lost`) and the
    run ends with `LeaseLost` (exit 5), naming the new holder. Taking and releasing the lease are never cut in
    half by a signal (`signals.deferred`): it is acted on when the change is written."""
    if not is_chief_worker():
        yield None
        return

    def lost(now_holder: dict) -> None:
        say(f"lease | lost: {leases.holder_text(now_holder)} took run.model_dir {model_dir} over while this "
            "run held it; this run writes nothing more there")

    def unreachable(since: float, exc: BaseException) -> None:  # said once, however long it lasts
        say(f"lease | cannot reach the lease {leases.lease_path(model_dir)} since {leases.clock_text(since)} "
            f"({reason(exc)}); retrying: the run holds off writing to model_dir until it can tell its lease is "
            f"still its own, up to the lease's stale time ({lease.stale_after_s:g} s)")

    def reachable(since: float, seconds: float) -> None:
        say(f"lease | reachable again after {leases.age_text(seconds)} (unreachable since {leases.clock_text(since)}); "
            "the lease is still this run's")

    def release(forced=None) -> None:
        try:
            lease.release()
        except Exception as exc:  # left held, it goes stale: the next run takes it over
            say(f"lease | not released ({type(exc).__name__}: {first_line(exc)}); it goes stale after "
                f"{lease.stale_after_s:g} s")

    lease, ending = None, None
    try:
        # A signal here is raised once the lease is taken and the run record's block runs (it records the stop);
        # the `finally` below releases the lease (or, when the run's step does not return after a signal, the
        # forced stop does: `stop_deadline.py`).
        with deferred(until_recorded=True):
            lease = leases.acquire(model_dir, run_id=leases.new_run_id(), command=command, take=take)
            freeze_point(LEASE_TAKEN)  # a rehearsal's freeze, the lease written and nothing else yet
            ending = Ending(release)
            lease.on_unreachable, lease.on_reachable = unreachable, reachable
            lease.start_renewing(on_lost=lost)
        took = lease.took_over
        if took:
            why = ("at once (--take-lease)" if took["forced"] else
                   "its holder's process on this host is no longer running" if took.get("gone") else
                   f"its holder stopped renewing it (stale after {lease.stale_after_s:g} s)")
            say(f"lease | took over run.model_dir {model_dir} from {leases.holder_text(took)}, last renewed "
                f"{leases.age_text(took['renewed_s_ago'])} ago: {why}")
        yield lease
    finally:
        if ending is not None:
            with deferred():
                ending()
    if lease.lost is not None:  # after its last write (its record checked the lease): nothing of it is mixed
        say(f"lease | {leases.holder_text(lease.lost)} took run.model_dir {model_dir} over as this run ended, "
            "after its last write there")
