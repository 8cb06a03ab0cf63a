"""Can this TensorFlow drive this TPU? The installed TensorFlow, the slice's generation and the node's runtime
version against one table of facts, as pure functions (no TensorFlow import, no network): `checks/stack.py`
turns their verdicts into located problems for `validate` (and every verb's gate), `status` asks them about
the node's runtimeVersion, and `up` takes its default runtime from `default_runtime`.

An engine's `EngineAbout.on_tpu.runtime` says how it reaches the TPU:
  * "se" (the estimator engine): TPUEstimator's sessions send the graph over gRPC to the TensorFlow server of the
    node's own `tpu-vm-tf-X.Y.Z[-pod]-se` image, which runs the TPU. The installed TensorFlow only builds the
    graph, so any TensorFlow 2.15 wheel does (the PyPI `tensorflow` 2.15.1 wheel has no TPU runtime loader
    itself), but the node must carry a TensorFlow server of the same major.minor: a base image has none.
  * "pjrt" (the keras engine): TensorFlow loads libtpu in the training process, on the TPU VM, so the installed
    wheel must be built with TPU support: `tensorflow-tpu` (with the libtpu it requires), or the TensorFlow a
    `tpu-vm-tf-X.Y.Z-pjrt` image carries. The `tensorflow` and `tensorflow-cpu` wheels have no TPU runtime.

Every fact is in FACTS below, once, with its source.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping, Optional, Tuple

from tpulaunch.seam.about import Framework

Version = Tuple[int, ...]

# ------------------------------------------------------------------------------------------------ the facts
FACTS = {
    # Distributions that install the `tensorflow` package. Several at once share one folder: whichever pip
    # installed last owns the files while every one's metadata stays (e.g. tf-keras pulling `tensorflow` over
    # `tensorflow-tpu`): a clobbered install.
    "tensorflow_distributions": ("tensorflow", "tensorflow-cpu", "tensorflow-tpu", "tensorflow-intel",
                                 "tensorflow-macos", "tf-nightly", "tf-nightly-cpu", "tf-nightly-tpu"),
    # Wheels built with TPU support: libtpu.so, TPU_LIBRARY_PATH and FindAndLoadTpuLibrary are in
    # tensorflow_tpu 2.19.1's and 2.20.0's libtensorflow_cc.so.2 and in neither tensorflow 2.15.1's nor
    # tensorflow 2.21.0's (nor tensorflow-cpu 2.15.1's); tensorflow-tpu requires libtpu (2.19.1: libtpu==0.0.10).
    # PyPI's tensorflow-tpu releases: 2.16.1, 2.16.2, 2.17.0, 2.17.1, 2.18.0, 2.19.1, 2.20.0 (none before 2.16).
    "tpu_builds": ("tensorflow-tpu", "tf-nightly-tpu"),
    # The extra that installs a TPU build (setup.cfg [keras-tpu]: the tensorflow-tpu keras-team/keras
    # requirements-tensorflow-tpu.txt pins).
    "tpu_build_install": "pip install 'tpulaunch[keras-tpu]' (tensorflow-tpu 2.19.1 with libtpu) into a fresh environment",
    # TensorFlow per generation, https://cloud.google.com/tpu/docs/supported-tpu-versions ("TPU software
    # versions"): "TPU v6e, v5e, and v5p support TensorFlow 2.15.0 and later", their runtime versions are
    # tpu-vm-tf-x.y.z[-pod]-pjrt only; v2, v3 and v4 (TF 2.10.1 and later) take -se and -pjrt.
    # (first TensorFlow, runtimes)
    "generations": {
        "v2": ((2, 0), ("se", "pjrt")), "v3": ((2, 0), ("se", "pjrt")), "v4": ((2, 10), ("se", "pjrt")),
        "v5e": ((2, 15), ("pjrt",)), "v5p": ((2, 15), ("pjrt",)), "v6e": ((2, 15), ("pjrt",)),
    },
    # Generations Cloud TPU offers that run no TensorFlow at all (TPU7x, Ironwood: JAX and PyTorch only).
    "no_tensorflow": {"tpu7x": "TPU7x (Ironwood)", "v7": "TPU7x (Ironwood)", "v7x": "TPU7x (Ironwood)"},
    # Runtime versions: tpu-vm-tf-x.y.z[-pod][-{se|pjrt}] ("-se or -pjrt required from 2.15.0", the same page);
    # the newest TensorFlow with an image is 2.18 (tpu-vm-tf-2.18.0-pjrt): a newer TensorFlow runs on a base image.
    "runtime_suffix_required_from": (2, 15),
    "newest_image": (2, 18),
    # Base images carry no TensorFlow (the same page's PyTorch/JAX versions; v2-alpha-tpuv5-lite for v5e as in
    # https://github.com/pytorch/xla/issues/6611): the default for a TPU build the pip wheel brings itself.
    "base_images": re.compile(r"^(tpu-ubuntu\d+-base|tpu-vm-base|tpu-vm-v4-base|v2-alpha(-tpuv[0-9a-z-]+)?|"
                              r"v2-tpuv[0-9a-z-]+|tpu-vm-(v4-)?pt-.+|tpu-vm-(v4-)?jax-.+)$"),
    "default_base_image": {"v5e": "v2-alpha-tpuv5-lite"},
    "base_image": "tpu-ubuntu2204-base",
}

# TensorFlow as the engines that train with it declare it (`EngineAbout.framework`): its version is read from
# whichever of these distributions installed the `tensorflow` package.
TENSORFLOW = Framework("TensorFlow", "tensorflow", FACTS["tensorflow_distributions"])

_RUNTIME = re.compile(r"^tpu-vm-tf-(\d+)\.(\d+)\.(\d+)(-pod)?(?:-(se|pjrt|v4))?$")


# ---------------------------------------------------------------------------------------------- verdicts
@dataclass(frozen=True)
class Verdict:
    """What is wrong (None: nothing) and how to fix it; `severity` "error" or "warning"."""

    code: str
    message: str
    fix: str
    severity: str = "error"


@dataclass(frozen=True)
class Runtime:
    """A runtime version string as Cloud TPU names them."""

    text: str
    tensorflow: Optional[Version]  # (x, y, z) of a tpu-vm-tf image; None for a base image or an unknown name
    pod: bool = False
    api: Optional[str] = None  # "se" | "pjrt" | None (before 2.15, or a base image)
    base: bool = False  # a base image: no TensorFlow


def version_tuple(text: Optional[str]) -> Optional[Version]:
    numbers = re.findall(r"\d+", text or "")[:3]
    return tuple(int(n) for n in numbers) if len(numbers) >= 2 else None


def parse_runtime(text: str) -> Runtime:
    text = (text or "").strip()
    match = _RUNTIME.match(text)
    if match:
        version = tuple(int(match.group(i)) for i in (1, 2, 3))
        api = match.group(5) if match.group(5) in ("se", "pjrt") else None
        return Runtime(text, version, bool(match.group(4)), api)
    return Runtime(text, None, base=bool(FACTS["base_images"].match(text)))


def tensorflow_distributions(installed: Mapping[str, str]) -> dict:
    """The installed distributions (normalised name -> version) that install the `tensorflow` package."""
    names = {_normal(n): v for n, v in installed.items()}
    return {n: names[n] for n in FACTS["tensorflow_distributions"] if n in names}


framework_distributions = tensorflow_distributions  # by the name `EngineAbout.tpu_stack` modules share


def installed_verdict(installed: Mapping[str, str], api: str) -> Optional[Verdict]:
    """Can the installed TensorFlow (`installed`: distribution -> version) drive a TPU the engine's way (`api`)?"""
    found = tensorflow_distributions(installed)
    if not found:
        return None  # no TensorFlow here: nothing to judge (validate --static on a machine without it)
    listed = ", ".join(f"{name} {version}" for name, version in found.items())
    if len(found) > 1:
        return Verdict("tensorflow-clobbered",
                       f"several TensorFlow distributions share one `tensorflow` folder here ({listed}): whichever "
                       "was installed last owns the files, so which TensorFlow runs is unknown",
                       f"start from a fresh environment with one of them; for a TPU: {FACTS['tpu_build_install']}")
    if api == "pjrt" and not set(found) & set(FACTS["tpu_builds"]):
        return Verdict("tensorflow-without-tpu",
                       f"the installed TensorFlow ({listed}) has no TPU support: its wheel has no TPU runtime "
                       "(libtpu) loader, and this engine runs the TPU in its own process",
                       FACTS["tpu_build_install"])
    return None


