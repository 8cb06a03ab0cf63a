"""Find the newest checkpoint that was written completely, and make TensorFlow resume from it.

A preemption can cut a checkpoint save in half: the `checkpoint` state file may already name a
checkpoint whose data shard is empty or truncated, and restoring it fails (or, on some file
systems, hangs). `latest_complete_checkpoint` verifies each candidate, newest first:

* its `.index` file exists and is not empty;
* for some shard count N, all N `.data-0000i-of-N` files exist and are not empty;
* TensorFlow can open it and list its variables;
* the data shards hold at least the bytes the index says the numeric tensors take, and, when the
  data is small (FULL_READ_BYTES), every tensor reads back (which also checks each tensor's CRC).

The candidates are model_dir's own checkpoints, whatever the `checkpoint` state file names: every
`*.index` there, and each entry of the state taken by its name in model_dir (a copied or moved
model_dir's state may name the old place; a stale one, a deleted step). `repair_checkpoint_state`
rewrites the state file to name that checkpoint, by names relative to model_dir (TensorFlow resolves
them against the state file's folder), so every engine restores from it and a copy of model_dir names
and deletes only its own files. When checkpoint files exist and none can be restored, it refuses
(`UnreadableCheckpoints`, exit 1) instead of letting training start from step 0 over them.
`readable_checkpoint` is the same choice for evaluate and export. Files of dropped checkpoints are
left in place for inspection; the next save of the same step overwrites them.

Paths may be local or gs:// (tf.io.gfile). TensorFlow is imported inside the functions.
"""

from __future__ import annotations

import itertools
import os
import re
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

from tpulaunch.errors import TpuLaunchError, first_line

NON_FINITE_FOLDER = "non-finite-checkpoints"
"""Where a rollback moves model_dir's checkpoints newer than the last good one (`roll_back_to`)."""

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
    except Exception as exc:  # noqa: BLE001 — a damaged file raises what its reader happens to (OpError, IndexError...)
        return f"unreadable: {type(exc).__name__}: {first_line(exc)}"
    expected = sum(_numel(shapes[name]) * dtypes[name].size for name in shapes if dtypes[name] != tf.string)
    if complete[1] < expected:
        return f"data shards hold {complete[1]} bytes, the index lists {expected}: truncated"
    if complete[1] <= FULL_READ_BYTES:
        for name in sorted(shapes):
            try:
                reader.get_tensor(name)
            except Exception as exc:  # noqa: BLE001 — e.g. IndexError "Read less bytes than requested"
                return f"variable {name!r} unreadable: {type(exc).__name__}: {first_line(exc)}"
    return None


def checkpoint_step_of(prefix: str) -> Optional[int]:
    """The checkpoint's global_step (read from it, else from its name); None when neither says."""
    import tensorflow as tf

    try:
        return int(tf.train.load_variable(prefix, "global_step"))
    except (tf.errors.OpError, ValueError, KeyError):
        return step_in_name(prefix)


def step_in_name(prefix: str) -> Optional[int]:
    """The global step a checkpoint prefix names (`model.ckpt-STEP`); None for another name."""
    match = _STEP_SUFFIX.search(prefix)
    return int(match.group(1)) if match else None


def latest_complete_checkpoint(model_dir: str) -> Optional[Tuple[str, int]]:
    """(path, step) of the newest complete checkpoint in `model_dir`, or None.

    Candidates are the checkpoints the state file lists (model_checkpoint_path and
    all_model_checkpoint_paths), plus any `*.index` in model_dir when the state file is missing.
    """
    found, _ = _newest_complete(model_dir)
    return found


class UnreadableCheckpoints(TpuLaunchError):
    """model_dir holds checkpoint files and none of them can be restored: nothing is trained (or evaluated)
    over them."""


