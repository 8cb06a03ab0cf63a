"""What the estimator engine is and can do (read without TensorFlow; `seam/registry.py` lists it)."""

from tpulaunch.seam.about import EngineAbout, OnTpu, OwnKey
from tpulaunch.tpu.stack import TENSORFLOW

ABOUT = EngineAbout(
    name="estimator",
    engine="tpulaunch.engine.estimator.engine:EstimatorEngine",
    title="TPUEstimator (TensorFlow 2.15)",
    local_title="TPUEstimator (TensorFlow 2.15)",
    install_hint="pip install 'tpulaunch[cpu]' (or [tpu]): TensorFlow 2.15 with tensorflow-estimator, Python 3.9-3.11",
    framework=TENSORFLOW,
    tpu_stack="tpulaunch.tpu.stack",
    versions=(None, (2, 16)),  # TensorFlow 2.16 removed tf.estimator
    packages=(("tensorflow_estimator", "tensorflow-estimator"),),
    # TPUEstimator's own functions: the other engines refuse a job that names them (and explain names the way out)
    own_keys=(
        OwnKey("model.model_fn", "a TPUEstimator model_fn",
               "migrate the model to model.builder (a function returning a Keras model), with model.loss and "
               "model.metrics"),
        OwnKey("model.serving_input_fn", "a TPUEstimator serving_input_receiver_fn",
               "remove model.serving_input_fn (the other engines export the model with a signature of "
               "data.features)"),
        OwnKey("data.input_fn", "data.input_fn, a TPUEstimator input_fn(params),",
               "remove data.input_fn and name the TFRecords in data.train/data.eval (read with data.features and "
               "data.labels)"),
    ),
    static_rules="tpulaunch.engine.estimator.rules:problems",
    # What each of the job's own input_fns yields, called as TPUEstimator calls it.
    code_checks=(("input_fn", "tpulaunch.engine.estimator.input_signature:input_signature_problems"),),
    # Set by TPUEstimator itself: `batch_size` and `context` in params= are refused by TPUEstimator
    # (_RESERVED_PARAMS_KEYS); `use_tpu` would be overwritten without a word.
    params_set_by_tensorflow=("batch_size", "use_tpu", "context"),
    on_tpu=OnTpu(
        runtime="se",  # TPUEstimator's sessions run on the stream executor runtime
        extra="tpu",
        # On a multi-host slice (a -pod image: a TensorFlow server on every host) worker 0's session drives them all.
        hosts="chief",
    ),
)
