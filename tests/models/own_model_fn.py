"""A hand-written TPUEstimator model_fn, as an existing TPU program has it: features by name, as tf.io.parse_example gives them."""

import tensorflow as tf


def model_fn(features, labels, mode, params):
    net = tf.keras.Sequential([tf.keras.layers.Flatten(), tf.keras.layers.Dense(params["num_classes"])])
    logits = net(features["image"], training=mode == tf.estimator.ModeKeys.TRAIN)
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.compat.v1.estimator.tpu.TPUEstimatorSpec(mode, predictions={"logits": logits})
    loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True))
    if mode == tf.estimator.ModeKeys.EVAL:
        def metric_fn(labels, logits):
            return {"accuracy": tf.compat.v1.metrics.accuracy(labels, tf.argmax(logits, axis=-1))}

        return tf.compat.v1.estimator.tpu.TPUEstimatorSpec(mode, loss=loss, eval_metrics=(metric_fn, [labels, logits]))
    optimizer = tf.compat.v1.train.GradientDescentOptimizer(params["learning_rate"])
    if params["use_tpu"]:
        optimizer = tf.compat.v1.tpu.CrossShardOptimizer(optimizer)
    train_op = optimizer.minimize(loss, global_step=tf.compat.v1.train.get_or_create_global_step(),
                                  var_list=net.trainable_variables)
    return tf.compat.v1.estimator.tpu.TPUEstimatorSpec(mode, loss=loss, train_op=train_op)
