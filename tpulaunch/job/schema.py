"""The job file schema.

Every model forbids unknown keys, so a misspelled key is an error with a did-you-mean, never silently
ignored. Per-field rules live here; rules that relate several sections (partition vs shapes, batch vs
replicas, paths vs TPU) live in `tpulaunch.checks.static`.
"""

# No `from __future__ import annotations` here: pydantic would evaluate every field's annotation from
# its text again when it builds the models, a fifth of what importing this module costs.

import re
from typing import Any, Dict, List, Literal, Optional, Sequence, Union

from pydantic import (AfterValidator, BaseModel, BeforeValidator, ConfigDict, Discriminator, Field, PrivateAttr, Tag,
                      WithJsonSchema, field_validator, model_validator)
from pydantic_core import PydanticCustomError
from typing_extensions import Annotated

from tpulaunch.seam.registry import names as _engine_names



def _an_engine(value: str) -> str:
    """run.engine names an engine of the registry (read when a job is checked, so an engine added there is one)."""
    known = _engine_names()
    if value not in known:
        expected = " or ".join(", ".join(repr(name) for name in known).rsplit(", ", 1))
        raise PydanticCustomError("literal_error", "Input should be {expected}", {"expected": expected})
    return value

IMPORT_PATH = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")

DType = Literal["float32", "float16", "bfloat16", "int32", "int64", "uint8", "bool"]
Encoding = Literal["float_list", "int64_list", "raw", "png", "jpeg"]

FLOAT_DTYPES = ("float32", "float16", "bfloat16")
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "int32": 4, "int64": 8, "uint8": 1, "bool": 1}


INT64_MAX = 2 ** 63 - 1  # TensorFlow counts steps, batches and sizes in int64


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @field_validator("*", mode="after")
    @classmethod
    def _whole_numbers_fit_int64(cls, value):
        """One rule for every whole number of the job (steps, batch sizes, cadences, shapes, seeds): it reaches
        TensorFlow as an int64, so one beyond it is refused at its key (else it overflows, or a run never ends)."""
        for item in value if isinstance(value, list) else (value,):
            if isinstance(item, int) and not isinstance(item, bool) and not -INT64_MAX - 1 <= item <= INT64_MAX:
                raise PydanticCustomError("less_than_equal", "Input should be less than or equal to {le}",
                                          {"le": INT64_MAX})
        return value


def check_import_path(value: Optional[str]) -> Optional[str]:
    if value is not None and not IMPORT_PATH.match(value):
        raise ValueError(f"{value!r} is not an import path of the form 'package.module:function'")
    return value


class TensorSpec(Strict):
    """One input tensor as stored in the TFRecords. `shape` excludes the batch dimension."""

    shape: List[Optional[Annotated[int, Field(ge=1)]]] = Field(
        description="per-example shape, without the batch dim; null = unknown (not allowed on TPU)")
    dtype: DType = "float32"
    encoding: Optional[Encoding] = Field(None, description="how it is stored in tf.train.Example; default float_list for floats, int64_list otherwise")
    key: Optional[str] = Field(None, description="feature key in the record, if it differs from the tensor name")

    @model_validator(mode="after")
    def _encoding_fits_dtype(self):
        enc = self.stored_as
        if enc in ("png", "jpeg"):
            if self.dtype != "uint8":
                raise ValueError(f"{enc} images decode to uint8; set dtype: uint8 (cast in the model)")
            if len(self.shape) != 3 or self.shape[-1] not in (1, 3, 4, None):
                raise ValueError(f"{enc} images have shape [height, width, channels] with 1, 3 or 4 channels")
        if enc == "float_list" and self.dtype not in FLOAT_DTYPES:
            raise ValueError(f"float_list holds floats; dtype {self.dtype} needs int64_list or raw")
        if enc == "int64_list" and self.dtype in FLOAT_DTYPES:
            raise ValueError(f"int64_list holds integers; dtype {self.dtype} needs float_list or raw")
        return self

    @property
    def stored_as(self) -> str:
        if self.encoding:
            return self.encoding
        return "float_list" if self.dtype in FLOAT_DTYPES else "int64_list"

    @property
    def is_static(self) -> bool:
        return all(d is not None for d in self.shape)

    @property
    def num_elements(self) -> Optional[int]:
        if not self.is_static:
            return None
        n = 1
        for d in self.shape:
            n *= d
        return n


