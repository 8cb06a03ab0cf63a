# An existing TPUEstimator program, as the people tpulaunch is for have them: module-level absl
# FLAGS, a model_fn(features, labels, mode, params) that reads FLAGS, one input_fn per mode reading
# params["batch_size"] and params["data_dir"], TPUEstimatorSpec with eval_metrics, and a main() that
# parses the flags and builds RunConfig/TPUConfig/TPUEstimator by hand.
#
# It is written after tensorflow/tpu's models/official/mnist/mnist_tpu.py (same flags, same
# model_fn, input_fn and main structure), ported to TensorFlow 2.15's tf.compat.v1 names because the
# original targets TF 1.x (tf.contrib.tpu, tf.flags); it is not a copy of that file. Its dataset
# module reads MNIST's idx files; this one reads TFRecords of the same tensors (784 bytes of pixels,
# a label byte), so a test can write a few of them.
#
# tpulaunch's tests run it unmodified from a job file: model.model_fn, data.input_fn by mode,
# model.params {data_dir}, and flags {learning_rate, use_tpu}.
"""MNIST model training using TPUs.

This program demonstrates training of the convolutional neural network model on Google Cloud TPUs
(https://cloud.google.com/tpu/). If you are not interested in TPUs, you should ignore this file.
"""

import os

from absl import app
from absl import flags
import tensorflow as tf

# Cloud TPU Cluster Resolver flags
flags.DEFINE_string(
    "tpu", default=None,
    help="The Cloud TPU to use for training. This should be either the name used when creating the "
         "Cloud TPU, or a grpc://ip.address.of.tpu:8470 url.")
flags.DEFINE_string(
    "tpu_zone", default=None,
    help="[Optional] GCE zone where the Cloud TPU is located in. If not specified, we will attempt to "
         "automatically detect the GCE project from metadata.")
flags.DEFINE_string(
    "gcp_project", default=None,
    help="[Optional] Project name for the Cloud TPU-enabled project. If not specified, we will attempt "
         "to automatically detect the GCE project from metadata.")

# Model specific parameters
flags.DEFINE_string("data_dir", "", "Path to directory containing the MNIST dataset")
flags.DEFINE_string("model_dir", None, "Estimator model_dir")
flags.DEFINE_integer("batch_size", 1024,
                     "Mini-batch size for the training. Note that this is the global batch size and not "
                     "the per-shard batch.")
flags.DEFINE_integer("train_steps", 1000, "Total number of training steps.")
flags.DEFINE_integer("eval_steps", 0,
                     "Total number of evaluation steps. If `0`, evaluation after training is skipped.")
flags.DEFINE_float("learning_rate", 0.05, "Learning rate.")

flags.DEFINE_bool("use_tpu", True, "Use TPUs rather than plain CPUs")
flags.DEFINE_integer("iterations", 50, "Number of iterations per TPU training loop.")
flags.DEFINE_integer("num_shards", 8, "Number of shards (TPU chips).")

FLAGS = flags.FLAGS


def create_model(data_format):
    """Model to recognize digits in the MNIST dataset (the layers of official/mnist/mnist.py)."""
    if data_format == "channels_first":
        input_shape = [1, 28, 28]
    else:
        assert data_format == "channels_last"
        input_shape = [28, 28, 1]

    l = tf.keras.layers
    max_pool = l.MaxPooling2D((2, 2), (2, 2), padding="same", data_format=data_format)
    return tf.keras.Sequential([
        l.Reshape(target_shape=input_shape, input_shape=(28 * 28,)),
        l.Conv2D(8, 5, padding="same", data_format=data_format, activation=tf.nn.relu),
        max_pool,
        l.Conv2D(16, 5, padding="same", data_format=data_format, activation=tf.nn.relu),
        max_pool,
        l.Flatten(),
        l.Dense(64, activation=tf.nn.relu),
        l.Dropout(0.4),
        l.Dense(10),
    ])


def metric_fn(labels, logits):
    accuracy = tf.compat.v1.metrics.accuracy(labels=labels, predictions=tf.argmax(logits, axis=1))
    return {"accuracy": accuracy}


