"""The JobSet `tpulaunch run` submits for a job with a `gke:` section (kubernetes-sigs/jobset, `jobset.x-k8s.io/v1alpha2`).

One replicated Job of `tpu.slices` replicas, each a slice: `parallelism` = `completions` = the slice's hosts, one pod
per host asking `google.com/tpu` for the host's chips on the node pool its selectors name (`tpu/gke.py`), the
exclusive-topology annotation putting each Job on a node pool of its own, `hostNetwork` as GKE's TPU guide asks.
Each pod runs the same startup script as a TPU VM of `tpulaunch run` (`startup.sh`): it installs what the job needs,
fetches tpulaunch and the job from the stage under run.model_dir and starts the host runner, its place in the run
read from what GKE and JobSet give the pod (`TPU_WORKER_ID`, `TPU_WORKER_HOSTNAMES`, the slice's Job index and the
JobSet's restart attempt, through the downward API).

Restart by cause, from the exit codes' one meaning (`causes.py`): a pod that exits with a code of the job's own (1 a
bug, a NaN, bad input; 2; 70 a crash; 130) fails its Job by the pod failure policy, and the JobSet's failure policy
fails the JobSet on that reason at once; any other failure (an infrastructure exit code, a preempted or lost node)
fails the Job by its backoff limit of 0, and the JobSet restarts every pod, at most `--recreate` times
(`maxRestarts`). The job resumes from its newest complete checkpoint, as after a TPU VM's recovery.
"""

from __future__ import annotations

from typing import Optional

from tpulaunch.remote import causes
from tpulaunch.tpu import multislice
from tpulaunch.tpu.gke import EXCLUSIVE_TOPOLOGY, TPU_RESOURCE, GkeSlice

API_VERSION = "jobset.x-k8s.io/v1alpha2"
GROUP, VERSION, PLURAL = "jobset.x-k8s.io", "v1alpha2", "jobsets"
CONTAINER = "train"
REPLICATED_JOB = "slice"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
JOB_LABEL = "tpulaunch.dev/job"  # every object of one run: the JobSet's name, for `logs` and `cancel`
STAGE_ANNOTATION = "tpulaunch.dev/stage"  # the stage's digest: a rerun of another job is not reattached
# What JobSet puts on each pod (jobset's api/jobset/v1alpha2 constants): the slice's Job index and the restart count.
JOB_INDEX_KEY = "jobset.sigs.k8s.io/job-index"
RESTART_ATTEMPT_KEY = "jobset.sigs.k8s.io/restart-attempt"
TTL_AFTER_FINISHED_S = 12 * 3600  # the finished JobSet's pods (and their logs) are kept half a day, as xpk's are
TERMINATION_GRACE_S = 60  # SIGTERM to SIGKILL: train saves its checkpoint on SIGTERM


def jobset_name(job_name: str) -> str:
    """The JobSet's name: the job's, as a DNS label (Kubernetes names are lower case; JobSet adds suffixes to it)."""
    name = "".join(c if c.isalnum() else "-" for c in job_name.lower()).strip("-") or "job"
    return name[:40].rstrip("-")


