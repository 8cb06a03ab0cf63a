"""Run TensorFlow's own TPUEstimator partition and batch checks on a CPU, against a faked TPU slice.

TPUEstimator checks batch sizes and `input_partition_dims` only after it has asked the TPU master two
questions: which devices exist, and (with model parallelism) what the physical topology is. This module
answers both locally, lets TF 2.15 build the whole training or evaluation graph (context validation,
input_fn, infeed queues, partitioned infeed, TPU rewrite of model_fn), and stops just before a session
would be created. Whatever TF raised on the way is its verdict, with its exact message.

Every TF patch lives in `_tf_patched`, is active only inside it, and is undone on exit; callers that
also train for real use `run_cases_in_subprocess`, so the patches never exist in their process. Paths
below are relative to site-packages (tensorflow 2.15.1, tensorflow-estimator 2.15.0, the final
estimator release), and each patch stands in for exactly these lines:

* `tensorflow/python/tpu/tpu_system_metadata.py:90-95` (`session_lib.Session(master)` and
  `sess.list_devices()`: the device list TF counts cores and hosts from) and `:176-178`
  (`sess.run(tpu.initialize_system())`: the serialized TopologyProto, asked only with model
  parallelism). Both go through the module attribute `session_lib` (imported at `:20`); a fake module
  whose `Session` answers both stands in for it. `_DeviceAttributes` is the real class
  (`tensorflow/python/client/session.py:596`).
* `tensorflow_estimator/python/estimator/estimator.py:1398` `Estimator._train_with_estimator_spec`
  and `:1657` `Estimator._evaluate_run`: the first steps after the graph is built, where a session
  would be created; they are replaced by a stop that keeps the GraphDef.
* `tensorflow/python/tpu/tpu_feed.py:943` `_PartitionedInfeedQueue._check_dims_and_partition_or_replicate_on_host`
  (which runs `_check_input_partition_dims`, `:905-941`, then `partition_or_replicate_on_host`,
  `:35-78`) is wrapped, not replaced: it records the host-side pieces, and which tensor of the tuple
  was being checked when TF raised (TF's messages do not name it).
* Not a patch: a job's RunConfig (`TfCase.run_config`) is rebuilt with `master=FAKE_MASTER` where a
  real run gets its master from a TPUClusterResolver (`tensorflow_estimator/python/estimator/tpu/tpu_config.py:241-307`);
  its TPUConfig is used unchanged.

Read-only: the XLA sharding of each dequeued tensor comes from the `_XlaSharding` attribute that
`tpu_feed.py:81-102` (`_tag_sharding_attribute_for_dequeued_tensor`) puts on `InfeedDequeueTuple`.

Importing this module does not import TensorFlow.
"""

from __future__ import annotations

import contextlib
import enum
import os
import pickle
import subprocess
import sys
import tempfile
import traceback as traceback_lib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence

# Never contacted: the fake session answers for it.
FAKE_MASTER = "grpc://10.240.1.2:8470"
_JOB = "tpu_worker"  # tpu_system_metadata._DEFAULT_JOB_NAME, the job TF expects behind a grpc master
_PER_HOST_V2 = 3  # tpu_config.InputPipelineConfig.PER_HOST_V2


class _Omit(enum.Enum):
    OMIT = "OMIT"


OMIT = _Omit.OMIT
"""Leave an element out: `label_dims=OMIT` gives a 1-element `input_partition_dims`;
`feature_dims=OMIT` gives `input_partition_dims=None` (no spatial partitioning at all)."""


@dataclass(frozen=True)
class TensorDecl:
    """One input tensor; `shape` is per example, without the batch dimension."""

    name: str
    shape: tuple[Optional[int], ...]
    dtype: str = "float32"


