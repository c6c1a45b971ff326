"""`data=callable`, the user's function returning a `tf.data.Dataset`: its settings, description
and reader (`callable_data`), what its stream reads (`function_record`) and the stream itself
(`function_stream`)."""

from chain.data.sources.function.callable_data import SOURCE

__all__ = ["SOURCE"]
