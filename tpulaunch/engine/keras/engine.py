"""Keras (tf-keras or Keras 3) + tf.distribute as an `Engine`, on TensorFlow 2.16 and later: the strategy for the job and
the machine, the training step and checkpoints of `standalone.py`, its offline TPU verdict, and its program."""

from __future__ import annotations

from typing import Any, Optional

from tpulaunch.engine.job_code import command_line_path, export_from_command_line, running_job_code
from tpulaunch.engine.keras.about import ABOUT


class KerasEngine:
    """The keras engine (`seam/engine.py`'s Engine)."""

    name = ABOUT.name

    def load(self) -> None:
        from tpulaunch.seam.installed import installed_module
        from tpulaunch.seam.registry import require
        from tpulaunch.tf_env import import_tensorflow

        require(ABOUT.name)
        tf = import_tensorflow()
        _ = tf.distribute.Strategy  # touched: its lazy imports run now
        # Both Kerases a builder may use, where installed (tf.keras is tf-keras under TF_USE_LEGACY_KERAS=1):
        # loaded now, so the job's precision policy is set in each before the builder runs.
        if installed_module("tf_keras"):
            _ = tf.keras.layers.Layer
        import keras  # noqa: F401  (Keras 3: TensorFlow 2.16+ depends on it)

    def check_build(self, loaded, plan) -> list:
        from tpulaunch.engine.keras.build import build_problems

        with running_job_code(loaded.job):
            return build_problems(loaded, plan)

    def step_tensors(self, job, *, use_tpu: bool):
        from tpulaunch.engine.keras.build import step_tensors

        with running_job_code(job):
            return step_tensors(job, use_tpu=use_tpu)

    def preflight(self, loaded, plan) -> tuple:
        from tpulaunch.engine.keras.verdict import tf_problems

        with running_job_code(loaded.job):
            return tf_problems(loaded, plan, search_path=loaded.job.search_path)

    def train(self, job, plan, *, recorder, cluster_resolver=None, force=False, watch=None, profile=None,
              cpu_replicas: Optional[int] = None):
        from tpulaunch.engine.keras import runner

        with running_job_code(job):
            return runner.train(job, plan, recorder=recorder, cluster_resolver=cluster_resolver,
                                search_path=job.search_path, force=force, watch=watch, profile=profile,
                                cpu_replicas=cpu_replicas)

    def evaluate(self, job, plan, *, recorder, checkpoint: Optional[str] = None, cluster_resolver: Any = None,
                 cpu_replicas: Optional[int] = None):
        from tpulaunch.engine.keras import runner

        checkpoint = command_line_path(checkpoint)
        with running_job_code(job):
            return runner.evaluate(job, plan, checkpoint=checkpoint, recorder=recorder,
                                   cluster_resolver=cluster_resolver, search_path=job.search_path,
                                   cpu_replicas=cpu_replicas)

    def export(self, job, plan, out_dir: str, *, checkpoint: Optional[str] = None, say=None) -> str:
        from tpulaunch.engine.keras import runner

        return export_from_command_line(runner.export, job, plan, out_dir, checkpoint, say)

    def program(self, loaded, plan) -> str:
        from tpulaunch.engine.keras.program import explain_script

        return explain_script(loaded, plan)
