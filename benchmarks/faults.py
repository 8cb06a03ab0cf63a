"""A fault campaign: N random faults of each kind against real CPU training runs, on any engine; after each,
the rerun is compared with an uninterrupted run.

Kinds (`--kinds`, all by default):

- sigkill, sigint, sigterm, sighup: the signal at a uniformly random moment between the process's start and the
  end of an uninterrupted run (so in the first second, during TensorFlow's import, during saves and during the
  final evaluation too);
- sigstop: the run is frozen (SIGSTOP) once training runs, past the lease's stale time; a second run takes the
  lease over and trains to the end; then the first is thawed (SIGCONT). It must write nothing more to model_dir
  (fenced), and the second's checkpoints must be the ones left;
- disk-full: model_dir on a small tmpfs that fills up during a save (skipped, saying why, where no tmpfs can be
  mounted); the rerun gets a larger disk;
- corrupt-shard: one byte of a training shard flipped: the run stops naming the file; the rerun, on the repaired
  shard, finishes;
- nan: a record whose features are NaN: the run stops with exit 1 naming the step, its last checkpoint finite;
- copied-dir: a run trained halfway, its newest checkpoint truncated and its `checkpoint` state written with absolute
  paths (as older releases wrote it), then `cp -r` to a second model_dir that trains to the end: the original must be
  left byte for byte as it was, the copy must resume from its newest complete checkpoint;
- moved-dir: the same model_dir moved (`mv`) instead: the moved one resumes from its newest complete checkpoint and
  nothing reappears at the old path;
- damaged-state: the `checkpoint` state file names only a deleted step, is missing, or is garbage: the rerun resumes
  from the newest complete checkpoint, never from step 0;
- damaged-newest: the newest checkpoint's `.data` or `.index` truncated: `evaluate` and `export` fall back to the one
  before (exit 0), and when every checkpoint is damaged `train` refuses with exit 1, naming the files, and overwrites
  none of them;
- blocking-input: a FIFO nobody writes among the training files: refused with exit 1 naming it, in bounded time (a
  SIGINT after 60 s must still stop it);
- memory-limit: the run under an address-space limit (`ulimit -v`) drawn between 2 and 8 GiB: it either trains or
  stops with exit 1 naming the limit, its record written and its lease released (never exit 70); the rerun without
  the limit finishes;
- storage-outage: run.model_dir on gs:// (fake-gcs-server behind the suite's Cloud Storage proxy, tests/gcs_fake.py),
  the store unreachable for 2 to 10 s at a random step: the run waits for it and ends at its steps, exit 0, its
  record line written and its lease released — never fenced by its own lease.

After each fault (and the rerun, where one is due) the campaign checks the final step against train.steps, that
every checkpoint the state file lists reads back with finite values, that every run record line parses (a torn line
is a lost record), that the lease is released, and counts the steps lost (the last step the output showed before
the fault, less the step the rerun starts from; a SIGKILL may lose up to save_checkpoints_steps).

Run:  .venv/bin/python benchmarks/faults.py [--per-kind 5] [--engine estimator|keras|jax] [--kinds sighup,sigstop]
      [--seed 0] (the keras and jax engines under .venv-keras). Prints one line per fault and the table for docs/reliability.md;
      exits 1 on any failure.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import hashlib
import json
import os
import random
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import interrupts  # noqa: E402  (the tiny job, its records and the output reader)

from tpulaunch.errors import ExitCode  # noqa: E402

FENCED_EXIT = int(ExitCode.LEASE_LOST)  # a run that lost model_dir's lease (docs/running.md)

SIGNAL_KINDS = {"sigkill": signal.SIGKILL, "sigint": signal.SIGINT, "sigterm": signal.SIGTERM,
                "sighup": signal.SIGHUP}
KINDS = (*SIGNAL_KINDS, "sigstop", "disk-full", "corrupt-shard", "nan", "copied-dir", "moved-dir", "damaged-state",
         "damaged-newest", "blocking-input", "memory-limit", "storage-outage")
INTERNAL_ERROR_EXIT = int(ExitCode.INTERNAL)
EXPECTED_EXIT = {signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGHUP: 129, signal.SIGKILL: -signal.SIGKILL}
RECORDS = "tpulaunch-runs.jsonl"
LEASE = "tpulaunch.lease"
# The lease's timing for the sigstop fault: renewed every 0.5 s, stale after 3 s.
FAST_LEASE = {"TPULAUNCH_LEASE_RENEW_S": "0.5", "TPULAUNCH_LEASE_STALE_S": "3"}
# The storage outage's lease: renewed every second, stale after 60 s (an outage misses renewals, far from stale); and
# TensorFlow's gs:// retrying a second apart for as long as it takes, as it waits on Cloud Storage.
OUTAGE_LEASE = {"TPULAUNCH_LEASE_RENEW_S": "1", "TPULAUNCH_LEASE_STALE_S": "60"}
PATIENT_TF = {"GCS_RETRY_CONFIG_MAX_RETRIES": "1000", "GCS_RETRY_CONFIG_MAX_DELAY_TIME_US": "1000000"}
TESTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests")

_STEP = re.compile(r"^train \| step (\d+)/")
_DONE = re.compile(r"^done \| step (\d+)/(\d+) \| (\d+) steps in")


@dataclass
class Fault:
    kind: str
    at_s: Optional[float] = None  # seconds after the process started (signals)
    exit_code: Optional[int] = None
    last_step_seen: int = 0
    resumed_from: Optional[int] = None
    final_step: Optional[int] = None
    steps_lost: int = 0
    records_lost: int = 0
    mixed_files: int = 0
    stray_files: int = 0  # files of no listed checkpoint, written by a fenced run finishing a save as it thawed
    skipped: Optional[str] = None
    detail: str = ""  # what was injected, where a time does not say it
    landed: bool = True  # False: the run had ended before the fault could land
    failures: List[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures


class Campaign:
    def __init__(self, root: str, *, engine: str, steps: int, every: int):
        self.root, self.engine, self.steps, self.every = root, engine, steps, every
        self.job = interrupts.write_project(root, steps=steps, every=every)
        self._eval_job()
        self.shard = os.path.join(root, "data", "train.tfrecord")
        self.count = 0

    def _eval_job(self) -> None:
        """The tiny job with an evaluation after training (a signal may land in it)."""
        with open(self.job) as handle:
            text = handle.read()
        text = text.replace("  train: data/train.tfrecord", "  train: data/train.tfrecord\n  eval: data/train.tfrecord")
        text = text.replace("train: {batch_size: 4", "eval: {batch_size: 4, steps: 8}\ntrain: {batch_size: 4")
        with open(self.job, "w") as handle:
            handle.write(text)

    def command(self, model_dir: str, *extra: str) -> List[str]:
        args = interrupts.train_command(self.job, model_dir)
        if self.engine != "estimator":
            args += ["--set", f"run.engine={self.engine}"]
        return args + list(extra)

    def model_dir(self, kind: str) -> str:
        self.count += 1
        return os.path.join(self.root, "runs", f"{self.count:03d}-{kind}")

    # ------------------------------------------------------------------------------------- checks

    def rerun_and_compare(self, fault: Fault, model_dir: str, *, runs_recorded: int, env: Optional[dict] = None) -> None:
        """The rerun to completion, then what an uninterrupted run would have left."""
        rerun = subprocess.run(self.command(model_dir, "--set", f"train.steps={self.steps}"), capture_output=True,
                               text=True, env=env or interrupts._env(), timeout=600)
        lines = rerun.stdout.splitlines()
        if rerun.returncode != 0:
            fault.failures.append(f"rerun exited {rerun.returncode}: {rerun.stderr[-1500:]}")
            return
        fault.resumed_from, fault.final_step = _resumed_and_final(lines)
        if fault.final_step != self.steps:
            fault.failures.append(f"the rerun ended at step {fault.final_step}, not {self.steps}")
        fault.steps_lost = max(0, fault.last_step_seen - fault.resumed_from)
        self.check_model_dir(fault, model_dir, runs_recorded=runs_recorded + 1, final=True)

    def check_model_dir(self, fault: Fault, model_dir: str, *, runs_recorded: int, final: bool,
                        damaged_on_purpose: bool = False) -> None:
        step, finite, unreadable = checkpoints_state(model_dir)
        if final and step != self.steps:
            fault.failures.append(f"the newest complete checkpoint is at step {step}, not {self.steps}")
        if not finite:
            fault.failures.append("a checkpoint holds non-finite values")
        if unreadable and not damaged_on_purpose:
            fault.failures.append(f"unreadable checkpoints: {unreadable}")
        whole, torn = read_records(model_dir)
        fault.records_lost = max(0, runs_recorded - len(whole)) + torn
        if fault.records_lost:
            fault.failures.append(f"{fault.records_lost} run records lost ({len(whole)} whole, {torn} torn, "
                                  f"{runs_recorded} expected)")
        state = lease_state(model_dir)
        if state not in (None, "released"):
            fault.failures.append(f"the lease is left {state!r}")

    def at_most_a_checkpoint_lost(self, fault: Fault, what: str) -> None:
        fault.steps_lost = 0 if fault.resumed_from is None else max(0, fault.last_step_seen - fault.resumed_from)
        if fault.steps_lost > self.every:
            fault.failures.append(f"{what} lost {fault.steps_lost} steps (> save_checkpoints_steps {self.every})")

    # ------------------------------------------------------------------------------------- kinds

    def signal_fault(self, kind: str, at_s: float) -> Fault:
        signum = SIGNAL_KINDS[kind]
        fault = Fault(kind, at_s=round(at_s, 2))
        model_dir = self.model_dir(kind)
        child = subprocess.Popen(self.command(model_dir), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 env=interrupts._env())
        reader = interrupts._Reader(child.stdout)
        reader.start()
        errors: list = []
        threading.Thread(target=lambda: errors.append(child.stderr.read()), daemon=True).start()
        try:
            child.wait(at_s)
        except subprocess.TimeoutExpired:
            fault.last_step_seen = reader.snapshot()[0]
            child.send_signal(signum)
        else:
            fault.landed = False
        try:
            child.wait(300)
        except subprocess.TimeoutExpired:
            child.kill()
            fault.failures.append(f"{kind}: still running 300 s after the signal")
        reader.join(10)
        time.sleep(0.05)  # the stderr thread drains what is left
        stderr = "".join(errors)
        fault.exit_code = child.returncode
        if fault.landed and reader.done.is_set() and child.returncode in (0, -signum):
            fault.landed = False  # training ended just as the signal came
        # A signal after the run's end (its record written, its lease released) may come during the interpreter's
        # own exit, where Python has put the default action back: nothing is left to lose then.
        expected = {EXPECTED_EXIT[signum]} | ({0, -signum} if not fault.landed else set())
        if child.returncode not in expected:
            fault.failures.append(f"exit {child.returncode}, expected {sorted(expected)}: {stderr[-1200:]}")
        if "Traceback" in stderr or "error: unexpected" in stderr:
            fault.failures.append(f"a traceback after {kind}: {stderr[-1500:]}")
        # Every run but a killed one leaves its record once it has taken model_dir's lease, whenever the signal came
        # (before TensorFlow loaded too); one stopped before that (while Python loads tpulaunch) never touched it.
        reached = os.path.exists(os.path.join(model_dir, LEASE))
        self.rerun_and_compare(fault, model_dir, runs_recorded=0 if signum == signal.SIGKILL or not reached else 1)
        if signum != signal.SIGKILL and fault.steps_lost:
            fault.failures.append(f"{kind} lost {fault.steps_lost} steps")
        if signum == signal.SIGKILL and fault.steps_lost > self.every:
            fault.failures.append(f"SIGKILL lost {fault.steps_lost} steps (> save_checkpoints_steps {self.every})")
        return fault

    def sigstop_fault(self, rng: random.Random) -> Fault:
        """Freeze the holder past the stale time, let a second run take over and finish, thaw the first."""
        fault = Fault("sigstop")
        model_dir = self.model_dir("sigstop")
        env = dict(interrupts._env(), **FAST_LEASE)
        first = subprocess.Popen(self.command(model_dir), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 env=env)
        reader = interrupts._Reader(first.stdout)
        reader.start()
        errors: list = []
        threading.Thread(target=lambda: errors.append(first.stderr.read()), daemon=True).start()
        freeze_at = rng.randint(1, self.steps * 3 // 4)
        if not _wait(lambda: reader.snapshot()[0] >= freeze_at or first.poll() is not None, 300):
            first.kill()
            fault.failures.append("the first run never started training")
            return fault
        first.send_signal(signal.SIGSTOP)
        fault.last_step_seen = reader.snapshot()[0]
        # The second run starts once the frozen holder's lease has gone stale, as a relaunch on another host would.
        stale_after = float(FAST_LEASE["TPULAUNCH_LEASE_STALE_S"]) + 0.5
        if not _wait(lambda: time.time() - (_lease(model_dir) or {}).get("renewed", time.time()) > stale_after, 60):
            fault.failures.append(f"the frozen run's lease never went stale: {_lease(model_dir)}")
        second = subprocess.run(self.command(model_dir), capture_output=True, text=True, env=env, timeout=600)
        if second.returncode != 0:
            fault.failures.append(f"the second run exited {second.returncode}: {second.stderr[-1500:]}")
        before = _checkpoint_files(model_dir)
        first.send_signal(signal.SIGCONT)
        try:
            first.wait(300)
        except subprocess.TimeoutExpired:
            first.kill()
            fault.failures.append("the thawed run did not stop")
        reader.join(10)
        time.sleep(0.05)
        fault.exit_code = first.returncode
        if first.returncode != FENCED_EXIT:
            fault.failures.append(f"the thawed run exited {first.returncode}, expected {FENCED_EXIT} (fenced): "
                                  f"{''.join(errors)[-1200:]}")
        after = _checkpoint_files(model_dir)
        changed = sorted(name for name in after if after[name] != before.get(name))
        listed = _listed_checkpoints(model_dir)
        # Mixed: a file of the winner's overwritten, or a new file of a checkpoint the state file lists. A stray: a
        # new file of no listed checkpoint (a save under way when the process froze, finished as it thawed).
        mixed = [n for n in changed if n in before or _checkpoint_prefix(n) in listed]
        fault.mixed_files = len(mixed)
        fault.stray_files = len(changed) - len(mixed)
        if mixed:
            fault.failures.append(f"the fenced run wrote {mixed} after the takeover")
        fault.resumed_from, fault.final_step = _resumed_and_final(second.stdout.splitlines())
        self.at_most_a_checkpoint_lost(fault, "the frozen run")  # what it trained after its last checkpoint
        if fault.final_step != self.steps:
            fault.failures.append(f"the second run ended at step {fault.final_step}, not {self.steps}")
        self.check_model_dir(fault, model_dir, runs_recorded=_records_written(model_dir), final=True)
        return fault

    def disk_full_fault(self) -> Fault:
        fault = Fault("disk-full")
        with small_disk(os.path.join(self.root, "disks", f"{self.count + 1:03d}"), "700k") as disk:
            if disk is None:
                fault.skipped = "no tmpfs could be mounted (needs root)"
                return fault
            model_dir = os.path.join(disk, "run")
            self.count += 1
            first = subprocess.run(self.command(model_dir, "--set", f"train.steps={self.steps * 4}"),
                                   capture_output=True, text=True, env=interrupts._env(), timeout=600)
            if first.returncode == 0:
                fault.landed = False
            _check_refused(fault, first, "the full disk", "No space left on device", allow_success=True)
            leftovers = [n for n in _listdir(model_dir) if n.endswith(".tmp") or ".tmp" in n]
            if leftovers:
                fault.failures.append(f"temporary files left behind: {leftovers}")
            subprocess.run(["mount", "-o", "remount,size=64m", disk], check=True)
            steps, self.steps = self.steps, self.steps * 4
            try:
                self.rerun_and_compare(fault, model_dir, runs_recorded=_records_written(model_dir))
            finally:
                self.steps = steps
            self.at_most_a_checkpoint_lost(fault, "the full disk")
        return fault

    def corrupt_shard_fault(self, rng: random.Random) -> Fault:
        fault = Fault("corrupt-shard")
        model_dir = self.model_dir("corrupt-shard")
        with open(self.shard, "rb") as handle:
            clean = handle.read()
        damaged = bytearray(clean)
        offset = rng.randrange(len(damaged) // 4, len(damaged))
        damaged[offset] ^= 0xFF
        try:
            with open(self.shard, "wb") as handle:
                handle.write(bytes(damaged))
            first = subprocess.run(self.command(model_dir), capture_output=True, text=True, env=interrupts._env(),
                                   timeout=600)
        finally:
            with open(self.shard, "wb") as handle:
                handle.write(clean)
        _check_refused(fault, first, "the corrupt shard", "train.tfrecord")
        self.rerun_and_compare(fault, model_dir, runs_recorded=1)
        self.at_most_a_checkpoint_lost(fault, "the corrupt shard")
        return fault

    def nan_fault(self, rng: random.Random) -> Fault:
        """A NaN record in the data: the loss turns NaN; exit 1 with the step, the checkpoints left finite."""
        fault = Fault("nan")
        model_dir = self.model_dir("nan")
        data = os.path.join(self.root, "data", f"nan-{self.count:03d}.tfrecord")
        position = rng.randrange(8, 64)
        _write_records_with_nan(data, position)
        first = subprocess.run(self.command(model_dir, "--set", f"data.train={data}", "--set", "data.shuffle_buffer=1"),
                               capture_output=True, text=True, env=interrupts._env(), timeout=600)
        _check_refused(fault, first, "a NaN loss", "NaN")
        self.check_model_dir(fault, model_dir, runs_recorded=1, final=False)
        return fault

    # ------------------------------------------------------------------------------------- model_dir's own files

    def half_trained(self, kind: str) -> str:
        """A model_dir trained to half the steps (a checkpoint every `every`): what the file faults start from."""
        model_dir = self.model_dir(kind)
        done = subprocess.run(self.command(model_dir, "--set", f"train.steps={self.steps // 2}"), capture_output=True,
                              text=True, env=interrupts._env(), timeout=600)
        if done.returncode != 0:
            raise SystemExit(f"the half run failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
        return model_dir

    def moved_fault(self, kind: str, rng: random.Random) -> Fault:
        """copied-dir / moved-dir: a damaged, absolutely-stated model_dir copied or moved, then trained on."""
        fault = Fault(kind)
        source = self.half_trained(kind)
        steps = _complete_steps(source)
        truncate_checkpoint(source, max(steps), rng.choice((".data", ".index")))
        write_absolute_state(source)
        fault.last_step_seen = steps[-2] if len(steps) > 1 else 0  # the newest complete one once the newest is cut
        target = source + "-" + ("copy" if kind == "copied-dir" else "moved")
        if kind == "copied-dir":
            shutil.copytree(source, target)
            before = _file_hashes(source)
        else:
            shutil.move(source, target)
        self.rerun_and_compare(fault, target, runs_recorded=1)
        self.at_most_a_checkpoint_lost(fault, f"the {kind.split('-')[0]} model_dir")
        if kind == "copied-dir":
            after = _file_hashes(source)
            touched = sorted(n for n in set(before) | set(after) if before.get(n) != after.get(n))
            if touched:
                fault.failures.append(f"training the copy changed the original's files: {touched}")
        elif os.path.exists(source):
            fault.failures.append(f"training the moved model_dir wrote at its old path: {_listdir(source)}")
        return fault

    def damaged_state_fault(self, rng: random.Random) -> Fault:
        """The `checkpoint` state names only a deleted step, is missing, or is garbage: resume from the newest."""
        fault = Fault("damaged-state")
        model_dir = self.half_trained("damaged-state")
        steps = _complete_steps(model_dir)
        how = rng.choice(("names a deleted step", "missing", "garbage"))
        fault.detail = f" (state {how})"
        state = os.path.join(model_dir, "checkpoint")
        if how == "names a deleted step":
            for name in _listdir(model_dir):
                if _checkpoint_prefix(name) == f"model.ckpt-{steps[-1]}":
                    os.remove(os.path.join(model_dir, name))
            with open(state, "w") as handle:
                handle.write(f'model_checkpoint_path: "model.ckpt-{steps[-1]}"\n'
                             f'all_model_checkpoint_paths: "model.ckpt-{steps[-1]}"\n')
            steps = steps[:-1]
        elif how == "missing":
            os.remove(state)
        else:
            with open(state, "wb") as handle:
                handle.write(bytes(rng.randrange(256) for _ in range(64)))
        fault.last_step_seen = steps[-1]
        self.rerun_and_compare(fault, model_dir, runs_recorded=1)
        if fault.resumed_from != steps[-1]:
            fault.failures.append(f"state {how}: resumed from {fault.resumed_from}, not the newest complete "
                                  f"checkpoint {steps[-1]}")
        return fault

    def damaged_newest_fault(self, rng: random.Random) -> Fault:
        """evaluate and export fall back from a damaged newest checkpoint; train refuses when all are damaged."""
        fault = Fault("damaged-newest")
        model_dir = self.half_trained("damaged-newest")
        steps = _complete_steps(model_dir)
        part = rng.choice((".data", ".index"))
        fault.detail = f" ({part} cut)"
        truncate_checkpoint(model_dir, steps[-1], part)
        fault.last_step_seen = steps[-1]
        where = ["--set", f"run.model_dir={model_dir}"]
        evaluated = subprocess.run([sys.executable, "-m", "tpulaunch", "evaluate", self.job, "--local", *where,
                                    *self.engine_set()], capture_output=True, text=True, env=interrupts._env(),
                                   timeout=600)
        exported = subprocess.run([sys.executable, "-m", "tpulaunch", "export", self.job, model_dir + "-export",
                                   *where, *self.engine_set()], capture_output=True, text=True,
                                  env=interrupts._env(), timeout=600)
        for verb, done in (("evaluate", evaluated), ("export", exported)):
            if done.returncode != 0 or "Traceback" in done.stderr:
                fault.failures.append(f"{verb} with the newest {part} truncated exited {done.returncode}: "
                                      f"{(done.stdout + done.stderr)[-1200:]}")
        for step in steps[:-1]:
            truncate_checkpoint(model_dir, step, part)
        before = _file_hashes(model_dir)
        first = subprocess.run(self.command(model_dir), capture_output=True, text=True, env=interrupts._env(),
                               timeout=600)
        _check_refused(fault, first, "every checkpoint damaged", f"model.ckpt-{steps[-1]}")
        after = _file_hashes(model_dir)
        overwritten = sorted(n for n in before if _checkpoint_prefix(n).startswith("model.ckpt")
                             and after.get(n) != before[n])
        if overwritten:
            fault.failures.append(f"damaged checkpoints overwritten: {overwritten}")
        self.check_model_dir(fault, model_dir, runs_recorded=_records_written(model_dir), final=False,
                             damaged_on_purpose=True)
        return fault

    def blocking_input_fault(self) -> Fault:
        """A FIFO nobody writes among the training files: refused, never a run that cannot be stopped."""
        fault = Fault("blocking-input")
        model_dir = self.model_dir("blocking-input")
        data = os.path.join(self.root, "data", f"fifo-{self.count:03d}")
        os.makedirs(data)
        shutil.copy(self.shard, os.path.join(data, "a.tfrecord"))
        os.mkfifo(os.path.join(data, "b.tfrecord"))
        child = subprocess.Popen(self.command(model_dir, "--set", f"data.train={data}/*.tfrecord"),
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=interrupts._env())
        try:
            out, err = child.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            child.send_signal(signal.SIGINT)
            try:
                out, err = child.communicate(timeout=90)
                fault.failures.append(f"a run reading a FIFO was still going after 60 s (exit {child.returncode} "
                                      f"after SIGINT)")
            except subprocess.TimeoutExpired:
                child.kill()
                out, err = child.communicate()
                fault.failures.append("a run reading a FIFO did not stop within 90 s of SIGINT")
        _check_refused(fault, subprocess.CompletedProcess(child.args, child.returncode, out, err), "a FIFO",
                       "b.tfrecord")
        self.check_model_dir(fault, model_dir, runs_recorded=_records_written(model_dir), final=False)
        return fault

    def memory_limit_fault(self, rng: random.Random) -> Fault:
        """The run under an address-space limit: it trains, or stops at exit 1 naming the limit; never exit 70."""
        fault = Fault("memory-limit")
        model_dir = self.model_dir("memory-limit")
        limit = rng.randint(2, 8) << 30
        fault.detail = f" under {limit >> 30} GiB"

        def limited():
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

        first = subprocess.run(self.command(model_dir), capture_output=True, text=True, env=interrupts._env(),
                               timeout=600, preexec_fn=limited)
        fault.exit_code = first.returncode
        fault.last_step_seen = max([int(m.group(1)) for m in map(_STEP.match, first.stdout.splitlines()) if m],
                                   default=0)
        if first.returncode == 0:
            fault.landed = False
        elif first.returncode != 1 or "limit" not in (first.stdout + first.stderr):
            fault.failures.append(f"under a {limit >> 30} GiB address-space limit: exit {first.returncode} without "
                                  f"naming the limit: {(first.stdout + first.stderr)[-1200:]}")
        reached = os.path.exists(os.path.join(model_dir, LEASE))
        self.rerun_and_compare(fault, model_dir, runs_recorded=1 if reached else 0)
        self.at_most_a_checkpoint_lost(fault, "the memory limit")
        return fault

    def storage_outage_fault(self, rng: random.Random) -> Fault:
        """model_dir on gs://, its store unreachable for a few seconds mid-run: waited for, never a takeover."""
        from pathlib import Path

        sys.path.insert(0, TESTS)  # the suite's local Cloud Storage: fake-gcs-server behind a proxy that can fail
        from gcs_fake import free_port, local_gcs
        from lease_runs import fake_gcs_server, storage_client_env

        fault = Fault("storage-outage")
        self.count += 1
        model_dir = f"gs://runs/{self.count:03d}-storage-outage"
        work = Path(self.root) / "gcs" / f"{self.count:03d}"
        work.mkdir(parents=True)
        port = free_port()
        with fake_gcs_server(port, external_url="https://www.googleapis.com"), \
                local_gcs(work, upstream_port=port) as gcs:
            gcs.make_bucket("runs")
            client_env = storage_client_env(gcs)
            env = {**interrupts._env(), **gcs.env, **client_env, **OUTAGE_LEASE, **PATIENT_TF}
            child = subprocess.Popen(self.command(model_dir), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env=env)
            reader = interrupts._Reader(child.stdout)
            reader.start()
            errors: list = []
            threading.Thread(target=lambda: errors.append(child.stderr.read()), daemon=True).start()
            at = rng.randint(1, self.steps // 2)
            if _wait(lambda: reader.snapshot()[0] >= at or child.poll() is not None, 300) and child.poll() is None:
                fault.last_step_seen = reader.snapshot()[0]
                seconds = rng.uniform(2.0, 10.0)
                fault.detail = f" ({seconds:.1f} s at step {fault.last_step_seen})"
                with gcs.outage():
                    time.sleep(seconds)  # the fault's length (what is checked is the run's end, after it)
            else:
                fault.landed = False
            try:
                child.wait(600)
            except subprocess.TimeoutExpired:
                child.kill()
                fault.failures.append("still running 600 s after the outage")
            reader.join(10)
            time.sleep(0.05)
            stderr = "".join(errors)
            fault.exit_code = child.returncode
            if child.returncode != 0:
                fault.failures.append(f"exit {child.returncode} after a storage outage: {stderr[-1500:]}")
            if "Traceback" in stderr:
                fault.failures.append(f"a traceback: {stderr[-1500:]}")
            fault.resumed_from, fault.final_step = _resumed_and_final(list(reader.lines))
            if fault.final_step != self.steps:
                fault.failures.append(f"ended at step {fault.final_step}, not {self.steps}")
            saved = {name: os.environ.get(name) for name in client_env}
            os.environ.update(client_env)
            try:
                from lease_runs import gcs_records

                from tpulaunch.run import lease as leases

                records = gcs_records(model_dir)
                held = leases.read_lease(model_dir)
            finally:
                for name, value in saved.items():
                    if value is None:
                        os.environ.pop(name, None)
                    else:
                        os.environ[name] = value
            outcomes = [record.get("outcome") for record in records]
            if outcomes != ["done"]:
                fault.records_lost = 0 if outcomes else 1
                fault.failures.append(f"run record outcomes {outcomes}, expected ['done']")
            if (held or {}).get("state") != "released":
                fault.failures.append(f"the lease is left {(held or {}).get('state')!r}")
        return fault

    def engine_set(self) -> List[str]:
        return [] if self.engine == "estimator" else ["--set", f"run.engine={self.engine}"]


def _check_refused(fault: Fault, run: subprocess.CompletedProcess, what: str, must_say: str, *,
                   allow_success: bool = False) -> None:
    """A run the fault stopped: exit 1 with a message saying `must_say`, and no traceback."""
    fault.exit_code = run.returncode
    fault.last_step_seen = max([int(m.group(1)) for m in map(_STEP.match, run.stdout.splitlines()) if m], default=0)
    said = run.stdout + run.stderr
    if not (allow_success and run.returncode == 0) and (run.returncode != 1 or must_say not in said):
        fault.failures.append(f"{what}: exit {run.returncode} without saying {must_say!r}: {said[-1200:]}")
    if "Traceback" in run.stderr or "error: unexpected" in run.stderr:
        fault.failures.append(f"a traceback on {what}: {run.stderr[-1500:]}")


# ------------------------------------------------------------------------------------------- reading model_dir

def checkpoints_state(model_dir: str):
    """(the newest complete checkpoint's step, every listed checkpoint finite, the unreadable ones)."""
    import numpy as np
    import tensorflow as tf

    from tpulaunch.engine.core.checkpoints import latest_complete_checkpoint

    newest = latest_complete_checkpoint(model_dir) if os.path.isdir(model_dir) else None
    state = tf.train.get_checkpoint_state(model_dir) if os.path.isdir(model_dir) else None
    finite, unreadable = True, []
    for path in list(state.all_model_checkpoint_paths) if state else []:
        try:
            reader = tf.train.load_checkpoint(path)
            for name in reader.get_variable_to_shape_map():
                value = np.asarray(reader.get_tensor(name))
                if value.dtype.kind in "fc" and not np.all(np.isfinite(value)):
                    finite = False
        except Exception as exc:  # noqa: BLE001 — counted, not raised
            unreadable.append(f"{os.path.basename(path)}: {str(exc).splitlines()[0][:120]}")
    return (newest[1] if newest else None), finite, unreadable


def read_records(model_dir: str):
    """(the whole run records, the number of torn lines) of model_dir's run record file."""
    path = os.path.join(model_dir, RECORDS)
    if not os.path.exists(path):
        return [], 0
    whole, torn = [], 0
    with open(path, "rb") as handle:
        for line in handle.read().decode(errors="replace").splitlines():
            if not line.strip():
                continue
            try:
                whole.append(json.loads(line))
            except ValueError:
                torn += 1
    return whole, torn


def _resumed_and_final(lines: List[str]):
    """(the step a run started from, the step it ended at) from its `done | step N/N | K steps in ...` line."""
    done = [m for m in map(_DONE.match, lines) if m]
    if not done:
        return None, None
    final, trained = int(done[-1].group(1)), int(done[-1].group(3))
    return final - trained, final


def _records_written(model_dir: str) -> int:
    return len(read_records(model_dir)[0])


def _lease(model_dir: str) -> Optional[dict]:
    try:
        with open(os.path.join(model_dir, LEASE)) as handle:
            return json.load(handle)
    except FileNotFoundError:
        return None
    except ValueError:
        return {"state": "unreadable"}


def lease_state(model_dir: str) -> Optional[str]:
    lease = _lease(model_dir)
    return None if lease is None else lease.get("state")


def _checkpoint_files(model_dir: str) -> Dict[str, tuple]:
    files = {}
    for name in _listdir(model_dir):
        if name.startswith("model.ckpt") or name.startswith("ckpt") or name == "checkpoint":
            stat = os.stat(os.path.join(model_dir, name))
            files[name] = (stat.st_size, stat.st_mtime_ns)
    return files


def _listed_checkpoints(model_dir: str) -> set:
    """The checkpoint prefixes (model.ckpt-N) the state file lists."""
    path = os.path.join(model_dir, "checkpoint")
    if not os.path.exists(path):
        return set()
    with open(path) as handle:
        return set(re.findall(r'"(?:.*/)?([^/"]+)"', handle.read()))


def _checkpoint_prefix(name: str) -> Optional[str]:
    found = re.match(r"(model\.ckpt-\d+)", name)
    return found.group(1) if found else name


def _complete_steps(model_dir: str) -> List[int]:
    """The steps of model_dir's checkpoints whose index and data files are all there, oldest first."""
    names = _listdir(model_dir)
    steps = {int(m.group(1)) for m in (re.match(r"model\.ckpt-(\d+)\.index$", n) for n in names) if m}
    return sorted(s for s in steps if any(n.startswith(f"model.ckpt-{s}.data-") for n in names))


def truncate_checkpoint(model_dir: str, step: int, part: str) -> None:
    """Cut a checkpoint's `.index` or first `.data` shard to half its size, as a torn copy leaves it."""
    name = next(n for n in sorted(_listdir(model_dir)) if n.startswith(f"model.ckpt-{step}{part}"))
    path = os.path.join(model_dir, name)
    with open(path, "r+b") as handle:
        handle.truncate(os.path.getsize(path) // 2)


def write_absolute_state(model_dir: str) -> None:
    """The `checkpoint` state with absolute paths, as TensorFlow's Saver writes it when given an absolute prefix."""
    steps = _complete_steps(model_dir)
    paths = [os.path.join(os.path.abspath(model_dir), f"model.ckpt-{s}") for s in steps]
    with open(os.path.join(model_dir, "checkpoint"), "w") as handle:
        handle.write(f'model_checkpoint_path: "{paths[-1]}"\n')
        handle.writelines(f'all_model_checkpoint_paths: "{p}"\n' for p in paths)


def _file_hashes(root: str) -> Dict[str, str]:
    hashes = {}
    for folder, _, files in os.walk(root):
        for name in files:
            path = os.path.join(folder, name)
            with open(path, "rb") as handle:
                hashes[os.path.relpath(path, root)] = hashlib.sha256(handle.read()).hexdigest()
    return hashes


def _listdir(path: str) -> List[str]:
    return os.listdir(path) if os.path.isdir(path) else []


def _wait(predicate, limit_s: float) -> bool:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def _write_records_with_nan(path: str, position: int, records: int = 64) -> None:
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(position)
    with tf.io.TFRecordWriter(path) as writer:
        for i in range(records):
            label = int(rng.integers(2))
            x = (rng.normal(size=4) + (2 * label - 1)).astype(np.float32)
            if i == position:
                x[:] = np.nan
            writer.write(tf.train.Example(features=tf.train.Features(feature={
                "x": tf.train.Feature(float_list=tf.train.FloatList(value=x.tolist())),
                "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
            })).SerializeToString())


@contextlib.contextmanager
def small_disk(path: str, size: str) -> Iterator[Optional[str]]:
    """A tmpfs of `size` at `path` when this machine lets us mount one, else None."""
    os.makedirs(path, exist_ok=True)
    mounted = os.geteuid() == 0 and subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", path],
                                                   capture_output=True).returncode == 0
    try:
        yield path if mounted else None
    finally:
        if mounted:
            subprocess.run(["umount", "-l", path], check=False)


# ------------------------------------------------------------------------------------------- the campaign

def run_campaign(root: str, *, engine: str, kinds, per_kind: int, seed: int, steps: int, every: int,
                 report=print) -> List[Fault]:
    rng = random.Random(seed)
    campaign = Campaign(root, engine=engine, steps=steps, every=every)
    window = _uninterrupted_seconds(campaign)
    report(f"{engine} engine: a tiny job of {steps} steps, a checkpoint every {every}, an evaluation at the end; "
           f"an uninterrupted run takes {window:.1f} s from process start (seed {seed})")
    faults: List[Fault] = []
    for kind in kinds:
        for _ in range(per_kind):
            if kind in SIGNAL_KINDS:
                fault = campaign.signal_fault(kind, rng.uniform(0.0, window))
            elif kind == "sigstop":
                fault = campaign.sigstop_fault(rng)
            elif kind == "disk-full":
                fault = campaign.disk_full_fault()
            elif kind == "corrupt-shard":
                fault = campaign.corrupt_shard_fault(rng)
            elif kind == "nan":
                fault = campaign.nan_fault(rng)
            elif kind in ("copied-dir", "moved-dir"):
                fault = campaign.moved_fault(kind, rng)
            elif kind == "damaged-state":
                fault = campaign.damaged_state_fault(rng)
            elif kind == "damaged-newest":
                fault = campaign.damaged_newest_fault(rng)
            elif kind == "blocking-input":
                fault = campaign.blocking_input_fault()
            elif kind == "memory-limit":
                fault = campaign.memory_limit_fault(rng)
            else:
                fault = campaign.storage_outage_fault(rng)
            faults.append(fault)
            report(_line(fault))
    return faults


def _uninterrupted_seconds(campaign: Campaign) -> float:
    began = time.monotonic()
    done = subprocess.run(campaign.command(campaign.model_dir("baseline")), capture_output=True, text=True,
                          env=interrupts._env(), timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"the uninterrupted run failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
    return time.monotonic() - began


def _line(fault: Fault) -> str:
    if fault.skipped:
        return f"{fault.kind:13s} skipped: {fault.skipped}"
    at = f" at +{fault.at_s:5.2f}s" if fault.at_s is not None else ""
    return (f"{fault.kind:13s}{at}{fault.detail}: exit {fault.exit_code}, seen step {fault.last_step_seen}, resumed from "
            f"{fault.resumed_from}, final {fault.final_step}, lost {fault.steps_lost} steps, "
            f"{fault.records_lost} records, {fault.mixed_files} mixed, {fault.stray_files} stray{'' if fault.landed else ' (ended before the fault)'}"
            + ("" if fault.ok else "  FAIL\n    " + "\n    ".join(f.replace("\n", "\n    ") for f in fault.failures)))


def table(faults: List[Fault]) -> str:
    by = collections.OrderedDict((kind, [f for f in faults if f.kind == kind]) for kind in KINDS)
    rows = ["| fault | injected | landed | survived | steps lost (total/max) | records lost | data mixed | stray files |",
            "|---|---|---|---|---|---|---|---|"]
    for kind, group in by.items():
        if not group:
            continue
        if all(f.skipped for f in group):
            rows.append(f"| {kind} | skipped: {group[0].skipped} | | | | | | |")
            continue
        lost = [f.steps_lost for f in group]
        rows.append(f"| {kind} | {len(group)} | {sum(f.landed for f in group)} | {sum(f.ok for f in group)} | "
                    f"{sum(lost)}/{max(lost, default=0)} | {sum(f.records_lost for f in group)} | "
                    f"{sum(f.mixed_files for f in group)} | {sum(f.stray_files for f in group)} |")
    done = [f for f in faults if not f.skipped]
    rows.append(f"| all | {len(done)} | {sum(f.landed for f in done)} | {sum(f.ok for f in done)} | "
                f"{sum(f.steps_lost for f in done)} | {sum(f.records_lost for f in done)} | "
                f"{sum(f.mixed_files for f in done)} | {sum(f.stray_files for f in done)} |")
    return "\n".join(rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-kind", type=int, default=5)
    parser.add_argument("--engine", choices=("estimator", "keras", "jax"), default="estimator")
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated, of: {', '.join(KINDS)}")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--every", type=int, default=5)
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args(argv)
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        parser.error(f"unknown kinds {unknown}; known: {', '.join(KINDS)}")
    root = args.workdir or tempfile.mkdtemp(prefix="tpulaunch-faults-")
    started = time.monotonic()
    faults = run_campaign(root, engine=args.engine, kinds=kinds, per_kind=args.per_kind, seed=args.seed,
                          steps=args.steps, every=args.every)
    print(f"\n{args.engine} engine, {time.monotonic() - started:.0f} s:\n" + table(faults))
    if not args.workdir:
        shutil.rmtree(root, ignore_errors=True)
    return 0 if all(f.ok for f in faults) else 1


if __name__ == "__main__":
    sys.exit(main())
