"""Two heads on one trunk: a class (logits) and a box (4 values), returned as a list or as a dict."""

import tensorflow as tf


def _trunk(input_shape):
    image = tf.keras.Input(shape=tuple(input_shape))
    x = tf.keras.layers.Conv2D(4, 3, padding="same", activation="relu")(image)
    return image, tf.keras.layers.GlobalAveragePooling2D()(x)


def as_list(input_shape, num_classes=3):
    """[class logits, box]: output layers with Keras's own names, so they pair with the labels in order."""
    image, x = _trunk(input_shape)
    return tf.keras.Model(image, [tf.keras.layers.Dense(num_classes)(x), tf.keras.layers.Dense(4)(x)])


def as_named_list(input_shape, num_classes=3):
    """[box, cls]: output layers named like the labels, in another order than the job declares them."""
    image, x = _trunk(input_shape)
    box = tf.keras.layers.Dense(4, name="box")(x)
    cls = tf.keras.layers.Dense(num_classes, activation="softmax", name="cls")(x)
    return tf.keras.Model(image, [box, cls])


def as_dict(input_shape, num_classes=3):
    """{"cls": class probabilities, "box": box}."""
    image, x = _trunk(input_shape)
    return tf.keras.Model(image, {"cls": tf.keras.layers.Dense(num_classes, activation="softmax")(x),
                                  "box": tf.keras.layers.Dense(4)(x)})


def box_distance(labels, outputs):
    """The job's own loss for the box head: mean absolute distance."""
    return tf.reduce_mean(tf.abs(labels - outputs))


def box_error(labels, outputs):
    """The job's own metric for the box head."""
    return tf.compat.v1.metrics.mean_absolute_error(labels, outputs)
