"""docs/code-map.md's "Adding an engine", followed: a fourth engine is one folder (its about.py and its Engine class)
and one line in `seam/registry.py`'s ENGINES, and validate, explain and train use it through the CLI's own code,
nothing else touched. The engine here trains nothing: it tells what the verbs handed it."""

import json
import sys
import textwrap

import pytest
from click.testing import CliRunner

from records import write_examples
from tpulaunch.cli.app import cli
from tpulaunch.seam import registry

ABOUT = '''
from tpulaunch.seam.about import EngineAbout, Framework, RefusedKey

ABOUT = EngineAbout(
    name="tally",
    engine="tally_engine.engine:TallyEngine",
    title="a tally of what the verbs ask",
    local_title="a tally of what the verbs ask, on this machine",
    install_hint="pip install numpy",
    framework=Framework("NumPy", "numpy", ("numpy",)),
    versions=(None, None),
    tpu_stack=None,  # it runs on no TPU
    refused_keys=(RefusedKey("run.warm_start", "the tally engine does not warm-start", "remove run.warm_start"),),
)
'''

ENGINE = '''
import json
import os

from tpulaunch.errors import TpuLaunchError


def _tell(job, verb, **what):
    os.makedirs(job.run.model_dir, exist_ok=True)
    with open(os.path.join(job.run.model_dir, "tally.jsonl"), "a") as handle:
        handle.write(json.dumps({"verb": verb, **what}) + "\\n")


class TallyEngine:
    name = "tally"

    def load(self):
        import numpy  # noqa: F401  (its framework)

    def check_build(self, loaded, plan):
        return []

    def step_tensors(self, job, *, use_tpu):
        raise TpuLaunchError("the tally engine has no step to measure")

    def preflight(self, loaded, plan):
        return [], {}

    def train(self, job, plan, *, recorder, cluster_resolver=None, force=False, watch=None, profile=None,
              cpu_replicas=None):
        _tell(job, "train", batch=plan.batch("train").per_replica, steps=job.train.steps, watch=watch,
              cpu_replicas=cpu_replicas)
        recorder.at_step(job.train.steps)
        return recorder.finish()

    def evaluate(self, job, plan, *, recorder, checkpoint=None, cluster_resolver=None, cpu_replicas=None):
        _tell(job, "evaluate", checkpoint=checkpoint)

    def export(self, job, plan, out_dir, *, checkpoint=None, say=None):
        return out_dir

    def program(self, loaded, plan):
        return f"# the tally of job {plan.job}: train batch {plan.train_batch_size}\\n"
'''

JOB = """\
name: counted
model: {builder: tpulaunch.models.cnn:build}
data:
  train: data/train-*.tfrecord
  features: {image: {shape: [4], dtype: float32}}
  labels: {label: {shape: [], dtype: int64}}
train: {batch_size: 8, steps: 3}
run: {model_dir: runs/counted, engine: tally}
"""


@pytest.fixture
def tally(tmp_path, monkeypatch):
    """The tally engine's folder (a package outside tpulaunch) and its one registry line."""
    folder = tmp_path / "tally_engine"
    folder.mkdir()
    (folder / "__init__.py").write_text("")
    (folder / "about.py").write_text(textwrap.dedent(ABOUT))
    (folder / "engine.py").write_text(textwrap.dedent(ENGINE))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(registry.ENGINES, "tally", "tally_engine.about:ABOUT")  # the one line
    (tmp_path / "job.yaml").write_text(JOB)
    (tmp_path / "data").mkdir()
    write_examples(tmp_path / "data" / "train-0.tfrecord",
                   [{"image": [0.5] * 4, "label": i % 2} for i in range(16)])
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    for name in [m for m in sys.modules if m == "tally_engine" or m.startswith("tally_engine.")]:
        del sys.modules[name]
    registry.about.cache_clear()


def test_a_fourth_engine_is_a_folder_and_one_registry_line(tally):
    runner = CliRunner()
    refused = runner.invoke(cli, ["validate", "--static", "job.yaml", "--set", "run.warm_start={from: runs/old}"])
    assert refused.exit_code == 1, refused.output
    assert "run.warm_start: the tally engine does not warm-start" in refused.output
    assert "[tally-engine-unsupported]" in refused.output
    # TPUEstimator's own keys are refused on it as on every engine but the estimator.
    own = runner.invoke(cli, ["validate", "--static", "job.yaml", "--set", "model.model_fn=my_code:model_fn",
                              "--set", "model.builder=null"])
    assert own.exit_code == 1 and "this job runs on the tally engine" in own.output, own.output

    explained = runner.invoke(cli, ["explain", "job.yaml"])
    assert explained.exit_code == 0, explained.output
    assert explained.output == "# the tally of job counted: train batch 8\n"

    trained = runner.invoke(cli, ["train", "job.yaml", "--local"])
    tallied = [json.loads(line) for line in (tally / "runs" / "counted" / "tally.jsonl").read_text().splitlines()]
    assert tallied == [{"verb": "train", "batch": 8, "steps": 3, "watch": None, "cpu_replicas": None}], trained.output
    record = json.loads((tally / "runs" / "counted" / "tpulaunch-runs.jsonl").read_text().splitlines()[-1])
    assert record["outcome"] == "done", record
