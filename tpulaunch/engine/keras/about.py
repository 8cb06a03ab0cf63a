"""What the keras engine is and can do (read without TensorFlow; `seam/registry.py` lists it)."""

from tpulaunch.seam.about import EngineAbout, Layout, OnTpu, RefusedKey
from tpulaunch.tpu.stack import TENSORFLOW

ABOUT = EngineAbout(
    name="keras",
    engine="tpulaunch.engine.keras.engine:KerasEngine",
    title="Keras + tf.distribute.TPUStrategy",
    # On this machine the strategy depends on the machine (engine/keras/standalone.make_strategy).
    local_title=("Keras + tf.distribute (MultiWorkerMirrored with several workers in TF_CONFIG, Mirrored over "
                 "several GPUs, else one device)"),
    install_hint="pip install 'tpulaunch[keras]': current TensorFlow with tf-keras",
    framework=TENSORFLOW,
    tpu_stack="tpulaunch.tpu.stack",
    versions=((2, 16), None),
    # Nothing besides TensorFlow: it brings Keras 3, and tf-keras (Keras 2) is needed only by builders written with
    # it (an install without it, such as tensorflow-tpu's, trains Keras 3 models).
    packages=(),
    # TensorFlow 2.16+ makes tf.keras Keras 3 unless this is set; with it, tf.keras is tf-keras (Keras 2), as
    # builders written with `from tensorflow import keras` expect. `import keras` is Keras 3 either way.
    environment={"TF_USE_LEGACY_KERAS": "1"},
    # Only where tf-keras is installed: without it, TF_USE_LEGACY_KERAS leaves tf.keras nothing to load, and what
    # imports tf.keras (tensorflow_text, KerasHub with it) fails with a RecursionError, in every engine's process
    # (the [jax] extra has no tf-keras: its engine trains Keras 3). tf.keras is then Keras 3, as TensorFlow ships it.
    environment_needs="tf_keras",
    refused_keys=(
        RefusedKey("data.skip_corrupt", "data.skip_corrupt is not supported by the keras engine yet: its input "
                   "pipeline would stop at the first bad record",
                   "set run.engine: estimator, or remove data.skip_corrupt (`tpulaunch validate --all-records` lists "
                   "bad records to remove)"),
        RefusedKey("run.warm_start", "run.warm_start is not supported by the keras engine yet",
                   "set run.engine: estimator, or remove run.warm_start (a builder can load weights itself with "
                   "model.load_weights)"),
    ),
    static_rules="tpulaunch.engine.keras.rules:problems",
    layout=Layout(
        even_splits=True,  # experimental_split_to_logical_devices refuses uneven splits
        device_assignment=True,  # TPUStrategy's DeviceAssignment: a replica is a block of the slice's topology
        batches_per_replica=True,  # distribute_datasets_from_function: InputContext.get_per_replica_batch_size
        cpu_replicas=True,
    ),
    on_tpu=OnTpu(
        runtime="pjrt",
        extra="keras-tpu",
        # Google publishes no TensorFlow image for TPUs on GKE: a plain Python image, tensorflow-tpu and libtpu
        # installed over it by the pod's startup script (the keras-tpu extra)
        container_image="python:3.11-slim",
        # Its process loads libtpu, which drives the chips of its own host only: on a multi-host slice every host runs
        # the program (the same TPUStrategy), worker 0 the chief.
        hosts="every",
    ),
)
