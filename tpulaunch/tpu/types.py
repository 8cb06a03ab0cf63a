"""Cloud TPU accelerator types: what `v3-32` or `v5litepod-16` means as TensorFlow sees it.

One table per generation, with its sources, so every other module asks here instead of guessing:
how many TensorFlow TPU devices a slice has (one per core on v2/v3, one per chip on the megacore and
single-core generations), on how many hosts, and how much HBM one device can use.

Sources:
  * Cloud TPU system architecture and per-generation pages (cloud.google.com/tpu/docs/system-architecture-tpu-vm,
    /v2, /v3, /v4, /v5e, /v5p, /v6e): cores per chip, HBM per chip, chips per host, slice names.
  * Usable HBM per device: XLA's own out-of-memory messages, "Used X of Y hbm", where Y is what one TPU
    device can hold. XLA prints bytes as Google's HumanReadableNumBytes does, in binary units ("G" is
    GiB: "HumanReadableNumBytes uses binary powers -- 1M = 1 << 20", strings/human_readable.h, e.g.
    apache/kudu src/kudu/gutil/strings/human_readable.h), so "15.75G" is 15.75 GiB. Each figure and
    where it was printed is beside its generation in GENERATIONS.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

GiB = 1024 ** 3


@dataclass(frozen=True)
class Generation:
    name: str  # v2, v3, v4, v5e, v5p, v6e
    prefix: str  # how accelerator type names start: v5litepod-8 for v5e
    cores_per_chip: int
    hbm_per_chip_bytes: int
    megacore: bool  # the chip's cores appear to TensorFlow as one device
    number_counts: str  # "cores" or "chips": what the N in "<prefix>-N" counts
    chips_per_host: int  # on multi-host slices
    max_single_host_chips: int  # the largest slice served by one host
    sizes: tuple  # the N values Cloud TPU offers
    usable_bytes_per_device: int  # what XLA lets one device use (its out-of-memory messages' "of Y hbm")
    spatial_partitioning_checked: bool  # TPUEstimator's fixed computation shapes assume 2 cores per chip

    @property
    def devices_per_chip(self) -> int:
        return 1 if self.megacore or self.cores_per_chip == 1 else self.cores_per_chip


_POW2 = tuple(2 ** k for k in range(3, 13))  # 8 .. 4096

# Physical HBM per chip is in GiB: XLA's usable figures are GiB and never exceed it (v5e "16 GB" is 16 GiB:
# XLA reports 15.75G usable and a 17179869184-byte memory; v5p's "95 GB" cannot be decimal: XLA uses 95.74 GiB of
# its six 16 GiB HBM2e stacks).
GENERATIONS = {
    g.name: g for g in (
        # "Used 8.38G of 8.00G hbm": https://github.com/tensorflow/tpu/issues/385 (a v2-8, 8 GiB per core)
        Generation("v2", "v2", 2, 16 * GiB, False, "cores", 4, 4, (8, 32, 128, 256, 512),
                   int(8.00 * GiB), True),
        # "Used 21.95G of 15.48G hbm": https://github.com/LargeWorldModel/LWM/issues/60 (a v3-8), also
        # https://github.com/erfanzar/EasyDeL/issues/142
        Generation("v3", "v3", 2, 32 * GiB, False, "cores", 4, 4, (8, 32, 64, 128, 256, 512, 1024, 2048),
                   int(15.48 * GiB), True),
        # "Used 63.80G of 30.75G hbm ... reserved 1.25G": https://github.com/erfanzar/EasyDeL/issues/166 (a v4-32),
        # also https://github.com/young-geng/EasyLM/issues/98 (a v4-256)
        Generation("v4", "v4", 2, 32 * GiB, True, "cores", 4, 4, _POW2,
                   int(30.75 * GiB), False),
        # "Used 19.22G of 15.75G hbm" on a v5litepod-1, and "Used 16.29G of 15.75G hbm" beside "would exceed
        # memory (size=17179869184)" (16 GiB) on v5e, in public run reports (GitHub code search; no issue thread
        # found). 15.75 = 16 - 0.25 GiB, the same reserve as v6e's.
        Generation("v5e", "v5litepod", 1, 16 * GiB, False, "chips", 4, 8, (1, 4, 8, 16, 32, 64, 128, 256),
                   int(15.75 * GiB), False),
        # "exceeding available bytes: 95.74G": XLA's own error page, https://openxla.org/xla/errors/error_1000
        # (TPU HBM OOM, error E1000); "Used 110.81G of 95.74G hbm" on a v5p-64 in public run reports.
        Generation("v5p", "v5p", 2, 96 * GiB, True, "cores", 4, 4, _POW2 + (6144, 8192, 12288),
                   int(95.74 * GiB), False),
        # "Used 46.60G of 31.25G hbm" on a v6e-8 in public run reports; "31.25 GB is addressable from XLA"
        # of v6e's 32: https://megacpp.pages.dev/blog/oom-on-v6e/
        Generation("v6e", "v6e", 1, 32 * GiB, False, "chips", 4, 8, (1, 4, 8, 16, 32, 64, 128, 256),
                   int(31.25 * GiB), False),
    )
}

# Other spellings users type (and that appear in docs), mapped to the prefix Cloud TPU uses.
_ALIASES = {"v5e": "v5litepod", "v5lite": "v5litepod", "v5litepod": "v5litepod", "v6": "v6e"}
_BY_PREFIX = {g.prefix: g for g in GENERATIONS.values()}
_TYPE_NAME = re.compile(r"^\s*(?P<prefix>v[0-9][a-z]*)-(?P<number>[0-9]+)\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class TpuType:
    """One accelerator type, e.g. v3-32: 32 TensorFlow devices on 4 hosts."""

    name: str
    generation: Generation
    number: int  # the N in the name
    chips: int
    cores: int
    devices: int  # TPU devices TensorFlow sees (what num_cores_per_replica and replicas count)
    hosts: int

    @property
    def devices_per_host(self) -> int:
        return self.devices // self.hosts

    @property
    def usable_bytes_per_device(self) -> int:
        return self.generation.usable_bytes_per_device


class UnknownTpuType(ValueError):
    """An accelerator type name that no Cloud TPU generation offers."""

    def __init__(self, message: str, hint: Optional[str] = None):
        super().__init__(message)
        self.hint = hint


def known_names(generation: Generation) -> list:
    return [f"{generation.prefix}-{n}" for n in generation.sizes]


def lookup(name: Optional[str]) -> Optional[TpuType]:
    """The accelerator type named `name`, or None when there is no name or no generation offers it."""
    if not name:
        return None
    try:
        return parse_tpu_type(name)
    except UnknownTpuType:
        return None


def parse_tpu_type(name: str) -> TpuType:
    """Parse an accelerator type name such as `v3-32`, `v4-8`, `v5litepod-16`.

    Raises:
        UnknownTpuType: with a hint listing the sizes the generation offers.
    """
    from tpulaunch.tpu.stack import FACTS

    family = str(name).strip().split("-")[0].lower()
    if family in FACTS["no_tensorflow"]:  # offered by Cloud TPU, but not to TensorFlow
        raise UnknownTpuType(f"{FACTS['no_tensorflow'][family]} runs no TensorFlow ('{name}')",
                             "choose a v2, v3, v4, v5e, v5p or v6e type")
    match = _TYPE_NAME.match(str(name))
    if not match:
        raise UnknownTpuType(f"'{name}' is not an accelerator type name",
                             "write <generation>-<size>, e.g. v3-8, v3-32, v4-8, v5litepod-16, v6e-8")
    prefix = match["prefix"].lower()
    prefix = _ALIASES.get(prefix, prefix)
    number = int(match["number"])
    generation = _BY_PREFIX.get(prefix)
    if generation is None:
        prefixes = ", ".join(g.prefix for g in GENERATIONS.values())
        raise UnknownTpuType(f"unknown TPU generation '{match['prefix']}'", f"one of: {prefixes}")
    if number not in generation.sizes:
        sizes = ", ".join(str(n) for n in generation.sizes)
        raise UnknownTpuType(f"{generation.prefix}-{number} does not exist",
                             f"{generation.prefix} slices come in {generation.number_counts}: {sizes}")
    if generation.number_counts == "cores":
        cores = number
        chips = number // generation.cores_per_chip
    else:
        chips = number
        cores = number * generation.cores_per_chip
    devices = chips * generation.devices_per_chip
    hosts = 1 if chips <= generation.max_single_host_chips else chips // generation.chips_per_host
    return TpuType(f"{generation.prefix}-{number}", generation, number, chips, cores, devices, hosts)
