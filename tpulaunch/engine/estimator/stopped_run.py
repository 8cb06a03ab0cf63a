"""`train`'s and `evaluate`'s own code, stopped before the first step: how `validate` builds a job.

`build_stopped` makes the TPUEstimator `train`/`evaluate` make (make.make_estimator: the job's
RunConfig, params, batch sizes and model_fn), hands it the input_fn they hand it, and calls its own
`train`/`evaluate`. So the global step, the params, the scaffold, the hooks and the order in which the
input_fn and the model_fn are called are TensorFlow's own, not a copy of them. `StopBeforeFirstStep`
ends the call once the graph is finalized and the session exists (variables initialized, a builder's
weights loaded, the input iterators made), before any step runs: no record is read, nothing trains. The
memory estimate, which reads only the step's graph, stops it earlier, once the model_fn has built it.

Two things differ from a real run, on purpose: the model_dir is a scratch directory (validate writes
nothing where the run's checkpoints are, and a model_dir already at `train.steps` would make
TensorFlow skip the build), and tpulaunch's own pipeline gets the data patterns as written instead of
the files they match (the files are never read here; the data check lists and reads them, so a
missing file is reported once, at data.train).

`graph_checks_hook` runs in real runs too: what it refuses, `train` refuses before its first step.
"""

from __future__ import annotations

import tempfile
from typing import Callable, Optional

from tpulaunch.engine.estimator.locate import located_error
from tpulaunch.errors import TpuLaunchError


class BuiltNotRun(Exception):
    """The graph was built (and, unless stopped before the session, finalized and given a session); the run was
    stopped before its first step."""


def build_stopped(job, mode: str, plan=None, *, on_graph: Optional[Callable] = None,
                  before_session: bool = False) -> None:
    """Build `mode` ("train" or "eval") as `train --local` / `evaluate --local` do, stopped before the first step.

    Args:
        job: the checked job.
        mode: which of the estimator's calls to make.
        plan: the command's Plan (`make.plan_on_this_machine`: the build runs on this machine whatever its target).
        on_graph: called with the graph before the stop.
        before_session: stop once the step's graph is built (the hooks' `begin`), before the session is made:
            what the memory estimate reads is all there, and the session (variables initialized, the builder's
            weights loaded, step 0's checkpoint and graph.pbtxt written) costs a large model most of its build.

    Raises:
        BuildError (build.py) or TpuLaunchError: what the job's code or TensorFlow refused, located at its key.
    """
    import tensorflow as tf

    from tpulaunch.engine.estimator.make import input_fn_for, make_estimator, plan_on_this_machine

    class StopBeforeFirstStep(tf.compat.v1.train.SessionRunHook):
        def begin(self):  # the model_fn has built the whole step; the scaffold is not finalized yet
            if before_session:
                stop(tf.compat.v1.get_default_graph())

        def after_create_session(self, session, coord):
            stop(session.graph)

    def stop(graph):
        if on_graph is not None:
            on_graph(graph)
        raise BuiltNotRun()

    # The memory estimate reads the graph and runs nothing; a TPU job's own graph runs its TPU ops on the TPU.
    tpu_ops_run = before_session or (plan is not None and plan.on_tpu)
    hooks = [graph_checks_hook(job, tpu_ops_run=tpu_ops_run), StopBeforeFirstStep()]
    with tempfile.TemporaryDirectory(prefix="tpulaunch-validate-") as scratch:
        estimator = make_estimator(job, plan_on_this_machine(job, plan), search_path=job.search_path, model_dir=scratch)
        input_fn = input_fn_for(job, mode, False, job.search_path, unread_files=True)
        try:
            if mode == "train":
                estimator.train(input_fn, max_steps=1, hooks=hooks)
            else:
                estimator.evaluate(input_fn, steps=1, hooks=hooks)
        except BuiltNotRun:
            return
        except Exception as exc:  # noqa: BLE001 (the job's code or TensorFlow refused it: located at its key)
            located = located_error(job, mode, exc)
            if located is exc:
                raise  # located already (its cause is the job's own error, kept for --debug)
            raise located from exc
    raise TpuLaunchError(f"the {mode} run ended without reaching its first step",
                         hint="report this with `tpulaunch --debug validate` output")


