"""The token ids a data set gives `model=gpt`: how many per example (the window, `seq_len`) and their type,
known without loading them, for every form of token data: windows of a token file or of text (`data=tokens`,
`data=text`: `data.seq_len`) and the user's `(N, T)` arrays of ids (`data=npz`: the header of `data.x`;
`data=tfrecord`: its declared feature), whose targets are the user's own `(N, T)` labels (nothing is
shifted here: a window's targets one token on are what `data=tokens` makes).

`ids(data)` refuses in one line an input that is not one row of integer ids per example (float ids: a model
of token ids would round them), and `check` ids of the user's arrays outside `[0, vocab)`, naming the key
and the file. No TensorFlow here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from chain.data.sources.npz import npz_members
from chain.data.streamed import Streamed
from chain.data.verify import in_vocab
from chain.errors import ConfigError

WINDOWED = ("text", "tokens")  # examples are windows of a token stream, `data.seq_len` ids each
ARRAYS = ("npz", "tfrecord")  # examples are the rows of the user's (N, T) integer arrays


@dataclass(frozen=True)
class Ids:
    """An example's token ids: `seq_len` of them, stored as `dtype` (NumPy's name; TFRecord: int64)."""

    seq_len: int
    dtype: str


def ids(data) -> Ids:
    """The ids `data` gives per example; one line when its inputs are not `(N, T)` integer ids."""
    if data.name in WINDOWED:
        return Ids(data.seq_len, getattr(data, "dtype", "uint8"))  # data=text: bytes
    if data.name == "npz":
        shape, dtype = npz_members.npz_header(data.path, data.x, "data.x", "data.path")
        where, held = f"data.x={data.x!r} of {data.path}", f"{dtype} of shape {shape}"
    elif data.name == "tfrecord":
        dtype_name, per_example = dict(data.features)[data.x]
        if None in per_example:  # int64[None]: up to the largest bucket
            per_example = tuple(data.buckets or (1,))[-1:]
        shape, dtype = ("N", *per_example), np.dtype(np.int64 if dtype_name == "int64" else np.float32)
        where, held = f"data.x={data.x!r} (data.features)", f"{dtype_name}{list(per_example)} per example"
    else:
        raise ConfigError(
            f"model=gpt reads token ids: it needs data=text, tokens, npz or tfrecord (is data={data.name})"
        )
    if dtype.kind not in "iu" or len(shape) != 2:
        raise ConfigError(
            f"model=gpt reads token ids, one row of integer ids per example ((N, T)), but {where} holds "
            f"{held}; give integer ids (e.g. np.int32)"
        )
    return Ids(int(shape[1]), dtype.name)


def check(
    data,
    x: np.ndarray | None,
    val_x: np.ndarray | None,
    shards: Streamed | None,
    vocab: int,
    target: str,
    ignored: int | None = None,
) -> Streamed | None:
    """The user's arrays of ids (`data=npz`, `data=tfrecord`) within `[0, vocab)`, before training: the
    loaded inputs `x` and `val_x` (their targets are checked as every class label is), or a stream's inputs
    and `target` (the one `model=gpt` learns; its labels may also be `ignored`, `ignore_class`)
    (`Streamed.check_ids`: a streamed `.npz` file's, read in place once; a streamed TFRecord's, as the
    stream reads them). Returns the stream to read (`shards`, or one that checks its ids)."""
    if data.name not in ARRAYS:
        return shards
    if x is not None:
        own = f"data.x={data.x!r} of {data.path}"
        in_vocab(x, vocab, own)
        if val_x is not None:
            val = data.val_path
            in_vocab(val_x, vocab, f"data.x={data.x!r} of {val}" if val else own)
    elif shards is not None:
        return shards.check_ids(data, vocab, target, ignored)
    return shards
