"""What a store call raises: the project's own errors, one kind per thing a caller decides on.

- `PreconditionFailed`: the object is not at the generation the call required (someone else's change won, or this
  caller's own retried write landed the first time): the caller reads it back and decides.
- `NotFound`: the object a rename, copy or delete names does not exist.
- `Unreachable`: no answer within the call's timeout (a network or server outage): nothing is known of the object;
  the call may be tried again.
- `Refused`: the store answered no (no credentials, no permission): trying again will not help.
"""

from __future__ import annotations

import re

from tpulaunch.errors import ExitCode, TpuLaunchError, first_line


class StoreError(TpuLaunchError):
    """A store call that failed; `url` is the object it was about."""

    def __init__(self, message: str, url: str, **kwargs):
        super().__init__(message, **kwargs)
        self.url = url


class PreconditionFailed(StoreError):
    """The object's generation was not the one the call required (0: it had to not exist)."""

    def __init__(self, url: str, expected: int):
        super().__init__(f"{url} changed: it is not at generation {expected}" if expected else
                         f"{url} exists already", url)
        self.expected = expected


class NotFound(StoreError):
    def __init__(self, url: str):
        super().__init__(f"{url} does not exist", url)


class Unreachable(StoreError):
    """`reason`: why, in a few words ("ConnectionError: [Errno 111] Connection refused")."""

    def __init__(self, message: str, url: str, reason: str, **kwargs):
        super().__init__(message, url, **kwargs)
        self.reason = reason


class Refused(StoreError):
    exit_code = ExitCode.CLUSTER


def reason(exc: BaseException) -> str:
    """An unreachable endpoint's reason in a few words ("ConnectionError: [Errno 111] Connection refused"), not the
    HTTP library's nested retelling of the request."""
    if isinstance(exc, Unreachable):
        return exc.reason
    text = first_line(exc)
    errno_said = re.findall(r"\[Errno -?\d+\] [^\"')\]]+", text)
    return f"{type(exc).__name__}: {errno_said[-1] if errno_said else text[:200]}"
