"""The analytic memory estimate against XLA's TPU compiler, per model style, and the published Cloud TPU verdicts.

For each case: the estimate (`tpulaunch plan`'s memory section) and XLA's own answer (the job's step compiled for
the TPU type by libtpu's compile-only client, `tpulaunch/plan/xla_tpu.py`), per core, and the estimate's error
against XLA's figure (XLA's required bytes where it ran out of memory). Prints a Markdown table.

    TPULAUNCH_XLA_PYTHON=.venv-xla/bin/python .venv/bin/python benchmarks/xla_vs_estimate.py [--only NAME...]
    TPULAUNCH_XLA_PYTHON=.venv-xla/bin/python .venv-keras/bin/python benchmarks/xla_vs_estimate.py --engine jax

`--engine jax`: the jax engine's cases (Keras 3 models, `benchmarks/models/keras3_styles.py`, on v5e), its own
estimate (`engine/jax/memory_plan.py`) against its own step lowered by JAX and compiled by XLA's TPU compiler.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(_HERE), _HERE]
# The step child builds the models too: it finds benchmarks/models the same way.
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [os.path.dirname(_HERE), _HERE, os.environ.get("PYTHONPATH")]))

from tpulaunch.job.schema import Job  # noqa: E402
from tpulaunch.plan.build import build_plan  # noqa: E402
from tpulaunch.plan.memory import plan_memory  # noqa: E402
from tpulaunch.plan.xla_tpu import XlaUnavailable, compile_step, fits  # noqa: E402
from tpulaunch.seam.registry import about, engine_for  # noqa: E402

GiB = 1024 ** 3


def job(name, builder, params, features, labels, loss, tpu, batch, cores=1, dims=None, optimizer="adam",
        precision="float32", engine=None) -> Job:
    doc = {"name": name, "model": {"builder": builder, "params": params, "loss": loss,
                                   "optimizer": {"name": optimizer}, "precision": precision},
           "data": {"features": features, "labels": labels},
           "tpu": {"type": tpu, "cores_per_replica": cores}, "train": {"batch_size": batch, "steps": 10},
           "run": {"model_dir": "gs://bucket/run", **({"engine": engine} if engine else {})}}
    if dims:
        doc["partition"] = {"features": {"image": dims}}
    return Job.model_validate(doc)


def retinanet(size, tpu, batch, cores=1, dims=None):
    from tpulaunch.models.retinanet import anchor_count

    anchors = anchor_count(size)
    return job(f"retinanet-{size}", "tpulaunch.models.retinanet:build", {"num_classes": 90},
               {"image": {"shape": [size, size, 3], "dtype": "uint8", "encoding": "raw"}},
               {"cls_targets": {"shape": [anchors], "dtype": "int32", "encoding": "raw"},
                "box_targets": {"shape": [anchors, 4], "dtype": "float32", "encoding": "raw"}},
               "tpulaunch.models.retinanet:loss", tpu, batch, cores, dims, "momentum", "bfloat16")


def unet3d(size, tpu, batch, cores=1, dims=None, optimizer="momentum"):
    return job(f"unet3d-{size}", "tpulaunch.models.unet3d:build", {"num_classes": 3},
               {"image": {"shape": [size, size, size, 1], "encoding": "raw"}},
               {"mask": {"shape": [size, size, size], "dtype": "uint8", "encoding": "raw"}},
               "sparse_categorical_crossentropy", tpu, batch, cores, dims, optimizer, "bfloat16")


def image_classifier(name, builder, size, channels, tpu, batch, params=None):
    return job(name, builder, dict(params or {}, num_classes=10),
               {"image": {"shape": [size, size, channels]}}, {"label": {"shape": [], "dtype": "int64"}},
               "sparse_categorical_crossentropy", tpu, batch)


CASES = {
    # style cases: (job, published verdict or "")
    "cnn-32": (lambda: image_classifier("cnn-32", "tpulaunch.models.cnn:build", 32, 3, "v3-8", 8 * 1024), ""),
    "cnn-512": (lambda: image_classifier("cnn-512", "tpulaunch.models.cnn:build", 512, 3, "v3-8", 8 * 32), ""),
    "resnet50-224": (lambda: image_classifier("resnet50-224", "models.xla_styles:resnet", 224, 3, "v3-8", 8 * 64), ""),
    "transformer-512": (lambda: job("transformer-512", "models.xla_styles:transformer", {"num_classes": 10},
                                    {"image": {"shape": [512, 256]}}, {"label": {"shape": [], "dtype": "int64"}},
                                    "sparse_categorical_crossentropy", "v3-8", 8 * 32), ""),
    # the seeds' published facts (docs/validate-and-plan.md)
    "retinanet-1280x8": (lambda: retinanet(1280, "v3-8", 64), "trains"),
    "retinanet-2560x8": (lambda: retinanet(2560, "v3-8", 64), "does not fit"),
    "retinanet-2560x8-8way": (lambda: retinanet(2560, "v3-8", 8, 8, [1, 4, 2, 1]), "trains"),
    "unet3d-128x4": (lambda: unet3d(128, "v3-8", 32), "trains"),
    # configs/unet3d_ct.yaml's own model and optimizer (Adam), at the published 128^3 x 4 per core
    "unet3d-128x4-adam": (lambda: unet3d(128, "v3-8", 32, optimizer="adam"), ""),
    "unet3d-256x1": (lambda: unet3d(256, "v3-8", 8), "Used 27.90G of 15.48G"),
    "unet3d-256-16way": (lambda: unet3d(256, "v3-32", 2, 16, [1, 4, 2, 2, 1]), "trains"),
}


def jax_job(name, builder, features, label, tpu, batch, params=None):
    """A jax engine case: a Keras 3 model of keras3_styles.py, Adam, float32 (the engine's only precision)."""
    return job(name, f"models.keras3_styles:{builder}", dict(params or {}), features, label,
               "sparse_categorical_crossentropy", tpu, batch, engine="jax")


CLASS = {"label": {"shape": [], "dtype": "int64"}}
JAX_CASES = {  # on v5litepod-4: 4 chips, one replica each, so the global batch is 4x the per-core one
    "jax-cnn-128": (lambda: jax_job("jax-cnn-128", "cnn", {"image": {"shape": [128, 128, 3]}}, CLASS, "v5litepod-4",
                                    4 * 128), ""),
    "jax-transformer-512": (lambda: jax_job("jax-transformer-512", "transformer", {"tokens": {"shape": [512, 256]}},
                                            CLASS, "v5litepod-4", 4 * 32), ""),
    "jax-unet3d-64": (lambda: jax_job("jax-unet3d-64", "unet3d", {"image": {"shape": [64, 64, 64, 1]}},
                                      {"mask": {"shape": [64, 64, 64], "dtype": "int64"}}, "v5litepod-4", 4 * 2), ""),
}


def row(name: str) -> str:
    make, published = {**CASES, **JAX_CASES}[name]
    the_job = make()
    plan = build_plan(the_job, engine=the_job.run.engine)
    section = plan_memory(the_job, plan, engine_for(the_job).step_tensors)
    if section.per_core_bytes is None:
        return f"| {name} | {published} | no estimate: {section.reason} | | | |"
    started = time.monotonic()
    try:
        xla = compile_step(the_job, plan, plan.per_replica_batch, section.optimizer_slots)
    except XlaUnavailable as exc:
        return (f"| {name} | {published} | {section.verdict}, {section.per_core_bytes / GiB:.2f} GiB "
                f"| no answer: {exc} | | |")
    seconds = time.monotonic() - started
    need = xla["per_core_bytes"] if xla["fits"] else xla["required_bytes"]
    said = (f"fits, {need / GiB:.2f} GiB at its peak" if fits(xla, plan)
            else f"compiled, {need / GiB:.2f} GiB at its peak: above the usable line" if xla["fits"]
            else f"does not fit, {need / GiB:.2f} GiB (XLA's out-of-memory figure)")
    error = (section.per_core_bytes - need) / need
    model = the_job.model
    case = (f"{name}: {model.builder}, {model.optimizer.name}, {model.precision}, {plan.engine} engine, "
            f"{plan.per_replica_batch} per replica")
    return (f"| {case} | {published} | {section.verdict}, {section.per_core_bytes / GiB:.2f} GiB | {said} | "
            f"{error:+.0%} | {seconds:.0f} s |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", choices=sorted({**CASES, **JAX_CASES}), help="these cases only")
    parser.add_argument("--engine", choices=("estimator", "keras", "jax"), default=None,
                        help="jax: the jax engine's cases (in the keras engine's environment); else the builder cases")
    args = parser.parse_args()
    if args.engine == "jax":  # Keras 3 on JAX in this process, before any Keras loads
        os.environ.update(about("jax").process_environment)
    print("| case | published | estimate | XLA (TPU compiler) | estimate vs XLA | export + compile |")
    print("|---|---|---|---|---|---|")
    for name in args.only or (JAX_CASES if args.engine == "jax" else CASES):
        print(row(name), flush=True)


if __name__ == "__main__":
    main()
