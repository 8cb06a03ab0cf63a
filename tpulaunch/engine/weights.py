"""A builder's weights: what `train` and `validate` say when the builder cannot download them.

What a fresh run starts from (the builder's own values, weights it loaded included, or another run's
checkpoint under `run.warm_start`) is standalone.py's `builder_weights_scaffold_fn`, which
`tpulaunch explain` prints with the rest of the model_fn. Here: a builder that fetches its weights
the way Keras does (`keras.utils.get_file`, Keras Applications' `weights='imagenet'`) and cannot
(no network) is told so, naming the URL, instead of an unexpected exception.
"""

from __future__ import annotations

import urllib.error
from typing import Optional, Tuple


_FETCH_FAILURE = "URL fetch failure on "  # keras.utils.get_file's message (data_utils.py)


def download_failure(exc: BaseException) -> Optional[Tuple[str, str]]:
    """(URL, reason) when `exc` (or what caused it) is a failed download, else None."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        text = str(exc)
        if text.startswith(_FETCH_FAILURE):  # "URL fetch failure on URL: errno -- reason"
            url, _, reason = text[len(_FETCH_FAILURE):].partition(": ")
            return url, reason.split(" -- ", 1)[-1]
        if isinstance(exc, urllib.error.URLError):
            return str(getattr(exc, "url", None) or getattr(exc, "filename", None) or "a URL"), str(exc.reason)
        exc = exc.__cause__ or exc.__context__
    return None


def download_error(builder: str, failure: Tuple[str, str]) -> Tuple[str, str]:
    """(message, hint) for a builder whose download failed."""
    url, reason = failure
    return (f"{builder} downloads {url} and the download failed ({reason})",
            "this machine cannot fetch it (no network?): download the file where you can and load it from a local "
            "path (e.g. weights='/path/to/weights.h5'), or copy it into ~/.keras/models/, where Keras looks first")
