"""Data: what a data set looks like (`catalog`, no TensorFlow), its arrays (`sources`), and
the one `tf.data` stream every stage shares (`stream`), the checks of arrays and batches
(`verify`)."""

from chain.data.catalog import DataInfo, Target, describe
from chain.data.sources import Dataset, load

__all__ = ["DataInfo", "Target", "Dataset", "describe", "load"]
