"""What XLA's TPU compiler said of the job's step (`MemoryPlan.xla_tpu`), in `plan`'s memory section and in
validate's refusal: one wording for both."""

from __future__ import annotations

GiB = 1024 ** 3


def human_bytes(n: int) -> str:
    """XLA's way: its out-of-memory messages' G is GiB, and so is ours."""
    return f"{n / GiB:.2f} GiB" if n >= GiB / 10 else f"{n / 1024 ** 2:.2f} MiB"


def figures_text(xla: dict) -> str:
    """XLA's per-core figures, or its out-of-memory numbers."""
    where = (f"{xla['topology']}, {xla['partitions']} core(s) per replica, "
             f"{xla['per_replica_batch']} examples per replica")
    if xla.get("dims"):
        where += f", input split {xla['dims']}"
    if not xla["fits"]:
        return (f"XLA's TPU compiler ({where}): does not fit: {xla['message']} "
                f"(needs {human_bytes(xla['required_bytes'])} of {human_bytes(xla['available_bytes'])})")
    parts = ", ".join(f"{name} {human_bytes(xla[name])}" for name in
                      ("arguments", "outputs", "aliased", "temporaries", "generated_code") if xla.get(name))
    cached = "; XLA's answer from the cache" if xla.get("cached") else ""
    return (f"XLA's TPU compiler ({where}): compiled, {human_bytes(xla['per_core_bytes'])} per core at its peak "
            f"({parts}); exported in {xla['export_seconds']} s, compiled in {xla['compile_seconds']} s{cached}")


def nearest_text(nearest: dict) -> str:
    """The largest batch XLA was found to fit among those it compiled: every batch named was compiled."""
    tried = ", ".join(f"{t['per_replica_batch']} {'fits' if t['fits'] else 'does not'} "
                      f"({human_bytes(t['bytes'])})" for t in nearest.get("compiled") or ())
    return (f"{nearest['per_replica_batch']} examples per replica fit (train.batch_size: {nearest['global_batch']}, "
            f"{human_bytes(nearest['per_core_bytes'])} per core): the largest batch compiled that fits, not a bound "
            f"(XLA's memory is not monotonic in the batch); compiled: {tried}")


def lines(memory: dict) -> list:
    """The memory section's lines about XLA's TPU compiler: its answer, or why the estimate answered."""
    xla = memory.get("xla_tpu")
    if not xla:
        return []
    if xla.get("answered") != "xla":  # one line: why the estimate answered, and how to get XLA's answer
        return [f"answered by the estimate ({xla['reason']})" + (f"; {xla['hint']}" if xla.get("hint") else "")]
    out = [f"answered by XLA: {figures_text(xla)}",
           f"usable HBM: {human_bytes(xla['usable_bytes'])} per core, XLA's own limit for {xla['topology']} (what its "
           "out-of-memory messages call available); the estimate and the verdict are held to it",
           f"the estimate says {memory.get('estimate_verdict')} at {human_bytes(memory['per_core_bytes'])}"]
    if xla.get("above_usable"):
        out.append(f"XLA compiled the step, yet its peak {human_bytes(xla['per_core_bytes'])} is above the usable "
                   f"{human_bytes(xla['usable_bytes'])}: not counted as fitting")
    if xla.get("nearest"):
        out.append("XLA: " + nearest_text(xla["nearest"]))
    elif xla["verdict"] != "fits" and "nearest" in xla:
        out.append("XLA: not even the smallest batch tried fits; split the input (partition:) or use a larger TPU")
    return out
