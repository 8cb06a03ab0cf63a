"""The Cloud TPU API v2 through google-cloud-tpu (`google.cloud.tpu_v2`): one client, one error mapping.

Everything tpulaunch asks of the TPU API (status, the watchdog, `up`, `down`, recovery) goes through
`call`, which turns the library's exceptions into the few outcomes a command can act on:

  _Transient        5xx, timeouts, refused connections, malformed replies: worth retrying
  NodeNotFound      the node (or the queued resource) does not exist: a state, not a failure
  NoCapacity        RESOURCE_EXHAUSTED: quota or a stockout in the zone (exit code 4: retry later)
  TpuLaunchError    permission denied, an unknown zone or type, anything else the API refused

Which endpoint: $TPULAUNCH_TPU_API_ENDPOINT (e.g. `http://127.0.0.1:8080`, an emulator or the test
suite's server; http:// and https:// both work over the REST transport), else Google's. As with the
v1 path, Google credentials go only to a `googleapis.com` endpoint; any other is asked anonymously.

google-cloud-tpu is imported only here, inside functions (the CLI's fast path never loads it).
"""

from __future__ import annotations

import json
import os
import re
import socket
import urllib.parse
from typing import Callable, Mapping, Optional, TypeVar

from tpulaunch.errors import ExitCode, TpuLaunchError

ENDPOINT_ENV = "TPULAUNCH_TPU_API_ENDPOINT"
GOOGLE_ENDPOINT = "tpu.googleapis.com"

T = TypeVar("T")


class _Transient(Exception):
    """An API failure worth retrying (5xx, 429 without RESOURCE_EXHAUSTED, timeout, refused connection)."""


class NodeNotFound(TpuLaunchError):
    """The node is not there (never created, deleted, or its name/zone/project is wrong)."""

    def __init__(self, message: str, *, hint: Optional[str] = None):
        super().__init__(message, hint=hint, exit_code=ExitCode.CLUSTER)


class NoCapacity(TpuLaunchError):
    """RESOURCE_EXHAUSTED: no quota left, or the zone has no free TPUs of that type (a stockout)."""

    def __init__(self, message: str, *, hint: Optional[str] = None):
        super().__init__(message, hint=hint, exit_code=ExitCode.NO_CAPACITY)


def endpoint(env: Mapping[str, str] = os.environ) -> Optional[str]:
    """The API endpoint asked ($TPULAUNCH_TPU_API_ENDPOINT), None for Google's."""
    return env.get(ENDPOINT_ENV) or None


def is_google_host(url: str) -> bool:
    host = urllib.parse.urlsplit(url if "//" in url else "//" + url).hostname or ""
    return host == "googleapis.com" or host.endswith(".googleapis.com")


# The Cloud TPU client alone, without a TensorFlow beside the installed one ([tpu] brings `tensorflow`, which would
# land beside [cpu]'s tensorflow-cpu): what `status`, `up`, `run` and `rehearse` need on this machine.
CLIENT_INSTALL = "pip install 'google-cloud-tpu>=1.10,<1.28' (the Cloud TPU client; it installs no TensorFlow)"


def require_client() -> None:
    """Refuse, before anything is staged or created, when google-cloud-tpu is not installed."""
    try:
        from google.cloud import tpu_v2  # noqa: F401
    except ImportError as exc:
        raise TpuLaunchError(f"asking the Cloud TPU API needs google-cloud-tpu, which is not installed "
                             f"(no module named '{exc.name}')", hint=CLIENT_INSTALL) from None


def client(api_endpoint: Optional[str] = None):
    """A `tpu_v2.TpuClient` over REST for `api_endpoint` (default: `endpoint()`, else Google's)."""
    require_client()
    from google.cloud import tpu_v2
    url = api_endpoint or endpoint()
    kwargs = {}
    if url and not is_google_host(url):
        from google.auth.credentials import AnonymousCredentials

        kwargs["credentials"] = AnonymousCredentials()  # a token never leaves for a host the user did not mean
    try:
        return tpu_v2.TpuClient(transport="rest", client_options={"api_endpoint": url or GOOGLE_ENDPOINT}, **kwargs)
    except Exception as exc:  # google.auth's DefaultCredentialsError, and friends
        if type(exc).__name__ == "DefaultCredentialsError":
            raise no_credentials(exc) from None
        raise


def no_credentials(exc: BaseException) -> TpuLaunchError:
    """What this machine lacks to ask the TPU API (v2 here, v1 for TensorFlow's resolver), and how to get it."""
    return TpuLaunchError(f"no Google credentials to ask the TPU API: {exc}",
                          hint="run `gcloud auth application-default login`, or set $GOOGLE_APPLICATION_CREDENTIALS",
                          exit_code=ExitCode.CLUSTER)


