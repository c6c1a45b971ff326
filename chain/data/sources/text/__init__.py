"""`data=text`: its settings, description and stream record (`text_data`: streamed as token files
are, by `chain.data.sources.tokens`) and a tokenizer's ids of the texts (`text_tokens`)."""

from chain.data.sources.text.text_data import SOURCE

__all__ = ["SOURCE"]
