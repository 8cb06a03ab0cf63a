"""A custom layer that adds an activity penalty with `self.add_loss` in `call`, used in a functional model."""

import tensorflow as tf


class PenalisedDense(tf.keras.layers.Layer):
    def __init__(self, units, **kwargs):
        super().__init__(**kwargs)
        self.dense = tf.keras.layers.Dense(units)

    def call(self, x):
        y = self.dense(x)
        self.add_loss(1e-3 * tf.reduce_mean(tf.square(y)))
        return y


def build(input_shape, num_classes=3):
    image = tf.keras.Input(shape=tuple(input_shape))
    x = tf.keras.layers.Flatten()(image)
    x = PenalisedDense(8)(x)
    return tf.keras.Model(image, tf.keras.layers.Dense(num_classes)(tf.nn.relu(x)))
