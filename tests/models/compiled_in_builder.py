"""Builders that compile() the model they return, as a Keras `fit()` user would."""

import tensorflow as tf


def _model(input_shape, num_classes):
    image = tf.keras.Input(shape=tuple(input_shape))
    x = tf.keras.layers.GlobalAveragePooling2D()(image)
    return tf.keras.Model(image, tf.keras.layers.Dense(num_classes)(x))


def with_loss_and_optimizer(input_shape, num_classes=3):
    model = _model(input_shape, num_classes)
    model.compile(optimizer=tf.keras.optimizers.Adam(1e-3),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def with_loss_only(input_shape, num_classes=3):
    """compile() without an optimizer still sets Keras's default one (RMSprop)."""
    model = _model(input_shape, num_classes)
    model.compile(loss="mse")
    return model
