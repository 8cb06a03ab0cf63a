"""Find the newest checkpoint that was written completely, and make TensorFlow resume from it.

A preemption can cut a checkpoint save in half: the `checkpoint` state file may already name a
checkpoint whose data shard is empty or truncated, and restoring it fails (or, on some file
systems, hangs). `latest_complete_checkpoint` verifies each candidate, newest first:

* its `.index` file exists and is not empty;
* for some shard count N, all N `.data-0000i-of-N` files exist and are not empty;
* TensorFlow can open it and list its variables;
* the data shards hold at least the bytes the index says the numeric tensors take, and, when the
  data is small (FULL_READ_BYTES), every tensor reads back (which also checks each tensor's CRC).

`repair_checkpoint_state` rewrites the state file to name that checkpoint, so the Estimator
restores from it. Files of dropped checkpoints are left in place for inspection; the next save
of the same step overwrites them.

Paths may be local or gs:// (tf.io.gfile). TensorFlow is imported inside the functions.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

from tpulaunch.errors import first_line

STATE_FILE = "checkpoint"
# Read every tensor back only when the data is at most this large (a restart should not have to
# read gigabytes from a bucket to check it).
FULL_READ_BYTES = 64 * 1024 * 1024

_DATA_SHARD = re.compile(r"\.data-(\d{5})-of-(\d{5})$")
_STEP_SUFFIX = re.compile(r"-(\d+)$")


@dataclass(frozen=True)
class Dropped:
    """A checkpoint that cannot be restored, and why."""

    path: str
    reason: str


@dataclass(frozen=True)
class CheckpointRepair:
    """What `repair_checkpoint_state` found and did.

    Attributes:
        path: the checkpoint the state file now names (None: no complete checkpoint).
        step: its global step.
        dropped: newer or listed checkpoints that were incomplete, newest first.
        rewritten: whether the state file was changed.
    """

    path: Optional[str]
    step: Optional[int]
    dropped: List[Dropped] = field(default_factory=list)
    rewritten: bool = False


def checkpoint_problem(prefix: str) -> Optional[str]:
    """Why the checkpoint `prefix` (e.g. .../model.ckpt-200) cannot be restored, or None if it is complete."""
    import tensorflow as tf

    gfile = tf.io.gfile
    index = prefix + ".index"
    if not gfile.exists(index):
        return "no .index file"
    if gfile.stat(index).length == 0:
        return "empty .index file"
    shards = _data_shards(prefix)
    if not shards:
        return "no .data shard"
    complete = None
    for count, present in sorted(shards.items()):
        missing = [i for i in range(count) if i not in present]
        empty = [i for i, size in sorted(present.items()) if size == 0]
        if not missing and not empty:
            complete = (count, sum(present.values()))
            break
        problem = (f"data shard {missing[0]} of {count} missing" if missing
                   else f"data shard {empty[0]} of {count} is empty")
    if complete is None:
        return problem
    try:
        reader = tf.train.load_checkpoint(prefix)
        shapes = reader.get_variable_to_shape_map()
        dtypes = reader.get_variable_to_dtype_map()
    except (tf.errors.OpError, ValueError) as exc:
        return f"unreadable: {first_line(exc)}"
    expected = sum(_numel(shapes[name]) * dtypes[name].size for name in shapes if dtypes[name] != tf.string)
    if complete[1] < expected:
        return f"data shards hold {complete[1]} bytes, the index lists {expected}: truncated"
    if complete[1] <= FULL_READ_BYTES:
        for name in sorted(shapes):
            try:
                reader.get_tensor(name)
            except (tf.errors.OpError, ValueError) as exc:
                return f"variable {name!r} unreadable: {first_line(exc)}"
    return None


def checkpoint_step_of(prefix: str) -> Optional[int]:
    """The checkpoint's global_step (read from it, else from its name); None when neither says."""
    import tensorflow as tf

    try:
        return int(tf.train.load_variable(prefix, "global_step"))
    except (tf.errors.OpError, ValueError, KeyError):
        match = _STEP_SUFFIX.search(prefix)
        return int(match.group(1)) if match else None


def latest_complete_checkpoint(model_dir: str) -> Optional[Tuple[str, int]]:
    """(path, step) of the newest complete checkpoint in `model_dir`, or None.

    Candidates are the checkpoints the state file lists (model_checkpoint_path and
    all_model_checkpoint_paths), plus any `*.index` in model_dir when the state file is missing.
    """
    found, _ = _newest_complete(model_dir)
    return found