def repair_checkpoint_state(model_dir: str) -> CheckpointRepair:
    """Point the state file at the newest complete checkpoint, leaving out incomplete ones and naming
    each by its name in model_dir.

    The state file is rewritten only when it names a checkpoint that is not complete, anything but
    model_dir's own checkpoints by relative names, or is missing while a complete checkpoint exists;
    otherwise it is left untouched. A state file naming only checkpoints with no file left is removed,
    so training starts afresh.

    Raises:
        UnreadableCheckpoints: checkpoint files exist and none of them is complete.
    """
    import tensorflow as tf

    found, dropped = _newest_complete(model_dir)
    raw = _raw_state(model_dir)
    if found is None:
        refuse_unreadable(model_dir, dropped, "training from step 0 would overwrite them")
        if raw is not None:
            tf.io.gfile.remove(os.path.join(model_dir, STATE_FILE))
            return CheckpointRepair(None, None, dropped, rewritten=True)
        return CheckpointRepair(None, None, dropped)
    path, step = found
    name = os.path.basename(path)
    stamps = {}
    if raw is not None and len(raw.all_model_checkpoint_timestamps) == len(raw.all_model_checkpoint_paths):
        stamps = {os.path.basename(p): t for p, t in zip(raw.all_model_checkpoint_paths,
                                                         raw.all_model_checkpoint_timestamps)}
    listed = [os.path.basename(p) for p in raw.all_model_checkpoint_paths] if raw is not None else []
    bad = {os.path.basename(d.path) for d in dropped}
    keep = [p for p in dict.fromkeys(listed)
            if p not in bad and _step_key(p) <= _step_key(name) and _exists(os.path.join(model_dir, p) + ".index")]
    if name not in keep:
        keep.append(name)
    keep.sort(key=_step_key)
    if raw is not None and raw.model_checkpoint_path == name and list(raw.all_model_checkpoint_paths) == keep:
        return CheckpointRepair(path, step, dropped)
    timestamps = [stamps[p] for p in keep] if all(p in stamps for p in keep) else None
    from tpulaunch.engine.portable import state_entry

    tf.compat.v1.train.update_checkpoint_state(
        model_dir, state_entry(model_dir, name), all_model_checkpoint_paths=[state_entry(model_dir, p) for p in keep],
        all_model_checkpoint_timestamps=timestamps,
        last_preserved_timestamp=raw.last_preserved_timestamp if raw is not None and timestamps else None)
    return CheckpointRepair(path, step, dropped, rewritten=True)


def refuse_unreadable(model_dir: str, dropped: List[Dropped], why: str) -> None:
    """Raise UnreadableCheckpoints naming each dropped checkpoint that has files in model_dir, when there are any."""
    present = [d for d in dropped if _files_of(d.path)]
    if present:
        named = "; ".join(f"{d.path}: {d.reason}" for d in present)
        raise UnreadableCheckpoints(
            f"no checkpoint in {model_dir} can be restored ({named})",
            hint=f"{why}: restore them from a copy, or move them out of model_dir to start afresh, or use another "
                 "run.model_dir (--model-dir)", code="unreadable-checkpoints")


@dataclass(frozen=True)
class Readable:
    """The checkpoint evaluate or export reads, and the lines that say why it is not the newest one."""

    path: str
    step: Optional[int]
    lines: List[str]


def readable_checkpoint(model_dir: str, checkpoint: Optional[str], verb: str) -> Optional[Readable]:
    """The checkpoint to read: `checkpoint` (--checkpoint) when given, else model_dir's newest complete one
    (whatever its state file names); None when model_dir holds no checkpoint. `verb` ("evaluating", "exporting")
    words the line that says which one is read when a newer one was skipped.

    Raises:
        TpuLaunchError: the given checkpoint cannot be restored (named, with why); UnreadableCheckpoints: model_dir
            holds checkpoint files and none can be restored.
    """
    if checkpoint:
        problem = checkpoint_problem(checkpoint)
        if problem:
            found, _ = _newest_complete(model_dir)
            other = f"; the newest complete one in model_dir is {found[0]}" if found and found[0] != checkpoint else ""
            raise TpuLaunchError(f"--checkpoint {checkpoint} cannot be restored: {problem}",
                                 hint="name a complete checkpoint: model.ckpt-STEP, without its extension" + other)
        return Readable(checkpoint, None, [])
    found, dropped = _newest_complete(model_dir)
    if found is None:
        refuse_unreadable(model_dir, dropped, "nothing can be read from them")
        return None
    path, step = found
    lines = [f"skipping incomplete checkpoint {d.path}: {d.reason}" for d in dropped]
    if lines:
        lines.append(f"{verb} {path} (step {step}), the newest complete checkpoint")
    return Readable(path, step, lines)


def describe_repair(repair: CheckpointRepair) -> List[str]:
    """One line per dropped checkpoint, plus where training resumes (for the progress display); one line when only
    the state file was rewritten (it named checkpoints elsewhere, by absolute paths, or was missing)."""
    lines = [f"skipping incomplete checkpoint {d.path}: {d.reason}" for d in repair.dropped]
    if repair.path is None:
        if repair.dropped:
            lines.append("no checkpoint file left: training starts from step 0")
    elif repair.dropped:
        lines.append(f"resuming from {repair.path} (step {repair.step})")
    elif repair.rewritten:
        lines.append(f"checkpoint state repaired: it names {repair.path} (step {repair.step}) and model_dir's other "
                     "checkpoints by their names in model_dir")
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


def _raw_state(model_dir: str):
    """The state file as written (its entries not resolved against model_dir), or None (none, or unparsable)."""
    import tensorflow as tf
    from google.protobuf import text_format
    from tensorflow.python.training.checkpoint_state_pb2 import CheckpointState  # the state file's message

    path = os.path.join(model_dir, STATE_FILE)
    try:
        if not tf.io.gfile.exists(path):
            return None
        with tf.io.gfile.GFile(path) as handle:
            text = handle.read()
        return text_format.Parse(text, CheckpointState())
    except (tf.errors.OpError, text_format.ParseError, ValueError):
        return None


