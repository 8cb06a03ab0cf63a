"""Finding the newest complete checkpoint and pointing the state file at it.

Checkpoints are written by TensorFlow's own v1 Saver (what the Estimator uses), then damaged the way a
preemption leaves them: a truncated or empty data shard, a missing shard, a missing index.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import tensorflow as tf

import pytest

from tpulaunch.engine.core.checkpoints import (
    NON_FINITE_FOLDER, CheckpointRepair, Dropped, UnreadableCheckpoints, aside_folders, checkpoint_problem,
    describe_repair, latest_complete_checkpoint, repair_checkpoint_state, roll_back_to,
)

WEIGHTS = 2048  # floats: 8 KiB of data per checkpoint, so a cut is visible


def save_checkpoints(model_dir: Path, steps) -> list:
    """Checkpoints model.ckpt-STEP for each step, with a global_step and one weight variable."""
    paths = []
    with tf.Graph().as_default():
        step = tf.compat.v1.train.get_or_create_global_step()
        weights = tf.compat.v1.get_variable("w", initializer=np.arange(WEIGHTS, dtype=np.float32))
        saver = tf.compat.v1.train.Saver(max_to_keep=10, sharded=True)
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            for value in steps:
                session.run([step.assign(value), weights.assign_add(tf.ones([WEIGHTS]))])
                paths.append(saver.save(session, str(model_dir / "model.ckpt"), global_step=value))
    return paths


def data_file(prefix: str) -> Path:
    return Path(prefix + ".data-00000-of-00001")


def state_paths(model_dir: Path):
    state = tf.train.get_checkpoint_state(str(model_dir))
    return state.model_checkpoint_path, list(state.all_model_checkpoint_paths)


def test_complete_checkpoints_are_left_alone_once_named_relative_to_model_dir(tmp_path):
    paths = save_checkpoints(tmp_path, [10, 20, 30])  # the v1 Saver's default: absolute paths in the state

    assert latest_complete_checkpoint(str(tmp_path)) == (paths[2], 30)
    assert repair_checkpoint_state(str(tmp_path)) == CheckpointRepair(paths[2], 30, [], rewritten=True)
    state = (tmp_path / "checkpoint").read_text()
    assert str(tmp_path) not in state and 'model_checkpoint_path: "model.ckpt-30"' in state, state
    assert state_paths(tmp_path) == (paths[2], paths)
    assert repair_checkpoint_state(str(tmp_path)) == CheckpointRepair(paths[2], 30, [], rewritten=False)
    assert (tmp_path / "checkpoint").read_text() == state


def test_truncated_data_shard_falls_back_to_the_previous_checkpoint(tmp_path):
    paths = save_checkpoints(tmp_path, [10, 20, 30])
    data = data_file(paths[2])
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])

    assert checkpoint_problem(paths[2]) == (
        f"data shards hold {WEIGHTS * 4 // 2 + 4} bytes, the index lists {WEIGHTS * 4 + 8}: truncated")
    repair = repair_checkpoint_state(str(tmp_path))

    assert repair == CheckpointRepair(paths[1], 20, [Dropped(paths[2], checkpoint_problem(paths[2]))], rewritten=True)
    assert state_paths(tmp_path) == (paths[1], paths[:2])
    assert tf.train.latest_checkpoint(str(tmp_path)) == paths[1]
    # What a resume restores: the weights of step 20 (two increments).
    assert tf.train.load_variable(paths[1], "w")[:3].tolist() == [2.0, 3.0, 4.0]
    assert describe_repair(repair) == [
        f"skipping incomplete checkpoint {paths[2]}: {checkpoint_problem(paths[2])}",
        f"resuming from {paths[1]} (step 20)",
    ]


def test_empty_or_missing_files_are_each_reported(tmp_path):
    paths = save_checkpoints(tmp_path, [10, 20, 30, 40])
    data_file(paths[3]).write_bytes(b"")
    data_file(paths[2]).unlink()
    os.remove(paths[1] + ".index")

    assert latest_complete_checkpoint(str(tmp_path)) == (paths[0], 10)
    assert repair_checkpoint_state(str(tmp_path)).dropped == [
        Dropped(paths[3], "data shard 0 of 1 is empty"),
        Dropped(paths[2], "no .data shard"),
        Dropped(paths[1], "no .index file"),
    ]
    assert state_paths(tmp_path) == (paths[0], [paths[0]])


def test_corrupted_bytes_of_the_same_length_are_caught_by_reading_back(tmp_path):
    paths = save_checkpoints(tmp_path, [10, 20])
    data = data_file(paths[1])
    raw = bytearray(data.read_bytes())
    raw[100:200] = bytes(100)
    data.write_bytes(bytes(raw))

    problem = checkpoint_problem(paths[1])
    assert problem is not None and problem.startswith("variable 'w' unreadable: "), problem
    assert latest_complete_checkpoint(str(tmp_path)) == (paths[0], 10)


def test_checkpoint_files_none_of_which_restores_are_refused_not_trained_over(tmp_path):
    (path,) = save_checkpoints(tmp_path, [10])
    data_file(path).write_bytes(b"x")
    state = (tmp_path / "checkpoint").read_text()

    with pytest.raises(UnreadableCheckpoints) as refused:
        repair_checkpoint_state(str(tmp_path))
    assert f"{path}: {checkpoint_problem(path)}" in refused.value.message
    assert (tmp_path / "checkpoint").read_text() == state


def test_a_state_naming_only_checkpoints_with_no_file_left_is_removed_so_training_starts_afresh(tmp_path):
    (path,) = save_checkpoints(tmp_path, [10])
    for name in tmp_path.glob("model.ckpt-10.*"):
        name.unlink()

    repair = repair_checkpoint_state(str(tmp_path))
    assert (repair.path, repair.step, repair.rewritten) == (None, None, True)
    assert not (tmp_path / "checkpoint").exists()
    assert describe_repair(repair) == [f"skipping incomplete checkpoint {path}: no .index file",
                                       "no checkpoint file left: training starts from step 0"]


def test_empty_or_missing_model_dir(tmp_path):
    assert latest_complete_checkpoint(str(tmp_path / "absent")) is None
    assert repair_checkpoint_state(str(tmp_path)) == CheckpointRepair(None, None, [], rewritten=False)


def test_missing_state_file_is_rebuilt_from_the_checkpoints_on_disk(tmp_path):
    paths = save_checkpoints(tmp_path, [10, 20])
    (tmp_path / "checkpoint").unlink()

    assert repair_checkpoint_state(str(tmp_path)) == CheckpointRepair(paths[1], 20, [], rewritten=True)
    assert tf.train.latest_checkpoint(str(tmp_path)) == paths[1]


def test_state_entries_naming_another_folder_are_never_named_nor_deleted_from_model_dir(tmp_path):
    """A state copied from elsewhere, naming `../other/...` and an absolute path there: the repair names model_dir's
    own checkpoints by their names, and a CheckpointManager (the keras and jax engines') saving past max_to_keep
    deletes only inside its own folder."""
    from tpulaunch.engine import portable

    other, model_dir = tmp_path / "other", tmp_path / "model_dir"
    other.mkdir()
    model_dir.mkdir()
    theirs = save_checkpoints(other, [1, 2])
    before = {p.name: p.read_bytes() for p in other.iterdir()}
    save_checkpoints(model_dir, [3])
    # As a CheckpointManager writes it: with the times it saved them (it manages, and deletes, those newer than
    # its last preserved one).
    (model_dir / "checkpoint").write_text(
        f'model_checkpoint_path: "{theirs[1]}"\n'
        f'all_model_checkpoint_paths: "../other/model.ckpt-1"\nall_model_checkpoint_paths: "{theirs[1]}"\n'
        'all_model_checkpoint_timestamps: 1000.0\nall_model_checkpoint_timestamps: 1001.0\n'
        'last_preserved_timestamp: 1.0\n')

    checkpoint = tf.train.Checkpoint(v=tf.Variable(1.0))
    manager = portable.checkpoint_manager_class(lambda: None)(checkpoint, str(model_dir), max_to_keep=1,
                                                              checkpoint_name="model.ckpt")
    for step in (4, 5):
        manager.save(checkpoint_number=step)
    assert {p.name: p.read_bytes() for p in other.iterdir()} == before
    assert str(tmp_path / "other") not in (model_dir / "checkpoint").read_text()

    (model_dir / "checkpoint").write_text(f'model_checkpoint_path: "{theirs[1]}"\n'
                                          'all_model_checkpoint_paths: "../other/model.ckpt-1"\n')
    repair = repair_checkpoint_state(str(model_dir))
    assert repair.path == str(model_dir / "model.ckpt-5") and repair.rewritten
    assert state_paths(model_dir) == (repair.path, [repair.path])
    assert "other" not in (model_dir / "checkpoint").read_text()
    assert {p.name: p.read_bytes() for p in other.iterdir()} == before


def test_a_rollback_moves_the_newer_checkpoints_aside_never_over_what_an_earlier_one_moved(tmp_path):
    paths = save_checkpoints(tmp_path, [2, 4, 6])
    folder, moved = roll_back_to(str(tmp_path), paths[1])
    assert (folder, moved) == (str(tmp_path / NON_FINITE_FOLDER), ["model.ckpt-6"])
    assert state_paths(tmp_path)[0] == paths[1] and not list(tmp_path.glob("model.ckpt-6.*"))
    first = {p.name: p.read_bytes() for p in Path(folder).iterdir()}
    assert "model.ckpt-6.index" in first

    # The same step saved again (a rerun from step 4) and rolled back again: kept beside the first, not over it.
    again = save_checkpoints(tmp_path, [6])
    folder_2, moved_2 = roll_back_to(str(tmp_path), paths[1])
    assert (folder_2, moved_2) == (str(tmp_path / f"{NON_FINITE_FOLDER}-2"), ["model.ckpt-6"]), again
    assert {p.name: p.read_bytes() for p in Path(folder).iterdir()} == first
    assert aside_folders(str(tmp_path)) == [folder, folder_2]


def test_a_rollback_with_no_good_checkpoint_moves_only_the_runs_own_and_steps_past_a_file_in_the_way(tmp_path):
    save_checkpoints(tmp_path, [3])
    with tf.Graph().as_default():  # the user's own checkpoint, of a name with no step
        tf.compat.v1.get_variable("w", initializer=np.zeros(4, np.float32))
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            tf.compat.v1.train.Saver().save(session, str(tmp_path / "init"))
    (tmp_path / NON_FINITE_FOLDER).write_text("a file, not the folder")
    folder, moved = roll_back_to(str(tmp_path), None)
    assert (folder, moved) == (str(tmp_path / f"{NON_FINITE_FOLDER}-2"), ["model.ckpt-3"])
    assert (tmp_path / "init.index").exists() and not (tmp_path / "checkpoint").exists()
    assert (tmp_path / NON_FINITE_FOLDER).read_text() == "a file, not the folder"
    assert aside_folders(str(tmp_path)) == [folder]
