"""`train`, `evaluate` and `export` end to end: real TPUEstimator on CPU, real TFRecords, real signals."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

import yaml
from click.testing import CliRunner

from paths import REPO
from train_jobs import JOB, MODELS, write_records
from tpulaunch.cli import run as cli_run
from tpulaunch.engine.estimator import runner
from tpulaunch.engine.core.model_dir import JOB_COPY, checkpoint_step
from tpulaunch.errors import ExitCode, TpuLaunchError
from tpulaunch.job.load import load_job
from tpulaunch.job.yamlfile import SECRET_MASK
from tpulaunch.run import phases
from tpulaunch.run.events import PhaseStarted, RunRecorder, StepsRun
from tpulaunch.run.signals import EvaluationStopped, TrainingStopped
from tpulaunch.plan.build import build_plan

TRAIN_COMMAND = [sys.executable, "-m", "tpulaunch", "train"]


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("train")
    (root / "train_models.py").write_text(MODELS)
    (root / "job.yaml").write_text(JOB)
    write_records(root / "data" / "train.tfrecord", 64, seed=1)
    write_records(root / "data" / "eval.tfrecord", 32, seed=2)
    return root


def invoke(command, *args: str):
    result = CliRunner().invoke(command, list(args), catch_exceptions=False)
    return result


def lines(text: str, prefix: str) -> list:
    return [line for line in text.splitlines() if line.startswith(prefix)]


def eval_steps(text: str) -> list:
    return [int(re.match(r"eval \| step (\d+) \|", line).group(1)) for line in lines(text, "eval | step")]


@pytest.fixture(scope="module")
def runs(project):
    """One model_dir, three `train --local` runs: to step 6, the same again, then on to step 8."""
    job = str(project / "job.yaml")
    first = invoke(cli_run.train, job, "--local")
    again = invoke(cli_run.train, job, "--local")
    further = invoke(cli_run.train, job, "--local", "--set", "train.steps=8")
    return first, again, further


def model_dir(project: Path) -> str:
    return str(project / "runs" / "cnn")


def test_train_reaches_the_step_evaluating_on_the_way(runs):
    first = runs[0]
    assert first.exit_code == 0, first.output
    assert eval_steps(first.output) == [3, 6]
    assert [line.split(" | ")[:2] for line in lines(first.output, "done")] == [["done", "step 6/6"]]
    assert lines(first.output, "train | start") == [f"train | start | step 0/6 | batch 8 | model_dir {runs_dir(runs)}"]


def runs_dir(runs) -> str:
    # The start line names the absolute model_dir (relative paths are anchored at the job file).
    return re.search(r"model_dir (\S+)", runs[0].output).group(1)


def test_rerun_resumes_and_adds_no_steps(project, runs):
    _, again, further = runs
    assert runs_dir(runs) == model_dir(project)

    assert again.exit_code == 0, again.output
    assert f"already at step 6 of 6 in {model_dir(project)}; nothing to train" in again.output.splitlines()
    assert lines(again.output, "train | start") == []

    assert further.exit_code == 0, further.output
    assert f"resumed from step 6 ({model_dir(project)})" in further.output.splitlines()
    (done,) = lines(further.output, "done")
    assert done.startswith("done | step 8/8 | 2 steps in "), done
    assert eval_steps(further.output) == [8]
    assert checkpoint_step(model_dir(project)) == 8


def test_model_dir_keeps_the_resolved_job_with_secrets_masked(project, runs):
    with open(os.path.join(model_dir(project), JOB_COPY)) as handle:
        copy = yaml.safe_load(handle)
    assert copy["model"]["params"] == {"num_classes": 2, "service_api_key": SECRET_MASK}
    assert copy["train"] == {"batch_size": 8, "steps": 8}
    assert copy["run"]["model_dir"] == model_dir(project)
    assert copy["data"]["train"] == str(project / "data" / "train.tfrecord")


def test_resuming_with_another_model_is_refused(project, runs):
    loaded = load_job(str(project / "job.yaml"), ["model.params.num_classes=3"])
    with pytest.raises(TpuLaunchError, match=r"holds checkpoints of a job with a different model$"):
        runner.train(loaded.job, build_plan(loaded.job, local=True), search_path=[str(project)])
    assert checkpoint_step(model_dir(project)) == 8


def test_evaluate_scores_the_latest_checkpoint(project, runs):
    result = invoke(cli_run.evaluate, str(project / "job.yaml"), "--local")
    assert result.exit_code == 0, result.output
    (line,) = lines(result.output, "eval")
    match = re.fullmatch(r"eval \| step 8 \| accuracy ([0-9.]+) \| loss ([0-9.e-]+)", line)
    assert match, line
    assert float(match.group(1)) >= 0.75


def test_export_writes_a_servable_saved_model(project, runs, tmp_path):
    result = invoke(cli_run.export, str(project / "job.yaml"), str(tmp_path / "exported"))
    assert result.exit_code == 0, result.output
    (line,) = lines(result.output, "exported ")
    path = line[len("exported "):]
    serve = tf.saved_model.load(path).signatures["serving_default"]

    assert {k: v.shape.as_list() for k, v in serve.structured_input_signature[1].items()} == {"image": [None, 8, 8, 1]}
    outputs = serve(image=tf.ones([3, 8, 8, 1]))
    assert {k: v.shape.as_list() for k, v in outputs.items()} == {"outputs": [3, 2]}
    # Bright images were class 1 in training: the exported model has the trained weights.
    assert np.argmax(outputs["outputs"].numpy(), axis=-1).tolist() == [1, 1, 1]


def test_invalid_job_is_refused_with_its_location(project, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(JOB.replace("train: {batch_size: 8, steps: 6}", "train: {batch_size: 8, steps: -6}")
                      .replace("runs/cnn", str(tmp_path / "never")))
    result = CliRunner().invoke(cli_run.train, [str(bad), "--local"])

    assert result.exit_code == 1
    located = [line for line in result.output.splitlines() if line.startswith(f"{bad}:")]
    line = bad.read_text().splitlines().index("train: {batch_size: 8, steps: -6}") + 1
    assert located and re.match(rf"{re.escape(str(bad))}:{line}:\d+: train\.steps: ", located[0]), result.output
    assert not (tmp_path / "never").exists()


def test_sigint_saves_a_checkpoint_and_the_rerun_finishes_exactly(project, tmp_path):
    """Ctrl-C once a progress line shows training under way, in a run far longer than the test lasts,
    so the signal lands in training however fast this machine is."""
    command = [*TRAIN_COMMAND, str(project / "job.yaml"), "--local", "--model-dir", str(tmp_path / "run"),
               "--set", "eval.every_steps=null", "--set", "run.log_every_steps=10"]
    env = dict(os.environ, PYTHONUNBUFFERED="1", CI="1", PYTHONPATH=str(REPO))
    child = subprocess.Popen([*command, "--set", "train.steps=1000000"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env)
    under_way = child.stdout.readline()
    while under_way and not under_way.startswith("train | step "):
        under_way = child.stdout.readline()
    assert under_way.startswith("train | step 10/1000000 | "), child.stderr.read()
    child.send_signal(signal.SIGINT)
    out, err = child.communicate(timeout=120)

    assert child.returncode == 130, err
    stopped = re.search(r"stopped at step (\d+), checkpoint saved; rerun the same command to resume", err)
    assert stopped, err
    step = int(stopped.group(1))
    assert 10 <= step < 1000000
    assert checkpoint_step(str(tmp_path / "run")) == step
    (summary,) = lines(out, "stopped (SIGINT)")
    assert summary.startswith(f"stopped (SIGINT) | step {step}/1000000 | "), summary
    # The run record says how it ended.
    (record,) = [json.loads(line) for line in (tmp_path / "run" / "tpulaunch-runs.jsonl").read_text().splitlines()]
    assert (record["outcome"], record["steps"]["to"]) == ("stopped (SIGINT)", step)

    target = step + 20
    rerun = subprocess.run([*command, "--set", f"train.steps={target}"], capture_output=True, text=True, env=env,
                           timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    assert f"resumed from step {step} ({tmp_path / 'run'})" in rerun.stdout.splitlines()
    (done,) = lines(rerun.stdout, "done")
    assert done.startswith(f"done | step {target}/{target} | 20 steps in "), done
    assert checkpoint_step(str(tmp_path / "run")) == target


@pytest.fixture(scope="module")
def long_eval(project) -> Path:
    """Eval records for 500 batches of 8: with `witnessed_classifier` (50 ms a batch), a 25 s evaluation."""
    path = project / "data" / "long_eval.tfrecord"
    write_records(path, 4000, seed=4)
    return path


def test_sigint_during_the_final_evaluation_exits_130_and_says_how_to_evaluate(project, long_eval, tmp_path):
    """Ctrl-C while the final evaluation runs: training's checkpoint stays, the unfinished evaluation is
    not reported, and the hint's command evaluates the checkpoint."""
    sets = ["--set", "model.builder=train_models:witnessed_classifier", "--set", "train.steps=4",
            "--set", "eval.every_steps=null", "--set", "eval.steps=100000", "--set", f"data.eval={long_eval}"]
    job = str(project / "job.yaml")
    env = dict(os.environ, PYTHONUNBUFFERED="1", CI="1", PYTHONPATH=str(REPO))
    child = subprocess.Popen([*TRAIN_COMMAND, job, "--local", "--model-dir", str(tmp_path / "run"), *sets],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    line = child.stdout.readline()  # the event: the run says its (500-batch) evaluation has begun
    while line and line.rstrip("\n") != "phase | evaluation":
        line = child.stdout.readline()
    assert line, child.communicate(timeout=60)
    child.send_signal(signal.SIGINT)
    out, err = child.communicate(timeout=120)

    assert child.returncode == ExitCode.INTERRUPTED == 130, err
    model_dir = tmp_path / "run"
    model_dir_set = f"run.model_dir={json.dumps(str(model_dir))}"
    command = shlex.join(["tpulaunch", "evaluate", job, "--local", *sets, "--set", model_dir_set])
    assert err.splitlines()[-2:] == [
        "stopped at step 4, checkpoint saved; training is complete, but the final evaluation did not finish and is "
        "not reported",
        f"hint: to evaluate that checkpoint: {command}"]
    assert lines(out, "eval") == []
    (summary,) = lines(out, "stopped (SIGINT)")
    assert summary.startswith("stopped (SIGINT) | step 4/4 | 4 steps in "), summary
    assert checkpoint_step(str(model_dir)) == 4
    assert not list(model_dir.glob("eval/events.out.tfevents.*"))  # no partial metrics for TensorBoard either

    # The hint's command works (here on 2 batches rather than the whole long file).
    hinted = shlex.split(command)
    evaluated = subprocess.run([sys.executable, "-m", *hinted, "--set", "eval.steps=2"], capture_output=True,
                               text=True, env=env, timeout=300)
    assert evaluated.returncode == 0, evaluated.stderr
    (scored,) = lines(evaluated.stdout, "eval |")
    assert re.fullmatch(r"eval \| step 4 \| accuracy [0-9.]+ \| loss [0-9.e-]+", scored)


def test_sigint_during_a_periodic_evaluation_stops_there_without_reporting_it(project, long_eval, tmp_path):
    run_dir = tmp_path / "periodic"
    loaded = load_job(str(project / "job.yaml"), [f"run.model_dir={run_dir}", "train.steps=8", "eval.every_steps=4",
                                                  "eval.steps=100000", f"data.eval={long_eval}",
                                                  "model.builder=train_models:witnessed_classifier"])

    recorder = RunRecorder(total_steps=8, batch_size=8)
    handler_before = signal.getsignal(signal.SIGINT)  # Python's default, or SIG_IGN under a parent that ignores it

    def interrupt_once_evaluating(event):  # the event: the recorder reports the evaluation's phase beginning
        if isinstance(event, PhaseStarted) and event.name == phases.EVALUATION:
            os.kill(os.getpid(), signal.SIGINT)

    recorder.subscribe(interrupt_once_evaluating)
    with pytest.raises(EvaluationStopped) as stopped:
        runner.train(loaded.job, build_plan(loaded.job, local=True), search_path=[str(project)], recorder=recorder)

    assert (stopped.value.exit_code, stopped.value.step, stopped.value.final) == (ExitCode.INTERRUPTED, 4, False)
    assert stopped.value.message == ("stopped at step 4, checkpoint saved; the evaluation at that step did not finish "
                                     "and is not reported; rerun the same command to resume training")
    assert stopped.value.checkpoint == str(run_dir / "model.ckpt-4")
    assert (stopped.value.summary.stopped_by, stopped.value.summary.evals) == ("SIGINT", [])
    assert checkpoint_step(str(run_dir)) == 4
    assert signal.getsignal(signal.SIGINT) is handler_before  # the handler it found is back


def test_sigterm_stops_training_with_exit_code_143_and_a_checkpoint(project, tmp_path):
    run_dir = tmp_path / "term"
    loaded = load_job(str(project / "job.yaml"), [f"run.model_dir={run_dir}", "train.steps=100000",
                                                  "eval.every_steps=null"])

    # The signal goes out on an event, not after a time: the first training step past step 0 has finished.
    recorder = RunRecorder(total_steps=100000, batch_size=8)
    stepped = threading.Event()
    recorder.subscribe(lambda event: stepped.set() if isinstance(event, StepsRun) and event.step > 0 else None)

    def terminate_once_training():
        stepped.wait(120)
        os.kill(os.getpid(), signal.SIGTERM)

    killer = threading.Thread(target=terminate_once_training, daemon=True)
    killer.start()
    with pytest.raises(TrainingStopped) as stopped:
        runner.train(loaded.job, build_plan(loaded.job, local=True), recorder=recorder, search_path=[str(project)])
    killer.join()

    assert stopped.value.exit_code == ExitCode.TERMINATED == 143
    assert 0 < stopped.value.step < 100000
    assert checkpoint_step(str(run_dir)) == stopped.value.step
    assert stopped.value.summary.final_step == stopped.value.step
    assert stopped.value.summary.stopped_by == "SIGTERM"
    # The handler is gone again: SIGTERM has its previous meaning after training.
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_skip_corrupt_counts_the_records_it_skipped(project, tmp_path):
    """Five records of a shard do not parse: training skips them and says how many.

    With data.cache the shard is read once and then replayed, so the count is exact: every bad record.
    """
    shard = tmp_path / "mixed.tfrecord"
    bad_at = {2, 5, 9, 13, 17}
    good = tmp_path / "good.tfrecord"
    write_records(good, 24 - len(bad_at), seed=3)
    clean = iter(tf.data.TFRecordDataset(str(good)).as_numpy_iterator())
    short = tf.train.Example(features=tf.train.Features(feature={  # 10 values where the job declares 64
        "image": tf.train.Feature(float_list=tf.train.FloatList(value=[0.5] * 10)),
        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[1]))})).SerializeToString()
    with tf.io.TFRecordWriter(str(shard)) as writer:
        for index in range(24):
            writer.write(short if index in bad_at else next(clean))

    sets = ["--set", f"data.train={shard}", "--set", f"data.eval={shard}", "--set", "data.skip_corrupt=true",
            "--set", "data.cache=true", "--set", "train.steps=12", "--set", "eval.every_steps=12",
            "--set", f"run.model_dir={tmp_path / 'run'}"]
    result = invoke(cli_run.train, str(project / "job.yaml"), "--local", *sets)
    assert result.exit_code == 0, result.output
    notes = lines(result.output, "data.skip_corrupt: skipping records that fail to parse (")
    assert len(notes) == 1, result.output
    (done,) = lines(result.output, "done | step 12/12")
    assert done.endswith(" | 5 records skipped (data.skip_corrupt)"), done
    # Evaluation reads the same shard in order: two batches of 8 good records pass all five bad ones.
    (evaluation,) = lines(result.output, "eval | step 12")
    assert evaluation.endswith(" | 5 records skipped (data.skip_corrupt)"), evaluation

    again = invoke(cli_run.evaluate, str(project / "job.yaml"), "--local", *sets)
    assert again.exit_code == 0, again.output
    assert lines(again.output, "eval | step 12")[0].endswith(" | 5 records skipped (data.skip_corrupt)"), again.output


def test_a_rerun_after_the_last_step_evaluates_what_the_run_left_unevaluated(project, tmp_path):
    """A run that reached its last step but not its final evaluation (killed, or run without eval): the rerun
    trains nothing and evaluates, so the run's result exists (every engine runs this one loop: engine/core/loop.py)."""
    job = str(project / "job.yaml")
    run_dir = tmp_path / "run"
    trained = invoke(cli_run.train, job, "--local", "--set", f"run.model_dir={run_dir}", "--set", "eval=null")
    assert trained.exit_code == 0, trained.output
    assert eval_steps(trained.output) == []

    rerun = invoke(cli_run.train, job, "--local", "--set", f"run.model_dir={run_dir}")
    assert rerun.exit_code == 0, rerun.output
    assert f"already at step 6 of 6 in {run_dir}; nothing to train" in rerun.output.splitlines()
    assert lines(rerun.output, "train | start") == []
    assert eval_steps(rerun.output) == [6]
