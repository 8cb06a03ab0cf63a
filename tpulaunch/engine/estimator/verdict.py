"""`validate --tf`: ask TensorFlow's own TPUEstimator whether it accepts the job, for the declared slice.

The job's train graph (and its eval graph when it evaluates) is built by TF 2.15 itself, in a child
process that fakes the TPU master's device list and topology (`tpulaunch.engine.estimator.offline`), with:

* the job's real RunConfig/TPUConfig (`make.run_config(job, use_tpu=True)`: cores per replica,
  `input_partition_dims`, PER_HOST_V2, iterations_per_loop); only the master address is a fake one
  that is never contacted;
* the job's real model_fn (`model.make_model_fn(job, use_tpu=True)`), or, when its Keras builder
  cannot be built at the declared shapes, a one-variable stand-in (said so in a warning);
* synthetic zeros of the declared shapes and structure instead of records (nothing is read).

TF's rejection becomes a located problem (code `tensorflow-rejected`) carrying TF's exact message;
what TF built (replicas, params['batch_size'], input_fn calls, per-core pieces, XLA sharding) is
returned for `plan_report.render_tf_built`.

Importing this module does not import TensorFlow.
"""

from __future__ import annotations

import inspect
import subprocess
from typing import TYPE_CHECKING, Sequence

from tpulaunch.errors import Problem
from tpulaunch.job.load import LoadedJob

if TYPE_CHECKING:
    from tpulaunch.plan.build import Plan

REJECTED = "tensorflow-rejected"
STAND_IN = "tensorflow-stand-in-model"
CHECK_FAILED = "tensorflow-check-failed"
EMPTY_PIECES = "tensorflow-empty-pieces"
UNEVEN_PIECES = "tensorflow-uneven-pieces"
NOT_ON_TPU = "tensorflow-not-on-tpu"
NO_CROSS_REPLICA_SUM = "tensorflow-no-cross-replica-sum"
PLACEHOLDER_IN_LOOP = "tensorflow-placeholder-in-tpu-loop"

# The error type a job's model_fn failure is reported under (see JobModelFn).
MODEL_BUILD_FAILED = "ModelBuildFailed"
MODEL_FN_FAILED = "ModelFnFailed"

# Words in TF's messages that say what it refused (tpu_context.py:442-465, :692-791; tpu_config.py:158-234).
# TF's static-shape refusals: tpu_feed.py:941 (partitioned), tpu_sharding.py:178 (dequeue),
# tpu_estimator.py:2006 (model_fn wrapper), tpu_sharding.py:265 (unknown batch dim), and numpy's
# refusal to split an unknown size for a product-1 dim (tpu_feed.py:35-78).
_STATIC_SHAPE_WORDS = ("is not fully defined", "must have static shape", "must have a fixed size",
                       "unsupported operand type(s) for *=: 'NoneType'", "ufunc 'divmod' not supported")
_REPLICA_WORDS = ("num_cores_per_replica", "model parallelism", "computation footprint", "replicas with shape")


class ModelBuildFailed(Exception):
    """The job's Keras builder could not be built at the declared shapes (no TF check involved)."""


class ModelFnFailed(Exception):
    """The job's model_fn raised while TF was building the TPU graph around it."""


class JobRunConfig:
    """Picklable `run_config(model_dir)`: the RunConfig a real TPU run of `job` on `plan` gets."""

    def __init__(self, job, plan: "Plan"):
        self.job, self.plan = job, plan

    def __call__(self, model_dir: str):
        from tpulaunch.engine.estimator.make import run_config

        return run_config(self.job, self.plan, model_dir=model_dir)


