"""Read and write the files of a remote run under run.model_dir: a local folder (a rehearsal's stand-in for
the bucket, or a mounted one) or gs:// through google-cloud-storage (what the model_dir lease uses: no
TensorFlow in the controller). Local writes are atomic (a temporary file renamed), as Cloud Storage's are.
"""

from __future__ import annotations

import os
import secrets
from typing import Optional

from tpulaunch.errors import ExitCode, TpuLaunchError


def is_gcs(url: str) -> bool:
    return url.startswith("gs://")


_clients: dict = {}


def _bucket_and_name(url: str):
    from google.cloud import storage  # only for gs://

    bucket, _, name = url[len("gs://"):].partition("/")
    if "client" not in _clients:
        from google.auth.exceptions import DefaultCredentialsError

        try:
            _clients["client"] = storage.Client()
        except DefaultCredentialsError:
            raise TpuLaunchError(f"no Google Cloud credentials to write {url}",
                                 hint="gcloud auth application-default login (or set GOOGLE_APPLICATION_CREDENTIALS)",
                                 exit_code=ExitCode.CLUSTER) from None
    return _clients["client"].bucket(bucket), name


def _refused(url: str, doing: str, exc: BaseException) -> TpuLaunchError:
    """A bucket this machine's account may not read or write, located at the file, with the fix."""
    bucket = url[len("gs://"):].partition("/")[0]
    said = getattr(exc, "message", None) or str(exc)
    return TpuLaunchError(f"permission denied {doing} {url}: {said}",
                          hint=f"the account in use needs roles/storage.objectAdmin on gs://{bucket} (`gcloud storage "
                               f"buckets add-iam-policy-binding gs://{bucket} --member=... "
                               "--role=roles/storage.objectAdmin`); on a TPU VM, its service account does",
                          exit_code=ExitCode.CLUSTER)


def _gcs(url: str, doing: str, fn):
    from google.api_core import exceptions

    try:
        return fn()
    except (exceptions.Forbidden, exceptions.Unauthorized) as exc:
        raise _refused(url, doing, exc) from None


def read(url: str, start: int = 0) -> Optional[bytes]:
    """The file's bytes from `start` on, or None when it does not exist."""
    if is_gcs(url):
        from google.api_core import exceptions

        bucket, name = _bucket_and_name(url)
        try:
            return _gcs(url, "reading", lambda: bucket.blob(name).download_as_bytes(start=start or None))
        except exceptions.NotFound:
            return None
        except exceptions.RequestRangeNotSatisfiable:
            return b""  # nothing past `start` yet
    try:
        with open(url, "rb") as handle:
            handle.seek(start)
            return handle.read()
    except FileNotFoundError:
        return None


def exists(url: str) -> bool:
    if is_gcs(url):
        bucket, name = _bucket_and_name(url)
        return _gcs(url, "reading", lambda: bucket.blob(name).exists())
    return os.path.exists(url)


def write(url: str, data: bytes) -> None:
    """Write the whole file at once (readers see the old content or the new, never a part)."""
    if is_gcs(url):
        bucket, name = _bucket_and_name(url)
        _gcs(url, "writing", lambda: bucket.blob(name).upload_from_string(data))
        return
    os.makedirs(os.path.dirname(url) or ".", exist_ok=True)
    temporary = f"{url}.{os.getpid()}.{secrets.token_hex(3)}.tmp"
    # Readable by this user alone: a run's files (its stage, logs, record) hold what the job holds.
    with os.fdopen(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as handle:
        handle.write(data)
    os.replace(temporary, url)
