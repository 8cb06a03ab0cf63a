"""Keras 3 models (`import keras` under TensorFlow 2.16 and later), functional and subclassed."""

import keras


def functional(input_shape, num_classes=3):
    image = keras.Input(shape=tuple(input_shape))
    x = keras.layers.GlobalAveragePooling2D()(image)
    return keras.Model(image, keras.layers.Dense(num_classes)(x))


class SmallNet(keras.Model):
    def __init__(self, num_classes):
        super().__init__()
        self.pool = keras.layers.GlobalAveragePooling2D()
        self.logits = keras.layers.Dense(num_classes)

    def call(self, image):
        return self.logits(self.pool(image))


def subclassed(num_classes=3):
    return SmallNet(num_classes)
