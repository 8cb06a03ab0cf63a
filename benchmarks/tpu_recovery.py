"""Recovery time and steps lost when the TPU is preempted, then deleted, under `train --recreate`.

One process: the local Cloud TPU API server of the test suite (tests/tpu_api_server.py, v2 over REST,
through the real google-cloud-tpu), and `tpulaunch train JOB --local --watch-node --auto-resume 2
--recreate` on a tiny job on the CPU (10 ms per step, a checkpoint every 20 steps). When checkpoint 20
is written the server marks the node PREEMPTED; once the node was created again and a checkpoint at 40
or later is written, it deletes the node. Both are events of the run, not times.

Per recovery it prints (from the run record, model_dir/tpulaunch-runs.jsonl, and the run's output):
- recovery: seconds from noticing the loss to the first step trained after it (`recovery_s`);
- recreate: seconds the delete + create + wait for READY took against the API (`recreated in`);
- steps lost: steps trained after the last complete checkpoint (trained again after the resume).
The server finishes a create after `--create-reads` requests; tpulaunch polls with the CLI's own
pauses (2 s, then doubling), so "recreate" is mostly those pauses. Goal: recovery <= 10 s + the API's
create time; 0 steps lost.

Run: .venv/bin/python benchmarks/tpu_recovery.py [--runs 3] [--interval 0.1] [--create-reads 2]
Exits 1 when a run does not finish at train.steps or loses steps.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]  # watched_runs.MODELS
os.environ.setdefault("NO_GCE_CHECK", "True")


def job_text(steps: int) -> str:
    return textwrap.dedent(f'''
        name: recovery
        model: {{builder: slow_models:slow_classifier, optimizer: {{name: sgd, learning_rate: 0.1}}}}
        data:
          train: data/train.tfrecord
          features: {{x: {{shape: [4]}}}}
          labels: {{label: {{shape: [], dtype: int64}}}}
        train: {{batch_size: 8, steps: {steps}}}
        tpu: {{name: my-tpu, zone: us-central1-a, project: test-project, type: v3-8,
              runtime_version: tpu-vm-tf-2.15.1-se}}
        run: {{model_dir: runs/x, save_checkpoints_steps: 20, keep_checkpoint_max: 20, log_every_steps: 1000}}
    ''')


def write_project(root: Path, steps: int) -> None:
    """The test suite's slow model (10 ms a step: tests/watched_runs.py's MODELS), its job and 64 records."""
    import numpy as np
    from records import write_examples
    from watched_runs import MODELS

    (root / "slow_models.py").write_text(MODELS)
    (root / "job.yaml").write_text(job_text(steps))
    (root / "data").mkdir()
    rng = np.random.default_rng(0)
    labels = [int(rng.integers(2)) for _ in range(64)]
    write_examples(root / "data" / "train.tfrecord",
                   [{"x": (rng.normal(size=4) + 2 * label - 1).astype(np.float32), "label": label} for label in labels])


def when_checkpoint(model_dir: Path, step: int, action, after=lambda: True) -> threading.Thread:
    def written() -> bool:
        return after() and any(int(p.name.split("-")[1].split(".")[0]) >= step for p in model_dir.glob("model.ckpt-*.index"))

    def run():
        deadline = time.monotonic() + 600
        while not written() and time.monotonic() < deadline:
            time.sleep(0.005)
        action()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def one_run(root: Path, args) -> dict:
    from click.testing import CliRunner
    from tpu_api_server import TpuApiServer

    from tpulaunch.cli import run as cli_run
    from tpulaunch.run.record import local_records

    server = TpuApiServer(create_reads=args.create_reads).start()
    os.environ["TPULAUNCH_TPU_API_ENDPOINT"] = server.endpoint
    os.environ["TPULAUNCH_TPU_DISCOVERY_URL"] = server.discovery_url
    server.set_node("my-tpu", tensorflow_version="2.15.1")
    model_dir = Path(tempfile.mkdtemp(dir=root))
    try:
        threads = [when_checkpoint(model_dir, 20, lambda: server.patch_node("my-tpu", state="PREEMPTED")),
                   when_checkpoint(model_dir, 40, lambda: server.delete_node("my-tpu"), after=lambda: server.created)]
        result = CliRunner().invoke(cli_run.train, [
            str(root / "job.yaml"), "--model-dir", str(model_dir), "--local", "--watch-node", "--watch-interval",
            str(args.interval), "--auto-resume", "2", "--recreate"], catch_exceptions=False)
        for thread in threads:
            thread.join()
    finally:
        server.stop()
    records = local_records(str(model_dir))
    recreated = [float(m) for m in re.findall(r"recreated in (\d+\.\d) s", result.output)]
    done = [line for line in result.output.splitlines() if line.startswith("done | step")]
    return {"exit": result.exit_code, "done": done[0] if done else result.output[-500:], "events": records[-1]["events"],
            "recreated_in": recreated, "final": records[-1]["final_step"] if "final_step" in records[-1] else None}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--interval", type=float, default=0.1, help="--watch-interval (seconds)")
    parser.add_argument("--create-reads", type=int, default=2, help="polls before the server's create finishes")
    args = parser.parse_args()
    failures = 0
    recoveries, creates, lost = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_project(root, args.steps)
        sys.path.insert(0, str(root))
        os.chdir(root)
        for index in range(args.runs):
            out = one_run(root, args)
            ok = out["exit"] == 0 and out["done"].startswith(f"done | step {args.steps}/{args.steps} | {args.steps} steps")
            for event, made in zip(out["events"], out["recreated_in"]):
                recoveries.append(event["recovery_s"])
                creates.append(made)
                lost.append(event["steps_lost"])
                print(f"run {index + 1}: {event['detail']:<9} at step {event['step']:>3}: recovery "
                      f"{event['recovery_s']:.2f} s (recreate {made:.1f} s), steps lost {event['steps_lost']}")
            if not ok or len(out["events"]) != 2 or any(e["steps_lost"] for e in out["events"]):
                failures += 1
                print(f"run {index + 1}: FAILED: {out['done']}")
    if recoveries:
        print(f"\n{len(recoveries)} recoveries: recovery median {statistics.median(recoveries):.2f} s, max "
              f"{max(recoveries):.2f} s; recreate (delete + create + READY) median {statistics.median(creates):.1f} s; "
              f"steps lost: max {max(lost)}, total {sum(lost)}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
