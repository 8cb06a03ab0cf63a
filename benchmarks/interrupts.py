"""Interrupt real CPU training runs with SIGINT, SIGTERM and SIGKILL; resume each; count what was lost.

For every run (seeded): a fresh model_dir, `python -m tpulaunch train JOB --local` on a tiny job (a
one-layer builder module and TFRecords written here), a signal at a random moment of training
(checkpoints are saved every few steps, so some signals land during a checkpoint write), then the
same command again, to completion. A run passes when

- the interrupted process exits as the signal says (130 SIGINT, 143 SIGTERM, killed for SIGKILL)
  with no traceback;
- the resume exits 0, starts from the last complete checkpoint and ends at exactly train.steps;
- the final checkpoint's global_step is train.steps and every restored variable is finite;
- steps lost (the last step the progress output showed before the signal, minus the step the resume
  starts from) are 0 for SIGINT/SIGTERM and at most save_checkpoints_steps for SIGKILL, whose resume
  also starts at or after the last checkpoint the output announced.

Run: .venv/bin/python benchmarks/interrupts.py [--runs 50] [--seed 0] [--steps 300] [--every 10]
Prints one line per run and a table; exits 1 on any failure.
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from dataclasses import dataclass, field
from typing import List, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGKILL)
EXPECTED_EXIT = {signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGKILL: -signal.SIGKILL}

BUILDER = textwrap.dedent('''
    import os

    if os.environ.get("KERAS_BACKEND") == "jax":  # the jax engine trains Keras 3 models on JAX
        import keras
    else:
        import tensorflow as tf

        keras = tf.keras

    def build(num_classes=2, **unused):
        x = keras.Input(shape=(4,), name="x")
        return keras.Model(x, keras.layers.Dense(num_classes)(x))
''')

JOB = textwrap.dedent('''
    name: interrupts
    model:
      builder: tiny_builder:build
      params: {num_classes: 2}
      optimizer: {name: sgd, learning_rate: 0.1}
    data:
      train: data/train.tfrecord
      features: {x: {shape: [4]}}
      labels: {y: {shape: [], dtype: int64}}
      shuffle_buffer: 16
    train: {batch_size: 4, steps: STEPS}
    run: {model_dir: runs/default, save_checkpoints_steps: EVERY, keep_checkpoint_max: 3, log_every_steps: 1, seed: 1}
''')

_STEP = re.compile(r"^train \| step (\d+)/")
_CKPT = re.compile(r"^checkpoint \| step (\d+)")
_RESUMED = re.compile(r"^resumed from step (\d+) ")
_DONE = re.compile(r"^done \| step (\d+)/(\d+)")
_STOPPED = re.compile(r"stopped at step (\d+), checkpoint saved")


def write_project(root: str, *, steps: int, every: int, records: int = 64) -> str:
    """A tiny job, its builder module and its TFRecords under `root`; returns the job file's path."""
    import numpy as np
    import tensorflow as tf

    os.makedirs(os.path.join(root, "data"), exist_ok=True)
    with open(os.path.join(root, "tiny_builder.py"), "w") as handle:
        handle.write(BUILDER)
    job = os.path.join(root, "job.yaml")
    with open(job, "w") as handle:
        handle.write(JOB.replace("STEPS", str(steps)).replace("EVERY", str(every)))
    rng = np.random.default_rng(0)
    with tf.io.TFRecordWriter(os.path.join(root, "data", "train.tfrecord")) as writer:
        for _ in range(records):
            label = int(rng.integers(2))
            x = (rng.normal(size=4) + (2 * label - 1)).astype(np.float32)
            example = tf.train.Example(features=tf.train.Features(feature={
                "x": tf.train.Feature(float_list=tf.train.FloatList(value=x.tolist())),
                "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
            }))
            writer.write(example.SerializeToString())
    return job


def _env() -> dict:
    python_path = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    return dict(os.environ, PYTHONUNBUFFERED="1", CI="1", NO_COLOR="1", PYTHONPATH=python_path)


def train_command(job: str, model_dir: str) -> List[str]:
    return [sys.executable, "-m", "tpulaunch", "train", job, "--local", "--model-dir", model_dir]