def repair_checkpoint_state(model_dir: str) -> CheckpointRepair:
    """Point the state file at the newest complete checkpoint, leaving out incomplete ones.

    The state file is rewritten only when it names a checkpoint that is not complete (or is
    missing while a complete checkpoint exists); otherwise it is left untouched. With no complete
    checkpoint at all, a state file naming incomplete ones is removed, so training starts afresh
    instead of failing to restore.
    """
    import tensorflow as tf

    found, dropped = _newest_complete(model_dir)
    state = _state(model_dir)
    current = state.model_checkpoint_path if state is not None else None
    if found is None:
        state_path = os.path.join(model_dir, STATE_FILE)
        if state is not None and dropped:
            tf.io.gfile.remove(state_path)
            return CheckpointRepair(None, None, dropped, rewritten=True)
        return CheckpointRepair(None, None, dropped)
    path, step = found
    listed = list(state.all_model_checkpoint_paths) if state is not None else []
    bad = {d.path for d in dropped}
    keep = [p for p in listed if p not in bad and _step_key(p) <= _step_key(path)]
    if path not in keep:
        keep.append(path)
    keep.sort(key=_step_key)
    if current == path and keep == listed:
        return CheckpointRepair(path, step, dropped)
    tf.compat.v1.train.update_checkpoint_state(model_dir, path, all_model_checkpoint_paths=keep)
    return CheckpointRepair(path, step, dropped, rewritten=True)


def describe_repair(repair: CheckpointRepair) -> List[str]:
    """One line per dropped checkpoint, plus where training resumes (for the progress display)."""
    lines = [f"skipping incomplete checkpoint {d.path}: {d.reason}" for d in repair.dropped]
    if repair.dropped:
        lines.append(f"resuming from {repair.path} (step {repair.step})" if repair.path
                     else "no complete checkpoint left: training starts from step 0")
    return lines


# ------------------------------------------------------------------------------------------ helpers

def _newest_complete(model_dir: str):
    """((path, step) or None, [Dropped] newer than it)."""
    dropped = []
    for path in _candidates(model_dir):
        problem = checkpoint_problem(path)
        if problem is None:
            step = checkpoint_step_of(path)
            if step is not None:
                return (path, step), dropped
            problem = "no global_step"
        dropped.append(Dropped(path, problem))
    return None, dropped


def _state(model_dir: str):
    import tensorflow as tf

    try:
        return tf.train.get_checkpoint_state(model_dir)
    except (tf.errors.OpError, ValueError):  # a state file that does not parse
        return None


def _candidates(model_dir: str) -> List[str]:
    """Checkpoint prefixes, newest (highest step) first, without duplicates."""
    import tensorflow as tf

    state = _state(model_dir)
    paths = []
    if state is not None:
        paths = [*state.all_model_checkpoint_paths, state.model_checkpoint_path]
    elif tf.io.gfile.isdir(model_dir):
        paths = [name[: -len(".index")] for name in tf.io.gfile.glob(os.path.join(model_dir, "*.index"))]
    unique = {_normalize(p, model_dir): None for p in paths if p}
    return sorted(unique, key=_step_key, reverse=True)


def _normalize(path: str, model_dir: str) -> str:
    if "://" in path or os.path.isabs(path):
        return path
    return os.path.join(model_dir, path)


def _step_key(path: str) -> int:
    match = _STEP_SUFFIX.search(path)
    return int(match.group(1)) if match else -1


def _data_shards(prefix: str) -> dict:
    """{shard count: {shard index: size}} for the prefix's data files."""
    import tensorflow as tf

    shards: dict = {}
    for name in tf.io.gfile.glob(glob_escape(prefix) + ".data-?????-of-?????"):
        match = _DATA_SHARD.search(name)
        if match:
            shards.setdefault(int(match.group(2)), {})[int(match.group(1))] = tf.io.gfile.stat(name).length
    return shards


def glob_escape(path: str) -> str:
    """`path` as a glob pattern that matches only itself."""
    return re.sub(r"([*?\[])", r"[\1]", path)


def _numel(shape) -> int:
    count = 1
    for dim in shape:
        count *= int(dim)
    return count


# ------------------------------------------------------------------------------ after a NaN or Inf loss

def has_non_finite(prefix: str) -> Optional[str]:
    """The first floating-point variable of the checkpoint that holds a NaN or Inf, or None when all are finite."""
    import numpy as np
    import tensorflow as tf

    reader = tf.train.load_checkpoint(prefix)
    dtypes = reader.get_variable_to_dtype_map()
    for name in sorted(dtypes):
        if dtypes[name].is_floating and not np.all(np.isfinite(reader.get_tensor(name))):
            return name
    return None


def last_good_checkpoint(model_dir: str) -> Optional[Tuple[str, int]]:
    """(path, step) of the newest complete checkpoint whose variables are all finite, or None.

    A save at the step the loss became NaN holds the weights that step's update made NaN: it is passed over."""
    for path in _candidates(model_dir):
        if checkpoint_problem(path) is None and has_non_finite(path) is None:
            step = checkpoint_step_of(path)
            if step is not None:
                return path, step
    return None


def roll_back_to(model_dir: str, path: str) -> None:
    """Point the state file at `path`, leaving newer checkpoints out of it (their files stay, for inspection; the
    next save of the same step overwrites them): a rerun, or the next session, restores `path`."""
    import tensorflow as tf

    state = _state(model_dir)
    listed = list(state.all_model_checkpoint_paths) if state is not None else []
    keep = sorted({p for p in listed if _step_key(p) < _step_key(path)} | {path}, key=_step_key)
    tf.compat.v1.train.update_checkpoint_state(model_dir, path, all_model_checkpoint_paths=keep)
