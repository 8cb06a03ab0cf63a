"""A remote run's `${VAR}`s: resolved on the TPU VM from Secret Manager, never written anywhere.

The job is staged as its author wrote it, its `${VAR}`s references. Each VAR the job uses (outside the keys the
controller itself needs here: `tpu:` and the paths, see `controller_side`) is the secret of that name in the TPU's
project: the host runner on the VM reads `projects/P/secrets/VAR/versions/latest` with the VM's service account
(a token from the metadata server, then Secret Manager's REST API) and puts the value into its `tpulaunch train`'s
environment only, so no value reaches a staged file, a log, the node's metadata or a record. A VAR with a default
(`${VAR:-x}`) whose secret does not exist gets its default there, as it would here.

Before anything is staged or created, `tpulaunch run` checks that each VAR has a secret (or a default, when it is
not set on this machine either), reading only the secrets' names (`secretmanager.secrets.get`), never their values.

$TPULAUNCH_SECRET_MANAGER_URL points both sides at another Secret Manager (a rehearsal's: the local Cloud TPU API
server serves one from a folder, `tpu/local_api.py`).
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence

from tpulaunch.errors import ExitCode, TpuLaunchError

GOOGLE_URL = "https://secretmanager.googleapis.com/v1/"
URL_ENV = "TPULAUNCH_SECRET_MANAGER_URL"
METADATA_URL = "http://metadata.google.internal/computeMetadata/v1/"
METADATA_URL_ENV = "TPULAUNCH_METADATA_URL"  # the same variable the startup script reads (tpu/local_vm.py sets it)
TOKEN_PATH = "instance/service-accounts/default/token"
PLACEHOLDER = "secret-from-secret-manager"  # what validate sees here for a VAR the VM reads from Secret Manager
TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Reference:
    name: str
    path: tuple  # where the job uses it
    default: Optional[str]  # `${VAR:-x}`'s x


def references(loaded) -> List[Reference]:
    """Every `${VAR}` of the job file, where it is used, with its default."""
    from tpulaunch.job.yamlfile import env_parts

    found = []
    for path, names in loaded.marks.env_refs.items():
        parts = [part for part in env_parts(loaded.marks.env_texts.get(path, "")) if isinstance(part, tuple)]
        defaults = {name: default for name, default in parts}
        for name in dict.fromkeys(names):
            found.append(Reference(name, tuple(path), defaults.get(name)))
    return found


def controller_side(path: tuple) -> bool:
    """A value the controller needs on this machine (where the TPU is, where the run is staged, the data): it is
    resolved here and reaches the VM as a `--set` (stage.vm_sets), never from Secret Manager."""
    from tpulaunch.job.secrets import place

    return place(path)


def vm_references(refs: Sequence[Reference]) -> List[Reference]:
    return [ref for ref in refs if not controller_side(ref.path)]


def validation_env(refs: Sequence[Reference], environ: Mapping[str, str] = os.environ) -> Dict[str, str]:
    """The environment the job is checked with here: this machine's, except for the VARs the VM reads from
    Secret Manager, which stand as a placeholder (their defaults where they have one)."""
    env = {key: value for key, value in environ.items() if key not in {ref.name for ref in refs}}
    for ref in refs:
        if ref.default is None:
            env[ref.name] = PLACEHOLDER
    return env


def base_url(environ: Mapping[str, str] = os.environ) -> str:
    return (environ.get(URL_ENV) or GOOGLE_URL).rstrip("/") + "/"


def secret_name(project: str, name: str) -> str:
    return f"projects/{project}/secrets/{name}"


def create_command(project: str, name: str) -> str:
    return f"printf %s \"$VALUE\" | gcloud secrets create {name} --project {project} --data-file=-"


# ------------------------------------------------------------------------------ the controller's check

def _session(url: str):
    """A requests session for `url`: Google's credentials for googleapis.com, none for any other host."""
    import requests

    host = urllib.parse.urlsplit(url).hostname or ""
    if host == "googleapis.com" or host.endswith(".googleapis.com"):
        import google.auth
        from google.auth.transport.requests import AuthorizedSession

        try:
            credentials, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"])
        except Exception as exc:  # DefaultCredentialsError
            raise TpuLaunchError(f"no Google credentials to ask Secret Manager: {exc}",
                                 hint="run `gcloud auth application-default login`, or set "
                                      "$GOOGLE_APPLICATION_CREDENTIALS", exit_code=ExitCode.CLUSTER) from None
        return AuthorizedSession(credentials)
    return requests.Session()


