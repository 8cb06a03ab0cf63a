"""`tpulaunch run` on GKE: the job staged under run.model_dir as for a TPU VM, submitted as one JobSet through the
Kubernetes API (the official client, the user's kubeconfig as kubectl finds it), then followed from the JobSet's
status and from what the chief writes to model_dir. The JobSet's controller in the cluster restarts it by cause
(`jobset.py`), so nothing here needs to stay awake: Ctrl-C detaches, a rerun reattaches, `tpulaunch cancel` ends it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Callable, Optional

from tpulaunch.errors import ExitCode, TpuLaunchError
from tpulaunch.remote import jobset
from tpulaunch.remote.follow import HostLog, Recovery, host_status
from tpulaunch.remote.stage import Stage
from tpulaunch.tpu.gke import gke_slice
from tpulaunch.tpu.types import parse_tpu_type

Say = Callable[[str], None]
INSTALL_HINT = "pip install 'tpulaunch[gke]' (the Kubernetes Python client)"


@dataclass
class Submission:
    """A job's JobSet: what is submitted, and where it runs."""

    manifest: dict
    stage: Stage
    namespace: str
    context: Optional[str]

    @property
    def name(self) -> str:
        return self.manifest["metadata"]["name"]


def submission(checked, stage: Stage, startup_script: str, *, recreate: int, attempt_base: int = 0) -> Submission:
    """The JobSet for a checked job with a gke: section and its stage; `attempt_base`: the VMs model_dir's earlier
    runs took (`follow.newest_attempt`), so this run's pods write their own attempts' folders."""
    from tpulaunch.seam.registry import about

    job = checked.job
    engine = about(checked.plan.engine)
    tpu_slice = gke_slice(parse_tpu_type(job.tpu.type))
    manifest = jobset.build(job_name=job.name, gke=job.gke, slices=job.tpu.slices, tpu_slice=tpu_slice,
                            image=job.gke.image or engine.on_tpu.container_image, startup_script=startup_script,
                            stage_digest=stage.digest, recreate=recreate, python=engine.on_tpu.container_python,
                            attempt_base=attempt_base)
    return Submission(manifest, stage, job.gke.namespace, job.gke.context)


def as_yaml(manifest: dict) -> str:
    """The manifest as `kubectl apply -f -` takes it (the startup script a block scalar, readable as written)."""
    import yaml

    class Dumper(yaml.SafeDumper):
        def ignore_aliases(self, data):  # the labels repeated, not anchored: as a person would write them
            return True

    def text(dumper, value):
        style = "|" if "\n" in value else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    def sequence(dumper, value):  # the exit codes on one line
        flow = all(isinstance(item, int) for item in value) and bool(value)
        return dumper.represent_sequence("tag:yaml.org,2002:seq", value, flow_style=flow)

    Dumper.add_representer(str, text)
    Dumper.add_representer(list, sequence)
    return yaml.dump(manifest, Dumper=Dumper, sort_keys=False, width=120)


def connect(context: Optional[str]):
    """The Kubernetes custom-objects API for the kubeconfig's context (kubectl's: $KUBECONFIG or ~/.kube/config)."""
    try:
        from kubernetes import client, config
    except ImportError:
        raise TpuLaunchError("running on GKE needs the Kubernetes Python client, which is not installed",
                             hint=INSTALL_HINT, exit_code=ExitCode.PROBLEMS) from None
    try:
        config.load_kube_config(context=context)
    except Exception as exc:  # noqa: BLE001 — its own ConfigException, or a file it could not read
        raise TpuLaunchError(f"no kubeconfig reaches the cluster: {str(exc).splitlines()[0]}",
                             hint="gcloud container clusters get-credentials CLUSTER --location LOCATION "
                                  "(or set KUBECONFIG, or gke.context)", exit_code=ExitCode.CLUSTER) from None
    return client.CustomObjectsApi(), client.ApiException


