"""`python -m chain.generate RUN_DIR --prompt TEXT [--tokens N] [--temperature T] [--seed S]`: text from a
trained byte-level language model (mode=e2e on data=text, e.g. model=gpt), sampled through its stages.
A run on data=tokens (ids without a tokenizer) takes and prints ids instead: `--prompt '464 2068 7586'`;
a run on data=text with `data.tokenizer` (a keras_hub tokenizer's ids, not bytes) is refused in one line.

The run's exported stages (`stage_00.keras`, `stage_01.keras`, ..., written at the end of a run with
checkpoint.export=true, the default) are loaded and called in order, each stage's output the next one's
input, as the chain trained them. The prompt's UTF-8 bytes are the context; each new byte is read from the
logits at the context's last position (the model is causal: the window is padded on the right, which no
earlier position sees), greedily at `--temperature 0` (the default) or drawn from softmax(logits / T) with
NumPy's generator seeded by `--seed` (the same seed, the same text). A context longer than the model's
window (`model.seq_len`) keeps its last `seq_len` bytes; a prompt longer than that is cut so, and says so.
The prompt and its continuation are printed as UTF-8 (a byte sequence that is not valid UTF-8 shows as
U+FFFD), or, for data=tokens, as ids separated by spaces, each byte (or id) as it is made; Ctrl-C ends the
line there and says so in one line (exit 130). Bad input is one line and exit 2, and so is a run directory
that a run still training holds (its lock: its stages' exports are replaced one after another when it ends).
"""

from __future__ import annotations

import argparse
import codecs
import os
import signal
import sys
from dataclasses import dataclass
from typing import Any, Iterator, NoReturn, Sequence

import numpy as np

from chain.cli import fail, import_tensorflow_quietly, reader_left
from chain.errors import ChainError, first_line, plural

BYTES = 256  # a byte-level model's vocabulary
EXIT_INTERRUPTED = 130  # Ctrl-C, as a shell reports a process ended by SIGINT (128 + 2)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse's usage-and-error pair, as one line
        fail(
            f"{message}; usage: python -m chain.generate RUN_DIR --prompt TEXT [--tokens N] [--temperature T] "
            "[--seed S]"
        )


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m chain.generate", description=__doc__.split("\n\n")[0].split(": ", 1)[1])
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory of python -m chain (its exported stages)")
    p.add_argument(
        "--prompt",
        required=True,
        help="the text the model continues (its UTF-8 bytes; a data=tokens run: ids separated by spaces)",
    )
    p.add_argument("--tokens", type=int, default=100, help="bytes (or ids) to generate (default 100)")
    p.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="0: the most likely byte each time (default); T > 0: drawn from softmax(logits / T)",
    )
    p.add_argument("--seed", type=int, default=0, help="seeds the draws at temperature > 0 (default 0)")
    return p


@dataclass(frozen=True)
class Request:
    """What to generate: from the run in `run_dir`, `tokens` bytes after `prompt`, at `temperature` with `seed`."""

    run_dir: str
    prompt: str
    tokens: int
    temperature: float
    seed: int


def _request(argv: Sequence[str]) -> Request:
    a = _parser().parse_args(argv)
    if a.tokens < 1:
        fail(f"--tokens={a.tokens} must be at least 1")
    if not a.temperature >= 0 or not np.isfinite(a.temperature):
        fail(f"--temperature={a.temperature} must be a finite number >= 0 (0: greedy)")
    if not 0 <= a.seed < 2**32:
        fail(f"--seed={a.seed} must be an integer in [0, 2^32)")
    if not a.prompt:
        fail("--prompt is empty: give the text the model continues")
    return Request(a.run_dir, a.prompt, a.tokens, a.temperature, a.seed)


def _run_config(run_dir: str) -> str:
    """The data the run's model learned, `text` or `tokens`, from its composed config (Hydra's
    `.hydra/config.yaml`, read as written: its data need not exist any more); one line if it is not a
    language model's run."""
    from omegaconf import OmegaConf

    if not os.path.isdir(run_dir):
        fail(f"{run_dir}: no such run directory")
    path = os.path.join(run_dir, ".hydra", "config.yaml")
    if not os.path.isfile(path):
        fail(f"{path} is missing: generate reads a run directory written by python -m chain")
    cfg = OmegaConf.load(path)
    mode, data = OmegaConf.select(cfg, "mode"), OmegaConf.select(cfg, "data.name")
    if mode != "e2e" or data not in ("text", "tokens"):
        fail(
            f"{run_dir} is not a language model's run (mode={mode}, data={data}): generate continues text with a "
            "model trained by mode=e2e on data=text (or ids, on data=tokens), e.g. model=gpt"
        )
    tokenizer = OmegaConf.select(cfg, "data.tokenizer") if data == "text" else None
    if tokenizer is not None:  # its ids are a keras_hub tokenizer's, not bytes: a prompt's bytes would mean nothing
        fail(
            f"{run_dir} learned data.tokenizer={tokenizer}'s ids, not bytes: generate continues a byte-level "
            "model's text (data=text with data.tokenizer=null) or ids (data=tokens)"
        )
    return data


