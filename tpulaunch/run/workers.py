"""Which process of a multi-worker run this is, from TensorFlow's $TF_CONFIG (the cluster convention
MultiWorkerMirroredStrategy reads): the chief alone writes what is shared in model_dir."""

from __future__ import annotations

import json
import os
from typing import Optional, Tuple


def worker_task() -> Optional[Tuple[str, int]]:
    """This process's (task type, index) in $TF_CONFIG's cluster, or None when it names no task."""
    try:
        task = json.loads(os.environ.get("TF_CONFIG") or "{}").get("task") or {}
    except ValueError:
        return None
    return (str(task["type"]), int(task.get("index", 0))) if "type" in task else None


def is_chief_worker() -> bool:
    """Whether this process writes model_dir's shared files (job copy, run record, lease): the chief, or worker 0
    of a cluster without one, or any process outside a multi-worker cluster. Others checkpoint into a scratch
    folder."""
    task = worker_task()
    if task is None:
        return True
    cluster = json.loads(os.environ["TF_CONFIG"]).get("cluster", {})
    return task[0] == "chief" or (task == ("worker", 0) and "chief" not in cluster)
