"""`data=csv`: its settings, description, reader and stream record (`csv_data`), the CSV files read with
NumPy (`csv_table`), what its stream reads (`csv_record`) and its `tf.data` stream (`csv_stream`)."""

from chain.data.sources.csv.csv_data import SOURCE

__all__ = ["SOURCE"]
