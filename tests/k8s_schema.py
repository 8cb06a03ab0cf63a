"""A manifest checked as a Kubernetes API server checks a custom resource against its CRD's `openAPIV3Schema`, with
`kubectl apply`'s strict field validation: an unknown field anywhere is an error.

The CRD's schema is a structural OpenAPI v3 schema; jsonschema validates it once three of its Kubernetes
extensions are spelled out: `x-kubernetes-int-or-string` (an integer or a string), `nullable`, and the pruning of
unknown fields, which strict validation turns into refusal (`additionalProperties: false` on every object that lists
its properties, unless it says `x-kubernetes-preserve-unknown-fields`). Not checked: the CEL rules
(`x-kubernetes-validations`) and what JobSet's webhook adds; the embedded Job and Pod templates are in the CRD's
schema in full, so their fields are checked as the API server checks them.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import List

import yaml

JOBSET_CRD = Path(__file__).resolve().parent / "k8s" / "jobset.x-k8s.io_jobsets.yaml"  # tests/k8s/README.md
XPK_JOBSET = JOBSET_CRD.parent / "xpk-1.16.0-v6e-16x2.jobset.yaml"


def _strict(schema):
    if isinstance(schema, list):
        return [_strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    schema = {key: _strict(value) if key not in ("enum", "required", "default", "example") else value
              for key, value in schema.items()}
    if schema.pop("x-kubernetes-int-or-string", False):
        schema.pop("type", None)
        schema["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if schema.pop("nullable", False) and "type" in schema:
        schema["type"] = [schema["type"], "null"]
    preserve = schema.pop("x-kubernetes-preserve-unknown-fields", False)
    if schema.get("type") == "object" and "properties" in schema and not preserve:
        schema.setdefault("additionalProperties", False)
    return schema


@functools.lru_cache(maxsize=None)
def _validator():
    import jsonschema

    crd = yaml.safe_load(JOBSET_CRD.read_text())
    version = crd["spec"]["versions"][0]
    assert version["name"] == "v1alpha2"
    return jsonschema.Draft7Validator(_strict(copy.deepcopy(version["schema"]["openAPIV3Schema"])))


def jobset_errors(manifest: dict) -> List[str]:
    """What the API server would refuse in `manifest` (a JobSet), each with where it is; [] when it takes it."""
    return [f"{'.'.join(str(p) for p in error.absolute_path) or '(top)'}: {error.message}"
            for error in _validator().iter_errors(manifest)]