class Optimizer(Strict):
    name: str = Field("adam", description="sgd, momentum, adam, adagrad, rmsprop, or an import path 'pkg.mod:make' returning a tf.compat.v1.train.Optimizer")
    learning_rate: float = Field(1e-3, gt=0)
    args: Dict[str, Any] = Field(default_factory=dict, description="extra keyword arguments for the optimizer")


OPTIMIZERS = ("sgd", "momentum", "adam", "adagrad", "rmsprop")
LOSSES = ("sparse_categorical_crossentropy", "categorical_crossentropy", "binary_crossentropy", "mean_squared_error", "mean_absolute_error", "huber")
METRICS = ("accuracy", "mean_iou", "auc", "precision", "recall", "mean_squared_error", "mean_absolute_error")


CLASSIFICATION_LOSSES = ("sparse_categorical_crossentropy", "categorical_crossentropy", "binary_crossentropy")
# Which metrics fit which losses (standalone.metric_fits applies the same rule in the model_fn):
# class metrics need a crossentropy loss, value metrics a regression loss; an import-path loss fits both.
CLASSIFICATION_METRICS = ("accuracy", "mean_iou", "auc", "precision", "recall")
REGRESSION_METRICS = ("mean_squared_error", "mean_absolute_error")


def metric_fits_loss(metric: str, loss: str) -> bool:
    if ":" in metric or ":" in loss:
        return True
    if metric in CLASSIFICATION_METRICS:
        return loss in CLASSIFICATION_LOSSES
    return loss not in CLASSIFICATION_LOSSES


def _check_metric(value: str) -> str:
    if ":" in value:
        return check_import_path(value)
    if value not in METRICS:
        raise ValueError(f"unknown metric {value!r}")
    return value


def _check_loss(value: str) -> str:
    if ":" in value:
        return check_import_path(value)
    if value not in LOSSES:
        raise ValueError(f"unknown loss {value!r}")
    return value


LossName = Annotated[str, AfterValidator(_check_loss)]
MetricNames = List[Annotated[str, AfterValidator(_check_metric)]]


def _per_label_form(value) -> str:
    return "per-label" if isinstance(value, dict) else "one-for-all"


# One branch per form, so a mistake is reported once, against the form written (tags with '-' are
# skipped in error locations).
LossOrPerLabel = Annotated[
    Union[Annotated[LossName, Tag("one-for-all")], Annotated[Dict[str, LossName], Tag("per-label")]],
    Discriminator(_per_label_form)]
MetricsOrPerLabel = Annotated[
    Union[Annotated[MetricNames, Tag("one-for-all")], Annotated[Dict[str, MetricNames], Tag("per-label")]],
    Discriminator(_per_label_form)]


CALL_KEYS = ("factory", "function", "args", "method")


class Call(Strict):
    """Something a program's main() makes with a call, said in the job file: `factory(**args)` (its `.method` when
    one is named: tensorflow/tpu's `imagenet_input.ImageNetInput(is_training=True, ...).input_fn`, BERT's
    `model_fn_builder(bert_config=..., ...)`), or `function` with `args` bound (functools.partial: TAPAS's
    `input_fn(name=..., file_patterns=..., ...)` that TPUEstimator then calls with params). A value in `args`
    that is itself such a mapping is made first (`BertConfig.from_dict(...)`)."""

    factory: Optional[str] = Field(None, description="'pkg.mod:Class' or 'pkg.mod:fn' (or 'pkg.mod:Class.from_x'): "
                                                     "called with args")
    function: Optional[str] = Field(None, description="'pkg.mod:fn': args are bound to it (functools.partial)")
    args: Dict[str, Any] = Field(default_factory=dict, description="keyword arguments; a mapping with factory: or "
                                                                  "function: is made first")
    method: Optional[str] = Field(None, description="with factory: the method of what it returns to use "
                                                    "(e.g. input_fn)")

    _forms = field_validator("factory", "function")(check_import_path)

    @field_validator("method")
    @classmethod
    def _identifier(cls, value: Optional[str]) -> Optional[str]:
        if value is not None and not value.isidentifier():
            raise ValueError(f"{value!r} is not a method name")
        return value

    @model_validator(mode="after")
    def _one_target(self):
        if bool(self.factory) == bool(self.function):
            raise ValueError("give one of factory (called with args) and function (args bound to it)")
        if self.method and self.function:
            raise ValueError("method goes with factory: the method of the object the factory makes")
        return self

    @property
    def path(self) -> str:
        """The import path of what is called."""
        return self.factory or self.function


