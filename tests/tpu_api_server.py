"""The `tpu_api` fixture: a running local Cloud TPU API server (the package's own, `tpulaunch/tpu/local_api.py`,
which `tpulaunch rehearse` uses too), in an environment that cannot reach Google or a developer's credentials.

The server's names are re-exported here, so tests keep importing them from `tpu_api_server`.
"""

from __future__ import annotations

import pytest

from tpulaunch.tpu.local_api import (DEFAULT_PROJECT, DEFAULT_ZONE, TpuApiServer, discovery_document,  # noqa: F401
                                     node_json, v2_node)


@pytest.fixture
def tpu_api(monkeypatch, tmp_path):
    """A running TpuApiServer; the environment cannot reach Google or a developer's credentials.

    TPU_API_DISCOVERY_URL would override any discovery URL given to the client, so it is removed;
    HOME points at an empty directory so gcloud credentials are never picked up.
    """
    for var in ("TPU_API_DISCOVERY_URL", "TPULAUNCH_TPU_DISCOVERY_URL", "TPULAUNCH_TPU_API_ENDPOINT", "TPU_NAME", "TPU_ZONE", "TPU_PROJECT",
                "GOOGLE_CLOUD_PROJECT", "KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS", "GOOGLE_APPLICATION_CREDENTIALS"):
        monkeypatch.delenv(var, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("NO_GCE_CHECK", "True")
    server = TpuApiServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def cli_tpu_api(tpu_api, monkeypatch):
    """The `tpu_api` server, called by the verbs a test runs in its own process (TPULAUNCH_TPU_API_ENDPOINT), whose
    output is plain text (NO_COLOR)."""
    monkeypatch.setenv("TPULAUNCH_TPU_API_ENDPOINT", tpu_api.endpoint)
    monkeypatch.setenv("NO_COLOR", "1")
    return tpu_api
