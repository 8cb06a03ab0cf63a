"""The user-written models corpus (tests/models/) as jobs: each job names its model code and the job key a broken one
is refused at. tests/estimator/checks/test_user_models.py runs it on the estimator engine; the keras and jax
suites run it on theirs (what differs there, they say), and the builder-contract tests reuse its jobs and project.

`project` is a module-scoped fixture (the corpus copied where a user keeps it): a test module that uses it imports it
(`from user_models import project`) or binds it (`project = corpus.project`)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from paths import MODELS
from records import write_examples

IMAGE = {"image": {"shape": [8, 8, 1]}}
CLASS = {"label": {"shape": [], "dtype": "int64"}}
CLS_AND_BOX = {"cls": {"shape": [], "dtype": "int64"}, "box": {"shape": [4]}}
PER_LABEL_LOSS = {"cls": "sparse_categorical_crossentropy", "box": "mean_squared_error"}
# The smallest Keras Applications model (its builder takes **kwargs and ends in a softmax); no download.
MOBILENET = {"builder": "tensorflow.keras.applications:MobileNet",
             "params": {"weights": None, "input_shape": [32, 32, 3], "classes": 10, "alpha": 0.25}}


def job(model: dict, features: dict = IMAGE, labels: dict = CLASS) -> dict:
    return {"model": model, "data": {"features": features, "labels": labels}}


# name: (job, None if train must work, else the job key validate and train name: "key", or ("key", what train says))
JOBS = {
    "subclassed": (job({"builder": "subclassed:build", "metrics": ["accuracy"]}), None),
    "subclassed_softmax": (job({"builder": "subclassed:build", "params": {"probabilities": True},
                                "metrics": ["accuracy", "auc"]}), None),
    "sequential_without_input": (job({"builder": "sequential:build", "metrics": ["accuracy", "auc"]}), None),
    "keras_applications": (job({**MOBILENET, "metrics": ["accuracy"]}, {"image": {"shape": [32, 32, 3]}}), None),
    "two_inputs": (job({"builder": "two_inputs:build", "metrics": ["accuracy"]},
                       {"image": {"shape": [8, 8, 1]}, "extra": {"shape": [3]}}), None),
    "two_outputs_list_by_order": (job({"builder": "two_outputs:as_list", "loss": PER_LABEL_LOSS,
                                       "metrics": ["accuracy", "mean_absolute_error"]}, labels=CLS_AND_BOX), None),
    "two_outputs_list_by_name": (job({"builder": "two_outputs:as_named_list", "loss": PER_LABEL_LOSS,
                                      "metrics": {"cls": ["accuracy"], "box": ["mean_squared_error"]}},
                                     labels=CLS_AND_BOX), None),
    "two_outputs_dict_per_label_loss": (job({"builder": "two_outputs:as_dict", "loss": PER_LABEL_LOSS,
                                             "metrics": ["accuracy", "mean_squared_error"]}, labels=CLS_AND_BOX), None),
    "two_outputs_dict_own_loss_and_metric": (job({"builder": "two_outputs:as_dict",
                                                  "loss": {"cls": "sparse_categorical_crossentropy",
                                                           "box": "two_outputs:box_distance"},
                                                  "metrics": {"cls": ["accuracy"], "box": ["two_outputs:box_error"]}},
                                                 labels=CLS_AND_BOX), None),
    "custom_layer": (job({"builder": "custom_layer:build", "metrics": ["accuracy"]}), None),
    "own_model_fn": (job({"model_fn": "own_model_fn:model_fn", "params": {"num_classes": 3, "learning_rate": 0.1}}),
                     None),
    # Broken, each in one way.
    "label_shape_wrong_for_loss": (job({"builder": "subclassed:build"}, labels={"label": {"shape": [3], "dtype": "int64"}}),
                                   "model.loss"),
    "one_class_loss_for_a_box_head": (job({"builder": "two_outputs:as_dict"}, labels=CLS_AND_BOX), "model.loss"),
    "metric_fits_no_head": (job({"builder": "two_inputs:build", "params": {"units": 1}, "loss": "mean_squared_error",
                                 "metrics": ["accuracy"]},
                                {"image": {"shape": [8, 8, 1]}, "extra": {"shape": [3]}}, {"value": {"shape": [1]}}),
                            "model.metrics[0]"),
    "outputs_not_matching_labels": (job({"builder": "two_outputs:as_dict",
                                         "loss": {"kind": "sparse_categorical_crossentropy", "box": "huber"}},
                                        labels={"kind": {"shape": [], "dtype": "int64"}, "box": {"shape": [4]}}),
                                    "data.labels"),
    "more_outputs_than_labels": (job({"builder": "two_outputs:as_list"}, labels={"cls": {"shape": [], "dtype": "int64"}}),
                                 "data.labels"),
    "loss_key_not_a_label": (job({"builder": "two_outputs:as_dict",
                                  "loss": {"cls": "sparse_categorical_crossentropy", "bbox": "huber"}},
                                 labels=CLS_AND_BOX), "model.loss.bbox"),
    "own_loss_misspelled": (job({"builder": "two_outputs:as_dict",
                                 "loss": {"cls": "sparse_categorical_crossentropy", "box": "two_outputs:box_distanse"}},
                                labels=CLS_AND_BOX), ("model.loss.box", "no attribute 'box_distanse'")),
    "misspelled_param_of_kwargs_builder": (job({**MOBILENET, "params": {"weights": None, "input_shape": [32, 32, 3],
                                                                          "clases": 10, "alpha": 0.25}},
                                               {"image": {"shape": [32, 32, 3]}}),
                                           "model.params.clases"),
    "wrong_number_of_inputs": (job({"builder": "two_inputs:build"}), "data.features"),
    # add_loss in a layer of a functional model: TPUEstimator's graph keeps the penalty on the model's Input
    # placeholder, which nothing feeds (train used to stop at the first step); refused before it, at the builder.
    "add_loss_in_a_functional_model": (job({"builder": "activity_penalty:build"}), "model.builder"),
    # A metric returning a tensor, not TensorFlow 1's (value, update_op): TPUEstimator cannot evaluate it,
    # and train now finds that before its first step rather than after the whole run.
    "metric_returning_a_tensor": (job({"builder": "subclassed:build", "metrics": ["tensor_metric:mean_top_logit"]}),
                                  "model.metrics"),
    # add_loss in a subclassed model's own call: TPUEstimator's graph adds it to the optimized loss.
    "add_loss_in_a_subclassed_model": (job({"builder": "subclassed_add_loss:build"}), None),
    # Probabilities out of an op that does not say (a clipped softmax): refused rather than read as logits...
    "clipped_probabilities_undeclared": (job({"builder": "clipped_softmax:build"}), "model.outputs"),
    # ... and trained as probabilities once the job says so.
    "clipped_probabilities_declared": (job({"builder": "clipped_softmax:build", "outputs": "probabilities",
                                            "metrics": ["accuracy"]}), None),
}


KERAS3 = "keras3_models"
# The corpus written with Keras 3 (tests/models/keras3_models.py), which the keras engine trains
# (tests/keras_engine/test_keras3_models.py) and the jax engine too (tests/jax_engine/test_jax_corpus.py).
# name: (job, None when train must work, else the key both refuse it at, or (key, words both say)).
KERAS3_JOBS = {
    "subclassed": (job({"builder": f"{KERAS3}:subclassed", "metrics": ["accuracy"]}), None),
    "subclassed_softmax": (job({"builder": f"{KERAS3}:subclassed", "params": {"probabilities": True},
                                "metrics": ["accuracy", "auc"]}), None),
    "sequential_without_input": (job({"builder": f"{KERAS3}:sequential", "metrics": ["accuracy", "auc"]}), None),
    "two_inputs": (job({"builder": f"{KERAS3}:two_inputs", "metrics": ["accuracy"]},
                       {"image": {"shape": [8, 8, 1]}, "extra": {"shape": [3]}}), None),
    "two_outputs_list_by_order": (job({"builder": f"{KERAS3}:as_list", "loss": PER_LABEL_LOSS,
                                       "metrics": ["accuracy", "mean_absolute_error"]}, labels=CLS_AND_BOX),
                                  None),
    "two_outputs_list_by_name": (job({"builder": f"{KERAS3}:as_named_list", "loss": PER_LABEL_LOSS,
                                      "metrics": {"cls": ["accuracy"], "box": ["mean_squared_error"]}},
                                     labels=CLS_AND_BOX), None),
    "two_outputs_dict_own_loss_and_metric": (job({"builder": f"{KERAS3}:as_dict",
                                                  "loss": {"cls": "sparse_categorical_crossentropy",
                                                           "box": f"{KERAS3}:box_distance"},
                                                  "metrics": {"cls": ["accuracy"], "box": [f"{KERAS3}:box_error"]}},
                                                 labels=CLS_AND_BOX), None),
    "custom_layer": (job({"builder": f"{KERAS3}:custom_layer", "metrics": ["accuracy"]}), None),
    "own_keras3_optimizer": (job({"builder": f"{KERAS3}:subclassed", "optimizer": {"name": f"{KERAS3}:adam_with_clipnorm"}}),
                             None),
    # Keras 3's own loss scaling (its LossScaleOptimizer unscales in apply_gradients), and bfloat16 layers.
    "mixed_float16": (job({"builder": f"{KERAS3}:custom_layer", "precision": "mixed_float16", "metrics": ["accuracy"]}),
                      None),
    "bfloat16": (job({"builder": f"{KERAS3}:two_inputs", "precision": "bfloat16", "metrics": ["accuracy"]},
                     {"image": {"shape": [8, 8, 1]}, "extra": {"shape": [3]}}), None),
    # Broken, each in one way.
    "label_shape_wrong_for_loss": (job({"builder": f"{KERAS3}:subclassed"},
                                       labels={"label": {"shape": [3], "dtype": "int64"}}), "model.loss"),
    "one_class_loss_for_a_box_head": (job({"builder": f"{KERAS3}:as_dict"}, labels=CLS_AND_BOX), "model.loss"),
    "outputs_not_matching_labels": (job({"builder": f"{KERAS3}:as_dict",
                                         "loss": {"kind": "sparse_categorical_crossentropy", "box": "huber"}},
                                        labels={"kind": {"shape": [], "dtype": "int64"}, "box": {"shape": [4]}}),
                                    "data.labels"),
    "wrong_number_of_inputs": (job({"builder": f"{KERAS3}:two_inputs"}), "data.features"),
    # As Keras users write them: a model's own train_step, test_step or compute_loss runs as fit() runs it, a
    # compiled model trains (tests/keras_engine/test_keras_as_written.py checks the numbers), a Keras Metric is fed.
    "own_train_step": (job({"builder": f"{KERAS3}:with_train_step"}), None),
    "own_test_step": (job({"builder": f"{KERAS3}:with_test_step"}), None),
    "own_compute_loss": (job({"builder": f"{KERAS3}:with_compute_loss"}), None),
    "compiled": (job({"builder": f"{KERAS3}:compiled"}), None),
    "tf_keras_optimizer": (job({"builder": f"{KERAS3}:subclassed", "optimizer": {"name": f"{KERAS3}:tf_keras_adam"}}),
                           ("model.optimizer", "not a Keras 3 optimizer")),
    "keras3_metric_class": (job({"builder": f"{KERAS3}:subclassed", "metrics": [f"{KERAS3}:TopClassHits"]}), None),
}



# What the evaluation reports, for jobs whose metrics apply per head.
EVAL_METRICS = {
    "sequential_without_input": {"accuracy", "auc"},
    "two_outputs_list_by_order": {"cls/accuracy", "box/mean_absolute_error"},
    "two_outputs_list_by_name": {"cls/accuracy", "box/mean_squared_error"},
    "two_outputs_dict_per_label_loss": {"cls/accuracy", "box/mean_squared_error"},
    "two_outputs_dict_own_loss_and_metric": {"cls/accuracy", "box/box_error"},
}


def write_records(path: Path, specs: dict, count: int, seed: int) -> None:
    """`count` tf.train.Examples with random values of the declared shapes (integers: class ids 0-2)."""
    rng = np.random.default_rng(seed)
    write_examples(path, [{name: rng.integers(0, 3, int(np.prod(spec["shape"])))
                           if spec.get("dtype", "float32") == "int64"
                           else rng.normal(size=int(np.prod(spec["shape"]))).astype(np.float32)
                           for name, spec in specs.items()} for _ in range(count)])


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("user_models")
    for module in MODELS.glob("*.py"):
        shutil.copy(module, root / module.name)
    return root


def write_job(root: Path, name: str, document: dict) -> Path:
    data = document["data"]
    specs = {**data["features"], **data["labels"]}
    write_records(root / f"{name}-train.tfrecord", specs, 8, seed=1)
    write_records(root / f"{name}-eval.tfrecord", specs, 8, seed=2)
    full = {
        "name": name.replace("_", "-"),
        "model": {"optimizer": {"name": "sgd", "learning_rate": 0.01}, **document["model"]}
        if "builder" in document["model"] else document["model"],
        "data": {**data, "train": f"{name}-train.tfrecord", "eval": f"{name}-eval.tfrecord", "shuffle_buffer": 8},
        "train": {"batch_size": 4, "steps": 2},
        "eval": {"batch_size": 4, "steps": 1},
        "run": {"model_dir": f"runs/{name}", "save_checkpoints_steps": 100, "log_every_steps": 1, "seed": 1},
    }
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(full, sort_keys=False))
    return path


def assert_agreement(name: str, path: Path, validated, trained, broken_at) -> None:
    """validate OK <=> train exit 0, neither "unexpected"; a broken job refused at its key by both."""
    said = f"validate:\n{validated.output}\ntrain:\n{trained.output}"
    assert (validated.exit_code == 0) == (trained.exit_code == 0), said
    assert "unexpected" not in validated.output and "unexpected" not in trained.output, said
    assert "Traceback" not in said
    if broken_at is None:
        assert validated.exit_code == 0, said
        assert "done | step 2/2" in trained.output, said
        if name in EVAL_METRICS:
            (line,) = [line for line in trained.output.splitlines() if line.startswith("eval | step 2 |")]
            assert {part.split()[0] for part in line.split(" | ")[2:]} == EVAL_METRICS[name] | {"loss"}, line
    else:
        validate_key, train_says = broken_at if isinstance(broken_at, tuple) else (broken_at, f"{broken_at}:")
        assert validated.exit_code == 1, said
        assert f"{path.name}:" in validated.output and f"{validate_key}:" in validated.output, said
        assert train_says in trained.output, said