def is_call(value) -> bool:
    """Whether a value under `args` is itself a call to make (a mapping with factory: or function:)."""
    return (isinstance(value, dict) and ("factory" in value or "function" in value)
            and set(value) <= set(CALL_KEYS))


def _call_form(value) -> str:
    return "made-by-call" if isinstance(value, (dict, Call)) else "import-path"


# A function by import path, or one a call makes.
PathOrCall = Annotated[
    Union[Annotated[str, AfterValidator(check_import_path), Tag("import-path")],
          Annotated[Call, Tag("made-by-call")]],
    Discriminator(_call_form)]
OneInputFn = PathOrCall


OutputKind = Literal["logits", "probabilities"]


class Model(Strict):
    builder: Optional[str] = Field(None, description="module:function returning an inference-only tf.keras.Model")
    params: Dict[str, Any] = Field(default_factory=dict, description="keyword arguments for the builder; with model_fn: "
                                   "extra keys of the params dict TPUEstimator hands to model_fn and input_fn")
    loss: LossOrPerLabel = Field(
        "sparse_categorical_crossentropy",
        description=f"one of {', '.join(LOSSES)}, or 'pkg.mod:fn(labels, outputs) -> scalar' (it gets all labels and "
                    "outputs); or a mapping label -> loss, one per label. Not set, a model the builder compile()d "
                    "trains with its own compile's loss (keras engine)")
    optimizer: Optimizer = Field(default_factory=Optimizer,
                                 description="default adam; not set, a model the builder compile()d trains with its "
                                             "own compile's optimizer (keras engine)")
    metrics: MetricsOrPerLabel = Field(
        default_factory=list,
        description=f"any of {', '.join(METRICS)}, or import paths (on the keras engine a Keras Metric class or "
                    "object too): a list (each applied to every label whose loss it fits), or a mapping label -> list")
    precision: Literal["float32", "bfloat16", "mixed_float16"] = "float32"
    outputs: Optional[Union[OutputKind, Dict[str, OutputKind]]] = Field(
        None, description="what the model returns for a classification head: logits or probabilities (for every "
                          "label, or a mapping label -> kind); needed where the op producing an output does not "
                          "say (tpulaunch reads softmax/sigmoid as probabilities, linear layers as logits)")
    model_fn: Optional[PathOrCall] = Field(
        None, description="an existing TPUEstimator model_fn, 'pkg.mod:fn', or a call that makes it "
                          "({factory: 'pkg.mod:model_fn_builder', args: {...}})")
    serving_input_fn: Optional[str] = Field(
        None, description="export's serving inputs: an existing serving_input_receiver_fn() returning a "
                          "tf.estimator.export.ServingInputReceiver, 'pkg.mod:fn' (default: placeholders of data.features)")

    _builder_form = field_validator("builder", "serving_input_fn")(check_import_path)

    @field_validator("optimizer", mode="before")
    @classmethod
    def _optimizer_shorthand(cls, value):
        return {"name": value} if isinstance(value, str) else value

    def set_in_job(self) -> tuple:
        """Which of loss, optimizer and metrics the job file (or --set) sets; the defaults above fill the others. On
        the keras engine a model its builder compile()d (a KerasHub task model compiles itself) keeps its own
        compile's for those the job does not set, as a second compile() would replace only what it is given."""
        return tuple(key for key in ("loss", "optimizer", "metrics") if key in self.model_fields_set)

    @property
    def model_fn_path(self) -> Optional[str]:
        """The import path of the model_fn, or of what a call that makes it calls."""
        return self.model_fn.path if isinstance(self.model_fn, Call) else self.model_fn

    def outputs_by_label(self, labels) -> Dict[str, str]:
        """Each label's declared output kind ("logits" or "probabilities"), for the labels `model.outputs` covers."""
        if isinstance(self.outputs, dict):
            return {name: self.outputs[name] for name in labels if name in self.outputs}
        return {name: self.outputs for name in labels} if self.outputs else {}

    def losses_by_label(self, labels) -> Dict[str, str]:
        """Each label's loss name, for the labels `labels` names."""
        if isinstance(self.loss, dict):
            return {name: self.loss[name] for name in labels if name in self.loss}
        return {name: self.loss for name in labels}

    def function_paths(self) -> List[tuple]:
        """(job key, import path) for each loss and metric given as an import path, in file order."""
        losses = self.loss.items() if isinstance(self.loss, dict) else [(None, self.loss)]
        paths = [(("model", "loss") + ((label,) if label is not None else ()), name)
                 for label, name in losses if ":" in name]
        metrics = self.metrics.items() if isinstance(self.metrics, dict) else [(None, self.metrics)]
        for label, names in metrics:
            key = ("model", "metrics") + ((label,) if label is not None else ())
            paths += [(key + (i,), name) for i, name in enumerate(names) if ":" in name]
        return paths

    @model_validator(mode="after")
    def _builder_or_model_fn(self):
        if not self.builder and not self.model_fn:
            raise ValueError("set model.builder (a Keras builder) or model.model_fn (an existing model_fn)")
        if self.builder and self.model_fn:
            raise ValueError("set only one of model.builder and model.model_fn")
        return self


