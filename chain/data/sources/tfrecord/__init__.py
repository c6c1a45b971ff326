"""`data=tfrecord`: its settings, description, reader and stream record (`tfrecord_data`), a TFRecord
file's framing and features read without TensorFlow (`tfrecord_files`), what its stream reads
(`tfrecord_record`) and its `tf.data` stream (`tfrecord_stream`)."""

from chain.data.sources.tfrecord.tfrecord_data import SOURCE

__all__ = ["SOURCE"]
