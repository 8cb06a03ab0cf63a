"""TensorFlow's own gs:// filesystem against the local GCS from gcs_fake."""

import os
import socket

import pytest


# Every test here requests `gcs`, so the environment is set before this process's first gs:// call.


def _example(index: int, payload: bytes) -> bytes:
    import tensorflow as tf

    features = {
        "index": tf.train.Feature(int64_list=tf.train.Int64List(value=[index])),
        "payload": tf.train.Feature(bytes_list=tf.train.BytesList(value=[payload])),
    }
    return tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString()


def test_tfrecords_written_to_gs_read_back_byte_for_byte(gcs):
    import tensorflow as tf

    bucket = gcs.make_bucket("tfrecords")
    url = gcs.url(bucket, "x/train-0.tfrecord")
    records = [_example(0, b"small"), _example(1, os.urandom(1 << 20)), _example(2, b""), _example(3, b"tail")]

    with tf.io.TFRecordWriter(url) as writer:
        for record in records:
            writer.write(record)

    assert tf.io.gfile.glob(gcs.url(bucket, "x/train-*.tfrecord")) == [url]
    assert [r.numpy() for r in tf.data.TFRecordDataset(url)] == records


def test_exists_is_false_for_a_missing_object(gcs):
    import tensorflow as tf

    bucket = gcs.make_bucket("exists")
    with tf.io.gfile.GFile(gcs.url(bucket, "present.txt"), "w") as f:
        f.write("x")

    assert (tf.io.gfile.exists(gcs.url(bucket, "present.txt")),
            tf.io.gfile.exists(gcs.url(bucket, "absent.txt"))) == (True, False)


def test_glob_in_a_missing_bucket_raises_not_found(gcs):
    import tensorflow as tf

    with pytest.raises(tf.errors.NotFoundError):
        tf.io.gfile.glob(gcs.url("no-such-bucket", "*.tfrecord"))


def test_every_tunnel_goes_to_a_google_storage_host(gcs):
    import tensorflow as tf

    already_logged = len(gcs.connect_targets())
    bucket = gcs.make_bucket("tunnels")
    with tf.io.gfile.GFile(gcs.url(bucket, "a.txt"), "w") as f:
        f.write("hello")
    with tf.io.gfile.GFile(gcs.url(bucket, "a.txt"), "r") as f:
        assert f.read() == "hello"

    targets = gcs.connect_targets()[already_logged:]
    assert set(targets) == {"www.googleapis.com:443", "storage.googleapis.com:443"}


def test_proxy_refuses_tunnels_to_other_hosts(gcs):
    proxy_port = int(gcs.env["HTTPS_PROXY"].rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", proxy_port), timeout=5) as sock:
        sock.sendall(b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n")
        status_line = sock.makefile("rb").readline()

    assert status_line == b"HTTP/1.1 403 Forbidden\r\n"
    assert gcs.connect_targets()[-1] == "example.com:443"
