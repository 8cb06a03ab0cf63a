"""A custom layer wrapping convolutions (and batch norm), used in a functional model."""

import tensorflow as tf


class ConvBlock(tf.keras.layers.Layer):
    def __init__(self, filters, **kwargs):
        super().__init__(**kwargs)
        self.first = tf.keras.layers.Conv2D(filters, 3, padding="same", activation="relu")
        self.second = tf.keras.layers.Conv2D(filters, 3, padding="same")
        self.norm = tf.keras.layers.BatchNormalization()

    def call(self, x, training=False):
        return tf.nn.relu(self.norm(self.second(self.first(x)), training=training))


def build(input_shape, num_classes=3, filters=4):
    image = tf.keras.Input(shape=tuple(input_shape))
    x = ConvBlock(filters)(image)
    x = ConvBlock(filters * 2)(x)
    x = tf.keras.layers.GlobalAveragePooling2D()(x)
    return tf.keras.Model(image, tf.keras.layers.Dense(num_classes)(x))
