"""A training session TensorFlow recreated after an error (MonitoredSession recovers from an AbortedError, such as a
checkpoint upload Cloud Storage failed) restores through model_dir's checkpoint state; when reading that state fails
too, TensorFlow initialises the weights afresh at step 0, and its next saves would name lower steps and delete the
run's good checkpoints. The run's saver (`hooks.StagedSaver`, TensorFlow's Saver) and its progress hook refuse that
session before it trains or saves, naming both steps; the checkpoints stay as they were."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from tpulaunch.engine.estimator.hooks import ProgressHook, StagedSaver
from tpulaunch.errors import TpuLaunchError
from tpulaunch.run.events import RunRecorder


def _files(model_dir: Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(model_dir.iterdir()) if p.is_file()}


def test_a_save_at_a_lower_step_than_the_saver_has_written_is_refused_and_writes_nothing(tmp_path):
    with tf.Graph().as_default():
        step = tf.compat.v1.train.get_or_create_global_step()
        tf.compat.v1.get_variable("w", initializer=np.arange(4, dtype=np.float32))
        saver = StagedSaver(max_to_keep=2, sharded=True)
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            for value in (38, 39):
                session.run(step.assign(value))
                saver.save(session, str(tmp_path / "model.ckpt"), global_step=np.int64(value))
            before = _files(tmp_path)
            session.run(tf.compat.v1.global_variables_initializer())  # what a session initialised afresh holds
            with pytest.raises(TpuLaunchError) as refused:
                saver.save(session, str(tmp_path / "model.ckpt"), global_step=step)
            # The same step again (a session restored where it was) is saved as before.
            session.run(step.assign(39))
            saver.save(session, str(tmp_path / "model.ckpt"), global_step=np.int64(39))
    assert refused.value.message.startswith("training went back to step 0 after step 39: TensorFlow recreated its "
                                            "training session"), refused.value.message
    assert "rerun the same command" in refused.value.hint
    assert {name for name in before if name.startswith("model.ckpt-")} == \
        {name for name in _files(tmp_path) if name.startswith("model.ckpt-")}
    assert 'model_checkpoint_path: "model.ckpt-39"' in (tmp_path / "checkpoint").read_text()


def test_a_recreated_session_below_the_step_the_run_reached_is_refused_before_it_trains(tmp_path):
    recorder = RunRecorder(total_steps=48, batch_size=8)
    recorder.session_began(32)
    recorder.steps_run(39, 0.5)
    with tf.Graph().as_default():
        tf.compat.v1.train.get_or_create_global_step()
        hook = ProgressHook(recorder)
        hook.begin()
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            with pytest.raises(TpuLaunchError) as refused:
                hook.after_create_session(session, None)
    assert refused.value.message.startswith("training went back to step 0 after step 39"), refused.value.message
