"""One training step of the job's model as XLA's HLO, for XLA's TPU compiler (runs in the step child of
`plan/memory.py`, under the engine's TensorFlow).

The step is written functionally: weights and optimizer slots in, their new values out (forward, loss,
gradients, the slots' and weights' updates). An in-place step (`optimizer.apply_gradients`, `assign`) exports
copies that jaxlib's `hlo_to_stablehlo` cannot convert ("failed to legalize operation 'mhlo.copy'"); the
functional step has the same buffers, and the compiler is told that the variables' buffers are donated (XLA
reuses each for the output of its shape), so each is charged once, as the in-place step charges it.

`tf.function(jit_compile=True).experimental_get_compiler_ir(...)(stage="hlo_serialized")` gives the HLO;
captured variables become its parameters after the step's own inputs, in the concrete function's capture order.
"""

from __future__ import annotations

import os
import sys
import tempfile


def set_precision(precision: str) -> None:
    """The job's precision as a TPU run sets it, before the model is built: bfloat16 is Keras's mixed_bfloat16
    (float32 weights, bfloat16 compute). The engines' rule is `engine/portable.py`'s `policy_name(..., use_tpu=True)`,
    which plan/ may not import (it sits below the engines); this is its TPU branch."""
    import tensorflow as tf

    policy = precision if precision in ("float32", "mixed_float16") else "mixed_bfloat16"
    kerases = [module for name, module in sys.modules.items() if name in ("tf_keras", "keras") and
               hasattr(module, "mixed_precision")]
    for keras in kerases or [tf.keras]:
        keras.mixed_precision.set_global_policy(policy)


def export_step(request: dict, model) -> dict:
    """Write the HLO of one functional training step of `model` at `request["batch"]` examples.

    The loss stands in for the job's: any scalar of every output makes the backward pass keep what the
    real loss would (the label tensors a real loss reads are small beside the activations).

    Returns:
        {"hlo": path, "inputs": the step's own inputs, "donated": the parameters it updates, "parameters": count,
         "input_shape": per example, as built}.
    """
    import tensorflow as tf

    weights = list(model.trainable_weights)
    slot_count = int(request.get("slots", 0))
    slots = [[tf.Variable(tf.zeros_like(w), trainable=False) for w in weights] for _ in range(slot_count)]
    inputs = tf.nest.flatten(model.inputs)

    @tf.function(jit_compile=True)
    def step(*features):
        with tf.GradientTape() as tape:
            outputs = model(list(features) if len(features) > 1 else features[0], training=True)
            loss = tf.add_n([tf.reduce_mean(tf.square(tf.cast(o, tf.float32))) for o in tf.nest.flatten(outputs)])
        grads = tape.gradient(loss, weights)
        new_weights, new_slots = [], [[] for _ in slots]
        for i, (w, g) in enumerate(zip(weights, grads)):
            update = g
            for k, slot in enumerate(slots):  # Momentum's or Adam's kind of slot: one buffer per weight each
                update = 0.9 * slot[i] + tf.cast(g, slot[i].dtype)
                new_slots[k].append(update)
            new_weights.append(w - tf.cast(0.01 * update, w.dtype))
        return loss, new_weights, new_slots

    specs = [tf.TensorSpec([request["batch"], *t.shape[1:]], t.dtype) for t in inputs]
    concrete = step.get_concrete_function(*specs)
    hlo = step.experimental_get_compiler_ir(*specs)(stage="hlo_serialized")
    # Parameters: the step's own inputs, then the captured variables in capture order. The weights and slots the
    # step returns anew are donated, as the in-place step updates them; what the forward pass assigns itself (a
    # batch norm's moving averages) TensorFlow's export already aliases.
    returned = {id(v.handle) for v in weights} | {id(v.handle) for slot in slots for v in slot}
    donated = [len(specs) + j for j, captured in enumerate(concrete.captured_inputs) if id(captured) in returned]
    fd, path = tempfile.mkstemp(prefix="tpulaunch-step-", suffix=".hlo.pb", dir=request.get("dir"))
    with os.fdopen(fd, "wb") as f:
        f.write(hlo)
    return {"hlo": path, "inputs": len(specs), "donated": donated,
            "parameters": len(specs) + len(concrete.captured_inputs),
            "input_shape": [int(d) for d in inputs[0].shape[1:]]}
