"""Keras 3 models as Keras users write them (`import keras`): a task model that compiles itself in its constructor
around a backbone built from a config, as KerasHub's task models do (`Task.__init__` compiles), a model with its own
train_step as Keras's guide "Customizing what happens in fit()" writes it, a compiled model, and Keras metric
objects. Weights start from fixed values, so that a test can compute the steps by hand."""

import keras
import numpy as np
import tensorflow as tf


def fixed(shape, dtype=None):
    """Deterministic starting weights: evenly spaced in [-0.5, 0.5]."""
    return np.linspace(-0.5, 0.5, int(np.prod(shape))).reshape(shape).astype("float32")


class TinyBackbone(keras.Model):
    """A functional backbone made from its config, as KerasHub's Backbone.from_config makes one."""

    def __init__(self, hidden_dim=3, image_shape=(4, 4, 2), **kwargs):
        image = keras.Input(shape=tuple(image_shape))
        pooled = keras.layers.GlobalAveragePooling2D()(image)
        hidden = keras.layers.Dense(hidden_dim, kernel_initializer=fixed, name="projection")(pooled)
        super().__init__(inputs=image, outputs=hidden, **kwargs)
        self.hidden_dim = hidden_dim
        self.image_shape = tuple(image_shape)

    def get_config(self):
        return {"hidden_dim": self.hidden_dim, "image_shape": list(self.image_shape), "name": self.name}

    @classmethod
    def from_config(cls, config):
        return cls(**config)


class TinyClassifier(keras.Model):
    """A task model: the backbone and a head, compiled by its own constructor (the user never calls compile())."""

    def __init__(self, backbone, num_classes=3, **kwargs):
        image = backbone.input
        logits = keras.layers.Dense(num_classes, kernel_initializer=fixed, name="predictions")(backbone(image))
        super().__init__(inputs=image, outputs=logits, **kwargs)
        self.backbone = backbone
        self.compile(optimizer=keras.optimizers.SGD(learning_rate=0.5),
                     loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                     metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")])


def task_from_config(hidden_dim=3, num_classes=3):
    backbone = TinyBackbone.from_config({"hidden_dim": hidden_dim, "image_shape": [4, 4, 2]})
    return TinyClassifier(backbone, num_classes)


def ten_times_crossentropy(labels, logits):
    return 10.0 * keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)


def compiled_with_own_loss(num_classes=3):
    """A plain model its builder compiled with a loss of its own (ten times the crossentropy) and SGD."""
    image = keras.Input(shape=(4, 4, 2))
    logits = keras.layers.Dense(num_classes, kernel_initializer=fixed, name="predictions")(
        keras.layers.GlobalAveragePooling2D()(image))
    model = keras.Model(image, logits)
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.5), loss=ten_times_crossentropy)
    return model


class WithOwnTrainStep(keras.Model):
    """train_step as Keras's guide writes it, with an L2 penalty the compiled loss does not have."""

    def __init__(self, num_classes=3, **kwargs):
        super().__init__(**kwargs)
        self.pool = keras.layers.GlobalAveragePooling2D()
        self.dense = keras.layers.Dense(num_classes, kernel_initializer=fixed)

    def call(self, image, training=False):
        return self.dense(self.pool(image))

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.compute_loss(y=y, y_pred=y_pred) + 0.05 * tf.add_n(
                [tf.reduce_sum(tf.square(w)) for w in self.trainable_weights])
        gradients = tape.gradient(loss, self.trainable_weights)
        self.optimizer.apply(gradients, self.trainable_weights)
        for metric in self.metrics:
            if metric.name == "loss":
                metric.update_state(loss)
            else:
                metric.update_state(y, y_pred)
        return {m.name: m.result() for m in self.metrics}


def with_own_train_step(num_classes=3):
    model = WithOwnTrainStep(num_classes)
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.3, momentum=0.5),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model


def binary(units=1):
    """A one-unit sigmoid head, for binary metrics."""
    image = keras.Input(shape=(4, 4, 2))
    return keras.Model(image, keras.layers.Dense(units, activation="sigmoid", kernel_initializer=fixed)(
        keras.layers.GlobalAveragePooling2D()(image)))


# Metric objects made with their arguments, given by import path.
f1 = keras.metrics.F1Score(average="micro", threshold=0.5, name="f1")
