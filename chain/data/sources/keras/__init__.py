"""`data=keras`: its settings, description and reader (`keras_data`) and the Keras cache's files read
with NumPy (`keras_cache`)."""

from chain.data.sources.keras.keras_data import SOURCE

__all__ = ["SOURCE"]
