"""Stage what the TPU VM needs under run.model_dir, content-addressed: a rerun of the same job stages nothing new.

What is staged (`layout.py` says where):

- the job file as its author wrote it (its `${VAR}`s stay references: no value of this machine's environment is
  written; the VM reads them from Secret Manager, the manifest naming which), with the `--set`s the VM's
  `tpulaunch train` gets: the ones given here, then the job's local paths as this machine resolved them
  (relative paths are relative to the job file, which the VM does not have). A secret given with --set (under a
  secret-looking key, `job/secrets.py`) is refused: it would be written here in clear;
- the job's own code: the modules its import paths name that sit next to the job file, and each `python_path`
  directory (deterministic .tar.gz files);
- tpulaunch itself (this installation's package folder), and which extra of it the VM installs (the engine's
  `tpu_extra`, with its requirements as this installation's package metadata lists them).

The manifest (`stages/<sha256>.json`) names all of it by digest; its own digest names the stage, which the node's
metadata carries so that a rerun of `tpulaunch run` knows the VM runs this job.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import tarfile
from dataclasses import dataclass
from typing import Iterable, List, Optional, Sequence, Tuple

from tpulaunch.errors import ExitCode, TpuLaunchError
from tpulaunch.job.yamlfile import value_at
from tpulaunch import store
from tpulaunch.remote import layout

FORMAT = 1
TARGETS = ("tpu", "local")  # the VM trains on its TPU; in a rehearsal, on this machine's CPU (`train --local`)


@dataclass
class Stage:
    model_dir: str
    digest: str  # the manifest's sha256: the stage's name
    manifest: dict
    uploaded: int  # files written now (0 on a rerun of the same job)
    total: int  # files the stage has

    @property
    def url(self) -> str:
        return layout.manifest(self.model_dir, self.digest)

    def blob_url(self, digest: str) -> str:
        return layout.blob(self.model_dir, digest)


def digest_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ------------------------------------------------------------------------------------------ bundles

def tar_gz(entries: Iterable[Tuple[str, str]]) -> bytes:
    """A .tar.gz of (name in the archive, path on disk) files and folders, the same bytes for the same files:
    sorted, with no times, owners or caches in it."""
    files: List[Tuple[str, str]] = []
    for name, path in entries:
        if os.path.isdir(path):
            for folder, dirs, names in os.walk(path):
                dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not d.startswith("."))
                for file in names:
                    if file.endswith((".pyc", ".pyo")) or file.startswith("."):
                        continue
                    full = os.path.join(folder, file)
                    files.append((os.path.join(name, os.path.relpath(full, path)), full))
        else:
            files.append((name, path))
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0) as zipped:
        with tarfile.open(fileobj=zipped, mode="w", format=tarfile.GNU_FORMAT) as tar:
            for name, full in sorted(files):
                info = tarfile.TarInfo(name)
                with open(full, "rb") as handle:
                    data = handle.read()
                info.size = len(data)
                info.mode = 0o755 if os.access(full, os.X_OK) else 0o644
                tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def package_dir() -> str:
    import tpulaunch

    return os.path.dirname(os.path.abspath(tpulaunch.__file__))


def install_requirements(extra: str, *, strict: bool = False) -> Optional[List[str]]:
    """The requirements of tpulaunch and of its `extra`, as this installation's package metadata lists them
    (None when tpulaunch was not installed by pip: no metadata). `strict` (what a TPU VM installs): refused when the
    metadata does not list the extra at all."""
    from importlib import metadata

    try:
        declared = metadata.requires("tpulaunch") or []
        provided = metadata.metadata("tpulaunch").get_all("Provides-Extra") or []
    except metadata.PackageNotFoundError:
        return None
    if strict and extra and extra not in provided:  # installed before the extra existed: the VM would miss it
        raise TpuLaunchError(f"this installation's tpulaunch metadata has no [{extra}] extra (installed before it "
                             "was added), so the TPU VM cannot be told what to install",
                             hint="reinstall tpulaunch (pip install -e . in a checkout)", exit_code=ExitCode.PROBLEMS)
    wanted = []
    for requirement in declared:
        text, _, marker = requirement.partition(";")
        marker = marker.strip()
        if "extra ==" not in marker:
            wanted.append(requirement)
            continue
        clause = f'extra == "{extra}"'
        if clause not in marker:
            continue
        rest = marker.replace(f" and {clause}", "").replace(f"{clause} and ", "").replace(clause, "").strip()
        wanted.append(text.strip() + (f"; {rest}" if rest else ""))
    return wanted


# ------------------------------------------------------------------------------------------ the job

def _import_modules(data) -> List[str]:
    """The top-level modules of every import path ('pkg.mod:fn') in the job's values."""
    from tpulaunch.job.schema import IMPORT_PATH

    found: List[str] = []

    def walk(value):
        if isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)
        elif isinstance(value, str) and IMPORT_PATH.match(value):
            top = value.split(":")[0].split(".")[0]
            if top not in found:
                found.append(top)

    walk(data)
    return found