@dataclass(frozen=True)
class TfCase:
    """One TPUEstimator configuration to put through TF's checks.

    `features`/`labels` with one element give a single tensor, with more a dict keyed by name
    (`labels=()` gives labels None). `feature_dims`/`label_dims` are `input_partition_dims[0]`/`[1]`
    exactly as TF takes them. `model_fn` must be picklable (module level) for
    `run_cases_in_subprocess`; the default's loss touches every input.

    `run_config`, when given, is a picklable callable `run_config(model_dir) -> tpu.RunConfig` (a
    job's real configuration); its TPUConfig is used as is and only the master is replaced by
    `FAKE_MASTER`. `cores_per_replica`, `feature_dims`, `label_dims` and `iterations_per_loop` are
    then ignored (they describe the case for reports only).

    `input_fn`, when given, replaces the synthetic zeros of the declared shapes: a real input
    pipeline (e.g. `tpulaunch.engine.estimator.make.input_fn_for(job, mode, True, ())`) put through TF's
    per-host infeed. It is rarely picklable: use it with `run_case` in this process.

    `only_after`, when set, makes `run_cases` run this case only if the case before it failed with
    that error type (e.g. a stand-in model after the job's own model could not be built); otherwise
    its verdict is None.
    """

    devices: int
    hosts: int
    cores_per_replica: Optional[int]
    features: tuple[TensorDecl, ...]
    labels: tuple[TensorDecl, ...]
    feature_dims: object
    label_dims: object = None
    train_batch_size: int = 8
    eval_batch_size: Optional[int] = None
    mode: str = "train"
    iterations_per_loop: int = 1
    model_fn: Optional[Callable] = None
    run_config: Optional[Callable[[str], Any]] = None
    input_fn: Optional[Callable] = None
    only_after: Optional[str] = None


@dataclass(frozen=True)
class TfVerdict:
    """What TF decided for one `TfCase`.

    `error_type`/`message` are TF's exception class name and `str()` of it (None when accepted).
    `replicas`, `params_batch_size` (what input_fn saw) and `input_fn_calls` are None where TF stopped
    before knowing them. `piece_shapes` holds, per tensor name, the host-side pieces for each logical
    core of replica 0 on host 0 (one piece for a product-1 dim: core 0 only). `sharding` is the XLA
    sharding TF put on each dequeued tensor: "tiled", "replicated" or "core0". Both stay empty
    without spatial partitioning. `blamed` names the tensor whose partition dims TF was checking
    when it raised (TF's own messages do not name it), else None. `graph_facts` describes the built
    graph (empty when TF stopped before building it): "cross_replica_sum" (a CrossReplicaSum op exists,
    as CrossShardOptimizer makes) and "placeholders_in_tpu" (names of Placeholder ops inside the TPU
    computation, e.g. a Keras Input built inside the loop, which XLA cannot compile). `traceback` is
    the formatted traceback of TF's exception (for `--debug`), None when accepted.
    """

    accepted: bool
    error_type: Optional[str]
    message: Optional[str]
    replicas: Optional[int]
    params_batch_size: Optional[int]
    input_fn_calls: Optional[int]
    piece_shapes: dict[str, list[tuple[int, ...]]] = field(default_factory=dict)
    sharding: dict[str, str] = field(default_factory=dict)
    blamed: Optional[str] = None
    graph_facts: dict = field(default_factory=dict)
    traceback: Optional[str] = None


@dataclass(frozen=True)
class FakeTopology:
    """A v2/v3-style TPU topology: `mesh_shape` [x, y, z, cores_per_chip], coordinates per host/core."""

    mesh_shape: tuple[int, int, int, int]
    device_coordinates: tuple[tuple[tuple[int, int, int, int], ...], ...]

    def serialized(self) -> bytes:
        """The TopologyProto bytes `tpu.initialize_system()` returns on a real slice."""
        from tensorflow.python.tpu import topology as topology_lib

        return topology_lib.Topology(
            mesh_shape=list(self.mesh_shape), device_coordinates=list(self.device_coordinates)
        ).serialized()


