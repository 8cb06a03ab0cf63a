"""The controller of a remote run: it creates the job's TPU VM with the startup script in the node's metadata,
follows the run from outside (the host's lines and status under model_dir, the node's state from the API) and,
with `recreate` > 0, recovers from infrastructure failures (`causes.py`) by deleting the node and creating it
again with the same startup script: the job resumes from its newest complete checkpoint.

It holds nothing the run needs: killed or detached, it is started again (`tpulaunch run JOB`) and reattaches
to the node it created (the node's metadata names the stage it runs), reading its record (`run.json`) back.

Each run reads only the files its own VMs write: every VM created for model_dir gets a number no earlier one had
(`layout.py`), so a rerun after a failed run, or with more steps, starts a VM of its own and trains. A rerun
reattaches to the node it finds when that node runs this job's stage and is still this run's (its record not
ended) or still training; a node left from a run that ended (`--keep-tpu`) is deleted and a VM of this run's
created. Before it creates a VM the controller reads model_dir's lease (`contention.py`): an earlier VM's train
that still holds it with no node to reattach to is stopped first (it saves a checkpoint, the new VM resumes from
it); any other live holder refuses the run before anything is created.
"""

from __future__ import annotations

import json
import socket
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Callable, Dict, List, Optional

from tpulaunch.errors import ExitCode, TpuLaunchError
from tpulaunch import store
from tpulaunch.remote import causes, contention, layout
from tpulaunch.remote.follow import HostLog, attempt_taken, host_status
from tpulaunch.remote.stage import Stage
from tpulaunch.tpu import node as cluster
from tpulaunch.tpu.lifecycle import GUEST_ATTRIBUTES_KEY, Placement

Say = Callable[[str], None]

SAME_ZONE, NEXT_ZONE = "same-zone", "next-zone"
AFTER_PREEMPTION = (SAME_ZONE, NEXT_ZONE)  # `run --after-preemption`

# A host's phases before its part started (startup.sh, host.py), as a late host is described.
STARTING = {"installing": "is still installing the job's requirements", "fetching": "is still fetching tpulaunch",
            "fetched": "fetched the job but did not start it (its host runner stopped: its log says why)"}


@dataclass
class Recovery:
    """One infrastructure failure and what bringing the run back took (times in seconds)."""

    lost_vm: int  # which VM of the run was lost
    cause: str  # PREEMPTED, NOT_FOUND, "exit code 3: the TPU was lost"...
    step: Optional[int]  # the newest step its log showed
    checkpoint_step: Optional[int]  # the newest checkpoint its log showed saved
    noticed_at: float  # UTC seconds
    recreate_s: Optional[float] = None  # deleting and creating the node, until READY
    lease_released: bool = False  # the lost VM's model_dir lease, released by the controller
    resumed_from: Optional[int] = None  # the step the new VM's train started from
    startup_s: Optional[float] = None  # the new VM's boot to its train starting (install and fetch included)
    first_step_s: Optional[float] = None  # noticed to the first step the new VM trained
    steps_lost: Optional[int] = None  # steps trained since the checkpoint it resumed from

    @property
    def beyond_create_and_install_s(self) -> Optional[float]:
        """The recovery's own time: noticed to first resumed step, less the API's create and the install."""
        if self.first_step_s is None or self.recreate_s is None:
            return None
        return round(self.first_step_s - self.recreate_s - (self.startup_s or 0.0), 3)

    def text(self) -> str:
        words = f"{self.cause} at step {self.step if self.step is not None else '?'}"
        if self.resumed_from is not None:
            words += f", resumed from step {self.resumed_from}, {self.steps_lost} steps lost"
        if self.first_step_s is not None:
            words += f", back in {self.first_step_s:.1f} s"
        return words


@dataclass
class RunRecord:
    """`run.json`: the remote run as the controller knows it (rewritten at each change)."""

    job: str
    job_file: str
    stage: str
    node: str
    zone: str
    project: str
    started: float
    vms: List[dict] = field(default_factory=list)  # {"vm": n, "created": UTC s, "create_s": s}
    recoveries: List[dict] = field(default_factory=list)
    outcome: Optional[str] = None
    final_step: Optional[int] = None
    ended: Optional[float] = None

    @classmethod
    def load(cls, model_dir: str) -> Optional["RunRecord"]:
        found = store.read(layout.run_record(model_dir))
        if found is None or not found.data:
            return None
        try:
            return cls(**json.loads(found.data))
        except (ValueError, TypeError):
            return None

    def save(self, model_dir: str) -> None:
        store.write(layout.run_record(model_dir), (json.dumps(asdict(self), indent=1) + "\n").encode(), private=True)


