"""What a token stream reads (`data=tokens`, `data=text`): `TokenFiles` and its `TokenPart`s (and,
for a tokenizer's ids, what they were made from: `Tokenized`), made by `tokens_data.shards` and
`text_data.shards` without TensorFlow and read by `token_stream`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar


@dataclass(frozen=True)
class TokenPart:
    """Tokens `start`..`stop` of the ids of `paths` one after the other (each file `sizes[k]` ids of NumPy
    `dtype`; one file for `data=tokens`, a glob's UTF-8 files as bytes for `data=text`), cut into windows
    of `seq_len + 1` tokens (the inputs and, one token on, their targets): `windows` of them."""

    paths: tuple[str, ...]
    sizes: tuple[int, ...]
    dtype: str
    start: int
    stop: int
    seq_len: int

    @property
    def windows(self) -> int:
        """Whole windows the part holds at a stride of `seq_len` (each needs one more token)."""
        return max(0, (self.stop - self.start - 1) // self.seq_len)


@dataclass(frozen=True)
class Tokenized:
    """What a tokenizer's token files were made from (`data=text data.tokenizer`): the training texts
    (`texts`), the validation texts (`val_texts`, `data.val_path`; empty: held out of the training
    texts' ids) and the vocabulary's files. They are the stream's identity, not the ids' files in the
    user's cache, which a cleared cache, another `$HOME` or another machine makes again."""

    texts: tuple[str, ...]
    val_texts: tuple[str, ...]
    vocabulary: tuple[str, ...]
    VOCABULARY_KEY: ClassVar[str] = "data.tokenizer"


@dataclass(frozen=True)
class TokenFiles:
    """Token files streamed (`data=tokens`, `data=text`): the training tokens (`train`), the validation tokens
    (`val`, None: none), the vocabulary (`vocab`: ids 0..vocab-1) and how training windows are
    drawn (`windows`: `sequential`, every window of the part at a stride of seq_len, in order or
    shuffled per epoch; `random`, each starting at a random token, as nanoGPT's `get_batch`);
    `made_from`: the texts and vocabulary a tokenizer made the files of (None: the files are the data)."""

    train: TokenPart
    val: TokenPart | None
    vocab: int
    windows: str
    made_from: Tokenized | None = None
    TRAIN_KEY: ClassVar[str] = "data.path"  # what names the training files, and the validation files
    val_key: ClassVar[str] = "data.val_path"
    TARGET: ClassVar[str] = "next"  # the target: the next token at every position

    @property
    def examples(self) -> int:
        return self.train.windows
