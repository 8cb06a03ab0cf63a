"""The resolved job as plain data: what model_dir's job copy holds and the run record's job hash is taken of."""

from __future__ import annotations

from typing import Any

from tpulaunch.job.schema import Job

# Where a job holds mappings of the user's own keys: the only places a secret-looking name can be
# (everywhere else the schema fixes the key names, and `key` there is a TFRecord feature key).
_FREE_FORM = (("model", "params"), ("model", "optimizer", "args"), ("flags",))


def job_document(job: Job) -> dict:
    """The resolved job as plain data, with values under secret-looking keys in free-form mappings masked."""
    from tpulaunch.job.yamlfile import mask_secrets

    document = job.model_dump(mode="json", exclude_none=True)
    for keys in _FREE_FORM:
        parent = value_at(document, keys[:-1])
        if isinstance(parent, dict) and keys[-1] in parent:
            parent[keys[-1]] = mask_secrets(parent[keys[-1]])
    return document


def value_at(document: Any, keys: tuple):
    """The value under `keys` in a job document (None where a key is missing)."""
    for key in keys:
        if not isinstance(document, dict):
            return None
        document = document.get(key)
    return document
