"""The benchmarks' ablations of the e2e step (`chain.pipeline.play`): each leaves out one piece of the
step's machinery by patching the function that adds it, for as long as the context is open (the step's
build and its trace must both happen inside: the order is decided at build, the edges at trace).

    with ablations.ablated(ablations.NO_RELEASES):
        step = e2e_step(...)
        step(x, ys)
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from unittest import mock

from chain.pipeline import play

# Each: the functions of `chain.pipeline.play` replaced, by name.
UNORDERED = {"chained": lambda schedule, grad_accum: False}  # no control dependencies, so no releases either
ORDERED = {"chained": lambda schedule, grad_accum: True}  # chained and released even at one microbatch
NO_RELEASES = {"release": lambda done, action: done}  # chained, but no host release after a send
# a release after every send, before a receiving forward too (the rule before `play.released`)
EVERY_SEND = {"released": lambda order, schedule, devices: frozenset(a for a in order if play.sends(a, devices))}
WEIGHTS_LATE = {  # a backward's weight products queued behind its input gradients; W's sums folded by Grappler
    "weights_first": lambda weight_grads, ops: 0,
    "summed_in_turn": lambda sums, done: [],
}


@contextlib.contextmanager
def ablated(*patches: dict) -> Iterator[None]:
    """The step's functions replaced as `patches` say while the context is open."""
    with contextlib.ExitStack() as stack:
        for patch in patches:
            for name, fn in patch.items():
                stack.enter_context(mock.patch.object(play, name, fn))
        yield


def ablated_step(build: Callable[[], Callable], *patches: dict) -> Callable:
    """The step `build()` returns, built with `patches` and run (so traced) with them."""
    with ablated(*patches):
        body = build()

    def step(*args):
        with ablated(*patches):
            return body(*args)

    return step
