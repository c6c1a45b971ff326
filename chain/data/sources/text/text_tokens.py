"""`data=text data.tokenizer=PATH`: text files turned into a keras_hub tokenizer's ids, once, kept on disk.

The tokenizer is keras_hub's own, from a local vocabulary (nothing downloaded): a `vocab.txt`
(`WordPieceTokenizer`, one token a line) or a `vocab.json` with a `merges.txt` beside it
(`BytePairTokenizer`, GPT-2's files), or the folder holding either. keras_hub 0.32 runs both without
`tensorflow-text` (which the `lm` extra leaves out): it tokenizes with the `tokenizers` package, in
Python, and starts no TensorFlow runtime, so this runs in the preparation pass, before the devices
are set up. Each text file's ids are `tokenizer(text)` on the file's whole text, written as uint32
to the user's cache folder (`$XDG_CACHE_HOME/chain/tokens/`, `~/.cache/chain/tokens/` by default)
under a name made of the file's and the vocabulary's paths, sizes and modification times: a file or
vocabulary changed is tokenized again, an unchanged one read in place (memory-mapped) as
`data=tokens` reads its file. The cache is not the run's identity: a resume compares the texts and
the vocabulary (`chain.data.sources.tokens.token_record.Tokenized`), so ids made again elsewhere resume exactly.

With `data.examples=lines|files` (`example_files`) each file's ids are an example, or each line is
tokenized alone, its ids one example, and where each line's ids end is kept beside them.
"""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from chain.data.count_cache import user_cache
from chain.errors import ConfigError, first_line

log = logging.getLogger("chain")

KEY = "data.tokenizer"
DTYPE = "uint32"


@dataclass(frozen=True)
class Vocabulary:
    """A tokenizer's files: `vocab` (vocab.txt for WordPiece, vocab.json for byte-pair) and `merges`
    (byte-pair's merges.txt; None for WordPiece)."""

    vocab: str
    merges: str | None

    @property
    def paths(self) -> tuple[str, ...]:
        return (self.vocab,) if self.merges is None else (self.vocab, self.merges)


def vocabulary(path: str) -> Vocabulary:
    """The tokenizer files `path` names (a vocab.txt, a vocab.json with merges.txt beside it, or their
    folder); one line naming `data.tokenizer` otherwise."""
    folder = path if os.path.isdir(path) else os.path.dirname(path)
    if os.path.isdir(path):
        for name in ("vocab.json", "vocab.txt"):
            if os.path.isfile(os.path.join(path, name)):
                path = os.path.join(path, name)
                break
        else:
            raise ConfigError(
                f"{KEY}={path!r} is a folder without vocab.json (byte-pair, with merges.txt) or vocab.txt (WordPiece)"
            )
    if not os.path.isfile(path):
        raise ConfigError(
            f"{KEY}={path!r}: the file does not exist; give a vocab.txt (WordPiece), a vocab.json with "
            "merges.txt beside it (byte-pair), or their folder"
        )
    if path.endswith(".json"):
        merges = os.path.join(folder, "merges.txt")
        if not os.path.isfile(merges):
            raise ConfigError(
                f"{KEY}={path!r} is a byte-pair vocabulary, which needs merges.txt beside it ({merges} does not exist)"
            )
        return Vocabulary(path, merges)
    if path.endswith(".txt"):
        return Vocabulary(path, None)
    raise ConfigError(
        f"{KEY}={path!r} is neither a vocab.txt (WordPiece) nor a vocab.json (byte-pair, with merges.txt)"
    )


def tokenizer(v: Vocabulary) -> Any:
    """keras_hub's tokenizer of `v` (imported here, on demand: it imports TensorFlow, not its runtime)."""
    from chain.cli import import_tensorflow_quietly

    try:
        import_tensorflow_quietly()  # keras_hub imports TensorFlow: without its start-up banner
        import keras_hub
    except ImportError as e:
        raise ConfigError(
            f"{KEY} needs keras-hub ({first_line(e)}); install it (the `lm` extra and keras-hub, see "
            "the README), or leave data.tokenizer=null for byte-level ids"
        ) from None
    try:
        if v.merges is not None:
            return keras_hub.tokenizers.BytePairTokenizer(vocabulary=v.vocab, merges=v.merges)
        return keras_hub.tokenizers.WordPieceTokenizer(vocabulary=v.vocab)
    except Exception as e:  # keras_hub raises several kinds for a vocabulary it cannot read
        raise ConfigError(f"{KEY}={v.vocab!r}: keras_hub cannot make a tokenizer of it: {first_line(e)}") from None


