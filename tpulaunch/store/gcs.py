"""The store on Cloud Storage, through google-cloud-storage: the only module of tpulaunch that imports it (imported
inside the functions, so a process that touches no gs:// URL never loads it).

Every request answers within the call's timeout or is given up: each try waits at most half of it for an answer,
and the client's retries of transient failures (a connection refused or reset, 408, 429, 5xx) stop once half of it
has passed, so a call that gets no answer raises `Unreachable` within the timeout. Writes are retried too: a whole
object written again is the same object, and a conditional write whose first try landed (its reply lost) fails its
precondition on the retry, which the caller resolves by reading the object back.
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
import time
from typing import Iterator, List, Optional, Tuple

from tpulaunch.store.errors import NotFound, PreconditionFailed, Refused, StoreError, Unreachable, reason

_clients: dict = {}


def split_url(url: str) -> Tuple[str, str]:
    """('bucket', 'object/name') of gs://bucket/object/name."""
    bucket, _, name = url[len("gs://"):].partition("/")
    return bucket, name


def _bucket(url: str):
    from google.cloud import storage

    # One client a process and endpoint ($STORAGE_EMULATOR_HOST redirects Cloud Storage; a forked child makes its own).
    key = (os.getpid(), os.environ.get("STORAGE_EMULATOR_HOST"))
    if key not in _clients:
        _clients[key] = storage.Client()  # no credentials: `_calling` says so
    return _clients[key].bucket(split_url(url)[0])


def _within(timeout_s: float) -> dict:
    """The timeout and retry arguments of one request of a call that must end within `timeout_s`."""
    from google.cloud.storage.retry import DEFAULT_RETRY

    return {"timeout": timeout_s / 2, "retry": DEFAULT_RETRY.with_timeout(timeout_s / 2)}


@contextlib.contextmanager
def _calling(url: str, doing: str, timeout_s: float, expected: Optional[int] = None) -> Iterator[None]:
    """The client's errors as the store's: `doing` ("read", "write", ...) says what the call was for."""
    from google.api_core import exceptions
    from google.auth.exceptions import DefaultCredentialsError, TransportError

    began = time.monotonic()
    try:
        yield
    except DefaultCredentialsError:
        raise Refused(f"no Google Cloud credentials to {doing} {url}", url,
                      hint="gcloud auth application-default login (or set GOOGLE_APPLICATION_CREDENTIALS); on a "
                           "Cloud TPU VM the VM's service account is used") from None
    except exceptions.PreconditionFailed:
        raise PreconditionFailed(url, expected or 0) from None
    except exceptions.NotFound:
        raise NotFound(url) from None
    except (exceptions.Forbidden, exceptions.Unauthorized) as exc:
        bucket = split_url(url)[0]
        raise Refused(f"permission denied to {doing} {url}: {getattr(exc, 'message', None) or exc}", url,
                      hint=f"the account in use needs roles/storage.objectAdmin on gs://{bucket} (`gcloud storage "
                           f"buckets add-iam-policy-binding gs://{bucket} --member=... "
                           "--role=roles/storage.objectAdmin`); on a TPU VM, its service account does") from None
    except (exceptions.RetryError, exceptions.ServerError, exceptions.TooManyRequests, TransportError,
            ConnectionError, OSError) as exc:
        cause = exc.cause if isinstance(exc, exceptions.RetryError) and exc.cause is not None else exc
        said = reason(cause)
        raise Unreachable(f"could not reach Cloud Storage bucket gs://{split_url(url)[0]} to {doing} {url} within "
                          f"{timeout_s:g} s ({time.monotonic() - began:.1f} s tried): {said}", url, said,
                          hint="check this machine's network and the bucket's name; $STORAGE_EMULATOR_HOST, when "
                               "set, redirects Cloud Storage") from None
    except exceptions.GoogleAPICallError as exc:  # a bad request: a bucket name Cloud Storage refuses, say
        raise StoreError(f"Cloud Storage refused to {doing} {url}: {getattr(exc, 'message', None) or exc}",
                         url) from None


def read(url: str, start: int, timeout_s: float) -> Optional[Tuple[bytes, int]]:
    from google.api_core import exceptions

    while True:
        with _calling(url, "read", timeout_s):
            blob = _bucket(url).get_blob(split_url(url)[1], **_within(timeout_s))
            if blob is None:
                return None
            try:
                # The bytes of the generation just read: a change in between is read again, whole.
                return (blob.download_as_bytes(start=start or None, if_generation_match=blob.generation,
                                               **_within(timeout_s)), blob.generation)
            except exceptions.RequestRangeNotSatisfiable:
                return b"", blob.generation  # nothing past `start` yet
            except (exceptions.PreconditionFailed, exceptions.NotFound):
                continue


def generation(url: str, timeout_s: float) -> int:
    with _calling(url, "read", timeout_s):
        blob = _bucket(url).get_blob(split_url(url)[1], **_within(timeout_s))
    return 0 if blob is None else blob.generation


def write(url: str, data: bytes, if_generation_match: Optional[int], timeout_s: float) -> int:
    with _calling(url, "write", timeout_s, if_generation_match):
        blob = _bucket(url).blob(split_url(url)[1])
        blob.upload_from_string(data, if_generation_match=if_generation_match, **_within(timeout_s))
    return blob.generation


def copy(source: str, target: str, if_generation_match: Optional[int], timeout_s: float) -> Tuple[int, int]:
    """Copy `source` to `target`; (the source's generation copied, the target's new generation)."""
    with _calling(source, "read", timeout_s):
        blob = _bucket(source).get_blob(split_url(source)[1], **_within(timeout_s))
    if blob is None:
        raise NotFound(source)
    with _calling(target, "write", timeout_s, if_generation_match):
        copied = _bucket(source).copy_blob(blob, _bucket(target), split_url(target)[1],
                                           if_generation_match=if_generation_match,
                                           if_source_generation_match=blob.generation, **_within(timeout_s))
    return blob.generation, copied.generation


def delete(url: str, if_generation_match: Optional[int], timeout_s: float) -> None:
    with _calling(url, "delete", timeout_s, if_generation_match):
        _bucket(url).blob(split_url(url)[1]).delete(if_generation_match=if_generation_match, **_within(timeout_s))


def list_files(pattern: str, timeout_s: float) -> List[str]:
    bucket, name = split_url(pattern)
    wild = next((i for i, char in enumerate(name) if char in "*?["), None)
    prefix = name if wild is None else name[:wild]
    with _calling(pattern, "list", timeout_s):
        names = [blob.name for blob in _bucket(pattern).client.list_blobs(bucket, prefix=prefix, **_within(timeout_s))]
    if wild is None:  # a folder: everything under it; else the one object
        return sorted(f"gs://{bucket}/{found}" for found in names if name.endswith("/") or found == name)
    # As a local glob: `*` and `?` stay inside one folder.
    depth = name.count("/")
    return sorted(f"gs://{bucket}/{found}" for found in names
                  if found.count("/") == depth and fnmatch.fnmatchcase(found, name))
