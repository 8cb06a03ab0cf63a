"""What the tests share, so that no test module imports another for it:

- `records.py`: TFRecords of tf.train.Examples (one writer for every test that needs its own records);
- `gcs_fake.py`: a local Cloud Storage for TensorFlow's own `gs://` filesystem (the `gcs` fixture, here for
  every module);
- `tpu_api_server.py`: the `tpu_api` fixture (for every module): the package's local Cloud TPU API server
  (`tpulaunch/tpu/local_api.py`), started in an environment that cannot reach Google;
- `tests/models/`, `tests/programs/`, `tests/jobs/`: the user-written models, the unmodified reference
  programs and the good and bad job files the suites run.

Each test file runs in one pytest-xdist worker (`--dist loadfile`), so a module's expensive results (a
trained checkpoint, a built graph) are module-scoped fixtures that its tests share.
"""

import os
import tempfile

import pytest

# The suite never reads the contributor's home: XLA's TPU compiler installed where the README's Install table puts
# it (~/.tpulaunch/xla), credentials or a Keras config there would change what `plan`, `validate` and the README's
# transcripts print. Every test process and every child it starts sees an empty home of the suite's own; a test that
# wants XLA's compiler names the suite's (`.venv-xla`, tests/plan/test_xla_tpu.py).
os.environ["HOME"] = tempfile.mkdtemp(prefix="tpulaunch-tests-home-")
os.environ.pop("TPULAUNCH_XLA_PYTHON", None)
for _cache in ("TPULAUNCH_CACHE", "XDG_CACHE_HOME"):  # XLA's cached answers: the empty home's, not the contributor's
    os.environ.pop(_cache, None)

pytest_plugins = ["gcs_fake", "tpu_api_server"]


@pytest.fixture(autouse=True)
def _each_test_forgets_the_secrets_of_the_last():
    """A worker runs many tests in one process: the secrets a test's job had (masked in every message of the process,
    `job/secrets.py`) are not the next test's."""
    yield
    from tpulaunch.job import secrets

    secrets.forget()

# The files that take longest on one worker (measured with --durations=0), started first: with --dist loadfile a long
# file that starts last leaves the other worker idle at the end. The rest keep their collection order.
SLOW_FILES_FIRST = (
    "tests/run/test_keep_checkpoints.py",
    "tests/engine/test_reference_efficientnet.py", "tests/remote/test_rehearse.py", "tests/remote/test_rerun.py",
    "tests/plan/test_memory.py",
    "tests/docs/test_readme_examples.py", "tests/engine/test_reference_programs.py",
    "tests/engine/test_reference_resnet.py", "tests/checks/test_user_models.py", "tests/engine/test_own_program.py",
    "tests/plan/test_xla_tpu.py",
    "tests/run/test_lease_outage.py", "tests/run/test_stop_deadline.py", "tests/checks/test_gate_limits.py",
    "tests/keras_engine/test_oracle_jax.py", "tests/keras_engine/test_keep_checkpoints_keras.py",
    "tests/keras_engine/test_gke_rehearse.py", "tests/keras_engine/test_oracle_keras.py",
    "tests/keras_engine/test_keras_stop_deadline.py",
    "tests/keras_engine/test_keras_train.py", "tests/keras_engine/test_jax_engine.py",
    "tests/keras_engine/test_jax_xla_plan.py", "tests/keras_engine/test_startup_lines.py",
    "tests/keras_engine/test_keras3_models.py", "tests/keras_engine/test_jax_partition.py",
    "tests/keras_engine/test_jax_tpu_slice.py", "tests/keras_engine/test_jax_project_jobs.py",
)


def pytest_configure(config):
    if hasattr(config.option, "loadscopereorder"):  # pytest-xdist orders files by their number of tests otherwise
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(items):
    rank = {path: index for index, path in enumerate(SLOW_FILES_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))