def _candidates(model_dir: str) -> List[str]:
    """model_dir's checkpoint prefixes, newest (highest step) first: every `*.index` there, and each entry of the
    state file by its name in model_dir (whatever folder the entry names: a copied or moved model_dir's state
    names the old one; an entry with no file left is reported as such)."""
    import tensorflow as tf

    state = _raw_state(model_dir)
    names = set()
    if state is not None:
        names = {os.path.basename(p.rstrip("/")) for p in [*state.all_model_checkpoint_paths,
                                                             state.model_checkpoint_path] if p}
    if tf.io.gfile.isdir(model_dir):
        names |= {os.path.basename(name)[: -len(".index")]
                  for name in tf.io.gfile.glob(os.path.join(glob_escape(model_dir), "*.index"))}
    return sorted((os.path.join(model_dir, name) for name in names if name),
                  key=lambda path: (_step_key(path), path), reverse=True)


def _exists(path: str) -> bool:
    import tensorflow as tf

    return tf.io.gfile.exists(path)


def _files_of(prefix: str) -> List[str]:
    import tensorflow as tf

    return tf.io.gfile.glob(glob_escape(prefix) + ".*")


def _step_key(path: str) -> int:
    step = step_in_name(path)
    return -1 if step is None else step


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


def roll_back_to(model_dir: str, path: Optional[str]) -> Tuple[Optional[str], List[str]]:
    """Point the state file at `path` and move every newer checkpoint of model_dir (NaN weights, or incomplete) into
    a `non-finite-checkpoints` folder of it, for inspection: a rerun, or the next session, restores `path` (left in
    model_dir, the newest complete one would be restored again, whatever the state names). `path` None: no good
    checkpoint, every `model.ckpt-STEP` is moved and the state removed (training starts again from step 0; a
    checkpoint of another name, the user's own, stays). Entries by their names in model_dir. Returns (the folder
    they were moved to, the names moved (`model.ckpt-6`), oldest first); (None, []) when there were none."""
    import tensorflow as tf

    from tpulaunch.engine.portable import state_entry

    name = os.path.basename(path) if path is not None else None
    # Moved before the state is written: cut off between the two, the state names a checkpoint no longer there, and
    # the next run's repair picks the newest complete one left, `path`.
    newer = {candidate: _files_of(candidate) for candidate in _candidates(model_dir)
             if step_in_name(candidate) is not None and (name is None or _step_key(candidate) > _step_key(name))}
    moved = sorted((candidate for candidate, its_files in newer.items() if its_files), key=_step_key)
    files = [file for candidate in moved for file in newer[candidate]]
    folder = _aside_folder(model_dir, [os.path.basename(file) for file in files]) if files else None
    if folder is not None:
        tf.io.gfile.makedirs(folder)
    for file in files:
        tf.io.gfile.rename(file, os.path.join(folder, os.path.basename(file)))
    moved_names = [os.path.basename(candidate) for candidate in moved]
    if name is None:
        state_file = os.path.join(model_dir, STATE_FILE)
        if tf.io.gfile.exists(state_file):
            tf.io.gfile.remove(state_file)
        return folder, moved_names
    state = _raw_state(model_dir)
    listed = [os.path.basename(p) for p in state.all_model_checkpoint_paths] if state is not None else []
    keep = sorted({p for p in listed if _step_key(p) < _step_key(name)} | {name}, key=_step_key)
    tf.compat.v1.train.update_checkpoint_state(model_dir, state_entry(model_dir, name),
                                               all_model_checkpoint_paths=[state_entry(model_dir, p) for p in keep])
    return folder, moved_names


def _aside_folder(model_dir: str, file_names: List[str]) -> str:
    """`non-finite-checkpoints` in model_dir, or `non-finite-checkpoints-2`, -3, ...: the first that is not a file
    and holds none of `file_names` (what an earlier rollback moved aside is never overwritten)."""
    import tensorflow as tf

    for number in itertools.count(1):
        folder = os.path.join(model_dir, NON_FINITE_FOLDER + (f"-{number}" if number > 1 else ""))
        if not tf.io.gfile.exists(folder):
            return folder
        if tf.io.gfile.isdir(folder) and not set(file_names) & set(tf.io.gfile.listdir(folder)):
            return folder
    raise AssertionError("unreachable")


def aside_folders(model_dir: str) -> List[str]:
    """The folders of model_dir that hold checkpoints an earlier rollback moved aside (`roll_back_to`)."""
    import tensorflow as tf

    found = tf.io.gfile.glob(os.path.join(glob_escape(model_dir), NON_FINITE_FOLDER + "*"))
    return sorted((folder for folder in found
                   if tf.io.gfile.isdir(folder) and tf.io.gfile.glob(os.path.join(glob_escape(folder), "*.index"))),
                  key=lambda folder: (len(folder), folder))