@dataclass
class Outcome:
    """One interruption and its resume."""

    signal: str
    delay_s: float
    interrupted_exit: Optional[int] = None
    last_step_seen: int = 0  # the progress output's step when the signal was sent
    last_checkpoint_seen: Optional[int] = None
    stopped_at: Optional[int] = None  # "stopped at step N" (SIGINT/SIGTERM)
    resumed_from: Optional[int] = None
    final_step: Optional[int] = None
    steps_lost: Optional[int] = None
    finished_before_signal: bool = False
    failures: List[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures


class _Reader(threading.Thread):
    """Reads a child's stdout line by line, keeping the latest step and checkpoint seen."""

    def __init__(self, stream):
        super().__init__(daemon=True)
        self.stream = stream
        self.lines: List[str] = []
        self.step = 0
        self.checkpoint: Optional[int] = None
        self.started = threading.Event()
        self.done = threading.Event()  # the "done | step N/N" line: training has ended
        self.lock = threading.Lock()

    def run(self):
        for line in self.stream:
            line = line.rstrip("\n")
            with self.lock:
                self.lines.append(line)
                if line.startswith("train | start") or _STEP.match(line):
                    self.started.set()
                match = _STEP.match(line)
                if match:
                    self.step = max(self.step, int(match.group(1)))
                if _DONE.match(line):
                    self.done.set()
                match = _CKPT.match(line)
                if match:
                    self.checkpoint = int(match.group(1))
        self.started.set()

    def snapshot(self):
        with self.lock:
            return self.step, self.checkpoint


def interrupt_once(job: str, model_dir: str, signum: int, delay_s: float, *, steps: int, every: int,
                   timeout_s: float = 300) -> Outcome:
    """Train, send `signum` `delay_s` seconds after training starts, resume to completion, check."""
    outcome = Outcome(signal.Signals(signum).name, round(delay_s, 3))
    child = subprocess.Popen(train_command(job, model_dir), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=_env())
    reader = _Reader(child.stdout)
    reader.start()
    errors: list = []
    err_thread = threading.Thread(target=lambda: errors.append(child.stderr.read()), daemon=True)
    err_thread.start()
    if not reader.started.wait(timeout_s):
        child.kill()
        outcome.failures.append("training never started")
        return outcome
    time.sleep(delay_s)
    outcome.last_step_seen, outcome.last_checkpoint_seen = reader.snapshot()
    if child.poll() is None and not reader.done.is_set():
        child.send_signal(signum)
    else:
        # Training already ended: the process is only shutting down (or gone); nothing is left to lose.
        outcome.finished_before_signal = True
        if child.poll() is None:
            child.send_signal(signum)
    try:
        child.wait(timeout_s)
    except subprocess.TimeoutExpired:
        child.kill()
        outcome.failures.append(f"{outcome.signal}: the process did not stop within {timeout_s:.0f} s")
    reader.join(10)
    err_thread.join(10)
    stderr = "".join(errors)
    outcome.interrupted_exit = child.returncode
    if reader.done.is_set() and child.returncode in (0, -signum):
        outcome.finished_before_signal = True  # training ended between the check above and the signal
    if "Traceback" in stderr or "error: unexpected" in stderr:
        outcome.failures.append(f"traceback after {outcome.signal}:\n{stderr[-2000:]}")
    if outcome.finished_before_signal:
        if child.returncode not in (0, EXPECTED_EXIT[signum], -signum):
            outcome.failures.append(f"{outcome.signal} after training: exit {child.returncode}\n{stderr[-1500:]}")
    elif child.returncode != EXPECTED_EXIT[signum]:
        outcome.failures.append(f"{outcome.signal}: exit {child.returncode}, expected {EXPECTED_EXIT[signum]}\n{stderr[-1500:]}")
    stopped = _STOPPED.search(stderr)
    if stopped:
        outcome.stopped_at = int(stopped.group(1))

    rerun = subprocess.run(train_command(job, model_dir), capture_output=True, text=True, env=_env(),
                           timeout=timeout_s)
    _check_resume(outcome, rerun, model_dir, signum, steps=steps, every=every)
    return outcome


def _check_resume(outcome: Outcome, rerun, model_dir: str, signum: int, *, steps: int, every: int) -> None:
    out_lines = rerun.stdout.splitlines()
    if rerun.returncode != 0 or "Traceback" in rerun.stderr:
        outcome.failures.append(f"resume exited {rerun.returncode}:\n{rerun.stderr[-2000:]}")
        return
    resumed = [int(m.group(1)) for m in map(_RESUMED.match, out_lines) if m]
    already = [line for line in out_lines if line.startswith(f"already at step {steps} of {steps}")]
    outcome.resumed_from = resumed[0] if resumed else (steps if already else 0)
    done = [m for m in map(_DONE.match, out_lines) if m]
    outcome.final_step = int(done[-1].group(1)) if done else None
    if outcome.final_step != steps:
        outcome.failures.append(f"resume ended at step {outcome.final_step}, not {steps}:\n{rerun.stdout[-1000:]}")
    final, finite = _checkpoint_state(model_dir)
    if final != steps:
        outcome.failures.append(f"final checkpoint at global_step {final}, expected {steps}")
    if not finite:
        outcome.failures.append("the final checkpoint holds non-finite variables")
    outcome.steps_lost = max(0, outcome.last_step_seen - outcome.resumed_from)
    if signum in (signal.SIGINT, signal.SIGTERM):
        if outcome.steps_lost:
            outcome.failures.append(f"{outcome.signal} lost {outcome.steps_lost} steps")
        if outcome.stopped_at is not None and outcome.stopped_at != outcome.resumed_from:
            outcome.failures.append(f"stopped at step {outcome.stopped_at} but the resume starts at {outcome.resumed_from}")
    else:
        if outcome.steps_lost > every:
            outcome.failures.append(f"SIGKILL lost {outcome.steps_lost} steps (> save_checkpoints_steps {every})")
        if outcome.last_checkpoint_seen is not None and outcome.resumed_from < outcome.last_checkpoint_seen:
            outcome.failures.append(f"resume starts at {outcome.resumed_from}, before the checkpoint at "
                                    f"{outcome.last_checkpoint_seen} announced before the kill")


def _checkpoint_state(model_dir: str):
    """(global_step of the latest checkpoint, whether every variable in it is finite)."""
    import numpy as np
    import tensorflow as tf

    path = tf.train.latest_checkpoint(model_dir)
    if not path:
        return None, False
    reader = tf.train.load_checkpoint(path)
    finite = True
    for name in reader.get_variable_to_shape_map():
        value = np.asarray(reader.get_tensor(name))
        if value.dtype.kind in "fc" and not np.all(np.isfinite(value)):
            finite = False
    return int(reader.get_tensor("global_step")), finite


def measure_training_seconds(job: str, model_dir: str) -> float:
    """How long the training part of an uninterrupted run takes (from its first progress line)."""
    child = subprocess.Popen(train_command(job, model_dir), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             text=True, env=_env())
    reader = _Reader(child.stdout)
    reader.start()
    reader.started.wait(300)
    began = time.monotonic()
    reader.done.wait(300)
    ended = time.monotonic()
    child.wait(300)
    return ended - began


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=300, help="train.steps of the tiny job")
    parser.add_argument("--every", type=int, default=10, help="run.save_checkpoints_steps of the tiny job")
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    root = args.workdir or tempfile.mkdtemp(prefix="tpulaunch-interrupts-")
    job = write_project(root, steps=args.steps, every=args.every)
    window = measure_training_seconds(job, os.path.join(root, "runs", "baseline"))
    print(f"tiny job: {args.steps} steps, checkpoint every {args.every}; training takes {window:.2f} s; "
          f"signals at uniform random times in [0, {window:.2f}] s (seed {args.seed})")
    outcomes: List[Outcome] = []
    started = time.monotonic()
    try:
        _run_all(args, rng, job, root, window, outcomes)
    except KeyboardInterrupt:  # cut short: report the runs that completed
        print(f"stopped after {len(outcomes)} runs")
    print_table(outcomes, time.monotonic() - started)
    return 0 if outcomes and all(o.ok for o in outcomes) else 1