def fake_topology(devices: int, hosts: int) -> FakeTopology:
    """The topology of a v2/v3 slice with `devices` TPU cores on `hosts` hosts.

    Two cores per chip; each host owns a block of chips (2x2 for 8 cores), and host blocks are laid
    out x-fastest. The mesh matches real slices (v3-8 [2,2,1,2], v3-32 [4,4,1,2], v3-64 [8,4,1,2],
    v3-128 [8,8,1,2], ...), so TF's fixed computation shapes for 1..128 cores per replica
    (tpu_context.py:36) fit exactly where they fit on hardware. The layout itself is
    `tpulaunch.tpu.topology.core_pair_topology`, which the keras engine's checks share.

    Raises:
        ValueError: devices not a positive multiple of hosts.
    """
    from tpulaunch.tpu.topology import core_pair_topology

    layout = core_pair_topology(devices, hosts)
    return FakeTopology(mesh_shape=layout.mesh_shape, device_coordinates=layout.device_coordinates)


def _device_names(devices: int, hosts: int) -> list[tuple[str, str]]:
    """(name, type) per device as a TPU master lists them; uneven counts go to the first hosts."""
    names = []
    for host in range(hosts):
        prefix = f"/job:{_JOB}/replica:0/task:{host}/device:"
        names.append((prefix + "CPU:0", "CPU"))
        cores = devices // hosts + (1 if host < devices % hosts else 0)
        names.extend((f"{prefix}TPU:{i}", "TPU") for i in range(cores))
        names.append((prefix + "TPU_SYSTEM:0", "TPU_SYSTEM"))
    return names


class _ReachedSession(Exception):
    """Raised where TF would open a session: the graph was built and every host-side check passed."""


@dataclass
class _Recorder:
    """What the patched TF saw while building one case's graph."""

    pieces: list = field(default_factory=list)  # (queue, host_id, [piece shapes]) in call order
    graph_def: Any = None
    failed_index: Optional[int] = None  # tuple position of the tensor whose partition check raised


@contextlib.contextmanager
def _tf_patched(devices: int, hosts: int) -> Iterator[_Recorder]:
    """Fake the TPU master for a slice of `devices` cores on `hosts` hosts; undo everything on exit."""
    from tensorflow.python.client import session as real_session_lib
    from tensorflow.python.tpu import tpu_feed, tpu_system_metadata
    from tensorflow_estimator.python.estimator import estimator as estimator_lib

    recorder = _Recorder()
    device_list = [real_session_lib._DeviceAttributes(name, kind, 0, 0)  # pylint: disable=protected-access
                   for name, kind in _device_names(devices, hosts)]

    class FakeSession:
        """Stands in for `session_lib.Session(master)` in tpu_system_metadata.py:90 and :176."""

        def __init__(self, target="", graph=None, config=None):
            del target, graph, config

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def list_devices(self):  # tpu_system_metadata.py:95
            return list(device_list)

        def run(self, fetches, *args, **kwargs):  # tpu_system_metadata.py:178, initialize_system()
            del fetches, args, kwargs
            return fake_topology(devices, hosts).serialized()

    def stop(self, *args, **kwargs):  # estimator.py:1398 and :1657: the session would start here
        del self, args, kwargs
        import tensorflow as tf

        recorder.graph_def = tf.compat.v1.get_default_graph().as_graph_def()
        raise _ReachedSession()

    queue_cls = tpu_feed._PartitionedInfeedQueue  # pylint: disable=protected-access
    original_partition = queue_cls._check_dims_and_partition_or_replicate_on_host

    def recording_partition(self, tensor, dims):  # tpu_feed.py:943
        try:
            result = original_partition(self, tensor, dims)
        except Exception:
            # Calls go in tuple order, once per tensor of each replica the queue feeds.
            done = sum(1 for queue, _, _ in recorder.pieces if queue is self)
            recorder.failed_index = done % max(1, len(self._input_partition_dims))
            raise
        if dims is None:  # itertools.repeat: the whole tensor goes to every core of the replica
            shapes = [tensor.shape] * self._device_assignment.num_cores_per_replica
        else:
            shapes = [piece.shape for piece in result]
        recorder.pieces.append((self, self._host_id, [tuple(s.as_list()) for s in shapes]))
        return result

    saved = [
        (tpu_system_metadata, "session_lib", tpu_system_metadata.session_lib),
        (estimator_lib.Estimator, "_train_with_estimator_spec",
         estimator_lib.Estimator.__dict__["_train_with_estimator_spec"]),
        (estimator_lib.Estimator, "_evaluate_run", estimator_lib.Estimator.__dict__["_evaluate_run"]),
        (queue_cls, "_check_dims_and_partition_or_replicate_on_host", original_partition),
    ]
    fake_session_lib = type("FakeSessionLib", (), {
        "Session": FakeSession, "_DeviceAttributes": real_session_lib._DeviceAttributes})
    try:
        tpu_system_metadata.session_lib = fake_session_lib
        estimator_lib.Estimator._train_with_estimator_spec = stop
        estimator_lib.Estimator._evaluate_run = stop
        queue_cls._check_dims_and_partition_or_replicate_on_host = recording_partition
        yield recorder
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)