def _job_dir_code(job_dir: str, data) -> List[Tuple[str, str]]:
    """The modules the job's import paths name that sit next to the job file (a module or a package)."""
    entries = []
    for top in _import_modules(data):
        for candidate in (top + ".py", top):
            path = os.path.join(job_dir, candidate)
            if os.path.isfile(path) or (os.path.isdir(path) and candidate == top):
                entries.append((candidate, path))
                break
    return entries


def _refuse_environment(loaded, job_file: str) -> None:
    """A `${VAR}` where the controller needs the value here (tpu:, the paths: `secret_manager.controller_side`) is
    resolved here and reaches the VM as a --set; one set in this environment is refused where it is used, since the
    job file the VM reads would still say `${VAR}` (a VAR unset here with a default has the same default there).
    Every other `${VAR}` is read on the VM from Secret Manager (`secret_manager.py`)."""
    from tpulaunch.remote.secret_manager import controller_side

    problems = []
    for path, names in loaded.marks.env_refs.items():
        here = [name for name in names if name in os.environ]
        if here and controller_side(tuple(path)):
            problems.append(loaded.problem(
                path, "remote-env-var",
                f"${{{here[0]}}} is set on this machine, but the TPU VM gets none of this machine's environment: "
                f"the job would read another value there",
                f"write the value into the job, or pass it with --set {'.'.join(map(str, path))}=VALUE (the staged "
                "job keeps it: not for secrets)"))
    if problems:
        raise TpuLaunchError(f"not staging {job_file}: fix the problems above", problems=problems)


def _refuse_secret_sets(loaded, job_file: str) -> None:
    """A secret given with --set (`job/secrets.py`: under a secret-looking key) would be written into the stage in
    clear, as the VM's train reads its --sets from there: refused, with the way that keeps its value out of every
    file (a `${VAR}` in the job file, read on the VM from Secret Manager)."""
    from tpulaunch.job.secrets import env_name, set_secret_fix

    problems = [loaded.problem(
        path, "remote-secret-set",
        "a secret given with --set: the TPU VM's train reads its --sets from the stage under run.model_dir, "
        "which would hold it in clear",
        set_secret_fix(path, f"the VM reads secret {env_name(path)} from Secret Manager into train's environment; "
                             f"in a rehearsal, the file {env_name(path)} in --secrets DIR"))
        for path in sorted(loaded.secrets.from_command_line, key=lambda path: tuple(map(str, path)))]
    if not problems:
        return
    raise TpuLaunchError(f"not staging {job_file}: a secret cannot travel as a --set", problems=problems)


