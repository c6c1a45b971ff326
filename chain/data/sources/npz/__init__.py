"""`data=npz`: its settings, description, reader and stream record (`npz_data`), an `.npz` file's arrays
read with NumPy (`npz_members`), what its stream reads (`npz_record`) and its `tf.data` stream (`npz_stream`)."""

from chain.data.sources.npz.npz_data import SOURCE

__all__ = ["SOURCE"]
