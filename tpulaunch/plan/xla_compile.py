"""Compile one step for a TPU topology with XLA's own TPU compiler, and say what it needs per core.

Runs in the compiler's environment (jax with libtpu, `requirements/xla.txt`), never in TensorFlow's: this
module imports only the standard library at the top, and jax inside its functions, so any engine may import
it (a JAX engine that lowers its own step calls `compile_for_topology` directly) and `tpulaunch.plan.xla_tpu`
runs it as a script in that environment:

    <xla python> xla_compile.py < request.json   # {"hlo": path, "topology": "v3:2x2", ...} -> one JSON line

libtpu's compile-only client needs no TPU: `get_topology_desc` gives abstract devices for a topology, and its
client compiles for them and reports the executable's memory (arguments, outputs, aliased, temporaries,
generated code) or XLA's own out-of-memory message.
"""

from __future__ import annotations

import json
import os
import re
import sys
from typing import Optional, Sequence

# XLA's TPU out-of-memory message: "... the total memory required for HLO temporaries (47.04G) exceeds available
# HBM (15.75G)" or "Used 27.90G of 15.48G hbm"; its G is GiB.
_OOM_FORMS = (re.compile(r"\((?P<need>[\d.]+)([GM])\) exceeds available HBM \((?P<have>[\d.]+)G\)"),
              re.compile(r"Used (?P<need>[\d.]+)([GM]) of (?P<have>[\d.]+)G hbm"))


def out_of_memory(message: str) -> Optional[dict]:
    """XLA's figures from an out-of-memory compile error: {"required_bytes", "available_bytes"} (GiB-based), or
    None for any other error."""
    if "RESOURCE_EXHAUSTED" not in message and "hbm" not in message.lower():
        return None
    for form in _OOM_FORMS:
        found = form.search(message)
        if found:
            unit = 1024 ** 3 if found.group(2) == "G" else 1024 ** 2
            return {"required_bytes": int(float(found.group("need")) * unit),
                    "available_bytes": int(float(found.group("have")) * 1024 ** 3)}
    return None


def first_line(message: str) -> str:
    """The line of a compile error that says what went wrong (libtpu appends source traces), with MLIR's own
    first error where it gives one."""
    lines = [line.strip() for line in message.splitlines() if line.strip() and "Source Location" not in line]
    if not lines:
        return message.strip()
    detail = next((line.split("error: ", 1)[1] for line in lines[1:] if "error: " in line), None)
    return f"{lines[0]} {detail}" if detail else lines[0]


def _quiet_libtpu() -> None:
    # With no TPU here, libtpu warns about the accelerator type and worker hostnames it cannot find; the
    # compile-only client needs neither. Nor does it hold a TPU, so several compiles at once (parallel tests,
    # two users) may each load libtpu: without this, the second is refused at /tmp/libtpu_lockfile.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    # Each load of libtpu otherwise leaves its driver logs in /tmp/tpu_logs: a plan is not a TPU run.
    os.environ.setdefault("TPU_LOG_DIR", "disabled")
    os.environ.setdefault("TPU_ACCELERATOR_TYPE", "")
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def topology_devices(topology: str) -> list:
    """The abstract TPU devices of a libtpu topology name such as "v3:2x2" or "v4:2x2x1".

    Raises:
        ValueError: libtpu does not know the topology.
    """
    _quiet_libtpu()
    from jax.experimental import topologies

    try:
        return list(topologies.get_topology_desc(platform="tpu", topology_name=topology).devices)
    except Exception as exc:  # noqa: BLE001 (libtpu raises its own runtime error types)
        raise ValueError(f"libtpu does not know the topology {topology!r}: {first_line(str(exc))}") from None


def compile_for_topology(module, topology: str, partitions: int = 1) -> dict:
    """Compile an MLIR (StableHLO) module for `partitions` devices of `topology` (SPMD when more than one:
    the module's `mhlo.sharding` attributes say how), and return what one device needs.

    Returns:
        {"fits": True, "arguments", "outputs", "aliased", "temporaries", "generated_code", "buffers_total",
        "per_core_bytes" (XLA's peak), "available_bytes" (XLA's limit)} or
        {"fits": False, "required_bytes", "available_bytes", "message"} when XLA runs out of HBM.

    Raises:
        ValueError: the topology has fewer devices than asked for, or XLA rejects the step for another reason.
    """
    import numpy as np
    from jax._src import compiler
    from jax._src.lib import xla_client as xc

    devices = topology_devices(topology)
    if partitions > len(devices):
        raise ValueError(f"the topology {topology} has {len(devices)} devices, fewer than the {partitions} asked for")
    chosen = devices[:partitions]
    options = compiler.get_compile_options(num_replicas=1, num_partitions=partitions,
                                           device_assignment=np.array([[d.id for d in chosen]]))
    options.executable_build_options.use_spmd_partitioning = partitions > 1
    try:
        executable = chosen[0].client.compile(module, xc.DeviceList(tuple(chosen)), options)
    except Exception as exc:  # noqa: BLE001 (XLA's runtime errors: out of memory is a verdict, the rest an error)
        message = str(exc)
        oom = out_of_memory(message)
        if oom is None:
            raise ValueError(f"XLA rejected the step: {first_line(message)}") from None
        return dict(oom, fits=False, message=first_line(message))
    stats = executable.get_compiled_memory_stats()
    figures = {"arguments": stats.argument_size_in_bytes, "outputs": stats.output_size_in_bytes,
               "aliased": stats.alias_size_in_bytes, "temporaries": stats.temp_size_in_bytes,
               "generated_code": stats.generated_code_size_in_bytes}
    # Every buffer added up, as if all were live at once: an upper bound of what the step holds.
    figures["buffers_total"] = (figures["arguments"] + figures["outputs"] - figures["aliased"]
                                + figures["temporaries"] + figures["generated_code"])
    # XLA's own figure: the peak of its buffer assignment, what it holds against its limit (`hbm_limit`).
    figures["per_core_bytes"] = stats.peak_memory_in_bytes or figures["buffers_total"]
    return dict(figures, fits=True, available_bytes=hbm_limit(chosen[0].client, xc.DeviceList(tuple(chosen)),
                                                              options))