def _flat_names(decls: Sequence[TensorDecl]) -> list[str]:
    # tf.data nest flattens a dict in sorted-key order; a single tensor is itself.
    return [decls[0].name] if len(decls) == 1 else sorted(d.name for d in decls)


def _structure(decls: Sequence[TensorDecl], batch: Any, tf: Any) -> Any:
    def zeros(decl: TensorDecl) -> Any:
        value = tf.zeros([batch] + [1 if d is None else d for d in decl.shape], dtype=decl.dtype)
        if any(d is None for d in decl.shape):  # keep the declared unknown dims unknown
            value = tf.compat.v1.placeholder_with_default(value, [batch, *decl.shape])
        return value

    if len(decls) == 1:
        return zeros(decls[0])
    return {d.name: zeros(d) for d in decls}


def _default_model_fn(features, labels, mode, params):
    """A one-variable model whose loss reads every input, trained with CrossShardOptimizer."""
    del params
    import tensorflow as tf

    weight = tf.compat.v1.get_variable("w", [], initializer=tf.compat.v1.zeros_initializer())
    inputs = [t for t in tf.nest.flatten((features, labels)) if t is not None]
    loss = weight * tf.add_n([tf.reduce_sum(tf.cast(t, tf.float32)) for t in inputs]) + weight * weight
    train_op = None
    if mode == tf.estimator.ModeKeys.TRAIN:
        optimizer = tf.compat.v1.tpu.CrossShardOptimizer(
            tf.compat.v1.train.GradientDescentOptimizer(0.1))
        train_op = optimizer.minimize(loss, global_step=tf.compat.v1.train.get_global_step())
    return tf.compat.v1.estimator.tpu.TPUEstimatorSpec(mode=mode, loss=loss, train_op=train_op)


def _sharding_kinds(graph_def: Any) -> list[str]:
    """Per dequeued tuple element, the sharding tag TF put on InfeedDequeueTuple (tpu_feed.py:81-102)."""
    from tensorflow.compiler.xla import xla_data_pb2

    nodes = list(graph_def.node)
    for function in graph_def.library.function:
        nodes.extend(function.node_def)
    for node in nodes:
        if node.op == "InfeedDequeueTuple" and "_XlaSharding" in node.attr:
            sharding = xla_data_pb2.OpSharding()
            sharding.ParseFromString(node.attr["_XlaSharding"].s)
            kinds = []
            for element in sharding.tuple_shardings:
                if element.type == xla_data_pb2.OpSharding.OTHER:
                    kinds.append("tiled")
                elif element.type == xla_data_pb2.OpSharding.REPLICATED:
                    kinds.append("replicated")
                elif element.type == xla_data_pb2.OpSharding.MAXIMAL:
                    kinds.append(f"core{element.tile_assignment_devices[0]}")
                else:
                    kinds.append(xla_data_pb2.OpSharding.Type.Name(element.type).lower())
            return kinds
    return []


