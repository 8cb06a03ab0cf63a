"""What the tests share. No test module imports another (tests/core/test_suite_layout.py): what several use lies in
the helper modules of tests/, the one folder on pytest's path (docs/testing.md's Layout names them). Among them:

- `records.py`: TFRecords of tf.train.Examples (one writer for every test that needs its own records);
- `gcs_fake.py`: a local Cloud Storage for TensorFlow's own `gs://` filesystem (the `gcs` fixture, here for
  every module);
- `tpu_api_server.py`: the `tpu_api` fixture (for every module): the package's local Cloud TPU API server
  (`tpulaunch/tpu/local_api.py`), started in an environment that cannot reach Google; `cli_tpu_api`, the same
  server called by the verbs a test runs in its own process;
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
# wants XLA's compiler asks for the `compiler` fixture below.
os.environ["HOME"] = tempfile.mkdtemp(prefix="tpulaunch-tests-home-")
os.environ.pop("TPULAUNCH_XLA_PYTHON", None)
for _cache in ("TPULAUNCH_CACHE", "XDG_CACHE_HOME"):  # XLA's cached answers: the empty home's, not the contributor's
    os.environ.pop(_cache, None)
# Nor the contributor's cloud, cluster or Keras settings: a test that wants one sets it for itself.
for _setting in ("GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_CLOUD_PROJECT", "CLOUDSDK_CONFIG", "TPU_NAME", "TF_CONFIG",
                 "KERAS_BACKEND", "STORAGE_EMULATOR_HOST", "KUBECONFIG", "TPULAUNCH_TPU_API_ENDPOINT"):
    os.environ.pop(_setting, None)

pytest_plugins = ["gcs_fake", "tpu_api_server"]

# A worker that ran TensorFlow exits as `tpulaunch` does, without the collector's walk over all it still holds.
from tpulaunch.tf_env import skip_collection_at_exit  # noqa: E402

skip_collection_at_exit()


@pytest.fixture(autouse=True)
def _each_test_forgets_the_secrets_of_the_last():
    """A worker runs many tests in one process: the secrets a test's job had (masked in every message of the process,
    `job/secrets.py`) are not the next test's."""
    yield
    from tpulaunch.job import secrets

    secrets.forget()

@pytest.fixture()
def compiler(monkeypatch):
    """XLA's TPU compiler, the suite's own, as `plan` finds it ($TPULAUNCH_XLA_PYTHON): its interpreter's path."""
    from paths import SUITE_XLA_PYTHON
    from tpulaunch.plan import xla_home

    if not os.path.isfile(SUITE_XLA_PYTHON):
        pytest.fail(f"XLA's TPU compiler is not installed at {SUITE_XLA_PYTHON}: make it with `nox -s xla`")
    monkeypatch.setenv(xla_home.ENV_VAR, SUITE_XLA_PYTHON)
    return SUITE_XLA_PYTHON


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: a module of long end-to-end runs (its worker starts it first)")
    if hasattr(config.option, "loadscopereorder"):  # pytest-xdist orders files by their number of tests otherwise
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(items):
    # With --dist loadfile a long module that starts last leaves the other worker idle at the end: the modules marked
    # slow start first, the rest keep their collection order.
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
