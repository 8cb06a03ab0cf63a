"""Can JAX drive this TPU? The jax engine's stack facts and their verdicts (its `EngineAbout.tpu_stack`), as pure
functions with the names `tpu/stack.py` gives TensorFlow's (no JAX import, no network): `checks/stack.py` turns
them into located problems at `tpu:`, `tpu.type` and `tpu.runtime_version`.

JAX reaches a TPU through libtpu in its own process (PJRT), which `jax[tpu]` installs from the index, so a node
needs no framework on its image: JAX runs on the generation's base image. Every fact is in FACTS below, once,
with its source.
"""

from __future__ import annotations

import re
from typing import Mapping, Optional

from tpulaunch.tpu.stack import Verdict, version_tuple  # noqa: F401  (version_tuple: the name stack modules share)

FACTS = {
    # The distributions whose version is JAX's (the `jax` package) and the TPU runtime jax[tpu] brings.
    "jax_distributions": ("jax",),
    "tpu_runtime_distribution": "libtpu",
    "tpu_install": "pip install 'jax[tpu]' (JAX with libtpu) on the TPU VM",
    # The generations this engine targets: those the runtimes page gives a JAX base image (v4, v5e, v5p, v6e,
    # cloud.google.com/tpu/docs/runtimes) and TPU7x ("You can use the JAX framework on TPU7x. TensorFlow is not
    # supported", cloud.google.com/tpu/docs/tpu7x). v2 and v3 train on TensorFlow's engines.
    "generations": ("v4", "v5e", "v5p", "v6e", "tpu7x"),
    "older": ("v2", "v3"),
    # TPU7x is offered through Google Kubernetes Engine only ("To use TPU7x, you must use Google Kubernetes
    # Engine", cloud.google.com/tpu/docs/tpu7x): no TPU VM runtime version, and none tpulaunch can create.
    "gke_only": {"tpu7x": "TPU7x (Ironwood)", "v7": "TPU7x (Ironwood)", "v7x": "TPU7x (Ironwood)"},
    # Runtime versions for JAX: the base images, which carry no framework (cloud.google.com/tpu/docs/runtimes,
    # "PyTorch and JAX": tpu-ubuntu2204-base on every generation, v2-alpha-tpuv5-lite for v5e, v2-alpha-tpuv5 for
    # v5p, v2-alpha-tpuv6e for v6e). A tpu-vm-tf-* image carries TensorFlow's TPU server and libtpu of its own.
    "base_images": re.compile(r"^(tpu-ubuntu\d+-base|tpu-vm-base|tpu-vm-v4-base|v2-alpha(-tpuv[0-9a-z-]+)?|"
                              r"v2-tpuv[0-9a-z-]+)$"),
    "tensorflow_images": re.compile(r"^tpu-vm-tf-"),
    "default_image": {"v5e": "v2-alpha-tpuv5-lite", "v5p": "v2-alpha-tpuv5", "v6e": "v2-alpha-tpuv6e"},
    "base_image": "tpu-ubuntu2204-base",
}


def _listed(names) -> str:
    names = [FACTS["gke_only"].get(name, name).split(" ")[0] for name in names]  # TPU7x, not tpu7x
    return f"{', '.join(names[:-1])} or {names[-1]}"


GENERATIONS_TEXT = _listed(FACTS["generations"])  # v4, v5e, v5p, v6e or TPU7x
CREATABLE_TEXT = _listed([name for name in FACTS["generations"] if name not in FACTS["gke_only"]])


def installed_distributions() -> dict:
    """JAX's and libtpu's installed versions, from package metadata: no import."""
    from importlib import metadata

    found = {}
    for name in FACTS["jax_distributions"] + (FACTS["tpu_runtime_distribution"],):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def framework_distributions(installed: Mapping[str, str]) -> dict:
    """The installed distributions (normalised name -> version) that are JAX."""
    names = {re.sub(r"[-_.]+", "-", n).lower(): v for n, v in installed.items()}
    return {n: names[n] for n in FACTS["jax_distributions"] if n in names}


def installed_verdict(installed: Mapping[str, str], api: str) -> Optional[Verdict]:
    """Can the installed JAX drive a TPU? Only with libtpu beside it (jax[tpu])."""
    found = framework_distributions(installed)
    if not found or FACTS["tpu_runtime_distribution"] in installed:
        return None  # no JAX here: nothing to judge (validate on a machine without it)
    return Verdict("jax-without-tpu", f"the installed JAX ({found['jax']}) has no TPU runtime: libtpu is not "
                   "installed, and JAX loads it in the training process", FACTS["tpu_install"])


def generation_verdict(generation: str, api: str, version) -> Optional[Verdict]:
    """Does JAX run on the slice's generation?"""
    if generation in FACTS["generations"]:
        return None
    hint = f"choose a {GENERATIONS_TEXT} type"
    if generation in FACTS["older"]:
        hint += ", or train on this generation with run.engine: estimator or keras (TensorFlow)"
    return Verdict("generation-without-jax", f"the jax engine runs on TPU {GENERATIONS_TEXT}, not {generation}",
                   hint)


def type_verdict(family: str) -> Optional[Verdict]:
    """A generation JAX runs on that tpulaunch's TPU types do not list (a type it cannot create), by the family
    of the type's name (`tpu7x` of `tpu7x-8`); None for every other family."""
    if family not in FACTS["gke_only"]:
        return None
    return Verdict("generation-gke-only", f"{FACTS['gke_only'][family]} is offered through Google Kubernetes "
                   "Engine only, not as a TPU VM that tpulaunch can create", f"choose a {CREATABLE_TEXT} type")


def runtime_verdict(runtime: str, api: str, version, installed: Mapping[str, str], hosts: Optional[int] = None,
                    generation: Optional[str] = None) -> Optional[Verdict]:
    """Does runtime version `runtime` run the jax engine? A base image does (jax[tpu] brings JAX and libtpu)."""
    text = (runtime or "").strip()
    expected = default_runtime(api, version, hosts, generation)
    if FACTS["base_images"].match(text):
        return None
    if FACTS["tensorflow_images"].match(text):
        return Verdict("runtime-tensorflow-image",
                       f"{text} is a TensorFlow image (its own TensorFlow server and libtpu); the jax engine runs on "
                       "a base image, where jax[tpu] brings JAX and libtpu", f"use {expected}")
    return Verdict("runtime-unknown", f"{text} is not a runtime version tpulaunch knows for JAX (a base image: "
                   "tpu-ubuntu2204-base, v2-alpha-tpuv5-lite, v2-alpha-tpuv5, v2-alpha-tpuv6e)", f"use {expected}",
                   severity="warning")


def default_runtime(api: str, version, hosts: Optional[int] = None, generation: Optional[str] = None) -> str:
    """The generation's base image: JAX needs no framework on the node."""
    return FACTS["default_image"].get(generation or "", FACTS["base_image"])