def _graph_facts(graph_def: Any) -> dict:
    """What the built graph shows about the model_fn (see `TfVerdict.graph_facts`)."""
    functions = [(f.signature.name, list(f.node_def)) for f in graph_def.library.function]
    ops = {node.op for node in graph_def.node} | {node.op for _, nodes in functions for node in nodes}
    # Under control-flow v2 the TPU loop body is a function; nodes rewritten in the main graph carry
    # `_tpu_replicate`. A Placeholder in either is inside the TPU computation.
    placeholders = [node.name for node in graph_def.node
                    if node.op == "Placeholder" and "_tpu_replicate" in node.attr]
    placeholders += [node.name for _, nodes in functions for node in nodes if node.op == "Placeholder"]
    return {"cross_replica_sum": "CrossReplicaSum" in ops, "placeholders_in_tpu": sorted(set(placeholders))}


def _host0_pieces(recorder: _Recorder) -> list[list[tuple[int, ...]]]:
    """Pieces of the first replica fed by host 0's first partitioned queue, in tuple order."""
    host0 = [(queue, shapes) for queue, host, shapes in recorder.pieces if host == 0]
    if not host0:
        return []
    first_queue = host0[0][0]
    per_replica = len(first_queue._input_partition_dims)  # pylint: disable=protected-access
    return [shapes for queue, shapes in host0 if queue is first_queue][:per_replica]


def _input_partition_dims(case: TfCase) -> Any:
    if case.feature_dims is OMIT:
        return None
    if case.label_dims is OMIT:
        return [case.feature_dims]
    return [case.feature_dims, case.label_dims]


def _check_case(case: TfCase) -> None:
    names = [d.name for d in case.features + case.labels]
    if not case.features:
        raise ValueError("a TfCase needs at least one feature")
    if len(set(names)) != len(names):
        raise ValueError(f"tensor names must be unique across features and labels: {names}")
    if case.mode not in ("train", "eval"):
        raise ValueError(f"mode must be 'train' or 'eval', got {case.mode!r}")


def run_case(case: TfCase) -> TfVerdict:
    """Put one case through TPUEstimator on a faked slice; nothing is contacted over the network.

    Raises:
        ValueError: the case itself is malformed (no features, duplicate names, unknown mode).
    """
    _check_case(case)
    import tensorflow as tf

    calls: list[int] = []

    def input_fn(params):
        calls.append(params["batch_size"])
        if case.input_fn is not None:
            return case.input_fn(params)
        batch = params["batch_size"]

        def make(_):
            features = _structure(case.features, batch, tf)
            if not case.labels:
                return features
            return features, _structure(case.labels, batch, tf)

        return tf.data.Dataset.from_tensors(0).repeat().map(make)

    estimator = None
    error: Optional[BaseException] = None
    with tempfile.TemporaryDirectory(prefix="tpulaunch-tf-") as model_dir, \
            _tf_patched(case.devices, case.hosts) as recorder:
        try:
            tpu = tf.compat.v1.estimator.tpu
            if case.run_config is not None:
                run_config = _on_fake_master(case.run_config(model_dir), model_dir, tf)
            else:
                tpu_config = tpu.TPUConfig(
                    iterations_per_loop=case.iterations_per_loop,
                    num_cores_per_replica=case.cores_per_replica,
                    per_host_input_for_training=_PER_HOST_V2,
                    input_partition_dims=_input_partition_dims(case))
                run_config = tpu.RunConfig(master=FAKE_MASTER, model_dir=model_dir, tpu_config=tpu_config)
            estimator = tpu.TPUEstimator(
                model_fn=case.model_fn or _default_model_fn, config=run_config, use_tpu=True,
                train_batch_size=case.train_batch_size, eval_batch_size=case.eval_batch_size)
            if case.mode == "train":
                estimator.train(input_fn, steps=1)
            else:
                estimator.evaluate(input_fn, steps=1)
        except _ReachedSession:
            pass
        except Exception as exc:  # pylint: disable=broad-except  # TF's verdict, whatever its type
            error = exc
        replicas = _replicas(estimator, case.mode, tf)

    names = _flat_names(case.features) + (_flat_names(case.labels) if case.labels else [])
    pieces = _host0_pieces(recorder)
    kinds = _sharding_kinds(recorder.graph_def) if recorder.graph_def is not None else []
    return TfVerdict(
        accepted=error is None,
        error_type=None if error is None else type(error).__name__,
        message=None if error is None else str(error),
        replicas=replicas,
        params_batch_size=calls[0] if calls else None,
        input_fn_calls=len(calls) or None,
        piece_shapes=dict(zip(names, pieces)),
        sharding=dict(zip(names, kinds)),
        graph_facts=_graph_facts(recorder.graph_def) if recorder.graph_def is not None else {},
        traceback=None if error is None else "".join(
            traceback_lib.format_exception(type(error), error, error.__traceback__)),
        blamed=names[recorder.failed_index] if recorder.failed_index is not None
        and recorder.failed_index < len(names) else None,
    )


