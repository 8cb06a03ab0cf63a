"""Sizes that cannot fit the target's memory, refused at their key before anything is allocated.

A cheap lower bound, without TensorFlow: one batch of the declared inputs (every feature and label, at its dtype)
must fit where it lives. On this machine (`--local`, or a job without tpu:) that is the host's memory: its
physical RAM, or the address space this process may use (RLIMIT_AS, `ulimit -v`) when that is smaller. On a TPU
it is one core's HBM, holding its replica's share of the batch split over `tpu.cores_per_replica`. The model's
parameters, activations and the pipeline's prefetched batches come on top, so a job refused here cannot run, and
one that passes may still not fit (`tpulaunch plan` estimates the rest for a TPU).
"""

from __future__ import annotations

import math
import os
from typing import Optional, Tuple

from tpulaunch.job.load import LoadedJob
from tpulaunch.job.schema import DTYPE_BYTES
from tpulaunch.plan.xla_words import human_bytes


def host_memory() -> Tuple[int, str]:
    """(bytes this process can have, what they are): physical RAM, or RLIMIT_AS when that is lower."""
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    except (ImportError, ValueError, OSError):
        soft = -1
    if 0 < soft < physical:
        return soft, f"the {human_bytes(soft)} this process may address (RLIMIT_AS, ulimit -v)"
    return physical, f"this machine's {human_bytes(physical)} of memory"


def _size(n: int) -> str:
    return human_bytes(n) if n >= 1 << 20 else f"{n / 1024:.1f} KiB" if n >= 1024 else f"{n} bytes"


def _tensors(data):
    """(group, name, bytes of one example) of every declared tensor; an unknown dim counts as 1 (a lower bound)."""
    for group in ("features", "labels"):
        for name, spec in getattr(data, group).items():
            yield group, name, math.prod(d or 1 for d in spec.shape) * DTYPE_BYTES[spec.dtype]


def _target(loaded: LoadedJob) -> Optional[Tuple[int, int, str]]:
    """(bytes available, examples of a global batch one place holds per `divisor`, what the bytes are), or None."""
    tpu = loaded.section("tpu")
    if getattr(loaded, "local", False) or tpu is None:
        available, what = host_memory()
        return available, 1, what
    from tpulaunch.plan.build import layout_for
    from tpulaunch.tpu.types import lookup

    tpu_type, layout = lookup(tpu.type), layout_for(tpu)
    if tpu_type is None or layout is None:
        return None  # an unknown type or layout is reported by its own rule
    cores = max(1, tpu.cores_per_replica)
    return (tpu_type.usable_bytes_per_device, layout.replicas * cores,
            f"one {tpu_type.name} core's {human_bytes(tpu_type.usable_bytes_per_device)} of HBM")


def fit_problems(loaded: LoadedJob) -> list:
    """A declared shape whose single example, or a batch size whose one batch, cannot fit the target's memory."""
    data = loaded.section("data")
    if data is None or not loaded.usable("data", "tpu", "train", "eval"):
        return []
    target = _target(loaded)
    if target is None:
        return []
    available, share, where = target
    tensors = list(_tensors(data))
    example = sum(size for _, _, size in tensors)
    if not tensors:
        return []
    if -(-example // share) > available:  # one example is too big, whatever the batch
        group, name, size = max(tensors, key=lambda t: t[2])
        spec = getattr(data, group)[name]
        return [loaded.problem(("data", group, name, "shape"), "input-exceeds-memory",
                               f"one example of '{name}' {list(spec.shape)} {spec.dtype} is {_size(size)}, "
                               f"more than {where}",
                               "declare the shape the records hold (tpulaunch data inspect shows it); a tensor this "
                               "size must be cut into smaller examples")]
    whose = "" if share == 1 else f"each core's share (1/{share}) of "
    problems = []
    for section in ("train", "eval"):
        spec = loaded.section(section)
        if spec is None:
            continue
        batch = -(-spec.batch_size * example // share)
        if batch > available:
            most = available * share // example
            problems.append(loaded.problem(
                (section, "batch_size"), "batch-exceeds-memory",
                f"{whose}one batch of {spec.batch_size} examples is {_size(batch)} of inputs alone "
                f"({_size(example)} an example), more than {where}",
                f"use a batch_size well below {most}: the inputs of {most} examples fill it, and the model needs "
                "memory too"))
    return problems
