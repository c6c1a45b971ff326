"""Data: what a data set looks like (`catalog`, no TensorFlow), one module per source with its
settings, description and reader (`sources`, one registry), its arrays loaded once (`loader`),
the one `tf.data` stream every stage shares (`stream`), the checks of arrays and batches
(`verify`)."""

from chain.data.catalog import DataInfo, Target
from chain.data.loader import Dataset, load
from chain.data.sources import describe

__all__ = ["DataInfo", "Target", "Dataset", "describe", "load"]