class Controller:
    """Run the staged job on the job's TPU and supervise it until it ends, the controller detaches or gives up.

    Args:
        fallback: where the node may be created (`tpu/lifecycle.Fallback`: tpu.zones and tpu.tiers in order), its
            NodeSpec carrying no metadata (the controller adds it per VM).
        stage: what the VMs run; startup: the startup script for it.
        recreate: infrastructure failures to recover from, at most.
        poll_s: how often the run's files and the node are read.
        host_timeout_s: how long each host of a READY VM may take to start its part (boot, install, fetch) before
            it is reported by name and the VM counts as lost.
        on_step: told each step the log shows (a rehearsal preempts the VM at the steps it was asked to).
        keep_tpu: leave the node when the run ends (else it is deleted: its output is in model_dir).
        after_preemption: where a recovery from a PREEMPTED node looks first: SAME_ZONE, the zone it was in (then
            the others of tpu.zones, in order, wrapping round); NEXT_ZONE, the zone after it (the preempted one
            last), as a zone that just preempted a VM is likely short of capacity. Other losses: SAME_ZONE.
    """

    def __init__(self, fallback, stage: Stage, startup: str, *, job_file: str, recreate: int = 0, poll_s: float = 10.0,
                 create_timeout_s: float = 1800.0, host_timeout_s: float = 900.0, keep_tpu: bool = False,
                 after_preemption: str = SAME_ZONE,
                 say: Say = print, out: Say = print, on_step: Callable[[int], None] = lambda step: None):
        self.fallback, self.stage, self.startup = fallback, stage, startup
        self.life = fallback.life_at(fallback.tries[0])  # the placement the node is in, once known
        self.ref = self.life.ref
        self.model_dir = stage.model_dir
        self.job_file = job_file
        self.recreate, self.poll_s = recreate, poll_s
        self.create_timeout_s, self.host_timeout_s = create_timeout_s, host_timeout_s
        self.keep_tpu = keep_tpu
        assert after_preemption in AFTER_PREEMPTION
        self.after_preemption = after_preemption
        self.say, self.out, self.on_step = say, out, on_step
        self.vm = 0
        self.record: Optional[RunRecord] = None
        self.previous: Optional[RunRecord] = None  # the record model_dir had when this controller started
        self.log: Optional[HostLog] = None
        self.hosts = 1  # hosts of the node's slice
        self.statuses: Dict[int, dict] = {}  # worker -> its status (follow.host_status), once it wrote one
        self.removed = False  # the node was deleted at the run's end
        self.pending: Optional[Recovery] = None
        self.ready_at = 0.0

    # ------------------------------------------------------------------ the node

    def _metadata(self, vm: int) -> tuple:
        return ((layout.STARTUP_KEY, self.startup), (layout.STAGE_KEY, self.stage.digest),
                (layout.ATTEMPT_KEY, str(vm)), (GUEST_ATTRIBUTES_KEY, "TRUE"))

    def _create(self, vm: int, tries=None) -> float:
        """Create the node as the run's VM number `vm` in the first zone and tier with capacity (of `tries`, else
        the job's); the seconds until it was READY (the tries that found none included)."""
        started = time.monotonic()
        self.life, outcome = self.fallback.create(wait_s=self.create_timeout_s, metadata=self._metadata(vm),
                                                  tries=tries)
        self.ref = self.life.ref
        self.vm = vm
        self.record.zone = self.ref.zone
        self.record.vms.append({"vm": vm, "created": time.time(), "create_s": round(time.monotonic() - started, 3),
                                "zone": self.ref.zone, "tier": self.life.spec.tier})
        self.record.save(self.model_dir)
        self._follow_vm(self.life.read_node())
        self.say(f"tpu | {self.life.described} is READY after {outcome.seconds:.1f} s: VM {vm} of the run "
                 f"starts the job (its startup script, on {self._hosts_words()})")
        return outcome.seconds

    def _follow_vm(self, node: Optional[dict]) -> None:
        self.log = HostLog(self.model_dir, self.vm)
        self.statuses = {}
        # the run's hosts: on several slices (one multislice queued resource) each slice's, numbered slice after slice
        self.hosts = slice_hosts(node, self.life.spec.accelerator_type) * self.life.slices
        self.ready_at = time.monotonic()

    def _hosts_words(self) -> str:
        if self.hosts == 1:
            return "its one host"
        runs = "every host trains, worker 0 the chief" if self.stage.manifest.get("hosts") == "every" else \
            "worker 0 trains"
        return f"each of its {self.hosts} hosts; {runs}"

    @property
    def preempted_node(self):
        """The node a rehearsal's --preempt-at preempts: the job's, or on several slices the last slice's (which loses
        the whole queued resource)."""
        return replace(self.ref, name=self.life.node_names[-1])

    @property
    def status(self) -> Optional[dict]:
        """The chief's (worker 0's) status."""
        return self.statuses.get(0)

    def _find(self) -> Optional[dict]:
        """The run's node in the zone its record names, else in any zone it may be created in (self.life then
        points there); None when there is none."""
        zones = [self.record.zone] + [placement.zone for placement in self.fallback.tries]
        for zone in dict.fromkeys(zones):
            tier = next((p.tier for p in self.fallback.tries if p.zone == zone), self.fallback.tries[0].tier)
            life = self.fallback.life_at(Placement(zone, tier))
            node = life.read_node()
            if node is not None:
                self.life, self.ref = life, life.ref
                return node
        return None

    def _attach(self) -> None:
        """Find the run's node: reattach to it, wait for it, recover it, or create it."""
        node = self._find()
        if node is not None:
            metadata = node.get("metadata") or {}
            state = node.get("state")
            if layout.STAGE_KEY not in metadata:
                raise TpuLaunchError(
                    f"{self.life.described} exists but was not created by `tpulaunch run` (no startup script of "
                    "it)", hint=f"`{self.down_command()}` deletes it, or set tpu.name to another node",
                    exit_code=ExitCode.CLUSTER)
            if metadata[layout.STAGE_KEY] != self.stage.digest:
                raise TpuLaunchError(
                    f"{self.life.described} runs another staged job (stage {metadata[layout.STAGE_KEY][:12]}, "
                    f"this job's is {self.stage.digest[:12]}): the job file, its code or its --set values changed",
                    hint=f"let that run end, or `{self.down_command()}` first (the checkpoints stay in "
                         "model_dir)", exit_code=ExitCode.CLUSTER)
            vm = int(metadata.get(layout.ATTEMPT_KEY) or 1)
            ended = self._ended_earlier(vm)
            if ended is None:
                self.vm = vm
                self._follow_vm(node)
                self._read()  # its lines so far (the step it reached, when it was lost)
                self.say(f"tpu | reattached to {self.life.described} ({state}), VM {self.vm} of the run")
                if causes.node_cause(state):
                    self._recover(str(state))
                elif state != "READY":
                    self.life.create(wait_s=self.create_timeout_s)  # on its way: waited for
                return
            self.say(f"tpu | {self.life.described} is left from a run that ended (VM {vm}: {ended}): deleting "
                     "it; this run creates a VM of its own")
            self.life.delete(wait_s=self.create_timeout_s)
        self._clear_model_dir()
        self._create(self._next_vm())

    def _ended_earlier(self, vm: int) -> Optional[str]:
        """How VM `vm` (found running this job's stage) ended in a run before this one, in words; None when it is
        this run's to reattach to: in this run's record, or its train not ended (still booting or training)."""
        if self.record is self.previous and any(item.get("vm") == vm for item in self.record.vms):
            return None  # a controller that was killed or detached: its record goes on
        status = host_status(self.model_dir, vm, 0)
        if status is None or status.get("phase") != "ended":
            return None
        return causes.exit_text(status.get("exit_code") or 0) if status.get("exit_code") else "done"

    # ------------------------------------------------------------------ the VM numbers and model_dir's lease

    def _highest_vm(self) -> int:
        """The highest number a VM of model_dir has taken (0: none): the records' and, after them, any folder
        under attempts/ (a VM whose record was overwritten, or whose controller was killed while creating it)."""
        known = [item.get("vm") or 0 for record in (self.record, self.previous) if record for item in record.vms]
        highest = max(known, default=0)
        while attempt_taken(self.model_dir, highest + 1):
            highest += 1
        return highest

    def _next_vm(self) -> int:
        """The number of the VM about to be created, claimed (`attempts/<n>/vm.json`) before the node is: no VM
        of model_dir had it, so the controller reads only what this VM writes."""
        vm = self._highest_vm() + 1
        claim = {"vm": vm, "stage": self.stage.digest, "node": self.ref.name, "run_started": self.record.started,
                 "claimed": time.time()}
        store.write(layout.vm_claim(self.model_dir, vm), (json.dumps(claim, indent=1) + "\n").encode(), private=True)
        return vm

    def _clear_model_dir(self) -> None:
        """Before a VM is created: nothing else may hold model_dir's lease, or the VM's train is refused it. An
        earlier VM's train that still holds it with no node found (its controller killed with its rehearsal's
        local API) is stopped here, said; any other live holder refuses the run before anything is created."""
        holder = contention.live_holder(self.model_dir)
        if holder is None:
            return
        from tpulaunch.run import lease as leases

        who = leases.holder_text(holder)
        age = leases.age_text(time.time() - float(holder.get("renewed") or 0))
        found = contention.orphan_vm(self.model_dir, holder, range(self._highest_vm(), 0, -1))
        if found is None:
            self._end(f"failed: {causes.CONTENTION}: run.model_dir held by {who}")
            raise TpuLaunchError(
                f"run.model_dir {self.model_dir} is in use: {holder.get('command') or 'a run'} by {who} holds its "
                f"lease, last renewed {age} ago; a VM's train would be refused it (nothing was created)",
                hint="wait for that run to end, or stop it, then rerun (it resumes from model_dir's newest "
                     "checkpoint); or use another run.model_dir", exit_code=ExitCode.CLUSTER)
        vm, status = found
        orphan = (f"VM {vm} of an earlier run still trains in run.model_dir (train pid {holder.get('pid')} on "
                  f"{holder.get('host')}, holding its lease, last renewed {age} ago) but no TPU node of it is found")
        if holder.get("host") != socket.gethostname():
            self._end(f"failed: {causes.CONTENTION}: run.model_dir held by VM {vm} of an earlier run")
            raise TpuLaunchError(
                f"{orphan} in {', '.join(dict.fromkeys(p.zone for p in self.fallback.tries))}: this machine cannot "
                "stop it (nothing was created)",
                hint="wait for it to end (its lease released), or delete its TPU VM where it is, then rerun",
                exit_code=ExitCode.CLUSTER)
        self.say(f"tpu | {orphan} (its controller was killed with its rehearsal's local API): stopping it before "
                 "this run's VM starts")
        how = contention.stop_local(self.model_dir, holder)
        self.say(f"tpu | stopped VM {vm} of the earlier run: {how}; this run's VM resumes from model_dir's newest "
                 "checkpoint")

    # ------------------------------------------------------------------ recovery

    def _release_lease(self, status: Optional[dict]) -> bool:
        """Release model_dir's lease when the lost VM's train still holds it (its host and pid, as its status
        said), conditional on the lease read: the new VM then takes it at once instead of after the stale time."""
        if not status or status.get("train_pid") is None:
            return False
        from tpulaunch.run.lease import release_lost_holder

        return release_lost_holder(self.model_dir, host=status.get("host"), pid=status["train_pid"],
                                   why=f"tpulaunch run: VM {status.get('attempt')} of the run was lost")

    def _recover(self, cause: str) -> None:
        self._read()  # all the lost VM wrote: the step and checkpoint it reached
        step = self.log.step if self.log else None
        checkpoint = self.log.checkpoint if self.log else None
        recovery = Recovery(self.vm, cause, step, checkpoint, time.time())
        where = f" | step {step}" if step is not None else ""
        where += f" | checkpoint step {checkpoint}" if checkpoint is not None else ""
        self.say(f"tpu | {cause}{where} | VM {self.vm} of the run lost")
        used = len(self.record.recoveries)
        if used >= self.recreate:
            self._end(f"failed: {cause}")
            raise TpuLaunchError(
                f"{self.life.described} was lost ({cause}){where}, and "
                + (f"all {self.recreate} recoveries were used" if self.recreate else "--recreate is 0"),
                hint=f"`tpulaunch run {self.job_file} --recreate N` creates it again and resumes from the newest "
                     f"checkpoint; `{self.down_command()}` removes what is left of it",
                exit_code=ExitCode.CLUSTER)
        started = time.monotonic()
        self.life.delete(wait_s=self.create_timeout_s)
        recovery.lease_released = self._release_lease(self.status)
        if recovery.lease_released:
            self.say("lease | released the lost VM's lease on run.model_dir (it held it still)")
        self.record.recoveries.append(asdict(recovery))
        self.pending = recovery
        next_zone = cause == "PREEMPTED" and self.after_preemption == NEXT_ZONE
        tries = self.fallback.starting_at(self.ref.zone, after=next_zone)
        first = f", trying {tries[0]} first" + (f" (--after-preemption {NEXT_ZONE})" if next_zone else "") \
            if len(self.fallback.tries) > 1 else ""
        self.say(f"tpu | recovery {used + 1} of {self.recreate}: creating {self.life.described} again with the "
                 f"same startup script{first}")
        self._create(self._next_vm(), tries)
        recovery.recreate_s = round(time.monotonic() - started, 3)
        self._save_recovery()

    def _save_recovery(self) -> None:
        self.record.recoveries[-1] = {**asdict(self.pending),
                                      "beyond_create_and_install_s": self.pending.beyond_create_and_install_s}
        self.record.save(self.model_dir)

    def _check_resumed(self) -> None:
        """Once the new VM trained its first step: how long the recovery took and what it cost."""
        recovery = self.pending
        if recovery is None or self.log.first_step is None:
            return
        recovery.first_step_s = round(time.time() - recovery.noticed_at, 3)
        recovery.resumed_from = self.log.started_from
        if recovery.resumed_from is not None and recovery.step is not None:
            recovery.steps_lost = max(0, recovery.step - recovery.resumed_from)
        if self.status and self.status.get("booted") and self.status.get("started"):
            recovery.startup_s = round(self.status["started"] - self.status["booted"], 3)
        self._save_recovery()
        self.say(f"tpu | resumed: {recovery.text()}")
        self.pending = None

    # ------------------------------------------------------------------ following

    def _read(self) -> None:
        for line in self.log.new_lines():
            self.out(line)
            if self.log.step is not None:
                self.on_step(self.log.step)
        for worker in range(self.hosts):
            if (self.statuses.get(worker) or {}).get("phase") == "ended":
                continue  # its last word
            status = host_status(self.model_dir, self.vm, worker)
            if status is not None:
                self.statuses[worker] = status
        self._read_unreported()
        self._note_install()
        self._check_resumed()

    def _note_install(self) -> None:
        """The VM's install in its record, once its chief says it ended: its seconds from boot and where it came
        from (the run's wheelhouse, or the package index for the host that built it; none in a rehearsal)."""
        status = self.status or {}
        entry = next((item for item in self.record.vms if item.get("vm") == self.vm), None) if self.record else None
        if entry is None or "install_s" in entry or not status.get("installed") or not status.get("booted"):
            return
        entry["install_s"] = round(status["installed"] - status["booted"], 3)
        if status.get("installed_from"):
            entry["installed_from"] = status["installed_from"]
        self.record.save(self.model_dir)

    def _read_unreported(self) -> None:
        """A host that wrote no status may have failed without being able to (it cannot write run.model_dir):
        its startup script then left why in the VM's guest attributes (`startup.sh`'s `unreported`), read here,
        so that the run ends at once with the reason rather than after --host-timeout as a lost VM."""
        silent = [worker for worker in range(self.hosts) if worker not in self.statuses]
        if not silent or self.life is None:
            return
        try:
            found = self.life.guest_attributes(layout.GUEST_NAMESPACE)
        except TpuLaunchError:
            return  # not readable now: the host timeout still catches a host that never reports
        for worker in silent:
            failed = (found[worker] if worker < len(found) else {}).get(layout.GUEST_FAILED_KEY)
            if failed:
                self.statuses[worker] = {"worker": worker, "role": "startup", "phase": "starting", "failed": failed,
                                         "exit_code": 1, "unreported": True}

    def _end(self, outcome: str) -> None:
        self.record.outcome = outcome
        self.record.final_step = self.log.step if self.log else None
        self.record.ended = time.time()
        self.record.save(self.model_dir)

    def _remove_node(self) -> None:
        if self.keep_tpu:
            self.say(f"tpu | {self.life.described} kept (--keep-tpu): `{self.down_command()}` removes it")
            return
        self.say(f"tpu | deleting {self.life.described}: the run is over (its output is in run.model_dir)")
        self.life.delete(wait_s=self.create_timeout_s)
        self.removed = True

    def run(self, record: RunRecord) -> None:
        """Until the job ends: returns when it is done; raises TpuLaunchError when it failed or cannot go on, naming
        the node when one is left (with the command that removes it): nothing the run created is left unsaid."""
        try:
            self._run(record)
        except TpuLaunchError as failed:
            self._name_leftover(failed)
            raise
        except Exception:  # not one of ours: still say what the run leaves behind before it surfaces
            probe = TpuLaunchError("the controller stopped")
            self._name_leftover(probe)
            if probe.hint:
                self.say(f"tpu | {probe.message.split('; ', 1)[-1]}: {probe.hint}")
            raise

    def down_command(self) -> str:
        """What removes the node: `tpulaunch down JOB`, which finds it in the zone run.json names (a fallback's)."""
        return f"tpulaunch down {self.job_file}"

    def _name_leftover(self, failed: TpuLaunchError) -> None:
        if self.removed or self.down_command() in f"{failed.message} {failed.hint or ''}":
            return
        try:
            states = [node.get("state") for node in self.life.read_nodes() if node is not None]
            left = f"{self.life.described} ({', '.join(map(str, states))}) in {self.ref.zone}" if states else ""
        except Exception as exc:  # the API is failing too: say what could not be checked
            left = f"possibly {self.life.described} in {self.ref.zone} (could not check: {exc})"
        if left:
            failed.message = f"{failed.message}; left: {left}"
            failed.hint = f"`{self.down_command()}` removes it" + (f"; {failed.hint}" if failed.hint else "")

    def _run(self, record: RunRecord) -> None:
        previous = self.previous = RunRecord.load(self.model_dir)
        if previous is not None and previous.stage == record.stage and previous.outcome is None:
            record = previous  # a controller that was killed or detached: its record goes on
        self.record = record
        self.record.save(self.model_dir)
        self._attach()
        while True:
            self._read()
            if self._hosts_decide():
                return
            # every slice's node: one lost (preempted, gone) loses the run's queued resource, recreated whole (as
            # Cloud TPU recreates a multislice queued resource), its hosts resuming from the newest checkpoint
            states = [node.get("state") if node is not None else cluster.NOT_FOUND for node in self.life.read_nodes()]
            lost = next((state for state in states if causes.node_cause(state)), None)
            if lost is not None:
                self._recover(str(lost) if len(states) == 1 else f"{lost} ({self.life.node_names[states.index(lost)]})")
                continue
            late = self._late_hosts()
            if late:
                self._recover(late)
                continue
            time.sleep(self.poll_s)

    def _hosts_decide(self) -> bool:
        """What the hosts' statuses say: True when the run is done; recovers or raises when a host failed."""
        for worker, status in sorted(self.statuses.items()):
            if status.get("failed"):
                self._startup_failed(worker, status)
        training = [w for w, status in self.statuses.items() if status.get("role") == "train"]
        for worker in sorted(training, key=lambda w: (w != 0, w)):  # the chief's word first
            code = self.statuses[worker].get("exit_code")
            if code is None or code == 0:
                continue
            self._read()
            text = causes.exit_text(code)
            who = f"worker {worker}" + (" (the chief)" if worker == 0 and self.hosts > 1 else "")
            holder = self.statuses[worker].get("lease_holder")
            if holder:
                self._contention(who, code, holder)
            if causes.exit_cause(code) == causes.INFRASTRUCTURE:
                self._recover(f"{who}: {text}" if self.hosts > 1 else text)
                return False
            message = self.statuses[worker].get("message") or ""
            self._end(f"failed: {text}")
            self._remove_node()
            raise TpuLaunchError(
                f"the job failed on the TPU VM ({who}, {text}){': ' + message if message else ''}; not "
                "retried: a failure of the job's own is not an infrastructure failure",
                hint=f"its whole output: {layout.host_log(self.model_dir, self.vm, worker)}",
                exit_code=ExitCode(code) if code in set(int(c) for c in ExitCode) else ExitCode.PROBLEMS)
        done = self.status is not None and self.status.get("exit_code") == 0 and all(
            self.statuses.get(w, {}).get("exit_code") == 0 for w in training)
        if done:
            self._read()
            self._finish()
        return done

    def _contention(self, who: str, code: int, holder: dict) -> None:
        """The VM's train was refused model_dir's lease (or lost it): another run writes model_dir. Not the job's
        failure, and not recovered by a new VM while that run lives: the run ends saying who holds it."""
        from tpulaunch.run.lease import holder_text

        holder_words = f"{holder.get('command') or 'a run'} by {holder_text(holder)}"
        self._end(f"failed: {causes.CONTENTION}: run.model_dir held by {holder_words}")
        self._remove_node()
        raise TpuLaunchError(
            f"VM {self.vm} of the run could not train ({who}, exit code {code}): run.model_dir's lease is held by "
            f"{holder_words}, another run writing {self.model_dir}; not a failure of the job's own",
            hint="wait for that run to end, or stop it, then rerun: it resumes from model_dir's newest checkpoint",
            exit_code=ExitCode.CLUSTER)

    def _startup_failed(self, worker: int, status: dict) -> None:
        """A host whose startup script failed a step (an install, fetching tpulaunch): not retried, since the same
        script fails the same way on a new VM; the run ends naming the host, with the end of its output."""
        tail = [line for line in status.get("log_tail") or [] if line.strip()][-6:]
        self._end(f"failed: worker {worker}: {status['failed']}")
        self._remove_node()
        if status.get("unreported"):  # from the VM's guest attributes: run.model_dir has none of its output
            output = ("its whole startup output stays on the host (~/tpulaunch/startup.log; rerun with --keep-tpu to "
                      "read it there); the TPU VM's service account needs roles/storage.objectAdmin on "
                      "run.model_dir's bucket")
        else:
            output = (f"its whole startup output: {layout.host_startup_log(self.model_dir, self.vm, worker)}; fix the "
                      "job's requirements (or this tpulaunch's extra)")
        raise TpuLaunchError(
            f"worker {worker} of {self.life.described} (VM {self.vm} of the run) failed while "
            f"{status.get('phase') or 'starting'}: {status['failed']}; not retried: a new VM runs the same startup "
            "script" + ("; its output ends:\n  " + "\n  ".join(tail) if tail else ""),
            hint=f"{output} and rerun", exit_code=ExitCode.CLUSTER)

    def _late_hosts(self) -> Optional[str]:
        """The hosts that have not started their part within host_timeout_s of the VM being READY, in words (the
        cause of a recovery), or None. A host that wrote no status at all either never booted its startup script
        or cannot write run.model_dir (the VM's service account)."""
        waited = time.monotonic() - self.ready_at
        if waited <= self.host_timeout_s:
            return None
        late = []
        for worker in range(self.hosts):
            status = self.statuses.get(worker)
            if status is None:
                late.append(f"worker {worker} wrote no status (it did not run its startup script, or the VM's "
                            f"service account cannot write {self.model_dir})")
            elif status.get("phase") in STARTING:
                late.append(f"worker {worker} {STARTING[status['phase']]}")
        if not late:
            return None
        return f"a host did not start within {self.host_timeout_s:g} s (--host-timeout): " + "; ".join(late)

    def _finish(self) -> None:
        self._end("done")
        recoveries = [Recovery(**{k: v for k, v in r.items() if k in Recovery.__dataclass_fields__})
                      for r in self.record.recoveries]
        total = self.log.total
        words = [f"run | done | step {self.log.step if self.log.step is not None else '?'}"
                 + (f"/{total}" if total else ""), f"{len(self.record.vms)} VM{'s' if len(self.record.vms) != 1 else ''}"]
        if recoveries:
            words.append(f"{len(recoveries)} recover{'ies' if len(recoveries) != 1 else 'y'} ("
                         + "; ".join(r.text() for r in recoveries) + ")")
            words.append(f"{sum(r.steps_lost or 0 for r in recoveries)} steps lost")
        words.append(f"{time.time() - self.record.started:.0f} s")
        self._remove_node()
        self.out(" | ".join(words))


def slice_hosts(node: Optional[dict], accelerator_type: str) -> int:
    """How many hosts the node's slice has: its network endpoints (one per host), else as its type says."""
    endpoints = len((node or {}).get("networkEndpoints") or [])
    if endpoints:
        return endpoints
    from tpulaunch.tpu.types import lookup

    found = lookup(accelerator_type)
    return found.hosts if found else 1
