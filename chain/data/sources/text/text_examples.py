"""`data=text data.examples=lines|files`: examples of different lengths, each padded only to its length
bucket (`data.buckets`). No TensorFlow here: the files are scanned with NumPy (memory-mapped), each
example's first byte and length kept, and every epoch's batches are a pure function of the seed and the
epoch's number (`epoch_batches`), so the stream (`example_stream`) holds no state but a counter of
batches and a resumed run reads the batches it would have read.

An example is a line (its bytes and its newline: the model learns where a line ends) or a whole file;
with `data.tokenizer`, the tokenizer's ids of the line or the file (`Ids`, made by
`text_tokens.example_files`). Its inputs are its ids but the last, its targets the same ids one on. One
longer than the largest bucket is cut to it. The padding id is 0 in the inputs and the targets (the NUL
byte, which text files do not hold, or a tokenizer's id 0: a file that holds it is refused), and the loss and the metrics ignore it (`ignore_class=0`, settled by
`chain.config.checks.padding`). With `data.pack` the examples are packed into windows of `data.seq_len`
instead (`pack`, `packed`: token ids, segment ids and targets).
"""

from __future__ import annotations

import functools
import logging
import math
import os
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from chain.data.catalog import DataInfo, Target, held_out, increasing_buckets
from chain.data.sources.tokens.token_record import Tokenized
from chain.data.streamed import TRAIN, VAL, VOCABULARY
from chain.errors import ConfigError

log = logging.getLogger(__name__)

PAD = 0  # the padding id of inputs and targets
NEWLINE = 10
AUTO_QUANTILES = (0.5, 0.75, 0.9, 1.0)  # data.buckets=auto: these shares of the examples fit their bucket
AUTO_STEP = 8  # data.buckets=auto: bucket lengths are multiples of this


@dataclass(frozen=True)
class Ids:
    """Files of ids to cut into examples: the text files themselves (their bytes, `dtype` uint8, `ends`
    None: each line or file an example), or a tokenizer's ids of them (`text_tokens.example_files`:
    `paths` its files of uint32 ids, `ends[k]` where each example of file k ends, `texts` the text files
    they were made of, which error lines name)."""

    paths: tuple[str, ...]
    dtype: str = "uint8"
    ends: tuple[np.ndarray, ...] | None = None
    texts: tuple[str, ...] | None = None


@dataclass(frozen=True, eq=False)
class Part:
    """Examples of the files `paths` (their ids, of NumPy `dtype`, one after the other, `offsets[k]` the
    first id of file k): example i is `lengths[i]` inputs from id `starts[i]`, and the targets one id on."""

    paths: tuple[str, ...]
    offsets: tuple[int, ...]
    starts: np.ndarray  # int64
    lengths: np.ndarray  # int32, after the cut
    dtype: str = "uint8"

    def __len__(self) -> int:
        return len(self.starts)

    def taken(self, rows: np.ndarray) -> Part:
        """The examples `rows` of this part."""
        return Part(self.paths, self.offsets, self.starts[rows], self.lengths[rows], self.dtype)


def check_buckets(buckets, examples: str, seq_len: int) -> None:
    """`data.buckets` against `data.examples` and `data.seq_len`: one line naming the key."""
    if buckets is None:
        return
    if examples == "windows":
        raise ConfigError(
            f"data.buckets={_shown(buckets)} needs examples of different lengths: set data.examples=lines or "
            "files (data.examples=windows cuts every example to data.seq_len)"
        )
    if buckets == "auto":
        return
    increasing_buckets(buckets)
    if buckets[-1] > seq_len:
        raise ConfigError(
            f"data.buckets={_shown(buckets)} holds {buckets[-1]}, longer than data.seq_len={seq_len} (the longest "
            "an example may be); give buckets up to data.seq_len"
        )


def _shown(buckets) -> str:
    return buckets if isinstance(buckets, str) else "[" + ",".join(map(str, buckets)) + "]"


