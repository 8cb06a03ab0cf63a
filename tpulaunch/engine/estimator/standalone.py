"""The model_fn and TPUEstimator settings that `tpulaunch train` runs on the estimator engine, on plain values.

This module imports only TensorFlow, the Python standard library and `engine/portable.py` (the input
pipeline, precision, heads and losses the engines share), and takes plain values plus the job's own
callables. tpulaunch calls it with values converted from the job file (engine/estimator/plain.py), and
`tpulaunch explain` prints portable.py and then this module verbatim inside the standalone program
(without the import of portable's names below, which the program defines above it), so the program
runs exactly this code.
"""

import random
from typing import Callable, Dict, List, Optional

import tensorflow as tf

from tpulaunch.engine.portable import (  # explain: the program defines these above this module
    Head, Pair, SpecError, _classes, _losses_by_label, _predictions, _values_like_labels, compute_loss,
    imported_kerases, metrics_by_label, pair_heads, probabilities_of)


# ------------------------------------------------------------------------------------------ input_fn

def host_shard(context) -> tuple:
    """(this input pipeline's index, number of input pipelines) from what params["context"] holds: TPUEstimator's
    TPUContext, whose `current_input_fn_deployment()` is (host device, invocation index, invocation count, replicas
    fed); under PER_HOST_V2 that is one invocation per host. None (an Estimator on CPU): a single pipeline."""
    if context is None or not hasattr(context, "current_input_fn_deployment"):
        return 0, 1
    _, index, count, _ = context.current_input_fn_deployment()
    return int(index), int(count)


def params_input_fn(dataset_fn: Callable, training: bool = False, segment_steps: Optional[int] = None,
                    rolled_back: Callable[[], int] = lambda: 0) -> Callable:
    """TPUEstimator's `input_fn(params)` over the shared pipeline (`portable.make_dataset_fn`'s `dataset_fn`):
    `params["batch_size"]` is the batch of this call (per host under PER_HOST_V2, global on CPU) and
    `params["context"]` says which host's share of the data it reads (`host_shard`). `training`: the pipeline
    reads on from where the restored global step left it (`read_on`); `segment_steps`: the steps between the
    evaluations the run trains in segments of (eval.every_steps), None when it trains in one; `rolled_back()`: the
    steps this run trained and then rolled back from (a NaN loss, train.on_nan), whose batches it reads past, not
    again, as the other engines' input goes on after a rollback."""

    def input_fn(params):
        index, count = host_shard(params.get("context"))
        skip, reseed = read_on(params.get("context"), segment_steps, rolled_back()) if training else (0, 0)
        return dataset_fn(params["batch_size"], shard_index=index, shard_count=count, skip_batches=skip,
                          reseed=reseed)

    return input_fn