# A step no TPU can hold (a 128 GiB argument and as large an output): its out-of-memory message names XLA's limit.
_TOO_LARGE = """
func.func public @main(%arg0: tensor<8x65536x65536xf32>) -> tensor<8x65536x65536xf32> {
  %0 = stablehlo.sine %arg0 : tensor<8x65536x65536xf32>
  return %0 : tensor<8x65536x65536xf32>
}
"""


def hbm_limit(client, devices, options) -> Optional[int]:
    """XLA's own limit of HBM per device for these devices: what its out-of-memory message says is available, from a
    compile of a step no TPU holds (a tenth of a second). None where the message does not say."""
    from jax._src.lib.mlir import ir

    module = ir.Module.parse(_TOO_LARGE)  # in the caller's MLIR context
    try:
        client.compile(module, devices, options)
    except Exception as exc:  # noqa: BLE001
        found = out_of_memory(str(exc))
        return found["available_bytes"] if found else None
    return None


def _without_copies(module) -> int:
    """Drop the `mhlo.copy` ops TensorFlow's export leaves where a variable is read and then updated in place (a
    batch norm's moving averages in training, `assign`): a copy is its operand's value, and the TPU pipeline
    refuses the op ("failed to legalize operation 'mhlo.copy'"). Returns how many were dropped."""
    from jax._src.lib.mlir import ir

    copies = []

    def visit(op):
        if op.name == "mhlo.copy":
            copies.append(op)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    for op in copies:
        op.result.replace_all_uses_with(op.operands[0])
        op.erase()
    return len(copies)


def _annotate(module, shardings: Sequence[Optional[str]], donated: Sequence[int]) -> None:
    """Put each parameter's sharding, and whether its buffer is donated (a training step's weights, optimizer
    slots and moving averages: XLA reuses it for the output of the same shape), on the module's entry function."""
    from jax._src.lib.mlir import ir

    main = next(op for op in module.body.operations
                if "sym_name" in op.attributes and ir.StringAttr(op.attributes["sym_name"]).value == "main")
    function_type = ir.FunctionType(ir.TypeAttr(main.attributes["function_type"]).value)
    donated = set(donated)
    arguments = []
    for index in range(len(function_type.inputs)):
        attrs = {}
        if any(shardings):
            attrs["mhlo.sharding"] = ir.StringAttr.get(shardings[index] if index < len(shardings) and shardings[index]
                                                       else "{replicated}")
        if index in donated:
            attrs["jax.buffer_donor"] = ir.BoolAttr.get(True)
        arguments.append(ir.DictAttr.get(attrs))
    main.attributes["arg_attrs"] = ir.ArrayAttr.get(arguments)
    if any(shardings):  # a step's outputs (loss, new weights and slots) are whole on every device of the replica
        main.attributes["res_attrs"] = ir.ArrayAttr.get(
            [ir.DictAttr.get({"mhlo.sharding": ir.StringAttr.get("{replicated}")}) for _ in function_type.results])


def compile_hlo(hlo: bytes, topology: str, partitions: int = 1, shardings: Sequence[Optional[str]] = (),
                donated: Sequence[int] = (), form: str = "hlo") -> dict:
    """`compile_for_topology` for a serialized HLO module (what TensorFlow's `experimental_get_compiler_ir(...)
    (stage="hlo_serialized")` gives; `form` "stablehlo": the StableHLO text a JAX engine lowers its own step to),
    with per-parameter shardings (HLO sharding text, None = replicated) and the indices of the parameters whose
    buffers the step may reuse (`donated`)."""
    _quiet_libtpu()
    from jax._src.interpreters import mlir
    from jax._src.lib import xla_client as xc
    from jax._src.lib.mlir import ir

    try:
        text = hlo.decode() if form == "stablehlo" else xc._xla.mlir.hlo_to_stablehlo(hlo)
    except Exception as exc:  # noqa: BLE001
        raise ValueError("the exported step cannot be converted for XLA's TPU compiler: "
                         + first_line(str(exc))) from None
    with mlir.make_ir_context():
        module = ir.Module.parse(text)
        _without_copies(module)
        _annotate(module, shardings, donated)
        return compile_for_topology(module, topology, partitions)


def main() -> None:
    """Request JSON on stdin, one result JSON line on stdout: the figures, or {"error": ...}."""
    import atexit
    import gc

    # jax and libtpu loaded: a second of the exit spared, as tf_env.skip_collection_at_exit spares tpulaunch's (this
    # file also runs as a script, with only the standard library to import)
    atexit.register(gc.freeze)
    request = json.load(sys.stdin)
    try:
        with open(request["hlo"], "rb") as f:
            hlo = f.read()
        result = compile_hlo(hlo, request["topology"], request.get("partitions", 1), request.get("shardings") or (),
                             request.get("donated") or (), request.get("format", "hlo"))
    except ValueError as exc:
        result = {"error": str(exc)}
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
