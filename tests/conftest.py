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

pytest_plugins = ["gcs_fake", "tpu_api_server"]