class GkeRun:
    """Submit (or reattach to) a job's JobSet and follow it to its end."""

    def __init__(self, sub: Submission, *, say: Say, out: Say, poll_s: float = 10.0, timeout_s: float = 0):
        self.sub, self.say, self.out, self.poll_s, self.timeout_s = sub, say, out, poll_s, timeout_s
        self.api, self.ApiException = connect(sub.context)

    def _call(self, doing: str, fn, *args, **kwargs):
        try:
            return fn(jobset.GROUP, jobset.VERSION, self.sub.namespace, jobset.PLURAL, *args, **kwargs)
        except self.ApiException as exc:
            if exc.status in (404, 409):
                raise
            reason = exc.reason or ""
            hint = ("install JobSet in the cluster (kubectl apply --server-side -f "
                    "https://github.com/kubernetes-sigs/jobset/releases/download/v0.8.0/manifests.yaml)"
                    if exc.status == 404 else "check the kubeconfig's credentials and the namespace")
            raise TpuLaunchError(f"the Kubernetes API refused {doing} (HTTP {exc.status} {reason})", hint=hint,
                                 exit_code=ExitCode.CLUSTER) from None
        except OSError as exc:
            raise TpuLaunchError(f"the cluster's API server could not be reached while {doing}: {exc}",
                                 hint="check the network and the kubeconfig's server", exit_code=ExitCode.CLUSTER) \
                from None

    def get(self) -> Optional[dict]:
        try:
            return self._call("reading the JobSet", self.api.get_namespaced_custom_object, self.sub.name)
        except self.ApiException:
            return None

    def submit(self) -> dict:
        """Create the JobSet, or reattach to the one this job's stage already runs."""
        existing = self.get()
        if existing is not None:
            stage = (existing.get("metadata", {}).get("annotations") or {}).get(jobset.STAGE_ANNOTATION)
            if stage != self.sub.stage.digest:
                raise TpuLaunchError(
                    f"JobSet '{self.sub.name}' in namespace '{self.sub.namespace}' runs another stage of this job "
                    f"({(stage or 'unknown')[:12]}), not this one ({self.sub.stage.digest[:12]})",
                    hint=f"end it first: tpulaunch cancel JOB (or kubectl delete jobset {self.sub.name} -n "
                         f"{self.sub.namespace})", exit_code=ExitCode.PROBLEMS)
            self.say(f"gke | reattached to JobSet '{self.sub.name}' ({self.sub.namespace})")
            self.sub = replace(self.sub, manifest=existing)  # its own numbering of attempts, set when it was made
            return existing
        self._refuse_a_live_writer()
        created = self._call("creating the JobSet", self.api.create_namespaced_custom_object, self.sub.manifest)
        self.say(f"gke | JobSet '{self.sub.name}' created in namespace '{self.sub.namespace}'"
                 + (f", queued on '{self.sub.manifest['metadata']['labels'][jobset.QUEUE_LABEL]}'"
                    if jobset.QUEUE_LABEL in self.sub.manifest["metadata"]["labels"] else ""))
        return created

    def _refuse_a_live_writer(self) -> None:
        """Before a new JobSet is created: another run writing run.model_dir now (its lease held and renewed: a
        local train, a TPU VM run, another JobSet) would refuse this one's chief the lease, and the JobSet would
        fail as for the job's own cause after its pods started; refused here instead, naming that run (exit 3)."""
        from tpulaunch.run.lease import holder_text, lease_state, read_lease

        model_dir = self.sub.stage.model_dir
        held = read_lease(model_dir)
        if lease_state(held, time.time()) != "held":
            return
        raise TpuLaunchError(
            f"run.model_dir {model_dir} is in use: {held.get('command') or 'a run'} by {holder_text(held)} holds its "
            f"lease; JobSet '{self.sub.name}' was not created", exit_code=ExitCode.CLUSTER,
            hint="wait for that run to end (or end it: `tpulaunch cancel` for a remote run), or give this job another "
                 "run.model_dir")

    @property
    def attempt_base(self) -> int:
        env = self.sub.manifest["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
        return int(next(item["value"] for item in env["env"] if item["name"] == "TPULAUNCH_ATTEMPT_BASE"))

    def follow(self) -> int:
        """Follow the JobSet to its end: the chief's lines, restarts as they happen; the exit code."""
        model_dir, base = self.sub.stage.model_dir, self.attempt_base
        seen_restarts, log = None, None
        recovery = Recovery()
        began = time.monotonic()
        while True:
            current = self.get()
            if current is None:
                raise TpuLaunchError(f"JobSet '{self.sub.name}' is gone (deleted by hand or by `tpulaunch cancel`)",
                                     exit_code=ExitCode.CLUSTER)
            status = current.get("status") or {}
            restarts = int(status.get("restarts") or 0)
            if seen_restarts is None:  # the first look: a reattached JobSet may have restarted before it
                seen_restarts, log = restarts, HostLog(model_dir, base + restarts + 1)
                if restarts:
                    self.say(f"gke | the JobSet restarted {restarts} time{'s' if restarts != 1 else ''} before "
                             "this follow: its current pods' chief follows")
            elif restarts != seen_restarts:
                for line in log.new_lines():  # the lost generation's last lines, before its loss is told
                    self.out(line)
                back = recovery.back(log, time.monotonic())
                if back:
                    self.say(f"gke | {back}")
                limit = self.sub.manifest["spec"]["failurePolicy"]["maxRestarts"]
                self.say(f"gke | restart {restarts} of at most {limit}: every pod recreated, the job resumes from "
                         "its newest checkpoint")
                recovery.lost(log, time.monotonic())
                seen_restarts, log = restarts, HostLog(model_dir, base + restarts + 1)
            for line in log.new_lines():
                self.out(line)
            back = recovery.back(log, time.monotonic())
            if back:
                self.say(f"gke | {back}")
            ended = _condition(status)
            if ended == "Completed":
                self.say(f"gke | JobSet '{self.sub.name}' completed{recovery.summary()}")
                return 0
            if ended == "Failed":
                chief = host_status(model_dir, base + seen_restarts + 1) or {}
                code = chief.get("exit_code") or int(ExitCode.CLUSTER)
                self.say(f"gke | JobSet '{self.sub.name}' failed{recovery.summary()}: {_message(status)}"
                         + (f" (the chief exited {code})" if chief else ""))
                return int(code)
            if self.timeout_s and time.monotonic() - began > self.timeout_s:
                raise TpuLaunchError(f"JobSet '{self.sub.name}' did not end within {self.timeout_s:.0f} s",
                                     hint="it goes on in the cluster: rerun to follow it again",
                                     exit_code=ExitCode.CLUSTER)
            time.sleep(self.poll_s)



def _condition(status: dict) -> Optional[str]:
    for condition in status.get("conditions") or []:
        if condition.get("status") == "True" and condition.get("type") in ("Completed", "Failed"):
            return condition["type"]
    return None


def _message(status: dict) -> str:
    for condition in status.get("conditions") or []:
        if condition.get("type") == "Failed":
            return condition.get("message") or condition.get("reason") or "no reason given"
    return "no reason given"


def cancel(job_name: str, gke) -> bool:
    """Delete a job's JobSet and its pods (the checkpoints stay in run.model_dir); False when there is none."""
    api, api_exception = connect(gke.context)
    try:
        api.delete_namespaced_custom_object(jobset.GROUP, jobset.VERSION, gke.namespace, jobset.PLURAL,
                                            jobset.jobset_name(job_name), propagation_policy="Foreground")
    except api_exception as exc:
        if exc.status == 404:
            return False
        raise TpuLaunchError(f"the Kubernetes API refused deleting JobSet '{jobset.jobset_name(job_name)}' "
                             f"(HTTP {exc.status} {exc.reason or ''})", hint="check the kubeconfig's credentials",
                             exit_code=ExitCode.CLUSTER) from None
    return True


def read(name: str, gke) -> Optional[dict]:
    """The JobSet `name` in the job's namespace as the cluster has it, or None."""
    api, api_exception = connect(gke.context)
    try:
        return api.get_namespaced_custom_object(jobset.GROUP, jobset.VERSION, gke.namespace, jobset.PLURAL, name)
    except api_exception as exc:
        if exc.status == 404:
            return None
        raise TpuLaunchError(f"the Kubernetes API refused reading JobSet '{name}' (HTTP {exc.status})",
                             exit_code=ExitCode.CLUSTER) from None
    except OSError as exc:
        raise TpuLaunchError(f"the cluster's API server could not be reached: {exc}", exit_code=ExitCode.CLUSTER) \
            from None


def state_of(found: dict) -> str:
    """Completed, Failed, Suspended (Kueue has not admitted it) or Running."""
    status = found.get("status") or {}
    ended = _condition(status)
    if ended:
        return ended
    if found.get("spec", {}).get("suspend"):
        return "Suspended (waiting for Kueue to admit it)"
    return "Running"