class JobModelFn:
    """Picklable TPU model_fn of `job`, built in the process that runs it.

    When the job's model_fn raises, the Keras builder is tried on its own at the declared per-example
    shapes in a scratch graph: if that fails too, the error is `ModelBuildFailed` (the model cannot be
    built; TF's checks are then run with a stand-in), else `ModelFnFailed` with the original type and
    message. Either way it is told apart from TF's own checks. Nothing extra is built on success.
    """

    def __init__(self, job, search_path: Sequence[str] = ()):
        self.job = job
        self.search_path = list(search_path)

    def _probe(self) -> None:
        """Build the Keras model and call it on symbolic inputs of the declared shapes (batch 1)."""
        import tensorflow as tf

        from tpulaunch.job.builder_args import builder_kwargs
        from tpulaunch.job.imports import resolve

        spec, features = self.job.model, self.job.data.features
        builder = resolve(spec.builder, search_path=self.search_path, what="model builder")
        with tf.Graph().as_default():
            model = builder(**builder_kwargs(builder, spec.params, features))
            inputs = {name: tf.zeros([1, *f.shape], "float32" if f.dtype == "bfloat16" else f.dtype)
                      for name, f in features.items()}
            model(next(iter(inputs.values())) if len(inputs) == 1 else inputs, training=False)

    def _classify(self, exc: Exception) -> Exception:
        if self.job.model.builder:
            try:
                self._probe()
            except Exception as probe_exc:  # pylint: disable=broad-except  # any failure: the model cannot be built
                return ModelBuildFailed(_describe(probe_exc))
        return ModelFnFailed(_describe(exc))

    def __call__(self, features, labels, mode, params, config=None):
        from tpulaunch.engine.estimator.model_fn import make_model_fn

        try:
            model_fn = make_model_fn(self.job, use_tpu=True, search_path=self.search_path)
        except Exception as exc:  # pylint: disable=broad-except  # import paths, optimizer: nothing TF checks
            raise ModelBuildFailed(_describe(exc)) from exc
        # As Estimator._call_model_fn does: only the arguments the function names (estimator.py:1160-1173).
        # The harness's TPUEstimator has no params=: the job's own (model.params) are added as a run adds them.
        from tpulaunch.engine.estimator.params import estimator_params

        accepted = inspect.signature(model_fn).parameters
        params = {**(estimator_params(self.job) or {}), **(params or {})}
        given = {"labels": labels, "mode": mode, "params": params, "config": config}
        kwargs = {name: value for name, value in given.items() if name in accepted}
        try:
            return model_fn(features, **kwargs)
        except Exception as exc:  # pylint: disable=broad-except  # reported with TF's message
            raise self._classify(exc) from exc


def _describe(exc: BaseException) -> str:
    if getattr(exc, "detail", None):  # build.BuildError: already says what failed, in validate's words
        return exc.detail
    return f"{type(exc).__name__}: {getattr(exc, 'message', None) or exc}"


def cases_for_job(job, plan: "Plan", search_path: Sequence[str] = (), *, job_model: bool = True) -> list:
    """Per mode the job runs, two `TfCase`s: the job's own model_fn, then the stand-in model_fn (run
    only when the job's model cannot be built).

    With `job_model=False`, only the stand-in case per mode (the partition and batch checks do not
    depend on the model).

    Raises:
        tpulaunch.tpu.types.UnknownTpuType: the job's TPU type does not exist.
    """
    from tpulaunch.engine.estimator.offline import TensorDecl, TfCase
    from tpulaunch.tpu.types import parse_tpu_type

    tpu_type = parse_tpu_type(job.tpu.type)  # raises for an unknown type, as documented
    features = tuple(TensorDecl(n, tuple(s.shape), s.dtype) for n, s in job.data.features.items())
    labels = tuple(TensorDecl(n, tuple(s.shape), s.dtype) for n, s in job.data.labels.items())
    train_batch, eval_batch = plan.train_batch_size, plan.eval_batch_size
    cases = []
    for mode in modes_of(job):
        for model_fn in ((JobModelFn(job, search_path), None) if job_model else (None,)):
            fallback = job_model and model_fn is None
            cases.append(TfCase(
                devices=tpu_type.devices, hosts=tpu_type.hosts, cores_per_replica=job.tpu.cores_per_replica,
                features=features, labels=labels, feature_dims=None, train_batch_size=train_batch,
                eval_batch_size=eval_batch, mode=mode, iterations_per_loop=job.tpu.iterations_per_loop,
                model_fn=model_fn, run_config=JobRunConfig(job, plan),
                only_after=MODEL_BUILD_FAILED if fallback else None))
    return cases


def modes_of(job) -> list:
    """"train" when the job trains, "eval" when it evaluates (train first)."""
    return [m for m, section in (("train", job.train), ("eval", job.eval)) if section is not None]


