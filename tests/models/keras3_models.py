"""The models of the tf-keras corpus written with Keras 3 (`import keras` under TensorFlow 2.16 and later), as a
user moving to Keras 3 writes them: subclassed.py, sequential.py, two_inputs.py, two_outputs.py,
custom_layer.py, own_train_step.py and compiled_in_builder.py, layer for layer, so that the two corpora
compare (tests/keras_engine/test_keras3_models.py)."""

import keras
from keras import ops


class SmallConvNet(keras.Model):
    """subclassed.py: no Input, so it is built on the declared features' shapes."""

    def __init__(self, num_classes: int, probabilities: bool):
        super().__init__()
        self.conv = keras.layers.Conv2D(4, 3, padding="same", activation="relu")
        self.pool = keras.layers.GlobalAveragePooling2D()
        self.logits = keras.layers.Dense(num_classes)
        self.probabilities = probabilities

    def call(self, image, training=False):
        logits = self.logits(self.pool(self.conv(image)))
        return ops.softmax(logits) if self.probabilities else logits


def subclassed(num_classes=3, probabilities=False):
    return SmallConvNet(num_classes, probabilities)


def sequential(num_classes=3):
    """sequential.py: no Input layer, ending in a softmax (probabilities, not logits)."""
    return keras.Sequential([
        keras.layers.Conv2D(4, 3, padding="same", activation="relu"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(num_classes, activation="softmax"),
    ])


def two_inputs(units=3, image_shape=(8, 8, 1), extra_size=3):
    """two_inputs.py: two inputs taken as a dict by name."""
    image = keras.Input(shape=image_shape, name="image")
    extra = keras.Input(shape=(extra_size,), name="extra")
    x = keras.layers.GlobalAveragePooling2D()(keras.layers.Conv2D(4, 3, padding="same")(image))
    x = keras.layers.Concatenate()([x, extra])
    return keras.Model({"image": image, "extra": extra}, keras.layers.Dense(units)(x))


def _trunk(input_shape):
    image = keras.Input(shape=tuple(input_shape))
    x = keras.layers.Conv2D(4, 3, padding="same", activation="relu")(image)
    return image, keras.layers.GlobalAveragePooling2D()(x)


def as_list(input_shape, num_classes=3):
    """two_outputs.py: [class logits, box], output layers with Keras's own names, paired with the labels in order."""
    image, x = _trunk(input_shape)
    return keras.Model(image, [keras.layers.Dense(num_classes)(x), keras.layers.Dense(4)(x)])


def as_named_list(input_shape, num_classes=3):
    """[box, cls]: output layers named like the labels, in another order than the job declares them."""
    image, x = _trunk(input_shape)
    box = keras.layers.Dense(4, name="box")(x)
    cls = keras.layers.Dense(num_classes, activation="softmax", name="cls")(x)
    return keras.Model(image, [box, cls])


def as_dict(input_shape, num_classes=3):
    """{"cls": class probabilities, "box": box}."""
    image, x = _trunk(input_shape)
    return keras.Model(image, {"cls": keras.layers.Dense(num_classes, activation="softmax")(x),
                               "box": keras.layers.Dense(4)(x)})


def box_distance(labels, outputs):
    """The job's own loss for the box head: mean absolute distance."""
    return ops.mean(ops.abs(labels - outputs))


def box_error(labels, outputs):
    """The job's own metric for the box head: the batch's value (the keras engine averages it)."""
    return ops.mean(ops.abs(labels - outputs))


class ConvBlock(keras.layers.Layer):
    """custom_layer.py: a custom layer wrapping convolutions and batch norm."""

    def __init__(self, filters, **kwargs):
        super().__init__(**kwargs)
        self.first = keras.layers.Conv2D(filters, 3, padding="same", activation="relu")
        self.second = keras.layers.Conv2D(filters, 3, padding="same")
        self.norm = keras.layers.BatchNormalization()

    def call(self, x, training=False):
        return ops.relu(self.norm(self.second(self.first(x)), training=training))


def custom_layer(input_shape, num_classes=3, filters=4):
    image = keras.Input(shape=tuple(input_shape))
    x = ConvBlock(filters)(image)
    x = ConvBlock(filters * 2)(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(image, keras.layers.Dense(num_classes)(x))


# own_train_step.py: subclassed models that bring their own training logic, as Keras 3's guides teach fit() users.

class _SmallNet(keras.Model):
    def __init__(self, num_classes: int):
        super().__init__()
        self.pool = keras.layers.GlobalAveragePooling2D()
        self.logits = keras.layers.Dense(num_classes)

    def call(self, image, training=False):
        return self.logits(self.pool(image))


class WithTrainStep(_SmallNet):
    def train_step(self, data):
        images, labels = data
        loss = ops.mean(ops.square(self(images, training=True)))
        return {"loss": loss}


class WithTestStep(_SmallNet):
    def test_step(self, data):
        images, _ = data
        return {"loss": ops.mean(self(images, training=False))}


class WithComputeLoss(_SmallNet):
    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        return ops.mean(ops.square(y_pred)) * 10.0


def with_train_step(num_classes=3):
    return WithTrainStep(num_classes)


def with_test_step(num_classes=3):
    return WithTestStep(num_classes)


def with_compute_loss(num_classes=3):
    return WithComputeLoss(num_classes)


def compiled(input_shape, num_classes=3):
    """compiled_in_builder.py: compile()d in the builder, as a fit() user would."""
    image = keras.Input(shape=tuple(input_shape))
    model = keras.Model(image, keras.layers.Dense(num_classes)(keras.layers.GlobalAveragePooling2D()(image)))
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def tf_keras_adam(learning_rate):
    """An optimizer of the other Keras (tf-keras), as model.optimizer: it cannot update a Keras 3 model's variables."""
    import tf_keras

    return tf_keras.optimizers.Adam(learning_rate)


def adam_with_clipnorm(learning_rate):
    """A Keras 3 optimizer of the job's own, as model.optimizer."""
    return keras.optimizers.Adam(learning_rate, clipnorm=1.0)


class TopClassHits(keras.metrics.Metric):
    """loss_and_metric_classes.py's Keras Metric class, in Keras 3: refused as a job's metric (it keeps state)."""

    def __init__(self, name="top_class_hits", **kwargs):
        super().__init__(name=name, **kwargs)
        self.hits = self.add_variable(shape=(), initializer="zeros", name="hits")

    def update_state(self, labels, outputs, sample_weight=None):
        self.hits.assign_add(ops.sum(ops.cast(ops.equal(ops.argmax(outputs, -1), labels), "float32")))

    def result(self):
        return self.hits
