"""Timing a model's links on the devices that would run them (`placement.balance=time`).

A link is what lies between two neighbouring cuts the model allows (`Cuttable.points`; mode=e2e
also cuts where the model's inputs, ids or masks cross beside one activation): the smallest thing a
stage can hold. A layer alone may not be computable (its input comes from a branch), a link always
is: one activation in (with its Keras mask, if it carries one, and what crosses beside it; the first
link: the model's own inputs), one out, and is fed what it really takes (`chain.stages.examples`:
token ids within the vocabulary, keras_hub's named inputs, masks). Logical devices cut from one
physical device share its compute, so each physical device is timed once and its time
serves all its logical devices. Each link is called until its time settles (the median of
the last calls moves by less than `SETTLED`), at most `MAX_CALLS` times, by the timer of
`chain.stages.clock` (plan=auto's too), less a call's own cost (its probe's median).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Mapping, Sequence

import keras
import tensorflow as tf

from chain.stages import clock, examples
from chain.stages.cut import Cuttable, passed, piece
from chain.stages.examples import Feed

WINDOW = 5  # the median of this many calls is the estimate
SETTLED = 0.05  # stop when one more call moves the estimate by less than this fraction
MAX_CALLS = 30  # timed calls per link at most


@dataclass
class LinkTimes:
    """Forward-and-backward time of each link, per device.

    `links[j]`: layers [a, b) of link j; `times[device][j]`: its seconds per pass on a
    microbatch (one list shared by the logical devices of one physical device); `measured`:
    the physical devices timed; `calls[j]`: timed calls link j took on the last of them.
    """

    links: list[tuple[int, int]]
    times: dict[str, list[float]]
    measured: list[str]
    calls: list[int]

    def layer_costs(self, device: str) -> list[float]:
        """Per layer, for `chain.planning.balance`: each link's time on its last layer, 0 on the
        others (a cut only ever falls between links)."""
        out = [0.0] * self.links[-1][1]
        for (_, b), t in zip(self.links, self.times[device]):
            out[b - 1] = t
        return out


def _settled(samples: list[float]) -> bool:
    if len(samples) >= MAX_CALLS:
        return True
    if len(samples) <= WINDOW:
        return False
    now, before = statistics.median(samples[-WINDOW:]), statistics.median(samples[-WINDOW - 1 : -1])
    return abs(now - before) <= SETTLED * before


def _time_link(model: keras.Model, x, device: str, overhead: float) -> tuple[float, int]:
    """Seconds per forward-and-backward pass of `model` on `x` (a tensor or the structure the model takes;
    less a call's own `overhead`), and how many timed calls it took to settle."""
    variables = model.trainable_variables

    @tf.function(autograph=False)  # one pass, no loop: tracing is most of the cost, a loop doubles it
    def one_pass(x):
        with tf.device(device):
            given = examples.floats_of(x)  # not ids, nor masks
            with tf.GradientTape() as tape:
                tape.watch(given)
                y = tf.add_n(
                    [tf.reduce_sum(tf.cast(t, tf.float32)) for t in examples.floats_of(model(x, training=True))]
                    or [tf.constant(0.0)]
                )
            return tape.gradient(y, [*given, *variables])

    clock.seconds(one_pass, x)  # trace and warm up
    samples: list[float] = []
    while not _settled(samples):
        samples.append(clock.seconds(one_pass, x))
    return max(statistics.median(samples[-WINDOW:]) - overhead, 1e-7), len(samples)


def link_times(
    c: Cuttable,
    devices: Sequence[str],
    physical: Mapping[str, str],
    batch: int,
    fed: Feed | None = None,
    progress: bool | None = True,
    several: bool = False,
) -> LinkTimes:
    """Each link's forward-and-backward time on a batch of `batch` examples as `fed` describes them
    (`chain.stages.examples.feed`; None: floats of the model's input shape), each later link on what
    the one before gives, built on the first of `devices` behind each physical device (`physical`:
    logical device -> physical device; one absent is its own). `progress`: a progress bar (None: on a
    terminal only, tqdm's convention; False: none). `several`: the links of `Cuttable.points(several=True)`
    (mode=e2e, which sends every tensor crossing a cut: a language model's blocks, each reading the padding
    mask, are links of their own), else only cuts one tensor crosses."""
    from tqdm import tqdm

    points = c.points(several=several)
    bounds = list(zip(points, points[1:]))
    groups: dict[str, list[str]] = {}
    for d in dict.fromkeys(devices):
        groups.setdefault(physical.get(d, d), []).append(d)
    times: dict[str, list[float]] = {}
    calls: list[int] = []
    bar = tqdm(
        total=len(groups) * len(bounds),
        desc="time model links",
        unit="link",
        leave=False,
        disable=not progress or None,
    )
    with bar:
        for logical in groups.values():
            given = fed or Feed(tuple(d or 1 for d in c.input_shape))
            device, shape, row, calls = logical[0], given.shape, [], []
            with tf.device(device):
                # a call's own cost: paid once per step in training, not once per link
                overhead = statistics.median(clock.call_costs(device, tf.zeros((batch, *shape)), 2 * WINDOW + 1))
            signature = None
            for j, (a, b) in enumerate(bounds):
                with tf.device(device):
                    model = piece(c, a, b, keras.DTypePolicy("float32"))(shape, None, f"profile_{a}")
                    signature = examples.first(model, given) if signature is None else signature
                    x = examples.make(signature, batch, given.vocab, (0, j))
                seconds, n = _time_link(model, x, device, overhead)
                row.append(seconds)
                calls.append(n)
                shape = passed(model)
                with tf.device(device):  # the next link takes what this one gives
                    signature = examples.given(model, signature, given.vocab)
                bar.update()
            for d in logical:
                times[d] = row
    return LinkTimes(bounds, times, list(groups), calls)
