"""KerasHub task models as their users make them: `keras_hub.models.ResNetImageClassifier` around a `ResNetBackbone`
made from a config (no preset, nothing downloaded), tiny (32x32 images, one stack of one basic block). The task's
constructor compiles it with KerasHub's defaults (Adam(5e-5), SparseCategoricalCrossentropy on logits,
SparseCategoricalAccuracy); the builder never calls compile(). Its weights start from a fixed seed, so a test can
build the same model again and compute its steps by hand."""

import keras
import keras_hub

BACKBONE = {
    "input_conv_filters": [64],  # a basic block's first stack adds its input to 64 filters: the stem makes 64
    "input_conv_kernel_sizes": [3],
    "stackwise_num_filters": [64],  # KerasHub requires 64 first
    "stackwise_num_blocks": [1],
    "stackwise_num_strides": [1],
    "block_type": "basic_block",
    "image_shape": [32, 32, 3],
}


def resnet_classifier(num_classes=3, seed=11):
    keras.utils.set_random_seed(seed)  # the same weights each time it is built
    backbone = keras_hub.models.ResNetBackbone.from_config(dict(BACKBONE))
    return keras_hub.models.ResNetImageClassifier(backbone=backbone, num_classes=num_classes)


def resnet_classifier_with_preprocessor(num_classes=3, seed=11):
    """The task with a preprocessor, as `from_preset` gives one: its image converter resizes each image to 32x32
    and maps [0, 1] to [-1, 1]; its fit() and evaluate() apply it to each batch before the model sees it."""
    keras.utils.set_random_seed(seed)
    backbone = keras_hub.models.ResNetBackbone.from_config(dict(BACKBONE))
    converter = keras_hub.layers.ResNetImageConverter(image_size=(32, 32), scale=2.0, offset=-1.0)
    preprocessor = keras_hub.models.ResNetImageClassifierPreprocessor(image_converter=converter)
    return keras_hub.models.ResNetImageClassifier(backbone=backbone, num_classes=num_classes,
                                                  preprocessor=preprocessor)