def generation_verdict(generation: str, api: str, tensorflow: Optional[Version]) -> Optional[Verdict]:
    """Does the slice's generation run TensorFlow `tensorflow` (None: unknown) under runtime `api`?"""
    if generation in FACTS["no_tensorflow"]:
        return Verdict("generation-without-tensorflow", f"{FACTS['no_tensorflow'][generation]} runs no TensorFlow",
                       "choose a v2, v3, v4, v5e, v5p or v6e type")
    known = FACTS["generations"].get(generation)
    if known is None:
        return None
    first, runtimes = known
    if api not in runtimes:
        return Verdict("generation-runtime",
                       f"Cloud TPU runs TensorFlow on {generation} only with the {' or '.join(runtimes)} runtime; this "
                       f"engine needs {api}",
                       "choose a v2, v3 or v4 type for TPUEstimator, or train with the keras engine (run.engine: keras, "
                       "tpulaunch[keras-tpu])" if api == "se" else "choose another generation")
    if tensorflow is not None and tensorflow[:2] < first:
        return Verdict("generation-tensorflow", f"{generation} needs TensorFlow {first[0]}.{first[1]} or later; "
                       f"TensorFlow {_text(tensorflow)} is installed", "install a newer TensorFlow")
    return None


def runtime_verdict(runtime: str, api: str, tensorflow: Optional[Version], installed: Mapping[str, str],
                    hosts: Optional[int] = None, generation: Optional[str] = None) -> Optional[Verdict]:
    """Does runtime version `runtime` (a node's runtimeVersion, or tpu.runtime_version) run this engine's
    TensorFlow: the engine's `api`, the installed `tensorflow` version and distributions, a slice of `hosts`?"""
    parsed = parse_runtime(runtime)
    expected = default_runtime(api, tensorflow, hosts, generation)
    fix = f"use {expected}" if expected else "install the TensorFlow the node runs"
    if parsed.base:
        if api == "se":
            return Verdict("runtime-without-tensorflow",
                           f"{parsed.text} is a base image without TensorFlow: TPUEstimator needs the TensorFlow "
                           "server of a tpu-vm-tf image", fix)
        if not set(tensorflow_distributions(installed)) & set(FACTS["tpu_builds"]):
            return Verdict("runtime-without-tensorflow",
                           f"{parsed.text} is a base image without TensorFlow, and the installed TensorFlow brings no "
                           "TPU runtime of its own", FACTS["tpu_build_install"])
        return None  # the pip TPU build brings TensorFlow and libtpu onto the VM
    if parsed.tensorflow is None:
        return Verdict("runtime-unknown", f"{parsed.text} is not a TensorFlow runtime version tpulaunch knows "
                       "(tpu-vm-tf-X.Y.Z[-pod]-se|-pjrt, or a base image)", fix, severity="warning")
    if tensorflow is not None and parsed.tensorflow[:2] != tensorflow[:2]:
        return Verdict("runtime-tensorflow-mismatch",
                       f"{parsed.text} runs TensorFlow {_text(parsed.tensorflow[:2])}, this machine has TensorFlow "
                       f"{_text(tensorflow)}: the graph is built by one and run by the other", fix)
    if parsed.tensorflow[:2] >= FACTS["runtime_suffix_required_from"] and parsed.api != api:
        said = f"the {parsed.api} runtime" if parsed.api else "no runtime suffix"
        return Verdict("runtime-api-mismatch", f"{parsed.text} names {said}; this engine needs {api}", fix)
    if hosts is not None and parsed.pod != (hosts > 1):
        return Verdict("runtime-pod-mismatch",
                       f"{parsed.text} is for {'multi' if parsed.pod else 'single'}-host slices; this one has "
                       f"{hosts} host{'s' if hosts != 1 else ''}", fix)
    return None


def default_runtime(api: str, tensorflow: Optional[Version], hosts: Optional[int] = None,
                    generation: Optional[str] = None) -> Optional[str]:
    """The runtime version for this engine and TensorFlow: its tpu-vm-tf image (-pod on several hosts), or, for a
    TPU build newer than the newest image, the generation's base image; None when there is no TensorFlow."""
    if tensorflow is None:
        return None
    if api == "pjrt" and tensorflow[:2] > FACTS["newest_image"]:
        return FACTS["default_base_image"].get(generation or "", FACTS["base_image"])
    version = _text(tensorflow if len(tensorflow) == 3 else tensorflow + (0,))
    pod = "-pod" if hosts is not None and hosts > 1 else ""
    return f"tpu-vm-tf-{version}{pod}-{api}"


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _text(version: Version) -> str:
    return ".".join(str(n) for n in version)


# ---------------------------------------------------------------------------------------- this machine
def installed_distributions() -> dict:
    """The distributions the verdicts read (the TensorFlow ones and libtpu), from package metadata: no import."""
    from importlib import metadata

    found = {}
    for name in FACTS["tensorflow_distributions"] + ("libtpu",):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found
