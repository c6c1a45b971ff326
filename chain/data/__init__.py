"""Data: what a data set looks like (`catalog`, no TensorFlow), its arrays (`sources`), and
the one `tf.data` pipeline every stage shares (`pipeline`)."""

from chain.data.catalog import DataInfo, Target, describe
from chain.data.sources import Dataset, load

__all__ = ["DataInfo", "Target", "Dataset", "describe", "load"]
