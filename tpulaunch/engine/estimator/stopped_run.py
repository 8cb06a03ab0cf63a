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

    hooks = [graph_checks_hook(job), StopBeforeFirstStep()]
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
            raise located_error(job, mode, exc) from exc
    raise TpuLaunchError(f"the {mode} run ended without reaching its first step",
                         hint="report this with `tpulaunch --debug validate` output")


def graph_checks_hook(job):
    """A hook checking the built graph for what TensorFlow itself finds only when the first step runs."""
    import tensorflow as tf

    class GraphChecks(tf.compat.v1.train.SessionRunHook):
        def begin(self):
            unfed_placeholders(job, tf.compat.v1.get_default_graph())

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