def tf_problems(loaded: LoadedJob, plan: "Plan", search_path: Sequence[str] = ()) -> tuple:
    """TF's own verdict on the job, as located problems, and what TF built per mode.

    Returns:
        (problems, built): `built` maps "train"/"eval" to {accepted, replicas, params_batch_size,
        input_fn_calls, piece_shapes {name: [shape, ...]}, sharding {name: kind}, model ("job" or
        "stand-in"), message (TF's, or None), traceback (TF's formatted traceback, or None: for
        `--debug`)}.
    """
    from tpulaunch.engine.estimator.offline import run_cases_in_subprocess
    from tpulaunch.tpu.types import UnknownTpuType

    job = loaded.job
    if job is None:
        return [], {}
    if job.tpu is None:
        return [loaded.problem(("name",), NOT_ON_TPU,
                               "no tpu: section, so there is no TPUEstimator TPU path to check; the job runs locally",
                               "add a tpu: section to have TensorFlow check the job for a slice",
                               severity="info")], {}
    try:
        cases = cases_for_job(job, plan, search_path)
    except UnknownTpuType as exc:
        return [loaded.problem(("tpu", "type"), CHECK_FAILED, str(exc), exc.hint)], {}
    if not cases:
        return [], {}
    try:
        verdicts = run_cases_in_subprocess(cases)
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        return [loaded.problem(("tpu", "type"), CHECK_FAILED, f"TensorFlow's check could not run: {exc}",
                               "run `tpulaunch validate --tf --debug` for TensorFlow's traceback")], {}

    problems: list = []
    built: dict = {}
    for index, mode in enumerate(modes_of(job)):
        own, stand_in = verdicts[2 * index], verdicts[2 * index + 1]
        verdict, model = own, "job"
        if own.error_type == MODEL_BUILD_FAILED:
            verdict, model = stand_in, "stand-in"
            # The slice's partition and batch rules were still checked (with a one-variable stand-in), but a
            # job whose own model cannot be built never passes.
            problems.append(loaded.problem(
                _model_key(job), STAND_IN,
                f"the job's model could not be built for the {mode} graph ({own.message}); TensorFlow checked the "
                "partitioning and batches with a one-variable stand-in model_fn instead",
                "fix the model (plain `tpulaunch validate` locates the failure; --debug shows the traceback)"))
        built[mode] = _built(verdict, model)
        if not verdict.accepted:
            problems.append(rejection_problem(loaded, mode, verdict))
        problems.extend(piece_warnings(loaded, mode, verdict))
        if model == "job":
            problems.extend(graph_warnings(loaded, mode, verdict))
    return _unique(problems), built


def _built(verdict, model: str) -> dict:
    return {
        "accepted": verdict.accepted,
        "replicas": verdict.replicas,
        "params_batch_size": verdict.params_batch_size,
        "input_fn_calls": verdict.input_fn_calls,
        "piece_shapes": {name: [list(s) for s in shapes] for name, shapes in verdict.piece_shapes.items()},
        "sharding": dict(verdict.sharding),
        "model": model,
        "message": verdict.message,
        "traceback": verdict.traceback,
    }


def _model_key(job) -> tuple:
    return ("model", "builder") if job.model.builder else ("model", "model_fn")


def blamed_key(job, mode: str, verdict) -> tuple:
    """The job-file key TF's rejection is about.

    The declared shape of a tensor with an unknown dim for static-shape messages, the partition dims
    of the tensor TF was checking, the mode's batch_size for batch messages,
    tpu.cores_per_replica for replica messages, the model for model_fn failures, else tpu.type.
    """
    message = verdict.message or ""
    if any(words in message for words in _STATIC_SHAPE_WORDS):
        name = verdict.blamed or _first_unknown(job)
        if name is not None:
            group = "features" if name in job.data.features else "labels"
            return ("data", group, name, "shape")
    if verdict.blamed is not None:
        group = "features" if verdict.blamed in job.data.features else "labels"
        declared = getattr(job.partition, group, {}) if job.partition is not None else {}
        return ("partition", group, verdict.blamed) if verdict.blamed in declared else ("data", group, verdict.blamed)
    if verdict.error_type in (MODEL_FN_FAILED, MODEL_BUILD_FAILED):
        return _model_key(job)
    if verdict.error_type == "AssertionError" and not message.strip():
        # tpu_feed.py:859's bare assert: TPUEstimator packed small features (see checks.PACKED_FEATURES_MIN)
        return ("data", "features")
    if "batch size" in message or "batch_size" in message:
        section = "eval" if mode == "eval" and job.eval is not None else "train"
        return (section, "batch_size") if getattr(job, section) is not None else ("tpu", "type")
    if any(word in message for word in _REPLICA_WORDS):
        return ("tpu", "cores_per_replica")
    if "input_partition_dims" in message or "partition" in message:
        return ("partition",) if job.partition is not None else ("tpu", "cores_per_replica")
    if "iterations_per_loop" in message:
        return ("tpu", "iterations_per_loop")
    return ("tpu", "type")


