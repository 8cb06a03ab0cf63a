"""XLA's TPU compiler as `plan` drives it (`tpulaunch/plan/xla_compile.py`, run in the compiler's own environment:
jax with libtpu, compile-only, no TPU) answers what jax's own compile of the same step answers for the same TPU
topology: the memory figures of a step that fits, and XLA's own figures and limit for one that does not."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import SingleDeviceSharding

from tpulaunch.plan import xla_compile

REPO = Path(__file__).resolve().parents[2]


def step(weights, images):
    """A small training step: a dense layer's squared loss and the weights after one gradient step."""
    loss, grads = jax.value_and_grad(lambda w: jnp.mean(jnp.square(jnp.tanh(images @ w))))(weights)
    return loss, weights - 0.1 * grads


def lowered(topology: str, batch: int, width: int):
    device = xla_compile.topology_devices(topology)[0]
    placed = SingleDeviceSharding(device)
    return jax.jit(step, in_shardings=(placed, placed)).lower(
        jax.ShapeDtypeStruct((width, width), jnp.float32, sharding=placed),
        jax.ShapeDtypeStruct((batch, width), jnp.float32, sharding=placed))


@pytest.mark.parametrize("topology", ["v5e:2x2", "v4:2x2x1"])
def test_a_step_that_fits_has_jaxs_own_figures(topology):
    step_lowered = lowered(topology, batch=256, width=512)
    own = step_lowered.compile().memory_analysis()

    answer = xla_compile.compile_hlo(step_lowered.as_text().encode(), topology, form="stablehlo")

    assert answer["fits"] is True
    assert answer["arguments"] == own.argument_size_in_bytes == (512 * 512 + 256 * 512) * 4
    assert answer["outputs"] == own.output_size_in_bytes
    assert answer["temporaries"] == own.temp_size_in_bytes
    assert answer["generated_code"] == own.generated_code_size_in_bytes
    assert answer["per_core_bytes"] == (own.peak_memory_in_bytes or answer["buffers_total"])
    assert 0 < answer["per_core_bytes"] < answer["available_bytes"]


def test_a_step_no_core_holds_has_xlas_own_out_of_memory_figures():
    topology = "v5e:2x2"
    step_lowered = lowered(topology, batch=1 << 20, width=8192)  # 32 GiB of images on a 16 GiB core
    with pytest.raises(Exception, match="RESOURCE_EXHAUSTED") as own:
        step_lowered.compile()

    answer = xla_compile.compile_hlo(step_lowered.as_text().encode(), topology, form="stablehlo")

    assert answer["fits"] is False
    assert answer == dict(xla_compile.out_of_memory(str(own.value)), fits=False,
                          message=xla_compile.first_line(str(own.value)))
    assert answer["required_bytes"] > answer["available_bytes"] > 15 * 1024 ** 3


def test_plans_request_to_the_compiler_gets_one_json_line(tmp_path):
    """How `plan` asks (tpulaunch/plan/xla_tpu.py): the script, a request on stdin, one JSON line back; a topology
    libtpu does not know is an error line, not a traceback."""
    hlo = tmp_path / "step.mlir"
    hlo.write_text(lowered("v5e:2x2", batch=8, width=128).as_text())
    script = REPO / "tpulaunch" / "plan" / "xla_compile.py"
    for topology, key in (("v5e:2x2", "fits"), ("v9:2x2", "error")):
        request = {"hlo": str(hlo), "topology": topology, "format": "stablehlo"}
        done = subprocess.run([sys.executable, "-I", str(script)], input=json.dumps(request), capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        answer = json.loads(done.stdout.strip().splitlines()[-1])
        assert key in answer, answer
    assert "libtpu does not know the topology 'v9:2x2'" in answer["error"]
