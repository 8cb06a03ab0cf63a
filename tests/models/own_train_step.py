"""Subclassed models that bring their own training logic, the way Keras's guides teach `fit()` users."""

import tensorflow as tf


class _SmallNet(tf.keras.Model):
    def __init__(self, num_classes: int):
        super().__init__()
        self.pool = tf.keras.layers.GlobalAveragePooling2D()
        self.logits = tf.keras.layers.Dense(num_classes)

    def call(self, image, training=False):
        return self.logits(self.pool(image))


class WithTrainStep(_SmallNet):
    def train_step(self, data):
        images, labels = data
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(self(images, training=True))) + tf.cast(tf.reduce_sum(labels), tf.float32)
        self.optimizer.apply_gradients(zip(tape.gradient(loss, self.trainable_variables), self.trainable_variables))
        return {"loss": loss}


class WithTestStep(_SmallNet):
    def test_step(self, data):
        images, _ = data
        return {"loss": tf.reduce_mean(self(images, training=False))}


class WithComputeLoss(_SmallNet):
    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None):
        return tf.reduce_mean(tf.square(y_pred)) * 10.0


class WithInheritedTrainStep(WithTrainStep):
    """Inherits its train_step from the user's own base class."""


def with_train_step(num_classes=3):
    return WithTrainStep(num_classes)


def with_test_step(num_classes=3):
    return WithTestStep(num_classes)


def with_compute_loss(num_classes=3):
    return WithComputeLoss(num_classes)


def with_inherited_train_step(num_classes=3):
    return WithInheritedTrainStep(num_classes)
