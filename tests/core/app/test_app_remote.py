"""rehearse's refusal that comes before anything starts (`app/remote.py`): no TPU API server, no TensorFlow."""

import pytest

from paths import TESTS
from tpulaunch.app.remote import rehearse
from tpulaunch.errors import ExitCode, TpuLaunchError
from tpulaunch.tpu import api


def test_preempt_at_is_refused_against_an_outside_tpu_api_server(monkeypatch):
    monkeypatch.setenv(api.ENDPOINT_ENV, "http://127.0.0.1:9")  # nothing listens: the refusal comes first
    said = []
    with pytest.raises(TpuLaunchError) as refused:
        rehearse(str(TESTS / "jobs" / "good" / "tpu_ct.yaml"), [], preempt_at=(3,), recreate=1,
                 after_preemption="same-zone", secrets_dir=None, hosts=None, poll_s=0.2, keep_tpu=False,
                 host_timeout_s=60, try_wait_s=60, say=said.append, out=said.append)
    assert refused.value.message == "--preempt-at needs the rehearsal's own TPU API server"
    assert api.ENDPOINT_ENV in refused.value.hint
    assert refused.value.exit_code == ExitCode.USAGE
    assert said == []  # no local server was started, nothing staged
