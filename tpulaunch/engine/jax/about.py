"""What the jax engine is and can do (read without JAX; `seam/registry.py` lists it)."""

from tpulaunch.seam.about import EngineAbout, Framework, Layout, OnTpu, RefusedKey

JAX = Framework("JAX", "jax", ("jax",))

ABOUT = EngineAbout(
    name="jax",
    engine="tpulaunch.engine.jax.engine:JaxEngine",
    title="Keras 3 on JAX (keras.distribution.DataParallel)",
    local_title="Keras 3 on JAX over this machine's devices (keras.distribution: DataParallel, or a device mesh for "
                "partition:)",
    install_hint="pip install 'tpulaunch[jax]': Keras 3 on JAX (TensorFlow's tf.data reads the records)",
    framework=JAX,
    versions=((0, 4), None),
    # Which generations and runtime versions JAX runs on, checked at tpu.type and tpu.runtime_version; training on
    # a TPU itself is still refused at tpu: by its rules.
    tpu_stack="tpulaunch.engine.jax.stack",
    packages=(("keras", "Keras 3"), ("tensorflow", "TensorFlow (its tf.data reads the job's TFRecords)")),
    # Only in the process of a job on this engine: set for every engine this machine runs, it would turn the keras
    # engine's Keras 3 models into JAX ones. Keras reads it once, at its first import.
    process_environment={"KERAS_BACKEND": "jax"},
    refused_keys=(
        RefusedKey("data.skip_corrupt", "the jax engine does not skip corrupt records yet",
                   "remove data.skip_corrupt (a bad record then stops the run, naming its file), or set run.engine: "
                   "estimator"),
        RefusedKey("run.warm_start", "the jax engine does not warm-start yet",
                   "remove run.warm_start, or set run.engine: keras"),
    ),
    static_rules="tpulaunch.engine.jax.rules:problems",
    step_exporter="tpulaunch.engine.jax.memory_plan:export_step",  # Keras 3's train step lowered by JAX itself
    layout=Layout(
        even_splits=True,  # a NamedSharding splits an axis into equal pieces only
        partition_on_devices=True,  # a device mesh over this machine's devices (engine/jax/mesh.py)
        devices_here="tpulaunch.engine.jax.mesh:devices_here",  # JAX's devices: a local plan's replicas
        batches_per_replica=False,  # one pipeline makes the global batch; DataParallel splits it over the devices
        multislice=True,
        batches_per_host=True,  # each host reads its share of every global batch (engine/jax/hosts.py)
    ),
    on_tpu=OnTpu(
        extra="jax-tpu",
        # Google's JAX AI image for TPUs (jax 0.8.1 with libtpu; Keras and tpulaunch's own requirements are installed
        # over it by the pod's startup script), in the virtualenv it ships
        container_image="us-docker.pkg.dev/cloud-tpu-images/jax-ai-image/tpu:jax0.8.1-rev1",
        container_python="/opt/venv/bin/python",
        hosts="every",
        loops=False,  # one step per call on a TPU too: tpu.iterations_per_loop does not set its cadence
    ),
)
