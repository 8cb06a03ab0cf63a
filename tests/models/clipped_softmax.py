"""A classifier returning probabilities through an op that does not say so: a softmax clipped away from 0 and 1."""

import tensorflow as tf


class ClippedSoftmax(tf.keras.Model):
    def __init__(self, num_classes=3):
        super().__init__()
        self.flatten = tf.keras.layers.Flatten()
        self.logits = tf.keras.layers.Dense(num_classes)

    def call(self, image, training=False):
        return tf.clip_by_value(tf.nn.softmax(self.logits(self.flatten(image))), 1e-7, 1 - 1e-7)


def build(num_classes=3):
    return ClippedSoftmax(num_classes)