def graph_checks_hook(job, *, tpu_ops_run: bool = False):
    """A hook checking the built graph for what TensorFlow itself finds only when the first step runs (`tpu_ops_run`:
    ops that run only on a TPU are not checked)."""
    import tensorflow as tf

    class GraphChecks(tf.compat.v1.train.SessionRunHook):
        def begin(self):
            unfed_placeholders(job, tf.compat.v1.get_default_graph())
            if not tpu_ops_run:
                tpu_ops_off_the_tpu(job, tf.compat.v1.get_default_graph())

    return GraphChecks()


def unfed_placeholders(job, graph) -> None:
    """Refuse a loss that reads a graph placeholder nothing feeds: TensorFlow fails at the first step with
    "You must feed a value for placeholder tensor". A Keras functional model does this when a layer adds a
    loss (`add_loss`) on the model's symbolic Input, which then stays in `model.losses`."""
    import tensorflow as tf

    from tpulaunch.engine.core.build_failures import BuildError

    losses = graph.get_collection(tf.compat.v1.GraphKeys.LOSSES)
    found = sorted({op.name for op in _ancestors([t.op for t in losses]) if op.type == "Placeholder"})
    if not found:
        return
    key = ("model", "model_fn") if job.model.model_fn else ("model", "builder")
    names = ", ".join(f"'{name}'" for name in found)
    raise BuildError(
        key, "train",
        f"the loss reads graph placeholder(s) {names}, which no input feeds (TensorFlow would stop at the first "
        "step: 'You must feed a value for placeholder tensor')",
        "in a Keras functional model this is a loss added with add_loss() on the model's Input tensors (a custom "
        "layer calling self.add_loss in call()): compute it from the outputs in model.loss ('pkg.mod:fn(labels, "
        "outputs)'), or build the model as a subclass of tf.keras.Model")


# Ops that run only inside a TPU computation (no CPU or GPU kernel), and what in a program makes each.
TPU_ONLY_OPS = {
    "CrossReplicaSum": "tf.compat.v1.tpu.CrossShardOptimizer (or tf.compat.v1.tpu.cross_replica_sum)",
    "AllToAll": "tf.compat.v1.tpu.all_to_all", "CollectivePermute": "tf.compat.v1.tpu.collective_permute",
    "InfeedDequeue": "tf.compat.v1.tpu.infeed_dequeue", "InfeedDequeueTuple": "tf.compat.v1.tpu.infeed_dequeue_tuple",
    "OutfeedEnqueue": "tf.compat.v1.tpu.outfeed_enqueue", "OutfeedEnqueueTuple": "tf.compat.v1.tpu.outfeed_enqueue_tuple",
}


def tpu_ops_off_the_tpu(job, graph) -> None:
    """Refuse an op that runs only on a TPU outside a TPU computation, as in a `--local` run (TensorFlow stops at the
    first step: "No OpKernel was registered to support Op 'CrossReplicaSum'"). On a TPU, TPUEstimator builds the
    model_fn inside its TPU computation (TPUReplicateMetadata, and `_tpu_replicate` on its ops): such a graph is
    left alone."""
    from tpulaunch.engine.core.build_failures import BuildError, job_frame

    ops = graph.get_operations()
    if any(op.type == "TPUReplicateMetadata" for op in ops):
        return
    for op in ops:
        if op.type not in TPU_ONLY_OPS or _in_tpu_computation(op):
            continue
        frame = job_frame(op.traceback)
        key = ("model", "model_fn") if job.model.model_fn else ("model", "optimizer")
        raise BuildError(
            key, "train",
            f"the graph has the op '{op.type}', which runs on a TPU only: {TPU_ONLY_OPS[op.type]} makes it"
            + (f" (at {frame})" if frame else "") + "; here it has no kernel (TensorFlow: \"No OpKernel was "
            f"registered to support Op '{op.type}'\")",
            "use it only on a TPU, as tensorflow/tpu's programs do: `if params['use_tpu']: optimizer = "
            "tf.compat.v1.tpu.CrossShardOptimizer(optimizer)` (TPUEstimator sets params['use_tpu']: False in a "
            "--local run), or a flag the job sets (flags: {use_tpu: false})")


def _in_tpu_computation(op) -> bool:
    try:
        op.get_attr("_tpu_replicate")
        return True
    except ValueError:
        return False


def _ancestors(ops: list) -> list:
    seen, stack = {}, list(ops)
    while stack:
        op = stack.pop()
        if op.name in seen:
            continue
        seen[op.name] = op
        stack.extend(t.op for t in op.inputs)
        stack.extend(op.control_inputs)
    return list(seen.values())