def _stamp(path: str) -> str:
    st = os.stat(path)
    return f"{os.path.abspath(path)} {st.st_size} {st.st_mtime_ns}"


def _cached(path: str, v: Vocabulary, folder: str, kind: str = "") -> str:
    """The cache's file of `path`'s ids (`kind`: how they were made, "" for the whole text's), named from the
    file's and the vocabulary's stamps."""
    stamps = "|".join(_stamp(p) for p in v.paths)
    name = hashlib.sha256(f"{stamps}|{_stamp(path)}{kind}".encode()).hexdigest()[:32]
    return os.path.join(folder, f"{name}.{DTYPE}")


def _write(out: str, values: np.ndarray) -> None:
    tmp = f"{out}.{os.getpid()}.tmp"
    values.tofile(tmp)
    os.replace(tmp, out)  # a killed run leaves no half-written file under the real name


def token_files(paths: list[str], v: Vocabulary) -> tuple[list[str], list[int], int]:
    """Each text file of `paths` as a file of the tokenizer's ids (uint32; made once, then read from the
    cache), how many ids each holds, and the vocabulary's size."""
    made, sizes, tok = [], [], None
    folder = user_cache("tokens")
    for path in paths:
        out = _cached(path, v, folder)
        if not os.path.isfile(out):
            tok = tok or tokenizer(v)
            with open(path, encoding="utf-8") as f:
                ids = np.asarray(tok(f.read()), dtype=np.int64).reshape(-1)
            os.makedirs(folder, exist_ok=True)
            _write(out, ids.astype(DTYPE))
            log.info("%s: %s tokenized, %d ids (kept in %s)", KEY, path, len(ids), out)
        made.append(out)
        sizes.append(os.path.getsize(out) // np.dtype(DTYPE).itemsize)
    return made, sizes, (tok or tokenizer(v)).vocabulary_size()


def _lines(text: str) -> list[str]:
    """The text's lines, each with its newline (the last without one if the text ends without it), as
    `data.examples=lines` cuts a file's bytes."""
    parts = text.split("\n")
    return [p + "\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def example_files(paths: list[str], v: Vocabulary, examples: str) -> tuple[Any, int]:
    """`data.examples=lines|files` with a tokenizer: each text file's ids (uint32, in the cache) and where
    each of its examples ends among them (a `text_examples.Ids`), and the vocabulary's size. `files`: a
    file's ids (`token_files`') one example; `lines`: each line tokenized alone, their ids one after the
    other, the ends kept beside them (`.ends`, written first: the ids' file says both are whole)."""
    from chain.data.sources.text.text_examples import Ids

    if examples == "files":
        made, sizes, vocab = token_files(paths, v)
        return Ids(tuple(made), DTYPE, tuple(np.array([n], np.int64) for n in sizes), tuple(paths)), vocab
    made, ends, tok = [], [], None
    folder = user_cache("tokens")
    for path in paths:
        out = _cached(path, v, folder, "|lines")
        if not os.path.isfile(out):
            tok = tok or tokenizer(v)
            with open(path, encoding="utf-8") as f:
                lines = _lines(f.read())
            ids = [np.asarray(t, np.int64).reshape(-1) for t in (tok(lines) if lines else [])]
            os.makedirs(folder, exist_ok=True)
            _write(out + ".ends", np.cumsum([len(t) for t in ids], dtype=np.int64))
            _write(out, np.concatenate(ids or [np.zeros(0, np.int64)]).astype(DTYPE))
            log.info("%s: %s tokenized line by line, %d lines (kept in %s)", KEY, path, len(ids), out)
        made.append(out)
        ends.append(np.fromfile(out + ".ends", np.int64))
    return Ids(tuple(made), DTYPE, tuple(ends), tuple(paths)), (tok or tokenizer(v)).vocabulary_size()