def _first_unknown(job):
    """The first declared tensor with an unknown dim (TF names only the dequeued tensor)."""
    for group in (job.data.features, job.data.labels):
        for name, spec in group.items():
            if not spec.is_static:
                return name
    return None


def rejection_problem(loaded: LoadedJob, mode: str, verdict) -> Problem:
    """TF's rejection of `mode`, at the key it is about, with TF's exact message."""
    key = blamed_key(loaded.job, mode, verdict)
    where = f"the {mode} graph for {loaded.job.tpu.type}"
    if verdict.error_type in (MODEL_FN_FAILED, MODEL_BUILD_FAILED):
        return loaded.problem(key, REJECTED, f"the model_fn failed while TensorFlow built {where}: {verdict.message}",
                              "the model does not fit the declared inputs or labels on the TPU path; "
                              "`tpulaunch validate --tf --debug` shows the traceback")
    return loaded.problem(
        key, REJECTED, f"TensorFlow's TPUEstimator rejected {where}: {verdict.error_type}: {verdict.message}",
        "this is TensorFlow's own message (tpulaunch's offline rules did not catch it); fix the key it points at")


def piece_warnings(loaded: LoadedJob, mode: str, verdict) -> list:
    """Zero-size and uneven per-core pieces in what TF actually split on the host."""
    job = loaded.job
    problems = []
    for name, shapes in verdict.piece_shapes.items():
        if verdict.sharding.get(name) != "tiled":
            continue
        group = "features" if name in job.data.features else "labels"
        key = ("partition", group, name)
        text = ", ".join("[" + ", ".join(map(str, s)) + "]" for s in shapes)
        if any(0 in shape for shape in shapes):
            empty = sum(1 for shape in shapes if 0 in shape)
            problems.append(loaded.problem(
                key, EMPTY_PIECES,
                f"TensorFlow split '{name}' ({mode}) into per-core pieces {text}: {empty} of {len(shapes)} cores "
                "get an empty piece",
                "use dims that divide every split axis (or sizes divisible by the dims)", severity="warning"))
        elif len(set(map(tuple, shapes))) > 1:
            problems.append(loaded.problem(
                key, UNEVEN_PIECES,
                f"TensorFlow split '{name}' ({mode}) unevenly into per-core pieces {text}; XLA pads each to the largest",
                "sizes divisible by the dims avoid the padding", severity="warning"))
    return problems


def graph_warnings(loaded: LoadedJob, mode: str, verdict) -> list:
    """Silent mistakes TF builds without complaint but the built graph shows (KERAS_TPU.md)."""
    facts = verdict.graph_facts
    if not facts:
        return []
    key = _model_key(loaded.job)
    problems = []
    if mode == "train" and (verdict.replicas or 0) > 1 and not facts.get("cross_replica_sum"):
        problems.append(loaded.problem(
            key, NO_CROSS_REPLICA_SUM,
            f"the train graph has {verdict.replicas} replicas but no cross-replica gradient sum: each replica "
            "would train its own copy of the weights, and TF does not check this",
            "wrap the optimizer: tf.compat.v1.tpu.CrossShardOptimizer(optimizer) (on a TPU only)",
            severity="warning"))
    if facts.get("placeholders_in_tpu"):
        names = ", ".join(facts["placeholders_in_tpu"])
        problems.append(loaded.problem(
            key, PLACEHOLDER_IN_LOOP,
            f"the {mode} graph has placeholders inside the TPU loop ({names}), typically a Keras Input built in "
            "model_fn; XLA cannot compile a placeholder, so the TPU run would fail",
            "build the Keras model inside `with tf.init_scope():` in model_fn", severity="warning"))
    return problems


def _unique(problems: list) -> list:
    seen, out = set(), []
    for p in problems:
        key = (p.path, p.code, p.message)
        if key not in seen:
            seen.add(key)
            out.append(p)
    return out


__all__ = ["tf_problems", "cases_for_job", "modes_of", "blamed_key", "rejection_problem", "piece_warnings",
           "graph_warnings",
           "JobModelFn", "JobRunConfig", "ModelBuildFailed", "ModelFnFailed"]