def _ids(path: str, dtype: str = "uint8") -> np.ndarray:
    """The file's ids, memory-mapped (NumPy cannot map an empty file)."""
    return np.memmap(path, dtype=dtype, mode="r") if os.path.getsize(path) else np.zeros(0, dtype)


def _padding_held(ids: np.ndarray, source: Ids, k: int, examples: str, key: str) -> None:
    """One line naming the text file when its ids hold the padding id (a NUL byte, or a tokenizer's id 0)."""
    if not (nul := np.flatnonzero(ids == PAD)).size:
        return
    if source.texts is None:
        raise ConfigError(
            f"{key}: {source.paths[k]} holds a NUL byte (byte {int(nul[0])}), the padding id of "
            f"data.examples={examples}; remove it, or use data.examples=windows"
        )
    raise ConfigError(
        f"{key}: {source.texts[k]} tokenizes to id 0 (its id {int(nul[0])}), the padding id of "
        f"data.examples={examples}: give data.tokenizer a vocabulary whose id 0 is its padding token (WordPiece's "
        "[PAD] first), or use data.examples=windows"
    )


def _scan(source: Ids, examples: str, key: str) -> tuple[tuple[int, ...], np.ndarray, np.ndarray]:
    """Each file's first id among them all, and every example's first id and full length (its ids,
    newline included); examples of fewer than 2 ids (no target) are left out."""
    offsets, starts, sizes, first = [], [], [], 0
    for k, path in enumerate(source.paths):
        ids = _ids(path, source.dtype)
        _padding_held(ids, source, k, examples, key)
        if source.ends is not None:  # a tokenizer's ids: where each example ends, kept beside them
            end = source.ends[k]
            begin = np.concatenate([[0], end[:-1]]).astype(np.int64)
        elif examples == "files":
            begin, end = np.zeros(1, np.int64), np.array([len(ids)], np.int64)
        else:
            ends = np.flatnonzero(ids == NEWLINE).astype(np.int64) + 1  # one past each newline
            if len(ids) and (not ends.size or ends[-1] != len(ids)):
                ends = np.append(ends, len(ids))  # a last line without its newline
            begin, end = np.concatenate([[0], ends[:-1]]).astype(np.int64), ends
        kept = end - begin >= 2
        offsets.append(first)
        starts.append(first + begin[kept])
        sizes.append((end - begin)[kept])
        first += len(ids)
    return tuple(offsets), np.concatenate(starts), np.concatenate(sizes)


def auto_buckets(lengths: np.ndarray, seq_len: int) -> tuple[int, ...]:
    """`data.buckets=auto`: the lengths that `AUTO_QUANTILES` of the examples fit, rounded up to
    `AUTO_STEP`, the last the longest example (all at most it and `seq_len`)."""
    found = [int(np.quantile(lengths, q, method="higher")) for q in AUTO_QUANTILES]
    top = min(seq_len, int(lengths.max()))  # no bucket longer than the longest example
    return tuple(sorted({min(top, AUTO_STEP * math.ceil(n / AUTO_STEP)) for n in found[:-1]} | {top}))


def part(source: Ids, data, key: str, buckets: tuple[int, ...] | None = None) -> tuple[Part, tuple[int, ...]]:
    """The examples of `source` (`key` names their glob) and the buckets (`data.buckets`, or `buckets`
    given, or worked out from these lengths), each example cut to the largest bucket (logged)."""
    offsets, starts, sizes = _scan(source, data.examples, key)
    if not len(starts):
        raise ConfigError(
            f"{key}={getattr(data, key.split('.')[-1])!r} holds no example of 2 ids or more "
            f"(data.examples={data.examples}); give text files with some"
        )
    lengths = sizes - 1  # the inputs: every id but the last
    if buckets is None:
        buckets = (data.seq_len,) if data.pack else data.buckets  # packed: each example cut to a window
        if buckets == "auto":
            buckets = auto_buckets(lengths, data.seq_len)
            log.info("data.buckets=auto: %s (from the lengths of %d examples)", _shown(buckets), len(lengths))
    cut = int((lengths > buckets[-1]).sum())
    if cut:
        why = "a window, data.seq_len" if data.pack else "the largest bucket"
        log.info("%s: %d of %d examples cut to %d ids (%s)", key, cut, len(lengths), buckets[-1], why)
    cut_lengths = np.minimum(lengths, buckets[-1]).astype(np.int32)
    return Part(source.paths, offsets, starts, cut_lengths, source.dtype), buckets