def _run_all(args, rng, job: str, root: str, window: float, outcomes: List[Outcome]) -> None:
    for i in range(args.runs):
        signum = SIGNALS[i % 3]
        delay = rng.uniform(0.0, window)
        outcome = interrupt_once(job, os.path.join(root, "runs", f"run{i:03d}"), signum, delay,
                                 steps=args.steps, every=args.every)
        outcomes.append(outcome)
        print(f"run {i:3d} {outcome.signal:7s} at +{outcome.delay_s:5.2f}s: exit {outcome.interrupted_exit}, "
              f"seen step {outcome.last_step_seen}, ckpt seen {outcome.last_checkpoint_seen}, "
              f"resumed from {outcome.resumed_from}, final {outcome.final_step}, lost {outcome.steps_lost}"
              f"{' (finished before the signal)' if outcome.finished_before_signal else ''}"
              f"{'' if outcome.ok else '  FAIL'}", flush=True)
        for failure in outcome.failures:
            print("    " + failure.replace("\n", "\n    "))


def print_table(outcomes: List[Outcome], seconds: float) -> None:
    by = collections.defaultdict(list)
    for o in outcomes:
        by[o.signal].append(o)
    print(f"\n{'signal':8s} {'interruptions':>13s} {'landed':>7s} {'resumed ok':>10s} {'steps lost (total/max)':>22s} {'failures':>8s}")
    for name in ("SIGINT", "SIGTERM", "SIGKILL"):
        group = by.get(name, [])
        lost = [o.steps_lost or 0 for o in group]
        landed = sum(not o.finished_before_signal for o in group)
        print(f"{name:8s} {len(group):13d} {landed:7d} {sum(o.ok for o in group):10d} "
              f"{f'{sum(lost)}/{max(lost, default=0)}':>22s} {sum(not o.ok for o in group):8d}")
    print(f"total: {len(outcomes)} interruptions, {sum(o.ok for o in outcomes)} resumed to exactly the requested step, "
          f"{sum(not o.ok for o in outcomes)} failures, {seconds:.0f} s")


if __name__ == "__main__":
    sys.exit(main())
