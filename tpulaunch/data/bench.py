"""`tpulaunch data bench`: the job's own training input pipeline alone, as one host's input_fn runs it.

The pipeline is the one `train` runs (`make_dataset_fn`, or the job's `data.input_fn`), called with the
batch the Plan gives each input_fn call (`params['batch_size']`) and, when several pipelines feed the slice,
as the first of them (so it reads its own share of the files). It runs in a
graph session as under TPUEstimator, batches are pulled without copying them out, and the first
batch (opening files, filling buffers) is not timed. MB/s counts the batches' decoded tensors: what
the pipeline hands to the infeed (or the model), not the bytes read from storage.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Callable, Optional

from tpulaunch.errors import TpuLaunchError

# A pipeline that alone delivers less than this multiple of what training consumed barely outruns
# training: it was likely what the steps waited for. (In a CPU run the pipeline also shared the cores
# with the model, so its rate during training was lower still.)
BOUND_RATIO = 1.25


@dataclass(frozen=True)
class BenchResult:
    seconds: float  # timed (the first batch excluded)
    batches: int
    batch_size: int  # params['batch_size'] of one input_fn call
    bytes_per_batch: int  # decoded tensors
    input_pipelines: int  # input_fn calls feeding one training step over the slice

    @property
    def examples_per_s(self) -> float:
        return self.batches * self.batch_size / self.seconds if self.seconds > 0 else 0.0

    @property
    def mb_per_s(self) -> float:
        return self.batches * self.bytes_per_batch / self.seconds / 1e6 if self.seconds > 0 else 0.0

    def to_dict(self) -> dict:
        return {**asdict(self), "seconds": round(self.seconds, 3), "examples_per_s": round(self.examples_per_s, 2),
                "mb_per_s": round(self.mb_per_s, 3)}


@dataclass(frozen=True)
class Comparison:
    """The pipeline against the step rate a recorded training run needed, per input pipeline."""

    needed_examples_per_s: float  # per pipeline: the run's examples/s over its input pipelines
    ratio: float  # what the pipeline alone delivers / what training consumed
    run_end: Optional[str]
    run_on_tpu: bool

    @property
    def input_bound(self) -> bool:
        return self.ratio < BOUND_RATIO

    def to_dict(self) -> dict:
        return {**asdict(self), "needed_examples_per_s": round(self.needed_examples_per_s, 2),
                "ratio": round(self.ratio, 3), "input_bound": self.input_bound}


def compare(result: BenchResult, record: dict) -> Optional[Comparison]:
    """The bench against a train/resume run record that measured examples/s; None when it has no rate."""
    from tpulaunch.run.record import training_rate

    rate = training_rate(record)
    if not rate:
        return None
    needed = rate / max(1, int(record.get("input_pipelines") or 1))
    return Comparison(needed, result.examples_per_s / needed, record.get("end"), bool(record.get("on_tpu")))


def bench_input(job, plan, *, seconds: float, search_path=(), get_time: Callable[[], float] = time.perf_counter
                ) -> BenchResult:
    """Run the job's training input pipeline for about `seconds` (after its first batch) and count.

    Raises:
        TpuLaunchError: no training data, or the pipeline ends before its first batch.
    """
    import tensorflow as tf

    from tpulaunch.engine.pipeline import naming_read_errors

    if job.data.train is None and not job.data.input_fn:
        raise TpuLaunchError("data bench: the job has no data.train", hint="set data.train to TFRecord files")
    batch = plan.batch("train") or plan.batch("eval")
    batch_size = batch.params_batch_size if batch else 1
    pipelines = max(1, batch.global_batch // batch.params_batch_size) if batch else 1
    with tf.Graph().as_default(), naming_read_errors(job, "train"):
        dataset = _first_pipeline(job, plan, search_path, batch_size, pipelines)
        if not isinstance(dataset, tf.data.Dataset):
            raise TpuLaunchError("data bench: data.input_fn returned tensors, not a tf.data.Dataset",
                                 hint="return the dataset; TPUEstimator's PER_HOST_V2 input needs one anyway")
        element = tf.compat.v1.data.get_output_shapes(dataset), tf.compat.v1.data.get_output_types(dataset)
        iterator = tf.compat.v1.data.make_initializable_iterator(dataset)
        pulled = tf.group(*[t for t in tf.nest.flatten(iterator.get_next()) if t is not None])
        with tf.compat.v1.Session() as session:
            session.run([iterator.initializer, tf.compat.v1.local_variables_initializer()])
            batches = 0
            try:
                session.run(pulled)  # opens files, fills buffers: not timed
                began = get_time()
                while get_time() - began < seconds:
                    session.run(pulled)
                    batches += 1
            except tf.errors.OutOfRangeError:
                pass  # a pipeline that does not repeat: what it delivered counts
            if not batches:
                raise TpuLaunchError("data bench: the training data ran out before a batch could be timed",
                                     hint="data.train needs at least two batches of records")
            elapsed = get_time() - began
    return BenchResult(elapsed, batches, batch_size, _bytes(*element), pipelines)


def _first_pipeline(job, plan, search_path, batch_size: int, pipelines: int):
    """The dataset of the first of `pipelines` input pipelines: the job's own input_fn called as TPUEstimator calls it
    (`params`, with an input context naming the pipeline when there are several), or tpulaunch's pipeline."""
    if job.data.input_fn:
        import tensorflow as tf

        from tpulaunch.job.imports import resolve

        input_fn = resolve(job.data.input_fn, search_path=search_path, what="data.input_fn")
        params = {"batch_size": batch_size}
        if pipelines > 1:
            params["context"] = tf.distribute.InputContext(num_input_pipelines=pipelines, input_pipeline_id=0)
        return input_fn(params)
    from tpulaunch.engine.pipeline import make_dataset_fn

    return make_dataset_fn(job, "train", use_tpu=plan.on_tpu)(batch_size, shard_index=0, shard_count=pipelines)


def _bytes(shapes, types) -> int:
    """Bytes of one batch of the dataset's tensors (unknown dims count as 1)."""
    import tensorflow as tf

    total = 0
    for shape, dtype in zip(tf.nest.flatten(shapes), tf.nest.flatten(types)):
        count = 1
        for dim in shape.as_list() if shape.rank is not None else []:
            count *= dim or 1
        total += count * dtype.size
    return total
