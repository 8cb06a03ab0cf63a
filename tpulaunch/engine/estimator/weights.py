"""Where a fresh run's weights come from: the builder's own values, or another run's checkpoint.

The Estimator builds the Keras model inside its graph and initialises every variable with its
initializer, so values a builder loaded (`model.load_weights(path)`, Keras Applications' `weights=`,
`set_weights`) never reach training: in graph mode Keras writes them into its own session, which the
Estimator does not use. So when a run starts without a checkpoint, the Scaffold's `init_fn` builds the
model once more in a scratch graph with its own session (where loading works), reads the values back
with `get_weights()` and feeds them into the run's variables' initializers. Nothing is embedded in
the graph (a 38 M-parameter model would bloat every meta graph), and a resumed run restores its
checkpoint as before (TensorFlow runs `init_fn` only when nothing is restored).

`run.warm_start` is TensorFlow's WarmStartSettings: the trainable variables its regex matches come
from the other run's checkpoint; those keep the checkpoint's values, the rest take the builder's.
"""

from __future__ import annotations

import urllib.error
from typing import Any, Callable, List, Optional, Tuple

from tpulaunch.errors import TpuLaunchError
from tpulaunch.job.schema import Job, WarmStart


def warm_start_settings(job: Job):
    """`tf.estimator.WarmStartSettings` for `run.warm_start`, or None."""
    spec = job.run.warm_start
    if spec is None:
        return None
    import tensorflow as tf

    return tf.estimator.WarmStartSettings(ckpt_to_initialize_from=spec.from_, vars_to_warm_start=spec.vars)


def warm_started_variables(spec: Optional[WarmStart]) -> list:
    """The variables of the default graph that `spec` takes from its checkpoint (TensorFlow's own selection:
    trainable variables whose names the regex matches from the start)."""
    if spec is None:
        return []
    import tensorflow as tf

    return tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES, scope=spec.vars)


def built_weights(build_model: Callable[[], Any], seed: Optional[int]) -> Optional[List[Any]]:
    """The values the builder gives its model (loaded or freshly initialised), built in a scratch graph; None
    when the model has no weights until it is first called (subclassed, Sequential without an Input): such a
    builder cannot have loaded any, so the run's own initializers stand."""
    import tensorflow as tf

    with tf.Graph().as_default() as graph, tf.compat.v1.Session(graph=graph):
        if seed is not None:
            tf.compat.v1.set_random_seed(seed)  # as RunConfig(tf_random_seed=) does for the run's own graph
        model = build_model()
        return model.get_weights() if model.built else None


def builder_weights_scaffold_fn(build_model: Callable[[], Any], model, *, seed: Optional[int],
                                warm_start: Optional[WarmStart]) -> Callable[[], Any]:
    """A TPUEstimatorSpec `scaffold_fn` whose `init_fn` starts `model`'s variables from the builder's values.

    Args:
        build_model: calls the builder (the same one `model` came from).
        model: the Keras model built in the run's graph.
        seed: `run.seed`, given to the scratch graph as RunConfig gives it to the run's graph.
        warm_start: `run.warm_start`; the variables it selects keep the checkpoint's values.
    """
    import tensorflow as tf

    def init_fn(scaffold, session):
        del scaffold
        values = built_weights(build_model, seed)
        if values is None:
            return
        variables = model.weights
        if len(values) != len(variables) or any(tuple(v.shape) != tuple(x.shape) for v, x in zip(variables, values)):
            raise TpuLaunchError(
                f"the builder gave {len(values)} weights on a second call, the model in the graph has {len(variables)} "
                "(or their shapes differ)",
                hint="the builder must build the same model every time it is called")
        skip = {v.ref() for v in warm_started_variables(warm_start)}
        chosen = [(v, x) for v, x in zip(variables, values) if v.ref() not in skip]
        session.run([v.initializer for v, _ in chosen], feed_dict={v.initial_value: x for v, x in chosen})

    def scaffold_fn():
        return tf.compat.v1.train.Scaffold(init_fn=init_fn)

    return scaffold_fn


# ------------------------------------------------------------------------------------- downloads

_FETCH_FAILURE = "URL fetch failure on "  # keras.utils.get_file's message (data_utils.py)


def download_failure(exc: BaseException) -> Optional[Tuple[str, str]]:
    """(URL, reason) when `exc` (or what caused it) is a failed download, else None."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        text = str(exc)
        if text.startswith(_FETCH_FAILURE):  # "URL fetch failure on URL: errno -- reason"
            url, _, reason = text[len(_FETCH_FAILURE):].partition(": ")
            return url, reason.split(" -- ", 1)[-1]
        if isinstance(exc, urllib.error.URLError):
            return str(getattr(exc, "url", None) or getattr(exc, "filename", None) or "a URL"), str(exc.reason)
        exc = exc.__cause__ or exc.__context__
    return None


def download_error(builder: str, failure: Tuple[str, str]) -> Tuple[str, str]:
    """(message, hint) for a builder whose download failed."""
    url, reason = failure
    return (f"{builder} downloads {url} and the download failed ({reason})",
            "this machine cannot fetch it (no network?): download the file where you can and load it from a local "
            "path (e.g. weights='/path/to/weights.h5'), or copy it into ~/.keras/models/, where Keras looks first")
