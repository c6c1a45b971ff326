"""`data=tokens`: its settings, description and stream record (`tokens_data`), what a token stream
reads (`token_record`, `data=text`'s too), the width a token file was written at (`token_width`) and the
`tf.data` stream of token windows (`token_stream`)."""

from chain.data.sources.tokens.tokens_data import SOURCE

__all__ = ["SOURCE"]
