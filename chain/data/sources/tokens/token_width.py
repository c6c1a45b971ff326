"""Whether a token file is read at the width it was written with (`data=tokens data.dtype`). No TensorFlow.

A uint32 file read as uint16 (the default) gives two ids for each of its ids: the low half, and the
high half, which is 0 for an id under 65536 and below 16 for any id under `data.vocab`'s limit of 2^20.
So every second id, at the odd positions of a little-endian file, is 0 (or below 16). In a real
token file the even and odd positions hold ids of one distribution, so `narrow` refuses a uint16
reading only when a sample of pairs of positions (`PAIRS` of them in `BLOCKS` blocks spread over the
file, memory-mapped: a few pages read, whatever the file's size) shows every odd position 0 while at
least a quarter of the even ones are not, or every odd position below 16 while at least a quarter of
the even ones are not; and the file's size is a whole number of uint32 ids. A file of fewer than
`MIN_PAIRS` pairs is not judged. Were its positions independent draws of one distribution, a file
would trip a rule with a chance below e^(-0.19 n) for n pairs sampled (Chernoff's bound; at most
at a share of 1/8 of ids at or above the rule's bound): 10^-10 at `MIN_PAIRS`, 10^-300 at `PAIRS`.

The other mistake, a uint16 file read as uint32, makes ids of two ids each (`a + 65536 b`): at or
above 2^20, over `data.vocab`'s limit, as soon as one of the odd ids is 16 or more. `wide` is the
line that refuses such an id and names the width that fits.
"""

from __future__ import annotations

import sys

import numpy as np

from chain.data.data_source import MAX_CLASSES

PAIRS, BLOCKS = 4096, 64  # pairs of positions sampled, in blocks of 64 pairs (256 bytes) spread over the file
MIN_PAIRS = 128
HIGH = MAX_CLASSES >> 16  # 16: the high half of any id under the limit is below it
_HIGH_AT = 1 if sys.byteorder == "little" else 0  # memory-mapped ids are in the machine's byte order


def _sample(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(low halves, high halves) of up to `PAIRS` pairs of `ids` read as uint16, in `BLOCKS` blocks."""
    pairs = ids[: len(ids) // 2 * 2].reshape(-1, 2)
    if len(pairs) > PAIRS:
        per = PAIRS // BLOCKS
        starts = np.linspace(0, len(pairs) - per, BLOCKS).astype(np.int64)
        pairs = np.concatenate([pairs[s : s + per] for s in starts])
    return np.asarray(pairs[:, 1 - _HIGH_AT]), np.asarray(pairs[:, _HIGH_AT])


def narrow(path: str, key: str, size: int) -> str | None:
    """The one line refusing `path` (of `size` bytes, named by `key`) read as uint16 when its ids look
    like uint32 ones (see the module); None when they do not."""
    if size % 4:
        return None  # not a whole number of uint32 ids: not a uint32 file
    low, high = _sample(np.memmap(path, dtype="uint16", mode="r"))
    n = len(high)
    if n < MIN_PAIRS:
        return None
    for bound, said in ((1, "0"), (HIGH, f"below {HIGH}")):
        others = int((low >= bound).sum())
        if int(high.max()) < bound and 4 * others >= n:
            return (
                f"{key}={path!r} looks like uint32 ids read as data.dtype=uint16: at {n} pairs of positions "
                f"sampled over it, every second id is {said} (the high half of a uint32 id) and {others} of the "
                "others are not; set data.dtype=uint32"
            )
    return None


def wide(path: str, key: str, top: int, top_narrow: int) -> str:
    """The one line refusing `path` read as uint32, whose largest id `top` is over `data.vocab`'s limit;
    `top_narrow` is its largest id read as uint16."""
    return (
        f"{key}={path!r} read as data.dtype=uint32 holds the id {top}, over data.vocab's limit of {MAX_CLASSES} "
        f"ids: if it holds uint16 ids (each of these is two of them), set data.dtype=uint16 (its ids are then "
        f"0..{top_narrow})"
    )