def model_fn(features, labels, mode, params):
    """model_fn constructs the ML model used to predict handwritten digits."""

    del params
    image = features
    if isinstance(image, dict):
        image = features["image"]

    model = create_model("channels_last")

    if mode == tf.estimator.ModeKeys.PREDICT:
        logits = model(image, training=False)
        predictions = {
            "class_ids": tf.argmax(logits, axis=1),
            "probabilities": tf.nn.softmax(logits),
        }
        return tf.compat.v1.estimator.tpu.TPUEstimatorSpec(mode, predictions=predictions)

    logits = model(image, training=(mode == tf.estimator.ModeKeys.TRAIN))
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels=labels, logits=logits)

    if mode == tf.estimator.ModeKeys.TRAIN:
        learning_rate = tf.compat.v1.train.exponential_decay(
            FLAGS.learning_rate,
            tf.compat.v1.train.get_global_step(),
            decay_steps=100000,
            decay_rate=0.96)
        optimizer = tf.compat.v1.train.GradientDescentOptimizer(learning_rate=learning_rate)
        if FLAGS.use_tpu:
            optimizer = tf.compat.v1.tpu.CrossShardOptimizer(optimizer)
        return tf.compat.v1.estimator.tpu.TPUEstimatorSpec(
            mode=mode,
            loss=loss,
            train_op=optimizer.minimize(loss, tf.compat.v1.train.get_global_step()))

    if mode == tf.estimator.ModeKeys.EVAL:
        return tf.compat.v1.estimator.tpu.TPUEstimatorSpec(
            mode=mode, loss=loss, eval_metrics=(metric_fn, [labels, logits]))


def _dataset(data_dir, name):
    """Images as 784 float32 values in [0, 1] and int32 labels, as official/mnist/dataset.py yields them."""

    def decode(record):
        parsed = tf.io.parse_single_example(record, {
            "image_raw": tf.io.FixedLenFeature([], tf.string),
            "label": tf.io.FixedLenFeature([], tf.int64),
        })
        image = tf.cast(tf.io.decode_raw(parsed["image_raw"], tf.uint8), tf.float32) / 255.0
        return tf.reshape(image, [784]), tf.cast(parsed["label"], tf.int32)

    return tf.data.TFRecordDataset(os.path.join(data_dir, name + ".tfrecord")).map(decode)


def train_input_fn(params):
    """train_input_fn defines the input pipeline used for training."""
    batch_size = params["batch_size"]
    data_dir = params["data_dir"]
    # Retrieves the batch size for the current shard. The # of shards is
    # computed according to the input pipeline deployment. See
    # tf.compat.v1.estimator.tpu.RunConfig for details.
    ds = _dataset(data_dir, "train").cache().repeat().shuffle(
        buffer_size=50000).batch(batch_size, drop_remainder=True)
    return ds


def eval_input_fn(params):
    batch_size = params["batch_size"]
    data_dir = params["data_dir"]
    ds = _dataset(data_dir, "eval").batch(batch_size, drop_remainder=True)
    return ds


def predict_input_fn(params):
    batch_size = params["batch_size"]
    data_dir = params["data_dir"]
    # Take out top 10 samples from test data to make the predictions.
    ds = _dataset(data_dir, "eval").take(10).batch(batch_size)
    return ds


def main(argv):
    del argv  # Unused.
    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.INFO)

    tpu_cluster_resolver = tf.distribute.cluster_resolver.TPUClusterResolver(
        FLAGS.tpu,
        zone=FLAGS.tpu_zone,
        project=FLAGS.gcp_project
    )

    run_config = tf.compat.v1.estimator.tpu.RunConfig(
        cluster=tpu_cluster_resolver,
        model_dir=FLAGS.model_dir,
        session_config=tf.compat.v1.ConfigProto(
            allow_soft_placement=True, log_device_placement=True),
        tpu_config=tf.compat.v1.estimator.tpu.TPUConfig(FLAGS.iterations, FLAGS.num_shards),
    )

    estimator = tf.compat.v1.estimator.tpu.TPUEstimator(
        model_fn=model_fn,
        use_tpu=FLAGS.use_tpu,
        train_batch_size=FLAGS.batch_size,
        eval_batch_size=FLAGS.batch_size,
        predict_batch_size=FLAGS.batch_size,
        params={"data_dir": FLAGS.data_dir},
        config=run_config)
    # TPUEstimator.train *requires* a max_steps argument.
    estimator.train(input_fn=train_input_fn, max_steps=FLAGS.train_steps)
    # TPUEstimator.evaluate *requires* a steps argument.
    # Note that the number of examples used during evaluation is
    # --eval_steps * --batch_size.
    # So if you change --batch_size then change --eval_steps too.
    if FLAGS.eval_steps:
        estimator.evaluate(input_fn=eval_input_fn, steps=FLAGS.eval_steps)


if __name__ == "__main__":
    app.run(main)