Files = Union[str, List[str]]

INPUT_MODES = ("train", "eval", "predict")


class InputFns(Strict):
    """One input_fn per mode, as a TPUEstimator program has them."""

    train: Optional[OneInputFn] = Field(None, description="'pkg.mod:train_input_fn(params)', or a call that makes it: "
                                                          "{factory: 'pkg.mod:Class', args: {...}, method: input_fn} "
                                                          "or {function: 'pkg.mod:input_fn', args: {...}}")
    eval: Optional[OneInputFn] = Field(None, description="'pkg.mod:eval_input_fn(params)', or a call as for train")
    predict: Optional[OneInputFn] = Field(None, description="'pkg.mod:predict_input_fn(params)' (used by no command "
                                                            "yet)")

    @model_validator(mode="after")
    def _at_least_one(self):
        if not (self.train or self.eval or self.predict):
            raise ValueError("name at least one of train, eval, predict")
        return self


def _input_fn_form(value) -> str:
    return "input-fn-by-mode" if isinstance(value, (dict, InputFns)) else "input-fn-path"


# As for partition: one branch per form, so a mistake is reported once, against the form written.
InputFnOrByMode = Annotated[
    Union[Annotated[str, AfterValidator(check_import_path), Tag("input-fn-path")],
          Annotated[InputFns, Tag("input-fn-by-mode")]],
    Discriminator(_input_fn_form)]


class Data(Strict):
    train: Optional[Files] = Field(None, description="TFRecord file, glob, or list of them (local or gs://)")
    eval: Optional[Files] = None
    features: Dict[str, TensorSpec] = Field(description="model inputs by name; one entry = the model takes a single tensor")
    labels: Dict[str, TensorSpec] = Field(default_factory=dict, description="targets by name; one entry = a single tensor")
    compression: Optional[Literal["GZIP", "ZLIB"]] = None
    shuffle_buffer: int = Field(1024, ge=0)
    cache: bool = False
    skip_corrupt: bool = Field(False, description="skip unreadable records instead of stopping")
    input_fn: Optional[InputFnOrByMode] = Field(
        None, description="your own input pipeline instead of records: 'pkg.mod:input_fn(params)' returning a "
                          "tf.data.Dataset, or one per mode {train: ..., eval: ...}; data.features and data.labels "
                          "then describe what it yields")

    def input_fn_for(self, mode: str) -> Optional[str]:
        """The import path of the input_fn for `mode` ("train", "eval", "predict") — of what is called, for one a
        call makes (`input_fn_call`) — or None."""
        spec = self.input_fn_spec(mode)
        return spec.path if isinstance(spec, Call) else spec

    def input_fn_call(self, mode: str) -> Optional[Call]:
        """How the input_fn for `mode` is made, when a call makes it; else None."""
        spec = self.input_fn_spec(mode)
        return spec if isinstance(spec, Call) else None

    def input_fn_spec(self, mode: str):
        """The input_fn for `mode` as written: an import path, a Call, or None."""
        if isinstance(self.input_fn, InputFns):
            return getattr(self.input_fn, mode)
        return self.input_fn

    @field_validator("features")
    @classmethod
    def _at_least_one_feature(cls, value):
        if not value:
            raise ValueError("declare at least one feature")
        return value

    @field_validator("train", "eval")
    @classmethod
    def _non_empty_files(cls, value):
        if isinstance(value, list) and not value:
            raise ValueError("an empty list of files; remove the key or name a file or glob")
        if isinstance(value, str) and not value.strip():
            raise ValueError("an empty path")
        return value