def vm_sets(loaded, overrides: Sequence[str], python_path_dirs: Sequence[str], *, target: str) -> List[str]:
    """The `--set`s the VM's train gets: the given ones, then the job's paths as resolved here (absolute, or
    gs://), then python_path as the staged folders (relative to the VM's job file)."""
    from tpulaunch.job.load import PATH_KEYS

    sets = list(overrides)
    local = []
    for keys in PATH_KEYS:
        value = value_at(loaded.data, keys)
        if value is None:
            continue
        if keys == ("python_path",):
            sets.append(f"python_path={json.dumps(list(python_path_dirs))}")
            continue
        for entry in (value if isinstance(value, list) else [value]):
            if isinstance(entry, str) and "://" not in entry:
                local.append((keys, entry))
        sets.append(f"{'.'.join(keys)}={json.dumps(value)}")
    if target == "tpu" and local:
        problems = [loaded.problem(keys, "remote-local-path",
                                   f"{'.'.join(keys)} is a path on this machine ({entry}): the TPU VM cannot read it",
                                   "put it in Cloud Storage (gs://bucket/...); `tpulaunch rehearse` runs local paths")
                    for keys, entry in local]
        raise TpuLaunchError("not staging the job: the TPU VM reads only gs:// paths", problems=problems)
    return sets


def stage_job(checked, job_file: str, overrides: Sequence[str], *, engine: str, target: str = "tpu",
              secrets: Optional[dict] = None, say=lambda text: None, write: bool = True) -> Stage:
    """Stage the checked job under its run.model_dir; returns the Stage (what was new, what was there).

    `secrets`: which secrets the VM reads into train's environment (`secret_manager.require`), by name only;
    `write`: False to name the stage without writing it (`run --dry-run`)."""
    from tpulaunch import __version__
    from tpulaunch.seam.registry import about

    assert target in TARGETS
    loaded, job = checked.loaded, checked.job
    _refuse_environment(loaded, job_file)
    _refuse_secret_sets(loaded, job_file)
    model_dir = job.run.model_dir
    job_dir = os.path.dirname(os.path.abspath(job_file))
    blobs: List[Tuple[str, bytes]] = []

    def add(data: bytes) -> str:
        digest = digest_of(data)
        blobs.append((digest, data))
        return digest

    with open(job_file, "rb") as handle:
        job_digest = add(handle.read())
    bundles = []
    own = _job_dir_code(job_dir, loaded.data)
    if own:
        bundles.append({"blob": add(tar_gz(own)), "into": "job"})
    python_path = value_at(loaded.data, ("python_path",)) or []
    vm_dirs = []
    for index, folder in enumerate(python_path):
        if not os.path.isdir(folder):
            continue  # validate said so already
        into = f"python_path/{index}"
        bundles.append({"blob": add(tar_gz([("", folder)])), "into": f"job/{into}"})
        vm_dirs.append(into)
    package = add(tar_gz([("tpulaunch", package_dir())]))
    extra = about(engine).on_tpu.extra
    requirements = install_requirements(extra, strict=target == "tpu")  # a rehearsal installs nothing
    if requirements is None and target == "tpu":
        raise TpuLaunchError("tpulaunch's package metadata is missing here, so the TPU VM cannot be told what to "
                             "install", hint="install tpulaunch with pip (pip install -e . in a checkout)",
                             exit_code=ExitCode.PROBLEMS)
    manifest = {
        "format": FORMAT,
        "job": {"name": job.name, "file": os.path.basename(job_file), "blob": job_digest},
        "sets": vm_sets(loaded, overrides, vm_dirs, target=target),
        "target": target,
        "engine": engine,
        "model_dir": model_dir,
        "bundles": bundles,
        "tpulaunch": {"version": __version__, "blob": package, "into": "pkg"},
        "install": {"extra": extra, "requirements": requirements or []},
        "hosts": about(engine).on_tpu.hosts,  # which hosts of a multi-host slice run train (host.py)
    }
    if secrets and secrets.get("names"):
        manifest["secrets"] = secrets  # names and the project: the values stay in Secret Manager
    text = (json.dumps(manifest, sort_keys=True, indent=1) + "\n").encode()
    digest = digest_of(text)
    uploaded = 0
    if not write:
        return Stage(model_dir, digest, manifest, 0, len(dict(blobs)) + 1)
    for blob_digest, data in dict(blobs).items():
        url = layout.blob(model_dir, blob_digest)
        if not store.exists(url):
            store.write(url, data, private=True)
            uploaded += 1
    url = layout.manifest(model_dir, digest)
    if not store.exists(url):
        store.write(url, text, private=True)
        uploaded += 1
    return Stage(model_dir, digest, manifest, uploaded, len(dict(blobs)) + 1)
