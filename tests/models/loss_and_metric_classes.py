"""A job's own loss and metric written as Keras classes, `tf.keras.losses.Loss` and `tf.keras.metrics.Metric`."""

import tensorflow as tf


class ClassesCrossentropy(tf.keras.losses.Loss):
    """Sparse crossentropy on logits, per example (Keras reduces it)."""

    def call(self, y_true, y_pred):
        return tf.keras.losses.sparse_categorical_crossentropy(y_true, y_pred, from_logits=True)


# An instance, as `model.compile(loss=...)` takes one.
classes_crossentropy = ClassesCrossentropy()


class MarginLoss(tf.keras.losses.Loss):
    """A loss class that needs an argument: only an object made with it can be used."""

    def __init__(self, margin, **kwargs):
        super().__init__(**kwargs)
        self.margin = margin

    def call(self, y_true, y_pred):
        return tf.nn.relu(self.margin - tf.reduce_max(y_pred, axis=-1))


class TopClassHits(tf.keras.metrics.Metric):
    """The share of examples whose top logit is the label."""

    def __init__(self, name="top_class_hits", **kwargs):
        super().__init__(name=name, **kwargs)
        self.hits = self.add_weight(name="hits", initializer="zeros")
        self.seen = self.add_weight(name="seen", initializer="zeros")

    def update_state(self, y_true, y_pred, sample_weight=None):
        predicted = tf.argmax(y_pred, axis=-1, output_type=tf.int32)
        hit = tf.cast(tf.equal(predicted, tf.cast(tf.reshape(y_true, [-1]), tf.int32)), tf.float32)
        self.hits.assign_add(tf.reduce_sum(hit))
        self.seen.assign_add(tf.cast(tf.size(hit), tf.float32))

    def result(self):
        return self.hits / tf.maximum(self.seen, 1.0)


# An instance, as `model.compile(metrics=[...])` takes one.
top_class_hits = TopClassHits()
