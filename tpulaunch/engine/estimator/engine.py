"""TPUEstimator as an `Engine`: RunConfig/TPUConfig, the portable model_fn, train/evaluate/export,
TensorFlow's own offline verdict for a declared slice, and the equivalent standalone program."""

from __future__ import annotations

from typing import Any, Optional

from tpulaunch.engine.estimator.about import ABOUT
from tpulaunch.engine.job_code import command_line_path, export_from_command_line, running_job_code


class EstimatorEngine:
    """The estimator engine (`seam/engine.py`'s Engine)."""

    name = ABOUT.name

    def load(self) -> None:
        from tpulaunch.seam.registry import require
        from tpulaunch.tf_env import import_tensorflow

        require(ABOUT.name)
        tf = import_tensorflow()
        _ = tf.compat.v1.estimator.tpu.TPUEstimator, tf.keras.layers.Layer  # touched: their lazy imports run now

    def check_build(self, loaded, plan) -> list:
        from tpulaunch.engine.estimator.build import build_problems

        with running_job_code(loaded.job):
            return build_problems(loaded, plan)

    def step_tensors(self, job, *, use_tpu: bool):
        from tpulaunch.engine.estimator.build import step_tensors

        with running_job_code(job):
            return step_tensors(job, use_tpu=use_tpu)

    def preflight(self, loaded, plan) -> tuple:
        from tpulaunch.engine.estimator.verdict import tf_problems

        with running_job_code(loaded.job):
            return tf_problems(loaded, plan, search_path=loaded.job.search_path)

    def train(self, job, plan, *, recorder, cluster_resolver=None, force=False, watch=None, profile=None,
              cpu_replicas: Optional[int] = None):  # cpu_replicas: refused by the checks (ABOUT.layout.cpu_replicas)
        from tpulaunch.engine.estimator import runner

        with running_job_code(job):
            return runner.train(job, plan, recorder=recorder, cluster_resolver=cluster_resolver,
                                search_path=job.search_path, force=force, watch=watch, profile=profile)

    def evaluate(self, job, plan, *, recorder, checkpoint: Optional[str] = None, cluster_resolver: Any = None,
                 cpu_replicas: Optional[int] = None):
        from tpulaunch.engine.estimator import runner

        checkpoint = command_line_path(checkpoint)
        with running_job_code(job):
            return runner.evaluate(job, plan, checkpoint=checkpoint, recorder=recorder,
                                   cluster_resolver=cluster_resolver, search_path=job.search_path)

    def export(self, job, plan, out_dir: str, *, checkpoint: Optional[str] = None, say=None) -> str:
        from tpulaunch.engine.estimator import runner

        return export_from_command_line(runner.export, job, plan, out_dir, checkpoint, say)

    def program(self, loaded, plan) -> str:
        from tpulaunch.engine.estimator.program import explain_script

        return explain_script(loaded, plan, search_path=loaded.job.search_path)
