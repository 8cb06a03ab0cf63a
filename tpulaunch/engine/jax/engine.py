"""Keras 3 on JAX as an `Engine`: the job's Keras 3 model compiled for the JAX backend, data-parallel over this
machine's devices, trained in the loop every engine runs, exported as a SavedModel. What it does not do yet
(`--tf`) it refuses with a clear message."""

from __future__ import annotations

from typing import Any, Optional

from tpulaunch.engine.jax.about import ABOUT
from tpulaunch.engine.job_code import command_line_path, export_from_command_line, running_job_code
from tpulaunch.errors import TpuLaunchError


def _not_yet(what: str, hint: str) -> TpuLaunchError:
    return TpuLaunchError(f"the jax engine does not {what} yet", hint=hint)


class JaxEngine:
    """The jax engine (`seam/engine.py`'s Engine)."""

    name = ABOUT.name

    def load(self) -> None:
        from tpulaunch.engine.jax.training import load_keras
        from tpulaunch.seam.registry import require
        from tpulaunch.tf_env import import_tensorflow

        require(ABOUT.name)
        load_keras()  # KERAS_BACKEND=jax before Keras first loads in this process
        import_tensorflow()  # its tf.data reads the records

    def check_build(self, loaded, plan) -> list:
        from tpulaunch.engine.core.build_failures import BuildError, problems_of
        from tpulaunch.engine.jax.runner import make_training, trace_steps

        with running_job_code(loaded.job):
            try:
                # The train step, and the eval step when the job evaluates: each mode's failure at its key.
                builds = trace_steps(make_training(loaded.job, plan, search_path=loaded.job.search_path), loaded.job)
            except BuildError as failure:  # the model itself did not build
                return [loaded.problem(failure.key, failure.code or "model-build-failed",
                                       f"building the train model: {failure.detail}", failure.hint)]
            except TpuLaunchError as failure:
                return [loaded.problem(("model", "builder"), failure.code or "build-failed", failure.message,
                                       failure.hint)]
        return problems_of(loaded, builds, "model")

    def step_tensors(self, job, *, use_tpu: bool):
        from tpulaunch.engine.jax.memory_plan import step_tensors

        with running_job_code(job):
            return step_tensors(job, use_tpu=use_tpu)

    def preflight(self, loaded, plan) -> tuple:
        path = ("run", "engine") if loaded.section("run") is not None and loaded.section("run").engine else ("run",)
        return [loaded.problem(path, "jax-engine-unsupported", "--tf asks TensorFlow's TPU code, which the jax "
                               "engine does not run", "drop --tf")], {}

    def train(self, job, plan, *, recorder, cluster_resolver=None, force=False, watch=None, profile=None,
              cpu_replicas: Optional[int] = None):  # cpu_replicas: refused by the checks (ABOUT.layout.cpu_replicas)
        from tpulaunch.engine.jax import hosts, runner

        if profile:
            raise _not_yet("profile", "drop --profile")
        hosts.join(on_tpu=plan.on_tpu, say=recorder.note)  # several hosts ($TF_CONFIG): before JAX picks devices
        with running_job_code(job):
            return runner.train(job, plan, recorder=recorder, search_path=job.search_path, force=force, watch=watch)

    def evaluate(self, job, plan, *, recorder, checkpoint: Optional[str] = None, cluster_resolver: Any = None,
                 cpu_replicas: Optional[int] = None):
        from tpulaunch.engine.jax import hosts, runner

        hosts.join(on_tpu=plan.on_tpu, say=recorder.note)
        with running_job_code(job):
            return runner.evaluate(job, plan, checkpoint=command_line_path(checkpoint), recorder=recorder,
                                   search_path=job.search_path)

    def export(self, job, plan, out_dir: str, *, checkpoint: Optional[str] = None, say=None) -> str:
        from tpulaunch.engine.jax import runner

        return export_from_command_line(runner.export, job, plan, out_dir, checkpoint, say)

    def program(self, loaded, plan) -> str:
        from tpulaunch.engine.jax.program import explain_script

        return explain_script(loaded, plan)
