"""A checkpoint's files reach their names in model_dir only while this run still holds model_dir's lease.

A save takes a while (seconds; on gs:// longer). A run frozen in the middle of one (SIGSTOP, a paused VM, a
long network partition) past the lease's stale time thaws into a model_dir another run holds now. Had it written
`model.ckpt-N` in place, finishing the save would overwrite the successor's `model.ckpt-N` (the successor resumed
from an older checkpoint and has reached N again) and the checkpoint state after it. So every engine writes each
checkpoint under a staging prefix, `model_dir/.tpulaunch-saving-<pid>-<hex>/model.ckpt-N`, reread the lease
(`run/lease.ensure_held`) and only then move the files to their names, the `.index` last (TensorFlow finds a
checkpoint by its index). A run fenced there removes its staged files and raises `LeaseLost`: nothing of the
successor's is touched.

The lease is reread once more after the moves, right before the caller records the checkpoint in the
`checkpoint` state file (and deletes the oldest): a run frozen during the moves neither names its checkpoint nor
deletes one. What is left of the window is the moves themselves (renames on a local disk; on gs://, where a
rename is a copy, seconds for a large checkpoint) and the instant between the last reread and the state's write.

TensorFlow's filesystem throughout (model_dir may be gs://); TensorFlow is imported inside the functions.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from typing import Callable

from tpulaunch.engine.core.checkpoints import glob_escape, step_in_name
from tpulaunch.run.freeze_points import MID_SAVE, freeze_point
from tpulaunch.run.lease import LeaseLost, ensure_held

STAGING = ".tpulaunch-saving-"
"""The name every staging folder in model_dir starts with."""


def staged_write(write: Callable[[str], object], prefix: str) -> str:
    """Write a checkpoint through `write(staged_prefix)` under a staging folder beside `prefix`, then, if this run
    still holds the lease of `prefix`'s folder, move its files to `prefix`. Returns `prefix`.

    Raises `LeaseLost` (the staged files removed, its `step` the checkpoint's: the run had trained it) when another
    run took the lease over, before or during the write: a write that failed because the successor swept the
    staging folder away is a lost lease too."""
    try:
        _write_then_move(write, prefix)
    except LeaseLost as lost:
        lost.step = step_in_name(prefix)
        raise
    return prefix


def _write_then_move(write: Callable[[str], object], prefix: str) -> None:
    import tensorflow as tf

    model_dir = os.path.dirname(prefix)
    staging = os.path.join(model_dir, f"{STAGING}{os.getpid()}-{secrets.token_hex(4)}")
    staged = os.path.join(staging, os.path.basename(prefix))
    try:
        tf.io.gfile.makedirs(staging)  # TensorFlow's save ops write into a folder that exists
        write(staged)
        freeze_point(MID_SAVE, step_in_name(prefix))  # a rehearsal's freeze: staged, nothing at its name yet
        ensure_held(model_dir)
        names = sorted(tf.io.gfile.glob(glob_escape(staged) + ".*"), key=lambda path: path.endswith(".index"))
        for name in names:  # data shards (and a meta graph) first, the index last
            tf.io.gfile.rename(name, prefix + name[len(staged):], overwrite=True)
        ensure_held(model_dir)  # once more before the caller names it in the checkpoint state (at once, no I/O between)
    except LeaseLost:
        _remove(staging)
        raise
    except BaseException:
        _remove(staging)
        ensure_held(model_dir)  # the failure may be the lease's loss (a successor swept the staging folder)
        raise
    _remove(staging)


def sweep_staging(model_dir: str) -> None:
    """Remove staging folders left by saves that never finished (a killed run, a fenced one). Called by the run
    that holds model_dir's lease, at its start: no other run may write there, so none is in use (a frozen run
    that thaws finds its folder gone, and stops fenced)."""
    import tensorflow as tf

    with contextlib.suppress(Exception):  # best effort: an unlistable model_dir is said by its first write
        for name in tf.io.gfile.listdir(model_dir):
            if name.startswith(STAGING):
                _remove(os.path.join(model_dir, name.rstrip("/")))


def _remove(folder: str) -> None:
    import tensorflow as tf

    with contextlib.suppress(Exception):  # the error being raised (a full disk, the lost lease) is what matters
        if tf.io.gfile.exists(folder):
            tf.io.gfile.rmtree(folder)
