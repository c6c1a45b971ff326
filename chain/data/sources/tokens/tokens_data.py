"""`data=tokens`: a flat binary file of token ids (uint16 or uint32, as nanoGPT's `train.bin`), read
in place (memory-mapped) while training, cut into windows of `data.seq_len + 1` tokens: a window's
first `seq_len` ids are an example's inputs, its last `seq_len` (one token on) the target `next`,
a label per position for a per-token loss.

Windows are `sequential` (every window at a stride of `seq_len`; shuffled per epoch with
`data.shuffle`) or `random` (each starting at a random token, drawn from the run's seed). An epoch is
as many windows as the sequential cut holds either way. Validation is `data.val_path` (another token
file) or the last `data.val_fraction` of the file's tokens (default 0.1), always cut sequentially.
The stream's position is saved with every checkpoint (`token_stream`), so a resumed run
reads the windows it would have read.

No TensorFlow here. The ids are checked once: none may reach `data.vocab` (default: the largest id
+ 1, found by reading the file once), nor its limit of 2^20; and a file that looks written at the
other width than `data.dtype` is refused naming it (`token_width`).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from chain.data.paths import existing
from chain.data.sources.tokens import token_width
from chain.data.catalog import DataInfo, Target, held_out
from chain.data.data_source import MAX_CLASSES, DataSet, Read, Source
from chain.data.sources.tokens.token_record import TokenFiles, TokenPart
from chain.data.streamed import TRAIN, VAL, VOCABULARY, Streamed, refuse_share
from chain.errors import ConfigError
from chain.fields import choice, integer, optional, required, setting, string

DTYPES = ("uint16", "uint32")
WINDOWS = ("random", "sequential")
MAX_SEQ_LEN = 1 << 20


@dataclass(frozen=True, kw_only=True)
class Windowed(DataSet):
    """Ids cut into windows of `seq_len + 1` (what `data=tokens` and `data=text` share), always streamed."""

    seq_len: int = setting(integer(1, MAX_SEQ_LEN), "tokens per example (a window holds one more: the targets)")
    windows: str = setting(
        choice(*WINDOWS),
        "sequential: every window at a stride of seq_len (shuffled per epoch with data.shuffle); random: each "
        "starting at a random token",
    )

    @property
    def stream(self) -> bool:
        """Token files are always read in place while training, never loaded."""
        return True


@dataclass(frozen=True, kw_only=True)
class Tokens(Windowed):
    """A flat binary file of token ids, cut into windows of `seq_len + 1` tokens."""

    KIND: ClassVar[str] = "tokens"
    path: str = setting(
        required(string, "data=tokens data.path=train.bin data.seq_len=N"),
        "the token file: ids one after the other, no header (as nanoGPT's train.bin)",
    )
    val_path: str | None = setting(optional(string), "a second token file, for validation")
    dtype: str = setting(choice(*DTYPES), "the ids' type in the file")
    vocab: int | None = setting(
        optional(integer(2, MAX_CLASSES)),
        "ids are 0..vocab-1 (the model's output width); null: the file's largest id + 1",
    )


class TokenStream(TokenFiles, Streamed):
    """Token files streamed (`data=tokens`, `data=text`), opening their stream of windows (`token_stream`)."""

    def training(self, batch, shuffle, seed, skipped=None, share=None):
        from chain.data.sources.tokens import token_stream

        refuse_share(share)
        return token_stream.training(self, batch, shuffle, seed)

    def validation(self, batch, skipped=None):
        from chain.data.sources.tokens import token_stream

        return token_stream.validation(self, batch)

    def files_read(self) -> list[tuple[str, str, str]]:
        """The token files; for a tokenizer's ids, the texts and the vocabulary (not the ids' cache)."""
        if (made := self.made_from) is not None:
            return (
                [(p, self.TRAIN_KEY, TRAIN) for p in made.texts]
                + [(p, self.val_key, VAL) for p in made.val_texts]
                + [(p, made.VOCABULARY_KEY, VOCABULARY) for p in made.vocabulary]
            )
        out = [(p, self.TRAIN_KEY, TRAIN) for p in self.train.paths]
        if self.val is not None and self.val.paths != self.train.paths:  # data.val_path
            out += [(p, self.val_key, VAL) for p in self.val.paths]
        return out


def _tokens(path: str, key: str, dtype: str) -> int:
    """How many ids `path` holds; one line if it is not a whole number of them, or if they look like
    ids of the other width (`token_width`)."""
    existing(path, key)
    size, width = os.path.getsize(path), np.dtype(dtype).itemsize
    if size % width:
        raise ConfigError(
            f"{key}={path!r} holds {size} bytes, not a whole number of data.dtype={dtype} ids "
            f"({width} bytes each); give the dtype the file was written with"
        )
    if dtype == "uint16" and (line := token_width.narrow(path, key, size)) is not None:
        raise ConfigError(line)
    return size // width


@functools.lru_cache(maxsize=4)
def _largest(path: str, dtype: str, mtime: int, size: int) -> int:
    """The largest id of the file, read once per version of it (in blocks, memory-mapped)."""
    ids = np.memmap(path, dtype=dtype, mode="r")
    block = 1 << 24
    return max(int(ids[i : i + block].max()) for i in range(0, len(ids), block)) if len(ids) else -1


def largest(path: str, dtype: str) -> int:
    st = os.stat(path)
    return _largest(path, dtype, st.st_mtime_ns, st.st_size)


def part(paths: list[str], sizes: list[int], dtype: str, seq_len: int, start: int, stop: int, where: str) -> TokenPart:
    """Tokens `start`..`stop` of `paths` (their `sizes`); one line (`where`: the key, the file and which of
    its tokens) when they hold no whole window. Files of no token are left out (nothing to map)."""
    kept = [(p, n) for p, n in zip(paths, sizes) if n]
    out = TokenPart(tuple(p for p, _ in kept), tuple(n for _, n in kept), dtype, start, stop, seq_len)
    if not out.windows:
        raise ConfigError(
            f"{where} holds {stop - start} tokens, fewer than one window of data.seq_len={seq_len} "
            "+ 1; give more tokens or a smaller data.seq_len"
        )
    return out


def split(
    paths: list[str],
    sizes: list[int],
    val: tuple[list[str], list[int]] | None,
    data,
    key: str,
    what: str,
    dtype: str | None = None,
) -> tuple[TokenPart, TokenPart | None]:
    """The training part and the validation part: the files `val` (a key of their own), or the last
    `data.val_fraction` of the tokens (default 0.1, as nanoGPT's 90/10 split). The ids are `dtype`
    (default: `data.dtype`, or bytes for data=text)."""
    dtype, s, n = dtype or getattr(data, "dtype", "uint8"), data.seq_len, sum(sizes)  # data=text: bytes
    if val is not None:
        train = part(paths, sizes, dtype, s, 0, n, f"{key}={what}")
        return train, part(*val, dtype, s, 0, sum(val[1]), f"the validation files of {key}")
    held = held_out(n, data, f"data={data.name} ({what})")
    train = part(paths, sizes, dtype, s, 0, n - held, f"{key}={what}: its training share")
    return train, part(paths, sizes, dtype, s, n - held, n, f"{key}={what}: its validation share") if held else None


def shards(data: Tokens) -> TokenStream:
    """The training and validation tokens, their windows and the vocabulary (the ids checked against it)."""
    n = _tokens(data.path, "data.path", data.dtype)
    val = None
    if data.val_path is not None:
        if data.val_fraction is not None:
            raise ConfigError(f"data.val_fraction={data.val_fraction} and data.val_path are both set; give one")
        val = ([data.val_path], [_tokens(data.val_path, "data.val_path", data.dtype)])
    train, val = split([data.path], [n], val, data, "data.path", repr(data.path))
    tops = {path: largest(path, data.dtype) for p in (train, val) if p is not None for path in p.paths}
    for path, top in tops.items():
        if top >= MAX_CLASSES:  # only a uint32 reading gets there: a uint16 id is below 65536
            key = "data.path" if path == data.path else "data.val_path"
            raise ConfigError(token_width.wide(path, key, top, largest(path, "uint16")))
    top = max(tops.values())
    vocab = data.vocab if data.vocab is not None else max(2, top + 1)
    if top >= vocab:
        raise ConfigError(
            f"data.vocab={vocab}, but the token files hold the id {top}; ids are 0..vocab-1: set "
            f"data.vocab={top + 1} or more (the model's output width)"
        )
    return TokenStream(train, val, vocab, data.windows)


def describe_files(data, s: TokenFiles) -> DataInfo:
    """Examples of `seq_len` ids with the target `next` (the following id at each position, `vocab` classes)."""
    return DataInfo(
        data.name,
        (data.seq_len,),
        s.examples,
        (Target(TokenFiles.TARGET, s.vocab, (data.seq_len,)),),
        s.val.windows if s.val else 0,
    )


def describe(data: Tokens) -> DataInfo:
    """Examples of `seq_len` ids with the target `next` (the following id at each position, `vocab` classes)."""
    return describe_files(data, shards(data))


def read(data, seed: int, info: DataInfo | None = None) -> Read:
    """Never called: token files are streamed (`shards`)."""
    raise ConfigError(f"data={data.name} is read while training, never loaded")


SOURCE = Source(Tokens, describe, read, shards)