def _on_fake_master(config: Any, model_dir: str, tf: Any) -> Any:
    """`config` as given, but pointed at `FAKE_MASTER` (a real run gets its master from a cluster resolver)."""
    return tf.compat.v1.estimator.tpu.RunConfig(
        master=FAKE_MASTER, model_dir=model_dir, tpu_config=config.tpu_config,
        save_checkpoints_steps=config.save_checkpoints_steps, keep_checkpoint_max=config.keep_checkpoint_max,
        tf_random_seed=config.tf_random_seed, log_step_count_steps=config.log_step_count_steps,
        save_summary_steps=config.save_summary_steps)


def _replicas(estimator: Any, mode: str, tf: Any) -> Optional[int]:
    """TF's replica count from the cached metadata; None where TF itself cannot say."""
    if estimator is None:
        return None
    mode_key = tf.estimator.ModeKeys.TRAIN if mode == "train" else tf.estimator.ModeKeys.EVAL
    try:
        # In a graph, so a metadata query that did not happen yet also goes to the fake master.
        with tf.Graph().as_default(), estimator._ctx.with_mode(mode_key) as ctx:  # pylint: disable=protected-access
            return ctx.num_replicas
    except Exception:  # pylint: disable=broad-except  # the same error TF already reported
        return None


def run_cases(cases: Sequence[TfCase]) -> list[Optional[TfVerdict]]:
    """`run_case` for each case, in this process (None for an `only_after` case whose condition failed)."""
    verdicts: list[Optional[TfVerdict]] = []
    for case in cases:
        previous = verdicts[-1] if verdicts else None
        if case.only_after is not None and (previous is None or previous.error_type != case.only_after):
            verdicts.append(None)
        else:
            verdicts.append(run_case(case))
    return verdicts


def run_cases_in_subprocess(cases: Sequence[TfCase], timeout: float = 600) -> list[Optional[TfVerdict]]:
    """`run_cases` in a child Python, so the caller's TensorFlow (if any) is never patched.

    Raises:
        RuntimeError: the child failed; its stderr tail is in the message.
    """
    root = str(Path(__file__).resolve().parents[3])
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    child = subprocess.run(
        [sys.executable, "-c", "import tpulaunch.engine.estimator.offline as m; m._serve()"],
        input=pickle.dumps(list(cases)), capture_output=True, env=env, timeout=timeout, check=False)
    if child.returncode != 0:
        tail = child.stderr.decode(errors="replace")[-4000:]
        raise RuntimeError(f"TF check process exited with {child.returncode}:\n{tail}")
    return pickle.loads(child.stdout)


def _serve() -> None:
    """Child side of `run_cases_in_subprocess`: pickled cases on stdin, pickled verdicts on stdout."""
    from tpulaunch.tf_env import skip_collection_at_exit

    skip_collection_at_exit()
    cases = pickle.loads(sys.stdin.buffer.read())
    # Anything TF prints goes to stderr; stdout carries only the answer.
    answer = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    verdicts = run_cases(cases)
    answer.write(pickle.dumps(verdicts))
    answer.close()


__all__ = ["OMIT", "FAKE_MASTER", "TensorDecl", "TfCase", "TfVerdict", "FakeTopology", "fake_topology",
           "run_case", "run_cases", "run_cases_in_subprocess"]
