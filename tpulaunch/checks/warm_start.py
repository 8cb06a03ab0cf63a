"""`validate`'s warm-start check: `run.warm_start.from` holds a checkpoint, and for a builder job, the
variables `run.warm_start.vars` selects are in it with the model's shapes.

TensorFlow stops a run whose selected variable is missing from the checkpoint only once training
starts, and silently warm-starts nothing when the regex matches no variable; both are found here.
The model is built in a scratch graph, as the Estimator builds it, so the variable names are the
run's own.
"""

from __future__ import annotations

import re
from typing import Sequence

from tpulaunch.errors import first_line
from tpulaunch.job.load import LoadedJob

FROM = ("run", "warm_start", "from")
VARS = ("run", "warm_start", "vars")


def warm_start_problems(loaded: LoadedJob, search_path: Sequence[str] = (), *, build: bool = True) -> list:
    """No checkpoint at `from`; with `build`, what `vars` selects from a builder job's model against the checkpoint."""
    run = loaded.section("run")
    spec = run.warm_start if run is not None else None
    if spec is None:
        return []
    import tensorflow as tf

    try:
        stored = tf.train.load_checkpoint(spec.from_).get_variable_to_shape_map()
    except (ValueError, tf.errors.OpError) as exc:
        return [loaded.problem(FROM, "warm-start-no-checkpoint", f"no checkpoint at {spec.from_}: {first_line(exc)}",
                               "name a model_dir that holds checkpoints, or one checkpoint (model_dir/model.ckpt-N)")]
    variables = _builder_variables(loaded, search_path) if build else None
    if variables is None:
        return []
    # TensorFlow's own selection: get_collection(TRAINABLE_VARIABLES, scope=regex), re.match on 'name:0'.
    matched = [(name.split(":")[0], shape) for name, shape in variables.items() if re.match(spec.vars, name)]
    if not matched:
        some = ", ".join(name.split(":")[0] for name in list(variables)[:4])
        return [loaded.problem(VARS, "warm-start-matches-nothing",
                               f"{spec.vars!r} matches none of the model's trainable variables ({some}, ...): "
                               "nothing would be warm-started",
                               "the regex is matched from the start of each variable name", severity="warning")]
    missing = [name for name, _ in matched if name not in stored]
    if missing:
        return [loaded.problem(VARS, "warm-start-variable-missing",
                               f"{len(missing)} of the {len(matched)} variables {spec.vars!r} selects are not in "
                               f"{spec.from_}: {', '.join(missing[:5])}{', ...' if len(missing) > 5 else ''}",
                               "select only variables both models have (TensorFlow stops the run on a missing one)")]
    different = [f"{name} {shape} vs {stored[name]}" for name, shape in matched if list(shape) != list(stored[name])]
    if different:
        return [loaded.problem(VARS, "warm-start-shape-mismatch",
                               f"variables {spec.vars!r} selects have other shapes in {spec.from_}: "
                               f"{'; '.join(different[:3])}",
                               "select only the variables whose shapes did not change")]
    return []


def _builder_variables(loaded: LoadedJob, search_path: Sequence[str]):
    """name -> shape of the trainable variables of the job's Keras model, or None (no builder, or it fails:
    the model check reports that)."""
    model, data = loaded.section("model"), loaded.section("data")
    if model is None or data is None or not model.builder:
        return None
    import tensorflow as tf

    from tpulaunch.job.builder_args import builder_kwargs
    from tpulaunch.job.imports import resolve

    try:
        builder = resolve(model.builder, search_path=search_path, what="model builder")
        with tf.Graph().as_default(), tf.compat.v1.Session():
            keras_model = builder(**builder_kwargs(builder, model.params, data.features))
            return {v.name: v.shape.as_list() for v in keras_model.trainable_weights}
    except Exception:  # pylint: disable=broad-except  # reported by the model check
        return None
