"""`validate` says OK exactly when `train` works, on models written the ways users write them.

Each job below names model code from tests/models/ (copied next to the job files, where a user keeps
it). For every job, a full `validate` (no --static) and a real `train --local` of 2 steps plus an
evaluation on tiny TFRecords must agree: validate OK <=> train exit 0, and neither says "unexpected".
A broken job must also be refused at the job key its mistake is at, by validate and by train.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from click.testing import CliRunner

from tpulaunch.cli import run as cli_run
from tpulaunch.cli import validate as cli_validate
from user_models import JOBS, assert_agreement, project, write_job  # noqa: F401  (project: the corpus's fixture)

pytestmark = pytest.mark.slow  # long end-to-end runs: its worker starts it first


@pytest.mark.parametrize("name", list(JOBS))
def test_validate_agrees_with_train(project, name):
    document, broken_at = JOBS[name]
    path = write_job(project, name, document)

    validated = CliRunner().invoke(cli_validate.validate, [str(path)], catch_exceptions=False)
    trained = CliRunner().invoke(cli_run.train, [str(path), "--local"], catch_exceptions=False)
    assert_agreement(name, path, validated, trained, broken_at)


@pytest.mark.parametrize("builder, params, expected", [
    ("two_outputs:as_dict", {"input_shape": (8, 8, 1)}, {"cls": True, "box": False}),
    ("two_outputs:as_named_list", {"input_shape": (8, 8, 1)}, [False, True]),
    ("two_outputs:as_list", {"input_shape": (8, 8, 1)}, [False, False]),
    ("sequential:build", {}, True),
    ("subclassed:build", {}, False),
    ("subclassed:build", {"probabilities": True}, True),
    ("custom_layer:build", {"input_shape": (8, 8, 1)}, False),
])
def test_each_output_is_read_as_probabilities_or_logits_from_what_produces_it(project, builder, params, expected):
    """from_logits per head: a softmax/sigmoid output layer, or op, means probabilities; anything else logits."""
    from tpulaunch.engine.portable import probabilities_of
    from tpulaunch.job.imports import resolve

    build = resolve(builder, search_path=[str(project)], what="model builder")
    with tf.Graph().as_default():
        model = build(**params)
        outputs = model(tf.zeros([2, 8, 8, 1]), training=False)
        assert probabilities_of(model, outputs) == expected


def test_the_explained_program_of_per_label_import_path_losses_and_metrics_runs(project):
    """explain imports each loss and metric the job gives as an import path, per label too, as the engine does."""
    from explained_programs import explain, run

    name = "two_outputs_dict_own_loss_and_metric"
    path = write_job(project, name, JOBS[name][0])
    program = explain(path)
    text = Path(program).read_text()
    assert "CUSTOM_LOSSES = {'two_outputs:box_distance': " in text
    assert "CUSTOM_METRICS = {'two_outputs:box_error': " in text
    printed = run(program, "train") + run(program, "evaluate")
    assert "'box/box_error'" in printed and "'cls/accuracy'" in printed, printed[-2000:]


def test_declared_probabilities_are_scored_as_probabilities(project):
    """model.outputs: probabilities makes the loss the cross-entropy of those probabilities, -log p[label]."""
    from tpulaunch.engine.portable import compute_loss, pair_heads, probabilities_of
    from tpulaunch.job.imports import resolve

    model = resolve("clipped_softmax:build", search_path=[str(project)], what="model builder")()
    images = tf.random.stateless_normal([4, 8, 8, 1], seed=[1, 2])
    labels = tf.constant([0, 1, 2, 1], tf.int64)
    outputs = model(images)
    losses = {"label": "sparse_categorical_crossentropy"}
    pairs = pair_heads(labels, outputs, probabilities_of(model, outputs), losses, [], {"label": "probabilities"})
    loss = compute_loss("sparse_categorical_crossentropy", labels, outputs, pairs)
    by_hand = -np.mean(np.log(np.take_along_axis(outputs.numpy(), labels.numpy()[:, None], axis=1)))
    np.testing.assert_allclose(float(loss), by_hand, rtol=1e-5)
    assert not pairs["label"].head.from_logits
