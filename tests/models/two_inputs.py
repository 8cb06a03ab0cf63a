"""Two inputs taken as a dict by name; the builder knows its own input shapes."""

import tensorflow as tf


def build(units=3, image_shape=(8, 8, 1), extra_size=3):
    image = tf.keras.Input(shape=image_shape, name="image")
    extra = tf.keras.Input(shape=(extra_size,), name="extra")
    x = tf.keras.layers.GlobalAveragePooling2D()(tf.keras.layers.Conv2D(4, 3, padding="same")(image))
    x = tf.keras.layers.Concatenate()([x, extra])
    return tf.keras.Model({"image": image, "extra": extra}, tf.keras.layers.Dense(units)(x))