def bucket_of(lengths: np.ndarray, buckets: tuple[int, ...]) -> np.ndarray:
    """Each example's bucket: the first at least as long as it."""
    return np.searchsorted(np.asarray(buckets), lengths, side="left")


def whole_batches(lengths: np.ndarray, buckets: tuple[int, ...], batch: int) -> int:
    """Batches of `batch` in an epoch: each bucket's examples in whole batches (the rest left out that epoch)."""
    return int(sum(n // batch for n in np.bincount(bucket_of(lengths, buckets), minlength=len(buckets))))


def epoch_batches(lengths: np.ndarray, buckets: tuple[int, ...], batch: int, shuffle: bool, seed: int, epoch: int):
    """Epoch `epoch`'s batches ([batches, batch] example numbers), each of one bucket: the examples
    shuffled (from `seed` and `epoch`) and cut per bucket into whole batches, then the batches shuffled."""
    which = bucket_of(lengths, buckets)
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(len(lengths)) if shuffle else np.arange(len(lengths))
    rows = []
    for b in range(len(buckets)):
        members = order[which[order] == b]
        whole = len(members) // batch * batch
        rows.append(members[:whole].reshape(-1, batch))
    out = np.concatenate(rows)
    return out[rng.permutation(len(out))] if shuffle else out


def padded(part: Part, rows: np.ndarray, length: int) -> tuple[np.ndarray, np.ndarray]:
    """Examples `rows` of `part`: inputs and targets (int32 [len(rows), length]), padded with `PAD`."""
    x = np.full((len(rows), length), PAD, np.int32)
    y = np.full((len(rows), length), PAD, np.int32)
    for k, i in enumerate(rows.tolist()):
        start, n = int(part.starts[i]), int(part.lengths[i])
        ids = _read(part, start, start + n + 1)
        x[k, :n], y[k, :n] = ids[:-1], ids[1:]
    return x, y


def _read(part: Part, start: int, stop: int) -> np.ndarray:
    """Bytes `start`..`stop` of the part's files one after the other (an example never spans two)."""
    k = int(np.searchsorted(np.asarray(part.offsets), start, side="right")) - 1
    return _memmap(part.paths[k], part.dtype)[start - part.offsets[k] : stop - part.offsets[k]]


@functools.lru_cache(maxsize=64)
def _memmap(path: str, dtype: str) -> np.ndarray:
    return _ids(path, dtype)


@dataclass(frozen=True, eq=False)
class Examples:
    """Text examples of different lengths in length buckets: training and validation `Part`s (`val` None:
    none), the `buckets` (packed: the one window's length) and the vocabulary (bytes, or a tokenizer's:
    `made_from` its texts and vocabulary); `pack`: packed into windows of `buckets[0]` (`data.pack`). What
    `example_stream` reads."""

    train: Part
    val: Part | None
    buckets: tuple[int, ...]
    vocab: int
    pack: bool = False
    made_from: Tokenized | None = None
    TARGET: ClassVar[str] = "next"

    @property
    def examples(self) -> int:
        return len(self.train)

    def files_read(self) -> list[tuple[str, str, str]]:
        """The text files, training files first (`Streamed.files_read`); a tokenizer's: the texts and its
        vocabulary, not the ids' cache."""
        if (made := self.made_from) is not None:
            return (
                [(p, "data.path", TRAIN) for p in made.texts]
                + [(p, "data.val_path", VAL) for p in made.val_texts]
                + [(p, made.VOCABULARY_KEY, VOCABULARY) for p in made.vocabulary]
            )
        out = [(p, "data.path", TRAIN) for p in self.train.paths]
        if self.val is not None and self.val.paths != self.train.paths:
            out += [(p, "data.val_path", VAL) for p in self.val.paths]
        return out


def examples(
    data, ids: Ids, val_ids: Ids | None, vocab: int, made: type = Examples, made_from: Tokenized | None = None
) -> Examples:
    """The training and validation examples (a `made`: `Examples` or a subclass) of the files' ids: those of
    `data.val_path`, or the last `data.val_fraction` of the examples (default 0.1)."""
    train, buckets = part(ids, data, "data.path")
    if val_ids is not None:
        val = part(val_ids, data, "data.val_path", buckets)[0]
        return made(train, val, buckets, vocab, data.pack, made_from)
    held = held_out(len(train), data, f"data=text ({data.path!r})")
    n = len(train) - held
    val = train.taken(np.arange(n, len(train))) if held else None
    return made(train.taken(np.arange(n)), val, buckets, vocab, data.pack, made_from)


def describe(data, s: Examples) -> DataInfo:
    """Examples of up to the largest bucket's ids (what the memory estimate and plan=auto size), or packed
    windows of them (`examples` counts windows then), with the target `next`."""
    longest = s.buckets[-1]
    if s.pack:
        val = len(pack(s.val.lengths, longest)) if s.val else 0
        return DataInfo(
            data.name,
            (longest,),
            len(pack(s.train.lengths, longest)),
            (Target(s.TARGET, s.vocab, (longest,)),),
            val,
            padded=True,
        )
    return DataInfo(
        data.name,
        (longest,),
        s.examples,
        (Target(s.TARGET, s.vocab, (longest,)),),
        len(s.val) if s.val else 0,
        lengths_vary=True,
        padded=True,
    )


def pack(lengths: np.ndarray, window: int) -> list[np.ndarray]:
    """`data.pack`: the examples in windows of `window` ids, best fit, longest first: each example (an example
    is at most `window` long: cut) goes to the open window it leaves the least room in, or a new one, so the
    windows are nearly full (taking the next examples while they fit left a quarter of them padding on the
    standard library's lines); each window's example numbers, in order. Packed once: an epoch shuffles
    windows."""
    room: list[list[int]] = [[] for _ in range(window + 1)]  # room[r]: the windows with r ids free
    held = np.zeros(window + 1, np.int64)  # how many windows have r ids free
    windows: list[list[int]] = []
    for i in np.lexsort((np.arange(len(lengths)), -lengths)).tolist():  # longest first, ties in order
        n = int(lengths[i])
        fits = np.flatnonzero(held[n:])
        if fits.size:
            free = n + int(fits[0])
            w = room[free].pop()
            held[free] -= 1
        else:
            free, w = window, len(windows)
            windows.append([])
        windows[w].append(i)
        room[free - n].append(w)
        held[free - n] += 1
    return [np.sort(np.array(w)) for w in windows]


def packed(part: Part, windows: list[np.ndarray], length: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The `windows` of `part` (each its example numbers): token ids, segment ids (1, 2, ... per example; 0
    pads) and targets (each example's ids one on; 0 pads), int32 [len(windows), length]."""
    x = np.full((len(windows), length), PAD, np.int32)
    seg, y = np.zeros_like(x), np.full_like(x, PAD)
    for k, rows in enumerate(windows):
        at = 0
        for s, i in enumerate(rows.tolist()):
            start, n = int(part.starts[i]), int(part.lengths[i])
            ids = _read(part, start, start + n + 1)
            x[k, at : at + n], y[k, at : at + n], seg[k, at : at + n] = ids[:-1], ids[1:], s + 1
            at += n
    return x, seg, y
