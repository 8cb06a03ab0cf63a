"""Layers nearly every model has, each of which training and evaluation must treat as Keras does:
batch normalization (moving statistics in evaluation), dropout (off in evaluation), weight
regularization (part of the optimized loss) and frozen layers (never changed by training)."""

import tensorflow as tf


def _image(input_shape):
    return tf.keras.Input(shape=tuple(input_shape), name="image")


def batch_norm(input_shape=(8, 8, 1)):
    image = _image(input_shape)
    x = tf.keras.layers.Conv2D(4, 3, padding="same")(image)
    x = tf.keras.layers.BatchNormalization(momentum=0.5, name="norm")(x)
    x = tf.keras.layers.ReLU()(x)
    x = tf.keras.layers.GlobalAveragePooling2D()(x)
    return tf.keras.Model(image, tf.keras.layers.Dense(3)(x))


def dropout(input_shape=(8, 8, 1), rate=0.5):
    image = _image(input_shape)
    x = tf.keras.layers.Dense(16, activation="relu")(tf.keras.layers.Flatten()(image))
    x = tf.keras.layers.Dropout(rate)(x)
    return tf.keras.Model(image, tf.keras.layers.Dense(3)(x))


def regularized(input_shape=(8, 8, 1), l2=0.0):
    image = _image(input_shape)
    penalized = tf.keras.layers.Dense(3, kernel_regularizer=tf.keras.regularizers.L2(l2), name="penalized")
    return tf.keras.Model(image, penalized(tf.keras.layers.Flatten()(image)))


def frozen_base(input_shape=(8, 8, 1)):
    image = _image(input_shape)
    base = tf.keras.layers.Dense(8, activation="relu", name="frozen", trainable=False,
                                 kernel_initializer=tf.keras.initializers.Constant(0.05))
    return tf.keras.Model(image, tf.keras.layers.Dense(3, name="head")(base(tf.keras.layers.Flatten()(image))))