def existing(project: str, names: Sequence[str], url: Optional[str] = None) -> Dict[str, bool]:
    """Whether each secret exists in `project` (its name only is read, never a value)."""
    import requests

    url = url or base_url()
    session = _session(url)
    found = {}
    for name in dict.fromkeys(names):
        try:
            answer = session.get(url + secret_name(project, name), timeout=TIMEOUT_S)
        except requests.RequestException as exc:
            raise TpuLaunchError(f"cannot reach Secret Manager at {url}: {exc}",
                                 hint="check the network, or $" + URL_ENV, exit_code=ExitCode.CLUSTER) from None
        if answer.status_code == 403:
            raise TpuLaunchError(f"permission denied reading secret {name} of project '{project}' in Secret Manager",
                                 hint="grant this account roles/secretmanager.viewer on the project (the VM's "
                                      "service account needs roles/secretmanager.secretAccessor)",
                                 exit_code=ExitCode.CLUSTER)
        if answer.status_code not in (200, 404):
            raise TpuLaunchError(f"Secret Manager answered {answer.status_code} reading secret {name} of project "
                                 f"'{project}': {answer.text[:200]}", exit_code=ExitCode.CLUSTER)
        found[name] = answer.status_code == 200
    return found


def require(loaded, job, refs: Sequence[Reference], project: str, *, job_file: str, url: Optional[str] = None,
            rehearsal: bool = False, environ: Mapping[str, str] = os.environ) -> List[dict]:
    """The secrets the VM reads ([{"name", "optional"}], for the stage's manifest), after checking that each VAR
    the VM resolves has one; the missing ones are refused at each place the job uses them. (The VM's `train` masks
    every `${VAR}`'s value wherever it writes the job: `job/secrets.py`.)"""
    if not refs:
        return []
    found = existing(project, [ref.name for ref in refs], url)
    problems = []
    where = ("in the rehearsal's Secret Manager (`rehearse --secrets DIR`: a file DIR/NAME holds a secret's value)"
             if rehearsal else f"in Secret Manager (project '{project}')")
    for ref in refs:
        if found[ref.name]:
            continue
        fix = (f"add the file {ref.name} to --secrets DIR" if rehearsal
               else f"create it: {create_command(project, ref.name)}")
        if ref.default is None:
            problems.append(loaded.problem(
                ref.path, "remote-secret-missing",
                f"${{{ref.name}}} is read on the TPU VM from secret {ref.name}, which does not exist {where}",
                f"{fix}; or give a default: ${{{ref.name}:-value}}"))
        elif ref.name in environ:
            problems.append(loaded.problem(
                ref.path, "remote-env-var",
                f"${{{ref.name}}} is set on this machine, but the TPU VM reads it from secret {ref.name}, which does "
                f"not exist {where}: the VM would use its default",
                f"{fix}; or unset it here to use the default"))
    if problems:
        raise TpuLaunchError(f"not staging {job_file}: fix the ${{VAR}}s the TPU VM reads from Secret Manager",
                             problems=problems)
    return [{"name": name, "optional": all(ref.default is not None for ref in refs if ref.name == name)}
            for name in sorted({ref.name for ref in refs})]


# ------------------------------------------------------------------------------ on the VM

class SecretUnreadable(Exception):
    """A secret the VM could not read, in words (never with a value)."""


def _get(url: str, headers: Mapping[str, str]) -> bytes:
    request = urllib.request.Request(url, headers=dict(headers))
    with urllib.request.urlopen(request, timeout=TIMEOUT_S) as answer:
        return answer.read()


def read_on_vm(wanted: Optional[dict], environ: Mapping[str, str] = os.environ) -> Dict[str, str]:
    """The values of the stage's secrets (`{"project", "names": [{"name", "optional"}]}`), read with the VM's
    service account: {VAR: value} for `tpulaunch train`'s environment. An optional one that does not exist is left
    out (the job's default applies)."""
    import base64

    if not wanted or not wanted.get("names"):
        return {}
    metadata = environ.get(METADATA_URL_ENV) or METADATA_URL
    try:
        token = json.loads(_get(metadata + TOKEN_PATH, {"Metadata-Flavor": "Google"}))["access_token"]
    except (OSError, ValueError, KeyError) as exc:
        raise SecretUnreadable(f"no token for the VM's service account from the metadata server: {exc}") from None
    url = base_url(environ)
    values = {}
    for item in wanted["names"]:
        name = item["name"]
        try:
            data = json.loads(_get(url + secret_name(wanted["project"], name) + "/versions/latest:access",
                                   {"Authorization": f"Bearer {token}"}))
        except urllib.error.HTTPError as exc:
            if exc.code == 404 and item.get("optional"):
                continue
            why = {403: "permission denied: grant the VM's service account roles/secretmanager.secretAccessor",
                   404: "it has no enabled version"}.get(exc.code, f"HTTP {exc.code}")
            raise SecretUnreadable(f"cannot read secret {name} of project '{wanted['project']}': {why}") from None
        except (OSError, ValueError) as exc:
            raise SecretUnreadable(f"cannot read secret {name} of project '{wanted['project']}': {exc}") from None
        values[name] = base64.b64decode(data["payload"]["data"]).decode("utf-8")
    return values