def stages(run_dir: str, vocab: int | None) -> list[Any]:
    """The run's exported stage models (`stage_NN.keras`), in order; one line if there are none, or if
    they do not make a model of ids to logits per position (`vocab` of them, when given)."""
    import keras

    from chain.stages.stage import stage_name

    models = []
    while os.path.isfile(path := os.path.join(run_dir, f"{stage_name(len(models))}.keras")):
        try:
            models.append(keras.models.load_model(path, compile=False))
        except Exception as e:  # Keras raises many kinds for a file it cannot read
            fail(f"{path} cannot be loaded: {first_line(e, typed=False)}")
    if not models:
        fail(
            f"{run_dir} has no exported stages ({stage_name(0)}.keras ...): they are written when a run ends with "
            "checkpoint.export=true (the default)"
        )
    inputs, outputs = models[0].inputs, models[-1].outputs
    if (
        len(inputs) != 1
        or len(inputs[0].shape) != 2
        or inputs[0].shape[1] is None
        or "int" not in str(inputs[0].dtype)
        or len(outputs) != 1
        or len(outputs[0].shape) != 3
        or (vocab is not None and outputs[0].shape[-1] != vocab)
    ):
        fail(
            f"{run_dir}'s chain takes {[tuple(t.shape) for t in inputs]} and gives "
            f"{[tuple(t.shape) for t in outputs]}: generate needs a model of integer ids (batch, seq_len) to "
            f"logits per position (batch, seq_len, {vocab or 'vocab'})"
        )
    return models


def locked_stages(run_dir: str, vocab: int | None) -> list[Any]:
    """`stages(run_dir, vocab)`, read under the run directory's lock (`chain.state.lock.reading`, taken
    before TensorFlow is imported); one line when a run still training holds it."""
    from chain.state import lock

    try:
        with lock.reading(run_dir):
            import_tensorflow_quietly()
            return stages(run_dir, vocab)
    except ChainError as e:
        fail(str(e), e.exit_code)


def continuation(
    models: Sequence[Any], prompt: Sequence[int], tokens: int, temperature: float, seed: int
) -> Iterator[int]:
    """`tokens` ids after `prompt` from the chain of `models` (byte ids -> logits per position), each as it is
    made: read at the context's last position, the context its last seq_len ids; greedy at temperature 0,
    else drawn from softmax(logits / temperature) by NumPy's generator seeded with `seed`."""
    import tensorflow as tf

    seq_len = int(models[0].inputs[0].shape[1])
    dtype = models[0].inputs[0].dtype

    @tf.function(reduce_retracing=True)
    def logits(x):
        for m in models:  # stage k's output is stage k+1's input
            x = m(x, training=False)
        return x

    rng = np.random.default_rng(seed)
    ids = list(prompt)
    for _ in range(tokens):
        context = ids[-seq_len:]
        window = np.zeros((1, seq_len), dtype=str(dtype))
        window[0, : len(context)] = context  # padded on the right: causal, no earlier position sees it
        row = logits(tf.constant(window)).numpy()[0, len(context) - 1].astype(np.float64)
        if temperature == 0:
            nxt = int(np.argmax(row))
        else:
            p = np.exp((row - row.max()) / temperature)
            nxt = int(rng.choice(len(row), p=p / p.sum()))
        ids.append(nxt)
        yield nxt


class Printed:
    """Ids printed as they come, on one line: a byte-level run's as UTF-8 text (a byte that is not valid
    UTF-8 as U+FFFD, an incomplete character held until its next byte), a data=tokens run's as numbers
    separated by spaces; `count` of them so far."""

    def __init__(self, text: bool):
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace") if text else None
        self.count = 0

    def add(self, ids: Sequence[int]) -> None:
        if self.decoder is not None:
            shown = self.decoder.decode(bytes(ids))
        else:
            shown = " " * (self.count > 0) + " ".join(map(str, ids))
        self.count += len(ids)
        sys.stdout.write(shown)
        sys.stdout.flush()  # seen as it is made, and kept if Ctrl-C comes next

    def end(self) -> None:
        """The line's end (a character left incomplete shown as U+FFFD)."""
        sys.stdout.write((self.decoder.decode(b"", final=True) if self.decoder is not None else "") + "\n")
        sys.stdout.flush()


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of `python -m chain.generate RUN_DIR --prompt TEXT ...`."""
    r = _request(list(sys.argv[1:] if argv is None else argv))
    text = _run_config(r.run_dir) == "text"
    prompt = list(r.prompt.encode("utf-8")) if text else _ids(r.prompt)
    unit = "byte" if text else "id"
    printed = None
    try:
        models = locked_stages(r.run_dir, BYTES if text else None)
        vocab, seq_len = int(models[-1].outputs[0].shape[-1]), int(models[0].inputs[0].shape[1])
        if max(prompt) >= vocab:
            fail(f"--prompt holds the id {max(prompt)}, but the model's ids are 0..{vocab - 1}")
        if len(prompt) > seq_len:
            print(
                f"note: the prompt is {plural(len(prompt), unit)}, the model reads {seq_len} (model.seq_len): it "
                f"continues the last {seq_len}",
                file=sys.stderr,
            )
        printed = Printed(text)
        printed.add(prompt)
        for nxt in continuation(models, prompt[-seq_len:], r.tokens, r.temperature, r.seed):
            printed.add([nxt])
        printed.end()
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C does not cut the message short
        if printed is None:
            print("interrupted before generating", file=sys.stderr, flush=True)
        else:
            printed.end()
            made = printed.count - len(prompt)
            print(f"interrupted after {made} of {plural(r.tokens, unit)} (printed above)", file=sys.stderr, flush=True)
        sys.exit(EXIT_INTERRUPTED)
    except BrokenPipeError:  # `... | head -c 100`: the reader left
        reader_left()


def _ids(prompt: str) -> list[int]:
    """A data=tokens run's prompt: ids separated by spaces; one line otherwise."""
    try:
        ids = [int(word) for word in prompt.split()]
    except ValueError:
        fail(
            f"--prompt={prompt!r}: a run on data=tokens (ids without a tokenizer) takes ids separated by spaces, "
            "e.g. --prompt '464 2068 7586'"
        )
    if not ids or min(ids) < 0:
        fail(f"--prompt={prompt!r}: give ids >= 0, separated by spaces")
    return ids


if __name__ == "__main__":
    main()
