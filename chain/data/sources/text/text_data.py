"""`data=text`: UTF-8 text files (a glob), their bytes the token ids (0..255), one file after the other
in sorted order, cut into windows of `data.seq_len + 1` as `data=tokens` cuts a token file, and
streamed the same way (`chain.data.sources.tokens`): read in place, the position saved with every
checkpoint. A byte-level model needs no vocabulary: the target `next` has 256 classes. Validation is
`data.val_path` (another glob) or the last `data.val_fraction` of the bytes (default 0.1).

Each file is checked to be UTF-8 (one line naming the file and the first byte that is not). With
`data.tokenizer` (a keras_hub vocabulary: `text_tokens`) the ids are that tokenizer's of each
file's text instead, tokenized once and kept on disk, and the target has the vocabulary's classes.

`data.examples=lines|files` makes each line or file one example instead (its bytes, or the tokenizer's ids
of it), in length buckets (`data.buckets`) or packed into windows (`data.pack`): `text_examples`, streamed
by `example_stream`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import ClassVar

from chain.data.paths import matching
from chain.data.sources.text import text_examples, text_tokens
from chain.data.catalog import DataInfo
from chain.data.data_source import Read, Source
from chain.data.streamed import Streamed, refuse_share
from chain.data.sources.tokens import tokens_data
from chain.data.sources.tokens.token_record import Tokenized
from chain.data.sources.tokens.tokens_data import MAX_SEQ_LEN, TokenStream, Windowed, describe_files, split
from chain.errors import ConfigError
from chain.fields import boolean, choice, integer, list_or_word, optional, required, setting, string

BYTES = 256  # byte-level ids
EXAMPLES = ("windows", "lines", "files")
CHECK_BLOCK = 1 << 20


@dataclass(frozen=True, kw_only=True)
class Text(Windowed):
    """UTF-8 text files, their bytes the ids, cut into windows of `seq_len + 1` bytes."""

    KIND: ClassVar[str] = "text"
    path: str = setting(
        required(string, "data=text 'data.path=corpus/*.txt' data.seq_len=N"),
        "a glob of UTF-8 text files (read in sorted order, one after the other)",
    )
    val_path: str | None = setting(optional(string), "a glob of UTF-8 text files for validation")
    tokenizer: str | None = setting(
        optional(string),
        "a keras_hub tokenizer's local vocabulary: vocab.txt (WordPiece), vocab.json with merges.txt beside it "
        "(byte-pair), or their folder; null: byte-level ids",
    )
    examples: str = setting(
        choice(*EXAMPLES),
        "windows: the text cut into windows of data.seq_len; lines: each non-empty line one example (its newline "
        "the last target); files: each file one example (lines and files need data.buckets)",
    )
    buckets: tuple[int, ...] | str | None = setting(
        optional(list_or_word("auto", integer(1, MAX_SEQ_LEN))),
        "data.examples=lines|files: increasing lengths up to data.seq_len (e.g. [64,128,256]), each batch padded "
        "to the first its examples fit; auto: from the data's lengths (printed); longer examples cut to the last",
    )

    pack: bool = setting(
        boolean,
        "data.examples=lines|files: fill windows of data.seq_len with several examples (segment ids: model=gpt "
        "attends within each) instead of data.buckets",
    )

    @property
    def lengths_vary(self) -> bool:
        """Examples of different lengths, in buckets (`data.examples=lines|files`, not packed)."""
        return self.examples != "windows" and not self.pack

    @property
    def packed(self) -> bool:
        """Examples packed into windows of `seq_len` (`data.pack`)."""
        return self.pack


def _utf8(path: str, key: str) -> int:
    """The file's size in bytes, once it is known to be UTF-8 (read in blocks; a character cut
    between two blocks is carried to the next)."""
    import codecs

    decoder = codecs.getincrementaldecoder("utf-8")()
    done = 0
    with open(path, "rb") as f:
        while block := f.read(CHECK_BLOCK):
            try:
                decoder.decode(block)
            except UnicodeDecodeError as e:
                raise ConfigError(
                    f"{key}: {path} is not UTF-8 text (byte {done + e.start} is {block[e.start]:#04x}); "
                    "data=text reads UTF-8 files"
                ) from None
            done += len(block)
    try:
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        raise ConfigError(f"{key}: {path} is not UTF-8 text (it ends inside a character)") from None
    return os.path.getsize(path)


def _files(pattern: str, key: str) -> tuple[list[str], list[int]]:
    paths = matching(pattern, key)
    return paths, [_utf8(p, f"{key}={pattern!r}") for p in paths]


class ExampleStream(text_examples.Examples, Streamed):
    """Text examples of different lengths streamed in length buckets (`example_stream`)."""

    def training(self, batch, shuffle, seed, skipped=None, share=None):
        from chain.data.sources.text import example_stream

        refuse_share(share)
        if self.pack:
            return example_stream.packed_training(self, batch, shuffle, seed)
        return example_stream.training(self, batch, shuffle, seed)

    def validation(self, batch, skipped=None):
        from chain.data.sources.text import example_stream

        return example_stream.packed_validation(self, batch) if self.pack else example_stream.validation(self, batch)


def _checked(data: Text) -> None:
    """`data.examples` and `data.buckets` together, before any file is read."""
    text_examples.check_buckets(data.buckets, data.examples, data.seq_len)
    if data.pack and (data.examples == "windows" or data.buckets is not None):
        raise ConfigError(
            f"data.pack=true packs examples of different lengths into windows: it needs data.examples=lines or "
            f"files (is {data.examples}) and no data.buckets (is {data.buckets})"
        )
    if data.lengths_vary and data.buckets is None:
        raise ConfigError(
            f"data.examples={data.examples} makes examples of different lengths: give data.buckets "
            "(e.g. data.buckets=[64,128,256], or auto)"
        )


def shards(data: Text) -> TokenStream | ExampleStream:
    """The training and validation bytes and their windows (or, `data.examples=lines|files`, their examples)."""
    _checked(data)
    val = None
    if data.val_path is not None:
        if data.val_fraction is not None:
            raise ConfigError(f"data.val_fraction={data.val_fraction} and data.val_path are both set; give one")
        val = _files(data.val_path, "data.val_path")
    paths, sizes = _files(data.path, "data.path")
    if data.examples != "windows" and data.tokenizer is None:
        val_ids = text_examples.Ids(tuple(val[0])) if val is not None else None
        return text_examples.examples(data, text_examples.Ids(tuple(paths)), val_ids, BYTES, ExampleStream)
    if data.tokenizer is None:
        train, val_part = split(paths, sizes, val, data, "data.path", repr(data.path))
        return TokenStream(train, val_part, BYTES, data.windows)
    vocabulary = text_tokens.vocabulary(data.tokenizer)
    made_from = Tokenized(tuple(paths), tuple(val[0]) if val is not None else (), vocabulary.paths)
    if data.examples != "windows":  # each line's (or file's) ids, kept in the cache with where each example ends
        ids, vocab = text_tokens.example_files(paths, vocabulary, data.examples)
        val_ids = text_tokens.example_files(val[0], vocabulary, data.examples)[0] if val is not None else None
        return text_examples.examples(data, ids, val_ids, vocab, ExampleStream, made_from)
    paths, sizes, vocab = text_tokens.token_files(paths, vocabulary)
    if val is not None:
        val = text_tokens.token_files(val[0], vocabulary)[:2]
    train, val_part = split(paths, sizes, val, data, "data.path", repr(data.path), text_tokens.DTYPE)
    return TokenStream(train, val_part, vocab, data.windows, made_from=made_from)


def describe(data: Text) -> DataInfo:
    """Examples of `seq_len` ids (bytes, or the tokenizer's) with the target `next` (the following id at each
    position: 256 classes, or the tokenizer's vocabulary)."""
    s = shards(data)
    return text_examples.describe(data, s) if data.examples != "windows" else describe_files(data, s)


def read(data: Text, seed: int, info: DataInfo | None = None) -> Read:
    """Never called: text files are streamed (`shards`), as token files are."""
    return tokens_data.read(data, seed, info)


SOURCE = Source(Text, describe, read, shards)
