"""`partition: auto`: the dims tpulaunch chooses for a job's cores_per_replica. Pure Python.

The main feature (the only one, else the largest) is split over its largest spatial axes first; a
label that shares its spatial axes (a per-voxel mask) is split alike; everything else is replicated.
"""

from __future__ import annotations

from typing import Mapping, Optional, Sequence

from tpulaunch.job.schema import Partition
from tpulaunch.plan import partition as rules


def main_feature(features: Mapping) -> str:
    """The feature whose shape drives the model: the only one, else the largest."""
    if len(features) == 1:
        return next(iter(features))
    return max(features, key=lambda n: features[n].num_elements or 0)


def suggest_dims(features: Mapping, cores: int, per_replica_batch: int, *, even: bool = False) -> Optional[tuple]:
    """Partition dims of the main feature over `cores`: the largest spatial axes first (`even`: only
    splits that divide their axis, as the keras engine needs)."""
    spec = features[main_feature(features)]
    dims = rules.suggest([per_replica_batch] + list(spec.shape), cores, even=even)
    return tuple(dims) if dims else None


def auto_partition(features: Mapping, labels: Mapping, cores: int, per_replica_batch: int, *,
                   even: bool = False) -> Optional[Partition]:
    """The Partition `partition: auto` stands for; None when the main feature cannot be split `cores` ways
    (`even`: into equal pieces), an empty Partition for one core per replica."""
    if cores <= 1:
        return Partition()
    name = main_feature(features)
    spec = features[name]
    if not spec.is_static:
        return None
    dims = suggest_dims(features, cores, per_replica_batch, even=even)
    if dims is None:
        return None
    chosen = {n: None for n in features}
    chosen[name] = list(dims)
    return Partition(features=chosen,
                     labels={n: _follow(dims, spec.shape, label.shape) for n, label in labels.items()})


def _follow(dims: Optional[Sequence[int]], feature_shape, label_shape) -> Optional[list]:
    """A label that shares the feature's spatial axes (e.g. a per-voxel mask) is split the same way."""
    if not dims:
        return None
    spatial = list(feature_shape[:-1])
    if list(label_shape[:len(spatial)]) != spatial:
        return None
    return list(dims[:1 + len(spatial)]) + [1] * (len(label_shape) - len(spatial))