def read_on(context, segment_steps: Optional[int], rolled_back: int = 0) -> tuple:
    """(batches to skip, the step the pipeline is seeded at) for a training pipeline TPUEstimator made anew at the
    session's global step: at the start of each segment between evaluations (`train` is called once a segment),
    after a resume, or when TensorFlow recreates a session. A segment starting at step b reads a pipeline seeded
    at b (`portable.make_dataset_fn`'s `reseed`: the files in another order than the last segment's, each read
    again from its head) from its first batch; a run resumed at step k inside it skips the k - b batches the segment had handed
    out (times the replicas the pipeline feeds: `current_input_fn_deployment()`'s last item; one on CPU), so it
    reads what a run that never stopped reads, at the cost of reading at most a segment's batches again, never
    everything since step 0 at every evaluation; `rolled_back` steps more when the run rolled back from a NaN (the
    batches that made it are not read again). Tensors, read when the pipeline starts (after the restore)."""
    global_step = tf.compat.v1.train.get_global_step()
    if global_step is None:
        return 0, 0
    fed = 1
    if context is not None and hasattr(context, "current_input_fn_deployment"):
        fed = int(context.current_input_fn_deployment()[3])
    step = tf.cast(tf.convert_to_tensor(global_step), tf.int64)
    began = (step // segment_steps) * segment_steps if segment_steps else tf.zeros_like(step)
    return (step - began + rolled_back) * fed, began


# ------------------------------------------------------------------------------------------ optimizer

V1_OPTIMIZERS = {
    "sgd": tf.compat.v1.train.GradientDescentOptimizer,
    "momentum": tf.compat.v1.train.MomentumOptimizer,
    "adam": tf.compat.v1.train.AdamOptimizer,
    "adagrad": tf.compat.v1.train.AdagradOptimizer,
    "rmsprop": tf.compat.v1.train.RMSPropOptimizer,
}

# MomentumOptimizer has no default momentum; 0.9 is what nearly every reference model uses.
OPTIMIZER_DEFAULTS = {"momentum": {"momentum": 0.9}}


def optimizer_factory(optimizer: str, learning_rate: float, optimizer_args: dict,
                      make: Optional[Callable] = None) -> Callable:
    """A function returning a fresh v1 optimizer (one per graph): `make` (the job's own constructor, with
    `optimizer_args`), else the one V1_OPTIMIZERS names `optimizer`, with its defaults under `optimizer_args`."""
    args = dict(optimizer_args)
    if make is None:
        make = V1_OPTIMIZERS[optimizer]
        args = {**OPTIMIZER_DEFAULTS.get(optimizer, {}), **args}

    def factory():
        return make(learning_rate=learning_rate, **args)

    return factory


# -------------------------------------------------------------------------------------------- metrics

def _one_metric(name: str, head: Head, labels, outputs, custom: Optional[Callable]):
    m = tf.compat.v1.metrics
    if custom is not None:
        return custom(labels, outputs)
    if name in ("mean_squared_error", "mean_absolute_error"):
        fn = m.mean_squared_error if name == "mean_squared_error" else m.mean_absolute_error
        return fn(*_values_like_labels(labels, outputs))
    if head.kind is None:
        raise SpecError(f"metric {name!r} needs a classification loss; model.loss is {head.loss_name!r}",
                        hint="use mean_squared_error or mean_absolute_error, or a crossentropy loss")
    truth, predicted, probabilities, num_classes = _classes(head, labels, outputs)
    if name == "accuracy":
        return m.accuracy(truth, predicted)
    if name == "mean_iou":
        return m.mean_iou(truth, predicted, num_classes)
    binary = probabilities.shape.rank == truth.shape.rank
    if name == "auc":
        if binary:
            return m.auc(truth, probabilities)
        return m.auc(tf.one_hot(truth, num_classes), probabilities)  # micro-averaged over classes
    if name in ("precision", "recall"):
        fn = m.precision if name == "precision" else m.recall
        if binary:
            return fn(truth, predicted)
        return fn(tf.one_hot(truth, num_classes), tf.one_hot(predicted, num_classes))  # micro-averaged
    raise SpecError(f"unknown metric {name!r}", hint="use a metric name model.metrics accepts, or an import path")


def make_metric_fn(heads: Dict[str, Head], chosen: Dict[str, List[str]], custom_metrics: Dict[str, Callable]):
    """`metric_fn(**tensors)` for `eval_metrics`; tensors are flat: 'label/<label>' and 'output/<label>'.

    Results are named by metric, and by '<label>/<metric>' when the model has several heads.
    """

    def metric_fn(**tensors):
        results = {}
        for label, names in chosen.items():
            for name in names:
                custom = custom_metrics.get(name)
                key = custom.__name__ if custom is not None else name
                value = _one_metric(name, heads[label], tensors[f"label/{label}"], tensors[f"output/{label}"], custom)
                results[f"{label}/{key}" if len(heads) > 1 else key] = value
        return results

    return metric_fn


def _metric_tensors(pairs: Dict[str, Pair]) -> dict:
    tensors = {}
    for name, pair in pairs.items():
        tensors[f"label/{name}"] = _tpu_friendly(pair.labels)
        tensors[f"output/{name}"] = _tpu_friendly(pair.outputs)
    return tensors


def _tpu_friendly(tensor):
    # The TPU outfeed handles int32 natively; int64 labels are narrowed.
    return tf.cast(tensor, tf.int32) if tensor.dtype == tf.int64 else tensor


# ------------------------------------------------------------------------------------------- model_fn

def make_model_fn(builder: Callable, builder_kwargs: dict, *, use_tpu: bool, policy: str, loss, metrics,
                  make_optimizer: Callable, learning_rate: float, model_dir: str, summary_steps: int,
                  labels: Optional[Dict[str, dict]] = None, custom_loss: Optional[Callable] = None,
                  custom_losses: Optional[Dict[str, Callable]] = None,
                  custom_metrics: Optional[Dict[str, Callable]] = None, seed: Optional[int] = None,
                  warm_start_from: Optional[str] = None, warm_start_vars: str = ".*",
                  outputs: Optional[Dict[str, str]] = None) -> Callable:
    """The TPUEstimator model_fn around a Keras builder: `model_fn(features, labels, mode, params, config=None)`.

    It follows the one pattern known to work for Keras inside TPUEstimator: the model is built once
    per call inside `tf.init_scope()` and called with `training=(mode == TRAIN)`; outputs are cast to
    float32 before the loss (mixed precision computes in bf16/fp16); a v1 optimizer (from
    `make_optimizer`, wrapped in a loss-scale optimizer under mixed_float16 and in CrossShardOptimizer
    on a TPU) minimizes over `model.trainable_variables` with the batch-norm updates as control
    dependencies; eval metrics are tf.compat.v1.metrics in `eval_metrics`; loss and learning rate go
    to TensorBoard every `summary_steps` steps through `host_call`. A fresh run starts from the values
    the builder gives its model, weights it loaded included (see `builder_weights_scaffold_fn`).

    A model with several outputs has one head per label: its outputs pair with the labels by name
    (dict keys, or output layers named like the labels) or by order (a list, labels as declared),
    and each head's from_logits comes from `outputs` (label -> "logits" | "probabilities") where given, else
    from the layer or op producing its output; a crossentropy head neither says is refused.

    Args:
        builder: returns the (inference-only) tf.keras.Model, called as `builder(**builder_kwargs)`.
        use_tpu: build for a TPU (CrossShardOptimizer) or for CPU/GPU.
        policy: the Keras precision policy in effect (see `policy_name`).
        loss: a Keras loss name or an import path for all labels (an import path then gets the whole
            labels and outputs, as `custom_loss`), or a mapping label -> name or import path.
        metrics: metric names or import paths: a list (each applied to the heads it fits) or a mapping
            label -> list; import paths are the job's own functions, in `custom_metrics`.
        labels: the label specs (as for make_dataset_fn), in declared order: the heads' names.
        custom_losses: the functions of import-path losses in a `loss` mapping, by import path.
        model_dir: where summaries go when RunConfig has none.
        seed, warm_start_from, warm_start_vars: as given to `run_config` and `tpu_estimator`.
        outputs: what each label's output holds, "logits" or "probabilities", where the job declares it.
    """
    label_names = list(labels or {})
    custom_losses = dict(custom_losses or {})
    custom_metrics = dict(custom_metrics or {})
    loss_names = _losses_by_label(loss, label_names)
    declared_outputs = dict(outputs or {})

    def model_fn(features, labels, mode, params, config=None):
        del params  # batch size and context come from TPUEstimator; the model needs neither
        training = mode == tf.estimator.ModeKeys.TRAIN
        # Outside any TPU loop or control-flow context: the Keras Input placeholders must not land
        # inside the compiled loop, and one build per call keeps train/eval/resume variables identical.
        with tf.init_scope():
            seed_the_builder(seed)
            model = builder(**builder_kwargs)
        outputs = model(features, training=training)
        probabilities = probabilities_of(model, outputs)  # read before the cast hides the softmax
        outputs = tf.nest.map_structure(lambda t: tf.cast(t, tf.float32), outputs)
        output_names = list(getattr(model, "output_names", None) or ())

        if mode == tf.estimator.ModeKeys.PREDICT:
            predictions = _predictions(outputs, label_names, output_names)
            return tf.compat.v1.estimator.tpu.TPUEstimatorSpec(mode, predictions=predictions)

        # Outputs pair with labels for a loss per label and for metrics; the job's loss for all labels pairs its own.
        whole_loss = custom_loss if not isinstance(loss, dict) else None
        pairs = pair_heads(labels, outputs, probabilities, loss_names, output_names, declared_outputs) if (
            whole_loss is None or any(metrics)) else {}
        total = compute_loss(loss, labels, outputs, pairs, custom_loss=whole_loss, custom_losses=custom_losses)
        extra = model.get_losses_for(None) + model.get_losses_for(features)  # regularizers
        if extra:
            total = total + tf.add_n([tf.cast(t, tf.float32) for t in extra])

        if mode == tf.estimator.ModeKeys.EVAL:
            eval_metrics = None
            heads = {name: pair.head for name, pair in pairs.items()}
            chosen = metrics_by_label(metrics, heads) if metrics else {}
            if any(chosen.values()):
                eval_metrics = (make_metric_fn(heads, chosen, custom_metrics), _metric_tensors(pairs))
            return tf.compat.v1.estimator.tpu.TPUEstimatorSpec(mode, loss=total, eval_metrics=eval_metrics)

        optimizer = make_optimizer()
        if policy == "mixed_float16":
            optimizer = tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer(optimizer, "dynamic")
        if use_tpu:
            # Sums the gradients over replicas; without it each replica trains on its own.
            optimizer = tf.compat.v1.tpu.CrossShardOptimizer(optimizer)
        global_step = tf.compat.v1.train.get_or_create_global_step()
        # Batch-norm moving statistics are update ops; without these dependencies they never move.
        updates = model.get_updates_for(None) + model.get_updates_for(features)
        with tf.control_dependencies(updates):
            train_op = optimizer.minimize(total, global_step=global_step, var_list=model.trainable_variables)
        summary_dir = config.model_dir if config is not None and config.model_dir else model_dir
        host_call = (_summary_fn(summary_dir, summary_steps),
                     [tf.reshape(global_step, [1]), tf.reshape(total, [1]),
                      tf.reshape(tf.constant(learning_rate, tf.float32), [1])])
        scaffold_fn = builder_weights_scaffold_fn(builder, builder_kwargs, model, seed=seed,
                                                  warm_start_from=warm_start_from, warm_start_vars=warm_start_vars)
        return tf.compat.v1.estimator.tpu.TPUEstimatorSpec(mode, loss=total, train_op=train_op, host_call=host_call,
                                                           scaffold_fn=scaffold_fn)

    return model_fn


def _summary_fn(model_dir: str, every_steps: int):
    """host_call body (runs on the host, outside the TPU loop): loss and learning rate as TensorBoard scalars."""

    def host_call_fn(global_step, loss, learning_rate):
        step = global_step[0]
        writer = tf.compat.v2.summary.create_file_writer(model_dir, max_queue=every_steps)
        with writer.as_default(), tf.compat.v2.summary.record_if(tf.equal(step % every_steps, 0)):
            tf.compat.v2.summary.scalar("train/loss", loss[0], step=step)
            tf.compat.v2.summary.scalar("train/learning_rate", learning_rate[0], step=step)
            return tf.compat.v1.summary.all_v2_summary_ops()

    return host_call_fn


# -------------------------------------------------------------------------------------------- weights

def seed_the_builder(seed: Optional[int]) -> None:
    """With a seed, every build of the model starts from the same values: tf.keras 2 seeds each unseeded initializer
    from Python's `random` (not from the graph's seed; Keras's own generator once it is imported and seeded), Keras 3
    from its own seed generator, so those are seeded here with the graph's (RunConfig(tf_random_seed=))."""
    if seed is None:
        return
    random.seed(seed)
    for keras in imported_kerases():
        keras.utils.set_random_seed(seed)
    tf.compat.v1.set_random_seed(seed)


def built_weights(builder: Callable, builder_kwargs: dict, seed: Optional[int]) -> Optional[list]:
    """The values the builder gives its model (loaded or freshly initialised), built in a scratch graph;
    None when the model has no weights until it is first called (subclassed, Sequential without an
    Input): such a builder cannot have loaded any, so the run's own initializers stand.

    In graph mode Keras writes the values a builder loads (`model.load_weights(path)`, Keras
    Applications' `weights=`, `set_weights`) into a session of its own; here that is the scratch
    graph's session, and `get_weights()` reads them back from it.
    """
    with tf.Graph().as_default() as graph, tf.compat.v1.Session(graph=graph):
        seed_the_builder(seed)
        model = builder(**builder_kwargs)
        return model.get_weights() if model.built else None


def builder_weights_scaffold_fn(builder: Callable, builder_kwargs: dict, model, *, seed: Optional[int],
                                warm_start_from: Optional[str], warm_start_vars: str) -> Callable:
    """A TPUEstimatorSpec `scaffold_fn` whose `init_fn` starts `model`'s variables from the builder's values.

    The Estimator initialises every variable of its graph with its initializer, so values the builder
    loaded would never reach training. TensorFlow runs `init_fn` only on a fresh run (a resumed run
    restores its checkpoint): it builds the model again in a scratch graph (`built_weights`) and feeds
    those values into the initializers of `model`'s variables. Nothing is embedded in the graph. With
    `warm_start_from`, the trainable variables `warm_start_vars` selects keep the checkpoint's values.

    Args:
        builder, builder_kwargs: what `model` was built with, in the run's graph.
        model: the Keras model built in the run's graph.
        seed: the run's graph-level seed (RunConfig's tf_random_seed), given to the scratch graph too.
        warm_start_from, warm_start_vars: as given to `tpu_estimator`.
    """

    def init_fn(scaffold, session):
        del scaffold
        values = built_weights(builder, builder_kwargs, seed)
        if values is None:
            return
        variables = model.weights
        differ = [(v.name, list(x.shape), v.shape.as_list()) for v, x in zip(variables, values)
                  if list(x.shape) != v.shape.as_list()]
        if len(values) != len(variables) or differ:
            if differ:
                name, built, in_graph = differ[0]
                detail = f"{name} is {built} in the second build, {in_graph} in the graph"
            else:
                detail = f"{len(values)} weights, the model in the graph has {len(variables)}"
            raise SpecError(f"the builder built another model on a second call: {detail}",
                            hint="the builder must build the same model every time it is called")
        skip = set()
        if warm_start_from:  # TensorFlow's own selection: trainable variables matched from the start of the name
            trainable = tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES
            skip = {v.ref() for v in session.graph.get_collection(trainable, scope=warm_start_vars)}
        chosen = [(v, x) for v, x in zip(variables, values) if v.ref() not in skip]
        session.run([v.initializer for v, _ in chosen], feed_dict={v.initial_value: x for v, x in chosen})

    def scaffold_fn():
        return tf.compat.v1.train.Scaffold(init_fn=init_fn)

    return scaffold_fn


# ------------------------------------------------------------------------------------------ estimator

def run_config(*, use_tpu: bool, cluster_resolver, model_dir: str, iterations_per_loop: int,
               num_cores_per_replica: Optional[int], input_partition_dims, save_checkpoints_steps: int,
               keep_checkpoint_max: int, seed: Optional[int], log_every_steps: int):
    """The tf.compat.v1.estimator.tpu.RunConfig; the TPU parts only with `use_tpu`.

    `num_cores_per_replica` (None: one core, no model parallelism) comes with `input_partition_dims`:
    [features dims, labels dims], each mirroring the structure input_fn yields (a dict for several
    tensors, None = replicated to every core of a replica).
    """
    tpu = tf.compat.v1.estimator.tpu
    tpu_kwargs = {"iterations_per_loop": iterations_per_loop}
    if use_tpu:
        # PER_HOST_V2: input_fn runs once per host (once per replica when a replica spans hosts);
        # the only mode that supports input_partition_dims.
        tpu_kwargs["per_host_input_for_training"] = tpu.InputPipelineConfig.PER_HOST_V2
        if num_cores_per_replica:
            tpu_kwargs["num_cores_per_replica"] = num_cores_per_replica
            tpu_kwargs["input_partition_dims"] = input_partition_dims
    return tpu.RunConfig(
        cluster=cluster_resolver if use_tpu else None,
        model_dir=model_dir,
        save_checkpoints_steps=save_checkpoints_steps,
        keep_checkpoint_max=keep_checkpoint_max,
        tf_random_seed=seed,
        log_step_count_steps=log_every_steps,
        save_summary_steps=log_every_steps,
        tpu_config=tpu.TPUConfig(**tpu_kwargs),
    )


def tpu_estimator(model_fn: Callable, config, *, use_tpu: bool, train_batch_size: int,
                  eval_batch_size: Optional[int], export_to_tpu: bool = False, params: Optional[dict] = None,
                  warm_start_from: Optional[str] = None, warm_start_vars: str = ".*"):
    """The TPUEstimator; batch sizes are global (over all replicas), evaluation runs where training does.

    `params` reach model_fn and input_fn beside the keys TPUEstimator sets; `warm_start_from` starts a
    new run's trainable variables matching `warm_start_vars` from that checkpoint.
    """
    warm_start = None
    if warm_start_from:
        warm_start = tf.estimator.WarmStartSettings(ckpt_to_initialize_from=warm_start_from,
                                                    vars_to_warm_start=warm_start_vars)
    return tf.compat.v1.estimator.tpu.TPUEstimator(
        model_fn=model_fn,
        config=config,
        params=params or None,
        warm_start_from=warm_start,
        use_tpu=use_tpu,
        train_batch_size=train_batch_size,
        eval_batch_size=eval_batch_size,
        predict_batch_size=None,
        eval_on_tpu=use_tpu,
        export_to_tpu=export_to_tpu and use_tpu,
    )
