"""One store for the files tpulaunch keeps itself (the model_dir lease, the run record, a remote run's stage, logs
and status): local paths and gs:// URLs behind one interface, with one timeout and one retry rule.

- `read(url, start=0)`: the bytes (from `start` on) and the generation they are at, or None when there is none;
- `generation(url)`: the generation now (0: none), one metadata request;
- `write(url, data, if_generation_match=None)`: the whole object at once (a reader sees the old bytes or the new,
  never a part); with `if_generation_match` only if it is still at that generation (0: only if there is none);
  returns the new generation;
- `copy`, `rename` (local: os.replace; gs://: a copy, then a delete of the generation copied), `delete`,
  `exists`, `list_files(pattern)` (a glob, or a folder ending in `/`: everything under it).

A generation is Cloud Storage's generation number on gs://, a digest of the bytes locally (`local.py`).

Every call on gs:// answers within TIMEOUT_S, its retries of transient failures included (`gcs.py`), or raises
`Unreachable`: a caller that must tell an outage from someone else's change (the lease) can, because a change that
lost to another is always `PreconditionFailed`, never an outage. The errors are in `errors.py`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import List, Optional

from tpulaunch.store import gcs, local
from tpulaunch.store.errors import NotFound, PreconditionFailed, Refused, StoreError, Unreachable, reason

__all__ = ["TIMEOUT_S", "Found", "NotFound", "PreconditionFailed", "Refused", "StoreError", "Unreachable", "copy",
           "delete", "exists", "generation", "is_gcs", "list_files", "read", "reason", "rename", "write"]

# One call's time on gs://, its retries included: an unreachable bucket is said within seconds (a renewal of the
# lease, `status`), not after the client's default two minutes of retries. Local calls wait on the disk.
TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Found:
    data: bytes
    generation: int


def is_gcs(url: str) -> bool:
    return url.startswith("gs://")


def _checked(url: str, object_named: bool = True) -> str:
    if not is_gcs(url) and "://" in url:
        raise StoreError(f"{url} is neither a local path nor a gs:// URL: tpulaunch keeps its files in no other "
                         f"store ({url.split('://')[0]}://)", url, hint="use a local path or gs://BUCKET/PATH")
    if is_gcs(url) and (not gcs.split_url(url)[0] or (object_named and not gcs.split_url(url)[1])):
        raise StoreError(f"{url} names no object in a bucket", url, hint="write gs://BUCKET/PATH")
    return url


def read(url: str, start: int = 0) -> Optional[Found]:
    """The bytes from `start` on (b"" when there are none past it) and the object's generation; None when it does
    not exist."""
    if is_gcs(_checked(url)):
        found = gcs.read(url, start, TIMEOUT_S)
        return None if found is None else Found(*found)
    data = local.read(url)
    return None if data is None else Found(data[start:], local.digest(data))


def generation(url: str) -> int:
    """The object's generation now; 0 when it does not exist."""
    return gcs.generation(url, TIMEOUT_S) if is_gcs(_checked(url)) else local.generation(url)


def exists(url: str) -> bool:
    return generation(url) != 0 if is_gcs(_checked(url)) else os.path.exists(url)


def write(url: str, data: bytes, *, if_generation_match: Optional[int] = None, private: bool = False) -> int:
    """Write the whole object; with `if_generation_match`, only if it is at that generation (0: only if it does not
    exist), else `PreconditionFailed`. Returns its new generation. `private`: a local file readable by this user
    alone (on gs://, the bucket's permissions decide)."""
    if is_gcs(_checked(url)):
        return gcs.write(url, data, if_generation_match, TIMEOUT_S)
    return local.write(url, data, if_generation_match, private, TIMEOUT_S)


def copy(source: str, target: str, *, if_generation_match: Optional[int] = None) -> int:
    """Copy `source` over `target` (`if_generation_match`: target's, as `write`); the target's new generation.
    `NotFound` when `source` does not exist."""
    if is_gcs(_checked(source)) and is_gcs(_checked(target)):
        return gcs.copy(source, target, if_generation_match, TIMEOUT_S)[1]
    found = read(source)
    if found is None:
        raise NotFound(source)
    return write(target, found.data, if_generation_match=if_generation_match)


def rename(source: str, target: str, *, if_generation_match: Optional[int] = None) -> None:
    """Move `source` to `target` (`if_generation_match`: target's, as `write`). Locally one os.replace. On gs://
    a copy of the source's generation, then a delete of that generation: a source changed in between is left
    (`PreconditionFailed` naming it) beside the copy of what it was."""
    if not is_gcs(_checked(source)) and not is_gcs(_checked(target)):
        local.rename(source, target, if_generation_match, TIMEOUT_S)
        return
    if is_gcs(source) and is_gcs(target):
        copied, _ = gcs.copy(source, target, if_generation_match, TIMEOUT_S)
    else:
        found = read(source)
        if found is None:
            raise NotFound(source)
        write(target, found.data, if_generation_match=if_generation_match)
        copied = found.generation
    delete(source, if_generation_match=copied)


def delete(url: str, *, if_generation_match: Optional[int] = None, missing_ok: bool = False) -> None:
    """Remove the object (`if_generation_match`: only at that generation). `NotFound` when it does not exist,
    unless `missing_ok`."""
    try:
        if is_gcs(_checked(url)):
            gcs.delete(url, if_generation_match, TIMEOUT_S)
        else:
            local.delete(url, if_generation_match, TIMEOUT_S)
    except NotFound:
        if not missing_ok:
            raise


def list_files(pattern: str) -> List[str]:
    """The files a glob matches (`*`, `?` and `[...]` within one folder), or, for a folder ending in `/`, every file
    under it; sorted."""
    return gcs.list_files(pattern, TIMEOUT_S) if is_gcs(_checked(pattern, object_named=False)) else local.list_files(pattern)
