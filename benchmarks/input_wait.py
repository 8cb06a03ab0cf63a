"""What measuring the input wait costs: `tpulaunch train` steps/s with the measurement against without it.

The measurement (engine/estimator/input_wait.py) puts two timestamps around the step's `get_next()`
and fetches their difference with each session run. Both sides here are `runner.train` on the same
job, data and machine, in this process, alternating, best of --rounds each; the rate is the steady
one (each session's first step, with its start-up, left out). Two jobs: the quickstart CNN (batch
64, a realistic CPU step) and a model that barely computes (a dense layer on a 4x4 corner of the
image: the cheapest step there is, where a fixed per-step cost shows most).

    .venv/bin/python benchmarks/input_wait.py [--steps 300] [--rounds 4]

Goal: steps/s with the measurement >= 0.98 of without.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

from tpulaunch.data.synth import write_example  # noqa: E402
from tpulaunch.engine.estimator import runner  # noqa: E402
from tpulaunch.job.load import load_job  # noqa: E402
from tpulaunch.plan.build import build_plan  # noqa: E402
from tpulaunch.run.events import RunRecorder  # noqa: E402
from cnn_job import cnn_job  # noqa: E402  (benchmarks/cnn_job.py: the job every training benchmark times)


CORNER_MODEL = '''
import tensorflow as tf

def build(num_classes=10, input_shape=(32, 32, 3), **unused):
    image = tf.keras.Input(shape=tuple(input_shape), name="image")
    corner = tf.keras.layers.Cropping2D(((0, input_shape[0] - 4), (0, input_shape[1] - 4)))(image)
    return tf.keras.Model(image, tf.keras.layers.Dense(num_classes)(tf.keras.layers.Flatten()(corner)))
'''

BUILDERS = {"quickstart CNN": "tpulaunch.models.cnn:build", "barely computes": "corner_model:build"}


def steps_per_s(tmp: str, builder: str, steps: int, time_input: bool, round_: int) -> tuple:
    model_dir = os.path.join(tmp, f"run-{time_input}-{round_}")
    path = os.path.join(tmp, "job.yaml")
    with open(path, "w") as handle:
        handle.write(cnn_job("input-wait", builder=builder, data=os.path.join(tmp, "data"), model_dir=model_dir, steps=steps,
                             optimizer="sgd", learning_rate=0.01,
                             run={"save_checkpoints_steps": steps, "log_every_steps": steps}))
    job = load_job(path).job
    recorder = RunRecorder(total_steps=steps, batch_size=64, log_every_steps=steps, model_dir=model_dir)
    runner.train(job, build_plan(job, local=True), recorder=recorder, search_path=[tmp], time_input=time_input)
    shutil.rmtree(model_dir, ignore_errors=True)
    return recorder.steady_steps_per_sec, recorder.input_share


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    tf.get_logger().setLevel("ERROR")
    worst = 1.0
    with tempfile.TemporaryDirectory() as tmp:
        write_example("quickstart", os.path.join(tmp, "data"), records=2048)
        with open(os.path.join(tmp, "corner_model.py"), "w") as handle:
            handle.write(CORNER_MODEL)
        for name, builder in BUILDERS.items():
            rates = {True: [], False: []}
            shares = []
            for round_ in range(args.rounds):
                for timed in ((False, True) if round_ % 2 == 0 else (True, False)):
                    rate, share = steps_per_s(tmp, builder, args.steps, timed, round_)
                    rates[timed].append(rate)
                    if timed:
                        shares.append(share)
            best = {timed: max(values) for timed, values in rates.items()}
            ratio = best[True] / best[False]
            worst = min(worst, ratio)
            print(f"{name:<16} without {best[False]:7.2f} steps/s  with {best[True]:7.2f} steps/s  ratio {ratio:.3f}  "
                  f"(all rounds: without {', '.join(f'{r:.1f}' for r in rates[False])}; "
                  f"with {', '.join(f'{r:.1f}' for r in rates[True])}; input share measured "
                  f"{', '.join(f'{s:.0%}' for s in shares)})")
    print(f"worst ratio {worst:.3f} (goal >= 0.98)")
    return 0 if worst >= 0.98 else 1


if __name__ == "__main__":
    sys.exit(main())