class Tpu(Strict):
    name: Optional[str] = Field(None, description="TPU node name, 'local' on a TPU VM, or a grpc:// address; default $TPU_NAME")
    zone: Optional[str] = Field(None, description="zone of the node, e.g. us-central1-a; default $TPU_ZONE (or the "
                                                  "first of tpu.zones)")
    zones: Optional[List[str]] = Field(
        None, min_length=1, description="zones `tpulaunch run` tries in order when one has no capacity (a stockout or "
                                        "no quota), e.g. [us-central2-b, us-east1-d]; the first is tpu.zone")
    tiers: Optional[List[Literal["spot", "preemptible", "reserved", "on-demand"]]] = Field(
        None, min_length=1, description="tiers `tpulaunch run` tries in order, each in every zone, when one has no "
                                        "capacity, e.g. [spot, on-demand]; instead of tpu.spot/preemptible/reserved")
    project: Optional[str] = Field(None, description="Google Cloud project of the node; default $TPU_PROJECT / "
                                                     "$GOOGLE_CLOUD_PROJECT")
    type: str = Field(description="accelerator type, e.g. v3-8, v3-32, v4-8, v5litepod-8")
    cores_per_replica: int = Field(1, description="TPU cores one model replica spans (spatial partitioning)")
    iterations_per_loop: int = Field(100, ge=1, description="steps run on the TPU per host round trip")
    # What `tpulaunch up` (and `train --recreate`) create; reading a node needs none of them.
    runtime_version: Optional[str] = Field(
        None, description="TPU software version `up` creates the node with, e.g. tpu-vm-tf-2.15.1-se; default: the "
                          "installed TensorFlow's tpu-vm-tf-X.Y.Z[-pod]-se (estimator) or -pjrt (keras)")
    spot: bool = Field(False, description="create a Spot TPU (cheaper; can be preempted at any time)")
    preemptible: bool = Field(False, description="create a preemptible TPU (the older form of spot)")
    reserved: bool = Field(False, description="create the TPU from the project's reservation")
    network: Optional[str] = Field(None, description="VPC network for the node; default: the project's 'default'")
    subnetwork: Optional[str] = Field(None, description="VPC subnetwork for the node; default: the network's own")
    queued: Optional[bool] = Field(
        None, description="create through a queued resource; default: yes for v5e, v5p and v6e types, no for older")
    slices: int = Field(1, ge=1, description="slices of tpu.type the job trains on, data-parallel across them over "
                                             "the data-center network (multislice; the jax engine only)")

    @model_validator(mode="after")
    def _one_tier(self):
        tiers = [name for name in ("spot", "preemptible", "reserved") if getattr(self, name)]
        if len(tiers) > 1:
            raise ValueError(f"tpu.{tiers[0]} and tpu.{tiers[1]} exclude each other: a TPU is one of spot, "
                             "preemptible, reserved or on-demand (none set)")
        if self.tiers and tiers:
            raise ValueError(f"tpu.tiers and tpu.{tiers[0]} exclude each other: tpu.tiers lists the tiers to try, "
                             f"e.g. [{tiers[0]}, on-demand]")
        for name in ("zones", "tiers"):
            listed = getattr(self, name) or []
            if len(set(listed)) != len(listed):
                raise ValueError(f"tpu.{name} lists {sorted(x for x in set(listed) if listed.count(x) > 1)[0]} twice")
        if self.zones and self.zone is not None and self.zone != self.zones[0]:
            raise ValueError(f"tpu.zone ({self.zone}) is not the first of tpu.zones ({', '.join(self.zones)}): "
                             "tpu.zones is tried in order; drop tpu.zone or put it first")
        return self

    @model_validator(mode="before")
    @classmethod
    def _zone_from_zones(cls, data):
        """tpu.zone is the first of tpu.zones when only they are given (what `up`, `down` and `status` use)."""
        if isinstance(data, dict) and data.get("zone") is None and isinstance(data.get("zones"), list) \
                and data["zones"] and isinstance(data["zones"][0], str):
            data = {**data, "zone": data["zones"][0]}
        return data


DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


class Gke(Strict):
    """Where `tpulaunch run` submits the job as a JobSet instead of creating a TPU VM (docs/gke.md)."""

    cluster: str = Field(description="the GKE cluster's name (its TPU node pools run the job)")
    location: str = Field(description="the cluster's region or zone, e.g. us-central2 or us-central2-b")
    project: Optional[str] = Field(None, description="the cluster's Google Cloud project; default tpu.project")
    namespace: str = Field("default", pattern=DNS_LABEL, max_length=63,
                           description="the Kubernetes namespace the JobSet is created in")
    queue: Optional[str] = Field(None, description="the Kueue LocalQueue that admits the job "
                                                   "(label kueue.x-k8s.io/queue-name); none: no queueing")
    priority_class: Optional[str] = Field(None, description="the pods' PriorityClass, e.g. medium")
    image: Optional[str] = Field(None, description="the container image the pods run; default: the engine's stock "
                                                   "image (`tpulaunch run --dry-run` names it)")
    service_account: Optional[str] = Field(None, description="the pods' Kubernetes service account (Workload "
                                                             "Identity: the one that may read and write run.model_dir)")
    context: Optional[str] = Field(None, description="the kubeconfig context that reaches the cluster; default: "
                                                     "the current one, as kubectl finds it")


PartitionDims = Optional[List[int]]

# The job file also takes TensorFlow's own forms (the loader turns them into dims by name): a plain
# dims list for a job's only feature or label, and null for "replicate the whole group".
_TENSORFLOW_FORMS = WithJsonSchema({"anyOf": [
    {"type": "object", "additionalProperties": {"anyOf": [{"type": "array", "items": {"type": "integer"}},
                                                          {"type": "null"}]}},
    {"type": "array", "items": {"type": "integer"}}, {"type": "null"}]})


class Partition(Strict):
    features: Annotated[Dict[str, PartitionDims], _TENSORFLOW_FORMS] = Field(
        default_factory=dict,
        description="dims per feature name (rank incl. batch; null = replicate); a job with one feature may give "
                    "its dims list alone, as TensorFlow's input_partition_dims does")
    labels: Annotated[Dict[str, PartitionDims], _TENSORFLOW_FORMS] = Field(
        default_factory=dict,
        description="dims per label name (null = replicate; [1] = core 0 only); null replicates every label; a job "
                    "with one label may give its dims list alone")


def _partition_form(value) -> str:
    return "partition-auto" if isinstance(value, str) else "partition-dims"


# One branch per form, so a mistake is reported once, against the form the user wrote (the tags
# contain '-' so that error locations skip them).
PartitionOrAuto = Annotated[
    Union[Annotated[Literal["auto"], Tag("partition-auto")], Annotated[Partition, Tag("partition-dims")]],
    Discriminator(_partition_form)]


class OnNan(Strict):
    """What training does when its loss becomes NaN or Inf (default: stop, exit 1, naming the step and the last
    good checkpoint)."""

    rollback: int = Field(ge=0, description="restore the last good checkpoint and go on, at most this many "
                                               "times in a run (each in the run record); then stop")


class Train(Strict):
    batch_size: int = Field(ge=1, description="global batch size, over all replicas")
    steps: int = Field(ge=1, description="train until this global step")
    on_nan: Optional[OnNan] = Field(None, description="a NaN or Inf loss: {rollback: N} restores the last good "
                                                       "checkpoint and goes on, at most N times (default: stop, exit 1)")


class Eval(Strict):
    batch_size: int = Field(ge=1, description="global eval batch size")
    steps: int = Field(ge=1, description="eval batches per evaluation")
    every_steps: Optional[int] = Field(None, ge=1, description="evaluate every N train steps (default: once, at the end)")
    params: Dict[str, Any] = Field(
        default_factory=dict,
        description="model_fn jobs: params of the graphs that do not train (evaluation, export's serving graph), "
                    "each key over model.params' (e.g. no random flips, batch norm in inference)")


