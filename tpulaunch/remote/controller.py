"""The controller of a remote run: it creates the job's TPU VM with the startup script in the node's metadata,
follows the run from outside (the host's lines and status under model_dir, the node's state from the API) and,
with `recreate` > 0, recovers from infrastructure failures (`causes.py`) by deleting the node and creating it
again with the same startup script: the job resumes from its newest complete checkpoint.

It holds nothing the run needs: killed or detached, it is started again (`tpulaunch run JOB`) and reattaches
to the node it created (the node's metadata names the stage it runs), reading its record (`run.json`) back.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, List, Optional

from tpulaunch.errors import ExitCode, TpuLaunchError
from tpulaunch.remote import causes, layout, store
from tpulaunch.remote.follow import HostLog, host_status
from tpulaunch.remote.stage import Stage
from tpulaunch.tpu import node as cluster

Say = Callable[[str], None]


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
        data = store.read(layout.run_record(model_dir))
        if not data:
            return None
        try:
            return cls(**json.loads(data))
        except (ValueError, TypeError):
            return None

    def save(self, model_dir: str) -> None:
        store.write(layout.run_record(model_dir), (json.dumps(asdict(self), indent=1) + "\n").encode())


class Controller:
    """Run the staged job on the job's TPU and supervise it until it ends, the controller detaches or gives up.

    Args:
        life: the node's Lifecycle, its NodeSpec carrying no metadata (the controller adds it per VM).
        stage: what the VMs run; startup: the startup script for it.
        recreate: infrastructure failures to recover from, at most.
        poll_s: how often the run's files and the node are read.
        start_timeout_s: how long a READY VM may take to start the job before it counts as lost.
        on_step: told each step the log shows (a rehearsal preempts the VM at the steps it was asked to).
        keep_tpu: leave the node when the run ends (else it is deleted: its output is in model_dir).
    """

    def __init__(self, life, stage: Stage, startup: str, *, job_file: str, recreate: int = 0, poll_s: float = 10.0,
                 create_timeout_s: float = 1800.0, start_timeout_s: float = 1800.0, keep_tpu: bool = False,
                 say: Say = print, out: Say = print, on_step: Callable[[int], None] = lambda step: None):
        self.life, self.stage, self.startup = life, stage, startup
        self.ref = life.ref
        self.model_dir = stage.model_dir
        self.job_file = job_file
        self.recreate, self.poll_s = recreate, poll_s
        self.create_timeout_s, self.start_timeout_s = create_timeout_s, start_timeout_s
        self.keep_tpu = keep_tpu
        self.say, self.out, self.on_step = say, out, on_step
        self.vm = 0
        self.record: Optional[RunRecord] = None
        self.log: Optional[HostLog] = None
        self.status: Optional[dict] = None
        self.pending: Optional[Recovery] = None
        self.ready_at = 0.0

    # ------------------------------------------------------------------ the node

    def _spec(self, vm: int):
        from dataclasses import replace

        metadata = ((layout.STARTUP_KEY, self.startup), (layout.STAGE_KEY, self.stage.digest),
                    (layout.ATTEMPT_KEY, str(vm)))
        return replace(self.life.spec, metadata=metadata)

    def _create(self, vm: int) -> float:
        """Create the node as the run's VM number `vm`; the seconds until it was READY."""
        self.life.spec = self._spec(vm)
        outcome = self.life.create(wait_s=self.create_timeout_s)
        self.vm = vm
        self.record.vms.append({"vm": vm, "created": time.time(), "create_s": round(outcome.seconds, 3)})
        self.record.save(self.model_dir)
        self._follow_vm()
        self.say(f"tpu | TPU node '{self.ref.name}' is READY after {outcome.seconds:.1f} s: VM {vm} of the run "
                 "starts the job (its startup script)")
        return outcome.seconds

    def _follow_vm(self) -> None:
        self.log = HostLog(self.model_dir, self.vm)
        self.status = None
        self.ready_at = time.monotonic()

    def _attach(self) -> None:
        """Find the run's node: reattach to it, wait for it, recover it, or create it."""
        node = self.life.read_node()
        if node is None:
            self._create(len(self.record.vms) + 1)
            return
        metadata = node.get("metadata") or {}
        state = node.get("state")
        if layout.STAGE_KEY not in metadata:
            raise TpuLaunchError(
                f"TPU node '{self.ref.name}' exists but was not created by `tpulaunch run` (no startup script of it)",
                hint=f"`tpulaunch down {self.job_file}` deletes it, or set tpu.name to another node",
                exit_code=ExitCode.CLUSTER)
        if metadata[layout.STAGE_KEY] != self.stage.digest:
            raise TpuLaunchError(
                f"TPU node '{self.ref.name}' runs another staged job (stage {metadata[layout.STAGE_KEY][:12]}, this "
                f"job's is {self.stage.digest[:12]}): the job file, its code or its --set values changed",
                hint=f"let that run end, or `tpulaunch down {self.job_file}` first (the checkpoints stay in "
                     "model_dir)", exit_code=ExitCode.CLUSTER)
        self.vm = int(metadata.get(layout.ATTEMPT_KEY) or 1)
        self._follow_vm()
        self._read()  # its lines so far (the step it reached, when it was lost)
        self.say(f"tpu | reattached to TPU node '{self.ref.name}' ({state}), VM {self.vm} of the run")
        if causes.node_cause(state):
            self._recover(str(state))
        elif state != "READY":
            self.life.create(wait_s=self.create_timeout_s)  # on its way: waited for

    # ------------------------------------------------------------------ recovery

    def _release_lease(self, status: Optional[dict]) -> bool:
        """Release model_dir's lease when the lost VM's train still holds it (its host and pid, as its status
        said), conditional on the lease read: the new VM then takes it at once instead of after the stale time."""
        if not status or status.get("train_pid") is None:
            return False
        from tpulaunch.run import lease as leases

        held = leases.store_for(self.model_dir)
        text, token = held.read()
        if text is None:
            return False
        try:
            data = json.loads(text)
        except ValueError:
            return False
        if data.get("state") != "held" or data.get("host") != status.get("host") or data.get("pid") != status["train_pid"]:
            return False
        released = {**data, "state": "released", "renewed": time.time(),
                    "released_by": f"tpulaunch run: VM {status.get('attempt')} of the run was lost"}
        try:
            held.replace((json.dumps(released, indent=1) + "\n").encode(), token, float(data.get("stale_after_s") or 180))
        except leases._Conflict:  # the lease changed since it was read: someone else's now, left alone
            return False
        return True

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
                f"TPU node '{self.ref.name}' was lost ({cause}){where}, and "
                + (f"all {self.recreate} recoveries were used" if self.recreate else "--recreate is 0"),
                hint=f"`tpulaunch run {self.job_file} --recreate N` creates it again and resumes from the newest "
                     f"checkpoint; `tpulaunch down {self.job_file}` removes what is left of it",
                exit_code=ExitCode.CLUSTER)
        started = time.monotonic()
        self.life.delete(wait_s=self.create_timeout_s)
        recovery.lease_released = self._release_lease(self.status)
        if recovery.lease_released:
            self.say("lease | released the lost VM's lease on run.model_dir (it held it still)")
        self.record.recoveries.append(asdict(recovery))
        self.pending = recovery
        self.say(f"tpu | recovery {used + 1} of {self.recreate}: creating TPU node '{self.ref.name}' again with the "
                 "same startup script")
        self._create(self.vm + 1)
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
        status = host_status(self.model_dir, self.vm)
        if status is not None:
            self.status = status
        self._check_resumed()

    def _end(self, outcome: str) -> None:
        self.record.outcome = outcome
        self.record.final_step = self.log.step if self.log else None
        self.record.ended = time.time()
        self.record.save(self.model_dir)

    def _remove_node(self) -> None:
        if self.keep_tpu:
            self.say(f"tpu | TPU node '{self.ref.name}' kept (--keep-tpu): `tpulaunch down {self.job_file}` removes it")
            return
        self.say(f"tpu | deleting TPU node '{self.ref.name}': the run is over (its output is in run.model_dir)")
        self.life.delete(wait_s=self.create_timeout_s)

    def run(self, record: RunRecord) -> None:
        """Until the job ends: returns when it is done; raises TpuLaunchError when it failed or cannot go on."""
        previous = RunRecord.load(self.model_dir)
        if previous is not None and previous.stage == record.stage and previous.outcome is None:
            record = previous  # a controller that was killed or detached: its record goes on
        self.record = record
        self.record.save(self.model_dir)
        self._attach()
        while True:
            self._read()
            code = (self.status or {}).get("exit_code")
            if code is not None and (self.status or {}).get("role") == "train":
                self._read()
                if code == 0:
                    self._finish()
                    return
                text = causes.exit_text(code)
                if causes.exit_cause(code) == causes.INFRASTRUCTURE:
                    self._recover(text)
                    continue
                message = self.status.get("message") or ""
                self._end(f"failed: {text}")
                self._remove_node()
                raise TpuLaunchError(
                    f"the job failed on the TPU VM (worker 0, {text}){': ' + message if message else ''}; not "
                    "retried: a failure of the job's own is not an infrastructure failure",
                    hint=f"its whole output: {self.log.url}", exit_code=ExitCode(code) if code in
                    set(int(c) for c in ExitCode) else ExitCode.PROBLEMS)
            node = self.life.read_node()
            state = node.get("state") if node is not None else cluster.NOT_FOUND
            if causes.node_cause(state):
                self._recover(str(state))
                continue
            if self.status is None and time.monotonic() - self.ready_at > self.start_timeout_s:
                self._recover(f"worker 0 did not start the job within {self.start_timeout_s:g} s")
                continue
            time.sleep(self.poll_s)

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