def build(*, job_name: str, gke, slices: int, tpu_slice: GkeSlice, image: str, startup_script: str,
          stage_digest: str, recreate: int, python: Optional[str] = None, attempt_base: int = 0) -> dict:
    """The JobSet as plain data (what `kubectl apply -f -` takes once dumped as YAML).

    `gke`: the job's gke: section; `startup_script`: the one `startup.py` fills for the stage; `python`: the image's
    Python that runs it (the image's own, so its packages are used rather than installed again); `attempt_base`:
    the highest VM number model_dir's runs took before this one (its restarts number on from it)."""
    name = jobset_name(job_name)
    labels = {JOB_LABEL: name}
    if gke.queue:
        labels[QUEUE_LABEL] = gke.queue
    pod = {
        "restartPolicy": "Never",
        "nodeSelector": tpu_slice.node_selector,
        "hostNetwork": True,  # GKE's TPU guide: the slice's hosts reach each other on the node's network
        "dnsPolicy": "ClusterFirstWithHostNet",
        "terminationGracePeriodSeconds": TERMINATION_GRACE_S,
        "tolerations": [{"key": TPU_RESOURCE, "operator": "Exists"}],  # the TPU nodes' taint
        "containers": [{
            "name": CONTAINER,
            "image": image,
            "command": ["bash", "-c", startup_script],
            "env": _environment(name, tpu_slice, slices, python, attempt_base),
            "resources": {"requests": {TPU_RESOURCE: tpu_slice.chips_per_host},
                          "limits": {TPU_RESOURCE: tpu_slice.chips_per_host}},
            "securityContext": {"privileged": True},  # GKE before 1.28 reaches the TPU chips only so
        }],
    }
    if gke.priority_class:
        pod["priorityClassName"] = gke.priority_class
    if gke.service_account:
        pod["serviceAccountName"] = gke.service_account
    job_codes = [code for code in range(1, 256) if code not in causes.infrastructure_exit_codes()]
    return {
        "apiVersion": API_VERSION,
        "kind": "JobSet",
        "metadata": {"name": name, "namespace": gke.namespace, "labels": labels,
                     "annotations": {**EXCLUSIVE_TOPOLOGY, STAGE_ANNOTATION: stage_digest}},
        "spec": {
            "ttlSecondsAfterFinished": TTL_AFTER_FINISHED_S,
            "failurePolicy": {
                "maxRestarts": recreate,
                # A Job failed by its pod failure policy failed for the job's own cause: no restart.
                "rules": [{"name": "the-jobs-own-failure", "action": "FailJobSet",
                           "onJobFailureReasons": ["PodFailurePolicy"]}],
            },
            "replicatedJobs": [{
                "name": REPLICATED_JOB,
                "replicas": slices,
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "parallelism": tpu_slice.hosts,
                        "completions": tpu_slice.hosts,
                        "completionMode": "Indexed",
                        "backoffLimit": 0,  # one pod lost fails its Job: the JobSet restarts every slice's pods
                        "podFailurePolicy": {"rules": [{
                            "action": "FailJob",
                            "onExitCodes": {"containerName": CONTAINER, "operator": "In", "values": job_codes},
                        }]},
                        "template": {"metadata": {"labels": labels}, "spec": pod},
                    },
                },
            }],
        },
    }


def pod_hostname(name: str, slice_index: int, host: int) -> str:
    """A pod's DNS name, as JobSet gives it (`<jobset>-<replicated job>-<job index>-<pod index>.<jobset>`)."""
    return f"{name}-{REPLICATED_JOB}-{slice_index}-{host}.{name}"


def run_hosts(name: str, slices: int, hosts: int) -> str:
    """Every host of the run, slice after slice (what the host runner's $TF_CONFIG lists; worker 0 the chief)."""
    return ",".join(f"{pod_hostname(name, s, h)}:{HOST_PORT}" for s in range(slices) for h in range(hosts))


HOST_PORT = 8476  # where the run's hosts meet (jax.distributed's coordinator on host 0)


def _environment(name: str, tpu_slice: GkeSlice, slices: int, python: Optional[str], attempt_base: int) -> list:
    """What the startup script reads in a pod beside GKE's own TPU_WORKER_ID and TPU_WORKER_HOSTNAMES; on several
    slices, what libtpu's multislice reads too (JAX's GKE cluster detection turns MEGASCALE_* into its processes)."""
    slice_index = {"fieldRef": {"fieldPath": f"metadata.annotations['{JOB_INDEX_KEY}']"}}
    env = [
        {"name": "TPULAUNCH_SLICES", "value": str(slices)},
        {"name": "TPULAUNCH_HOSTS_PER_SLICE", "value": str(tpu_slice.hosts)},
        {"name": "TPULAUNCH_SLICE", "valueFrom": slice_index},
        {"name": "TPULAUNCH_RESTART_ATTEMPT",
         "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{RESTART_ATTEMPT_KEY}']"}}},
        {"name": "TPULAUNCH_RUN_HOSTS", "value": run_hosts(name, slices, tpu_slice.hosts)},
        {"name": "TPULAUNCH_ATTEMPT_BASE", "value": str(attempt_base)},
        # which JobSet the pods are of (their host statuses say it): a restarted chief releases only its own
        # JobSet's replaced chief's lease, never that of another JobSet whose attempts took the same numbers
        {"name": "TPULAUNCH_JOBSET", "value": name},
    ]
    coordinator = f"{pod_hostname(name, 0, 0)}:{multislice.MEGASCALE_PORT}"
    for key, value in multislice.megascale_environment(coordinator, slices, None).items():
        env.append({"name": key, "valueFrom": slice_index} if key == multislice.SLICE_ID else
                   {"name": key, "value": value})
    if python:
        env.append({"name": "TPULAUNCH_IMAGE_PYTHON", "value": python})
    return env