class WarmStart(Strict):
    """TensorFlow's WarmStartSettings: a fresh run starts from another run's checkpoint."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, serialize_by_alias=True)

    from_: str = Field(alias="from", description="a checkpoint (model.ckpt-N) or a model_dir (its latest checkpoint)")
    vars: str = Field(".*", description="regular expression: the trainable variables taken from the checkpoint "
                                        "(matched from the start of the name); the rest start as the model builds them")

    @field_validator("vars")
    @classmethod
    def _regex(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"{value!r} is not a regular expression: {exc}") from None
        return value


class Run(Strict):
    model_dir: str = Field(description="checkpoints, summaries and the resolved job (gs:// for a Cloud TPU)")
    engine: Optional[Annotated[str, AfterValidator(_an_engine),
                               WithJsonSchema({"type": "string", "enum": list(_engine_names())})]] = Field(
        None, description="what trains the job: estimator (TPUEstimator, TensorFlow 2.15), keras (Keras + "
                          "tf.distribute, TensorFlow 2.16 and later) or jax (Keras 3 on JAX); default: the first "
                          "whose framework is installed in a version it runs on")
    save_checkpoints_steps: int = Field(1000, ge=1)
    keep_checkpoint_max: int = Field(5, ge=1)
    log_every_steps: Optional[int] = Field(None, ge=1, description="progress line cadence (default: iterations_per_loop)")
    seed: Optional[int] = None
    warm_start: Optional[WarmStart] = Field(None, description="start a fresh run from another run's checkpoint "
                                                              "(a resumed run restores its own)")


def _flag_value(value):
    scalar = (bool, int, float, str)
    if isinstance(value, scalar) or (isinstance(value, list) and all(isinstance(v, scalar) for v in value)):
        return value
    raise ValueError(f"{value!r} is not a flag value: give true/false, a number, a string, or a list of them")


FlagValue = Annotated[Union[bool, int, float, str, List[Union[bool, int, float, str]]], BeforeValidator(_flag_value)]


class Job(Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=128)
    model: Model
    data: Data
    tpu: Optional[Tpu] = Field(None, description="absent: run locally on CPU/GPU")
    gke: Optional[Gke] = Field(None, description="`tpulaunch run` submits the job to this GKE cluster as a JobSet "
                                                 "(one Job per slice) instead of creating a TPU VM")
    partition: Optional[PartitionOrAuto] = Field(
        None, description="input partition dims per tensor, or 'auto': tpulaunch splits the largest spatial axes "
                          "of the main feature over tpu.cores_per_replica (see `tpulaunch plan`)")
    train: Optional[Train] = None
    eval: Optional[Eval] = None
    run: Run
    flags: Dict[str, FlagValue] = Field(
        default_factory=dict, description="absl flags the job's modules define, set before any of their functions "
                                          "runs (the rest keep their defaults)")
    python_path: List[str] = Field(
        default_factory=list,
        description="directories (relative to the job file) where the job's import paths are looked up after the "
                    "job file's own directory and before PYTHONPATH: a program's source tree, e.g. tensorflow/tpu's "
                    "[models, models/official/resnet], which its README puts on PYTHONPATH")
    _source_dir: Optional[str] = PrivateAttr(None)  # the job file's directory, set by load_job
    _secrets: Any = PrivateAttr(None)  # which values are secrets (`job/secrets.py`), set by load_job

    @property
    def on_tpu(self) -> bool:
        return self.tpu is not None

    @property
    def search_path(self) -> list:
        """Where the job's import paths are looked up before PYTHONPATH: the job file's directory, then
        python_path (relative to it)."""
        return search_path_of(self._source_dir, self.python_path)

    @property
    def secrets(self):
        """Which of the job's values are secrets (`job.secrets.Secrets`): masked wherever the job is written."""
        from tpulaunch.job.secrets import NONE

        return self._secrets or NONE

    def keeping(self, secrets) -> "Job":
        """This job, knowing which of its values are secrets (`job.secrets.Secrets`, found when it was loaded)."""
        self._secrets = secrets
        return self

    def located_at(self, directory: str) -> "Job":
        """This job, with its import paths resolved from `directory` (the job file's)."""
        self._source_dir = directory
        return self


def search_path_of(job_dir: Optional[str], python_path: Sequence[str] = ()) -> list:
    """The job file's directory, then python_path (made absolute from the job file's directory on load)."""
    return ([job_dir] if job_dir else []) + list(python_path)


SECTIONS = {name: field.annotation for name, field in Job.model_fields.items()}


def json_schema() -> dict:
    schema = Job.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "tpulaunch job"
    return schema