def call(fn: Callable[[], T], *, what: str, subject: str, where: str, tried: str = "") -> T:
    """Run one API request; map its failure (see the module docstring).

    Args:
        what: the request in words, for messages ("reading", "creating", "deleting").
        subject: what it is about ("TPU node 'my-tpu'").
        where: "project 'p', zone 'z'".
        tried: where the name/zone/project came from ("name from tpu.name, ..."), for not-found messages.
    """
    try:
        return fn()
    except TpuLaunchError:
        raise
    except Exception as exc:  # the library raises many types; classified below
        raise classify(exc, what=what, subject=subject, where=where, tried=tried) from None


def classify(exc: BaseException, *, what: str, subject: str, where: str, tried: str = "") -> Exception:
    """A _Transient to retry, or a TpuLaunchError (NodeNotFound, NoCapacity) no retry will fix."""
    from google.api_core import exceptions as core

    if isinstance(exc, core.NotFound):
        return NodeNotFound(f"{subject} not found in {where}" + (f" ({tried})" if tried else ""),
                            hint="check the name, zone and project")
    if isinstance(exc, (core.PermissionDenied, core.Unauthenticated, core.Unauthorized, core.Forbidden)):
        return TpuLaunchError(f"permission denied {what} {subject} in {where}: {_said(exc)}",
                              hint="the account needs roles/tpu.admin on the project to create and delete TPUs "
                                   "(roles/tpu.viewer to read them); check `gcloud auth list` and the project id",
                              exit_code=ExitCode.CLUSTER)
    if isinstance(exc, core.ResourceExhausted) or _status_of(exc) == "RESOURCE_EXHAUSTED":
        return NoCapacity(f"no capacity {what} {subject} in {where}: {_said(exc)}",
                          hint="a stockout or no quota left: retry later, try another zone, use a reservation "
                               "(tpu.reserved) or ask for quota (IAM & Admin > Quotas, 'TPU')")
    if isinstance(exc, (core.ServerError, core.TooManyRequests, core.DeadlineExceeded, core.RetryError)):
        code = getattr(exc, "code", None)
        return _Transient(f"HTTP {int(code)} from the TPU API" if isinstance(code, int) else
                          f"{type(exc).__name__} from the TPU API: {_said(exc)}")
    if isinstance(exc, (core.InvalidArgument, core.BadRequest, core.FailedPrecondition)):
        return TpuLaunchError(f"the TPU API refused {what} {subject} in {where}: {_said(exc)}",
                              hint="check tpu.zone, tpu.type and tpu.runtime_version: "
                                   "`gcloud compute tpus accelerator-types list --zone ZONE` lists the types a zone has",
                              exit_code=ExitCode.PROBLEMS)
    if isinstance(exc, core.GoogleAPICallError):
        return TpuLaunchError(f"the TPU API refused {what} {subject} in {where}: {_said(exc)}",
                              exit_code=ExitCode.CLUSTER)
    if isinstance(exc, (socket.timeout, TimeoutError)) or "Timeout" in type(exc).__name__:
        return _Transient("the TPU API did not answer in time")
    if isinstance(exc, (ConnectionError, OSError)) or "ConnectionError" in type(exc).__name__:
        return _Transient(f"cannot connect to the TPU API ({_said(exc)})")
    if isinstance(exc, json.JSONDecodeError) or type(exc).__name__ == "ParseError":
        return _Transient("the TPU API answered with malformed JSON")
    if isinstance(exc, ValueError):
        return _Transient(f"the TPU API's reply could not be read ({_said(exc)})")
    return exc if isinstance(exc, Exception) else RuntimeError(str(exc))


def _status_of(exc: BaseException) -> Optional[str]:
    """The google.rpc status name an operation's error or a REST error carries, when it has one."""
    status = getattr(exc, "grpc_status_code", None)
    return getattr(status, "name", None)


def _said(exc: BaseException, limit: int = 200) -> str:
    text = getattr(exc, "message", None) or str(exc)
    text = re.sub(r"^(GET|POST|DELETE|PATCH|PUT) \S+: ", "", " ".join(str(text).split()))  # the REST call's own prefix
    return text if len(text) <= limit else text[:limit] + "..."


def to_dict(message) -> dict:
    """A tpu_v2 message as the API's JSON names it (camelCase, enums by name)."""
    return type(message).to_dict(message, preserving_proto_field_name=False, use_integers_for_enums=False)
