"""Measuring what `placement.plan=auto` predicts from (`chain.records.auto_plan.Costs`), on the run's devices.

Each link of the model (a cut model's links between the cuts plan=auto takes, `Cuttable.points(several=True)`,
which several tensors may cross; or a built-in model's stages) is timed
on one device of the pool (logical devices cut from one physical device share its compute, as
`chain.stages.timing` times them: once per physical device kind, not per candidate), at a few microbatch
sizes: its forward (F), forward and input gradient (F+B) and forward and every gradient (F+B+W), each one
compiled function whose batch dimension is free (one trace serves every size), so B = (F+B) - F and W =
(F+B+W) - (F+B). Between the sizes the search interpolates. Also timed: a call's own cost (the step's fixed
cost), the update of the link with the most parameters (the others scaled by their parameters; a cut model's:
the whole's), a copy between two devices of the pool at two sizes (seconds per byte and latency), and, as a
step runs them, the copies' gradient exchange (`_exchange`: the model's links on two devices of the pool,
each computing its gradients, then each device receiving the other's and adding them, less the same without
the exchange) and a crossing (`_crossing`: the links' F+B+W with the second half on the other device, less
all on one). The exchange costs a step far more than a copy timed alone: on two single-core cluster workers,
gradients from the model's own backward crossed at about 1.1 ns/B against 0.15 for a tensor made alone.

On one physical device (logical devices of one CPU or GPU) every action runs after the one before: a step is the
sum of its actions whatever the schedule, so the model is timed whole and each link takes its share by weights.

A cut model's links are also checked against the whole: the model as one link is timed (F+B+W) at
every size the links were, and every link's times at a size are scaled by the whole's time over the
links' sum there: a pass of a link carries a
call's and a loop pass's own cost that a stage of many links pays once, and the links were timed one
after another while the machine's load varied; the whole is what a one-stage step computes. Its
update, too, is timed whole (each link's share by its weights). The whole and the update are timed
with enough passes per call to outweigh a call's own cost (`OUTWEIGH`).

Every call is timed by `chain.stages.clock`, whose timer and call-cost probe `chain.stages.timing` uses too.

`Measuring.budget_s` bounds the measuring: the largest size first (every link), then the smallest, then sizes
between; each measurement is the least of up to `CALLS` calls (another process only adds time); when the budget runs out the rest is
cut and `Costs.notes` says what.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, replace
from typing import Callable, Mapping, Sequence

import keras
import tensorflow as tf

from chain.pipeline import play
from chain.planning.devices import canonical
from chain.records.auto_plan import Costs
from chain.stages import clock, examples
from chain.stages.examples import Feed

CALLS = 5  # timed calls per measurement at most (the least is taken)
MIN_CALLS = 3  # and at least, whatever the budget (a pass shorter than LONG)
LONG = 0.02  # seconds: a pass this long is timed alone (a call's own cost is small beside it)
REPEAT = 4  # a measurement times a call of 1 + REPEAT passes against a call of one
# what the model as a whole and its update are timed with (every prediction stands on them): passes enough
# that they take OUTWEIGH times a call's own cost (whose jitter would swamp a few short passes), at most
# MAX_REPEAT
OUTWEIGH = 10
MAX_REPEAT = 64
ACTIONS = 4  # the chain of small actions whose cost per action is measured
# The chain of small actions lacks a real action's tape and gradient ops, so its cost per action is scaled up;
# on a cluster worker half of this process's chain is added instead (the fit: docs/benchmarks-in-code.md).
ACTION_SCALE = 1.5


class _Link:
    """One link's three compiled passes (F, F+B, F+B+W), their batch dimension free, each run `n` times
    in one call (a loop in the graph: the difference between two counts is the passes' own time, without
    the call's cost, which a step pays once for all its actions). `inputs` and `outputs`: the `Leaf`
    structures of what the link takes and gives (`chain.stages.examples`); ids are drawn below `vocab`."""

    def __init__(self, model: keras.Model, device: str, inputs, outputs, vocab: int):
        self.model, self.device = model, device
        self.inputs, self.outputs, self.vocab = inputs, examples.floating(outputs), vocab
        signature = [examples.spec(inputs), examples.spec(self.outputs), tf.TensorSpec((), tf.int32)]
        variables = model.trainable_variables

        def looped(one):
            @tf.function(input_signature=signature, autograph=False)
            def passes(x, g, n):
                def body(i, acc):
                    return i + 1, acc + one(_after(x, acc), g)  # each pass after the one before

                # the loop itself on the device too: on a cluster worker, a loop driven from the client would
                # add a round trip to every pass
                with tf.device(device):
                    return tf.identity(tf.while_loop(lambda i, acc: i < n, body, (tf.constant(0), tf.constant(0.0)))[1])

            return passes

        def forward(x, g):
            return _total(keras.tree.flatten(model(x, training=True)))

        def gradients(wrt):
            def one(x, g):
                given = examples.floats_of(x)
                with tf.GradientTape() as tape:
                    tape.watch(given)
                    y = examples.floats_of(model(x, training=True))
                return _total(
                    tape.gradient(y, [*given, *wrt], output_gradients=[tf.cast(a, t.dtype) for a, t in zip(g, y)])
                )

            return one

        self.passes = {"F": looped(forward), "FB": looped(gradients([])), "FBW": looped(gradients(variables))}

    def time(self, kind: str, size: int, calls: int, deadline: float, call_s: float, repeat: int = REPEAT) -> float:
        """Seconds of one pass `kind` on `size` examples: the least of up to `calls` calls of 1 + REPEAT
        passes less the least of one pass (the first call, which may trace, untimed; fewer calls past
        `deadline`). A pass that takes LONG or more is timed alone, less a call's own cost `call_s`, twice
        past the deadline (that cost is then a small share of it, and each call is expensive)."""
        with tf.device(self.device):
            x = examples.make(self.inputs, size, self.vocab, (1, size))
            g = examples.make(self.outputs, size, self.vocab, (2, size))
        fn = self.passes[kind]
        one, many = tf.constant(1), tf.constant(1 + repeat)
        clock.seconds(fn, x, g, one)
        lows = [clock.seconds(fn, x, g, one)]
        if lows[0] >= LONG:
            while len(lows) < calls and (len(lows) < 2 or time.perf_counter() < deadline):
                lows.append(clock.seconds(fn, x, g, one))
            return max(min(lows) - call_s, 0.0)
        highs = [clock.seconds(fn, x, g, many)]
        while len(lows) < calls and (len(lows) < MIN_CALLS or time.perf_counter() < deadline):
            lows.append(clock.seconds(fn, x, g, one))
            highs.append(clock.seconds(fn, x, g, many))
        return max(min(highs) - min(lows), 0.0) / repeat  # other processes only add time: the least is the pass's


def _total(ts) -> tf.Tensor:
    """The sum of every value of `ts` (None left out), one float32 scalar."""
    parts = [tf.reduce_sum(tf.cast(t, tf.float32)) for t in ts if t is not None]
    return tf.add_n(parts) if parts else tf.constant(0.0)


def _after(x, acc):
    """`x` made to depend on `acc` (each numeric tensor plus nothing): a loop's pass runs after the one before."""

    def later(t):
        return t if t.dtype == tf.bool else t + tf.cast(acc * 0.0, t.dtype)

    return keras.tree.map_structure(later, x)


def _action_cost(pool: Sequence[str]) -> float:
    """What an action of a pipeline step costs beyond its work: a chain of ACTIONS small actions on one
    device built as the step builds them (`chain.pipeline.play`: a little work, its sum added to a variable
    of the device, the action's end as a control edge, a release op on the host and the host's progress
    marker assigned), less a chain of one, per action. A copy between devices is not in it: the play
    adds the measured transfer on each crossing."""
    host = play.host()
    with tf.device(host):
        marker = tf.Variable(0, dtype=tf.int64, trainable=False)
    with tf.device(pool[0]):
        sums = [tf.Variable(tf.zeros((8,)), trainable=False)]

    def chained(count: int):
        @tf.function(autograph=False)
        def actions(x):
            done = []
            for i in range(count):
                with tf.device(pool[0]), tf.control_dependencies(done):
                    x = x * 1.0 + 1.0
                    end = tf.group(sums[0].assign_add(x, read_value=False))
                with tf.device(host), tf.control_dependencies([end]):
                    release = tf.raw_ops.RandomUniform(shape=[1], dtype=tf.float32, seed=1, seed2=1).op
                    done = [release, marker.assign(i, read_value=False)]
            with tf.control_dependencies(done):
                return tf.identity(tf.reduce_sum(x))

        return actions

    return _least_apart(chained(ACTIONS + 1), chained(1), tf.ones((8,)), calls=5) / ACTIONS


def _transfer(a: str, b: str) -> tuple[float, float]:
    """(seconds per byte, latency) of a copy from device `a` to `b`: a tensor made on `a` and summed on `b`
    in one call, at two sizes, a line through them (less the call's own cost, as measured at the small
    size: the latency is the small copy's time beyond a call that copies nothing)."""

    @tf.function(input_signature=[tf.TensorSpec((), tf.int32)], autograph=False)
    def copy(n):
        with tf.device(a):
            x = tf.fill(tf.reshape(n, [1]), 1.0) * 1.0
        with tf.device(b):
            return tf.reduce_sum(tf.identity(x))

    @tf.function(input_signature=[tf.TensorSpec((), tf.int32)], autograph=False)
    def stay(n):
        with tf.device(a):
            x = tf.fill(tf.reshape(n, [1]), 1.0) * 1.0
            return tf.reduce_sum(x)

    (b0, t0), (b1, t1) = [(4 * n, _least_apart(copy, stay, tf.constant(n), calls=3)) for n in (256, 1 << 18)]
    per_byte = max(0.0, (t1 - t0) / (b1 - b0))
    return per_byte, max(0.0, t0 - per_byte * b0)


def _update(model: keras.Model, optimizer: keras.optimizers.Optimizer, device: str, call_s: float) -> float:
    """Seconds of one optimizer update of `model`'s weights (made-up gradients, made on the device): a call
    of 1 + r updates (a loop on the device) less a call of one, per update (the call's own cost is not
    the update's); r is REPEAT, or more when r updates are short beside `call_s` (whose jitter they would
    not outweigh)."""
    variables = model.trainable_variables
    with tf.device(device):
        optimizer.build(variables)

    @tf.function(input_signature=[tf.TensorSpec((), tf.int32)], autograph=False)
    def updates(n):
        with tf.device(device):
            grads = [tf.fill(tf.shape(v), 1e-3) for v in variables]

            def body(i):
                optimizer.apply(grads, variables)  # stateful: the loop's body runs it every iteration
                return i + 1

            return tf.identity(tf.while_loop(lambda i: i < n, body, [tf.constant(0)])[0])

    one = tf.constant(1)
    clock.seconds(updates, one)
    low = min(clock.seconds(updates, one) for _ in range(3))
    repeat = REPEAT
    while True:
        per = max(min(clock.seconds(updates, tf.constant(1 + repeat)) for _ in range(3)) - low, 0.0) / repeat
        if repeat >= MAX_REPEAT or per * repeat >= OUTWEIGH * call_s:
            return per
        repeat = min(MAX_REPEAT, max(4 * repeat, math.ceil(OUTWEIGH * call_s / max(per, 1e-6))))


def _chain_step(chain: Sequence[tuple[keras.Model, str]], size: int, fed: Feed | None):
    """A compiled F+B+W of `chain` (each model on its device, in turn: its tensors crossing where the device
    changes) on `size` examples made on the first device (`chain.stages.examples`, as `fed`): the gradients of
    its weights, in the chain's order."""
    fed = fed or _float_feed(chain[0][0])
    inputs = examples.first(chain[0][0], fed)

    @tf.function(input_signature=[tf.TensorSpec((), tf.int32)], autograph=False)
    def run(seed):
        with tf.device(chain[0][1]):
            h = examples.make(inputs, size, fed.vocab, tf.stack([seed, 0]))
        with tf.GradientTape() as tape:
            tape.watch(examples.floats_of(h))
            for m, device in chain:
                with tf.device(device):
                    h = m(keras.tree.map_structure(tf.identity, h), training=True)
            loss = _total(examples.floats_of(h))
        return tape.gradient(loss, [v for m, _ in chain for v in m.trainable_variables])

    return run


def _float_feed(model: keras.Model) -> Feed:
    """A model's `Feed` without a data description: its own input's shape (a float tensor's)."""
    return Feed(tuple(d or 1 for d in keras.tree.flatten(examples.model_inputs(model))[0].shape[1:]))


def _least_apart(a: Callable, b: Callable, *args, calls: int = MIN_CALLS + 1) -> float:
    """The least of `calls` calls of `a` less the least of as many of `b`, after one untimed call of each
    (which may trace); alternated, so a change of the machine's load shows in both."""
    clock.seconds(a, *args)
    clock.seconds(b, *args)
    ta, tb = [], []
    for _ in range(calls):
        ta.append(clock.seconds(a, *args))
        tb.append(clock.seconds(b, *args))
    return max(min(ta) - min(tb), 0.0)


def _summed(fn: Callable, devices: Sequence[str]) -> Callable:
    """`fn`'s tensors (a list per device of `devices`) summed on their device, then into one scalar (what a
    timed call returns: each device's work, and no more bytes crossing than the step's own)."""

    @tf.function(input_signature=[tf.TensorSpec((), tf.int32)], autograph=False)
    def run(seed):
        parts = []
        for ts, device in zip(fn(seed), devices):
            with tf.device(device):
                parts.append(tf.add_n([tf.reduce_sum(x) for x in ts]))
        with tf.device(devices[0]):
            return tf.identity(tf.add_n([tf.identity(x) for x in parts]))

    return run


def _exchange(
    copies: Sequence[Sequence[keras.Model]],
    devices: Sequence[str],
    size: int,
    reduce: Callable[[list, list, str], list],
    fed: Feed | None = None,
) -> float:
    """Seconds the copies' gradient exchange adds to a step: `copies[r]` (the model's chain of links, built
    on `devices[r]`) each compute their gradients on `size` examples, and `reduce` (`chain.pipeline.replicas.
    reduce_mean`'s signature: values per device, the devices, a name) averages each gradient on every device;
    less the same step without the exchange. `fed`: what the first link takes (None: floats of its shape)."""
    steps = [_chain_step([(m, d) for m in chain], size, fed) for chain, d in zip(copies, devices)]

    def both(exchanged: bool):
        def run(seed):
            grads = [step(seed) for step in steps]
            if not exchanged:
                return grads
            means = [reduce([g[j] for g in grads], list(devices), f"plan_exchange_{j}") for j in range(len(grads[0]))]
            return [[m[r] for m in means] for r in range(len(devices))]

        return _summed(run, devices)

    return _least_apart(both(True), both(False), tf.constant(1))


def _crossing(
    own: Sequence[keras.Model],
    twin: Sequence[keras.Model],
    devices: Sequence[str],
    size: int,
    cut: int,
    fed: Feed | None = None,
) -> float:
    """Seconds one crossing between `devices` costs as a step runs it: F+B+W of the model's links with
    those from `cut` on the second device (`twin`'s) less the same all on the first, over its two
    crossings (forward there, the gradient back): in a step of one microbatch nothing overlaps them."""
    first = sum(len(m.trainable_variables) for m in own[:cut])
    apart = _chain_step([*((m, devices[0]) for m in own[:cut]), *((m, devices[1]) for m in twin[cut:])], size, fed)
    together = _chain_step([(m, devices[0]) for m in own], size, fed)

    def by_device(step: Callable) -> Callable:  # the first links' gradients, then the rest's
        def run(seed):
            grads = step(seed)
            return [grads[:first], grads[first:]]

        return run

    return (
        _least_apart(_summed(by_device(apart), devices), _summed(by_device(together), [devices[0]] * 2), tf.constant(1))
        / 2
    )


@dataclass(frozen=True)
class Measuring:
    """What `measure` times: `models` (the links, built on `pool[0]`; layers `links[j]` and `params[j]` weights
    each) on the devices of `pool` (`physical`: each one's physical device; one absent is its own), at microbatch
    `sizes` (each a size some candidate runs), within about `budget_s` seconds; `optimizer` makes the optimizer
    whose update is timed; `fixed_cut`: the links are a built-in model's stages. `fed`: what the first link
    takes (`chain.stages.examples.feed`: the data's example shape and vocabulary; None: floats of its input's
    shape); each later link takes what the one before gives. `same[j]`: an earlier link built alike (the same
    layers on the same input), whose times link j takes. `whole`: the links as one model (a cut model's), which
    scales the links' times (module docstring). `twin`: the model's links again on `pool[1]`, with `reduce` the
    copies' averaging (`chain.pipeline.replicas.reduce_mean`'s signature): they time the copies' exchange and a
    crossing as a step runs them (needed when `pool[0]` and `pool[1]` are two physical devices)."""

    models: tuple[keras.Model, ...]
    links: tuple[tuple[int, int], ...]
    params: tuple[int, ...]
    pool: tuple[str, ...]
    physical: Mapping[str, str]
    sizes: tuple[int, ...]
    budget_s: float
    optimizer: Callable[[], keras.optimizers.Optimizer]
    fixed_cut: bool
    fed: Feed | None = None
    same: tuple[int, ...] | None = None
    whole: keras.Model | None = None
    twin: tuple[keras.Model, ...] | None = None
    reduce: Callable[[list, list, str], list] | None = None

    def physical_of(self, device: str) -> str:
        """The physical device behind a device of the pool."""
        return self.physical.get(device, device)


@dataclass
class _Found:
    """The passes timed so far: `seconds[(pass, link, size)]`, the passes timed at every measured size
    (`kinds`: FBW, then F and FB while the budget lasts), the sizes measured and what the budget cut (`notes`)."""

    seconds: dict[tuple[str, int, int], float]
    kinds: list[str]
    sizes: list[int]
    notes: list[str]


def measure(given: Measuring) -> Costs:
    """`Costs` of `given`'s links on its pool at its microbatch sizes, within about its budget (`Measuring`)."""
    logger = tf.get_logger()  # each link's passes are tf.functions of one Python function, traced once each:
    level = logger.level  # TensorFlow would warn of "retracing" beyond five of them
    logger.setLevel(logging.ERROR)
    try:
        return _measure(replace(given, fed=given.fed or _float_feed(given.models[0])))
    finally:
        logger.setLevel(level)


def _measure(given: Measuring) -> Costs:
    """`measure`'s work, `given.fed` known: the passes, the update, an action's and a call's cost, the copies."""
    started = time.perf_counter()
    deadline = started + given.budget_s
    device = given.pool[0]
    with tf.device(device):
        signatures = examples.link_signatures(
            given.models, given.fed
        )  # each link's inputs, then the last one's outputs
    apart = len({given.physical_of(d) for d in given.pool}) > 1
    notes = [] if apart else [_one_device(len(given.models))]
    timed, same, shares = _timed(given, signatures, apart)
    call = min(clock.call_costs(device, tf.constant(1.0), 7))  # a call's own cost (once per step call): the least
    found = _pass_times(timed, same, given.sizes, apart, deadline, call)
    whole = given.whole if shares is None else None
    scale = _scales(
        whole,
        found.sizes,
        found.seconds,
        len(timed),
        device,
        deadline,
        call,
        (signatures[0], signatures[-1], given.fed.vocab),
    )
    forward, input_grad, weight_grad = _passes(found, scale, len(timed), shares)
    action = _action_s(given.pool)
    update = _updates(given, call)
    per_byte, latency, exchange_per_byte = _copies(given, found.sizes, signatures)
    return Costs(
        links=tuple(tuple(p) for p in given.links),
        sizes=tuple(found.sizes),
        forward=tuple(forward),
        input_grad=tuple(input_grad),
        weight_grad=tuple(weight_grad),
        update=update,
        crossing=tuple(examples.values(g) for g in signatures[1:]),
        params=tuple(given.params),
        action_s=action,
        update_s=action,
        step_s=call,
        transfer_s_per_byte=per_byte,
        transfer_latency_s=latency,
        exchange_s_per_byte=exchange_per_byte,
        exchange_latency_s=0.0,
        devices=tuple(given.pool),
        physical=tuple(given.physical_of(d) for d in given.pool),
        fixed_cut=given.fixed_cut,
        measuring_s=time.perf_counter() - started,
        notes=(*notes, *found.notes),
    )


def _one_device(links: int) -> str:
    """The note of a pool on one physical device, whose `links` are timed as `_timed` says."""
    return (
        "one physical device: its actions run one at a time, so "
        + ("the model is timed whole (each link's share by its weights) and " if links > 1 else "")
        + "F, B and W are not timed apart (each taken as a third of the pass)"
    )


def _timed(given: Measuring, signatures: Sequence, apart: bool) -> tuple[list[_Link], list[int], list[float] | None]:
    """What is timed (`_Link`s), the link whose times each takes (`same`), and each link's share of the
    model's time (None: each timed on its own).

    On one physical device every action runs after the one before, whatever the schedule: a step is the sum of
    its actions. F, B and W apart would only place a recomputed forward (each taken as a third), and each
    link's share only its recomputed forward and its stage's balance, which then changes nothing: the model
    is timed as one link, each link's share of it by its weights."""
    models, device, vocab = given.models, given.pool[0], given.fed.vocab
    if not apart and len(models) > 1:
        chained = given.whole or keras.Sequential([keras.Input(models[0].input_shape[1:]), *models], name="plan_chain")
        total = sum(given.params)
        shares = [p / total if total else 1 / len(models) for p in given.params]
        return [_Link(chained, device, signatures[0], signatures[-1], vocab)], [0], shares
    # each traced only when first called
    timed = [_Link(m, device, signatures[j], signatures[j + 1], vocab) for j, m in enumerate(models)]
    return timed, list(given.same) if given.same is not None else list(range(len(timed))), None


def _pass_times(
    timed: Sequence[_Link], same: Sequence[int], sizes: Sequence[int], apart: bool, deadline: float, call: float
) -> _Found:
    """Each timed link's passes at the `sizes` the budget allows (`same[j]`: the link whose times link j
    takes): F+B+W at the largest, smallest and middle size, then F and F+B there (two physical devices
    only), then every size between, each pass timed so far."""
    order = sorted(set(sizes), reverse=True)
    # always measured: the largest and smallest size and the one halfway between (by ratio), since a pass's
    # time is not linear in its size between them (caches, kernels): two points and one to bend the line
    ends = list(dict.fromkeys([order[0], order[-1], order[len(order) // 2]]))
    found = _Found({}, ["FBW"], list(ends), [])

    def at(size: int, kinds: Sequence[str]) -> None:
        for j, link in enumerate(timed):
            for kind in kinds:
                found.seconds[(kind, j, size)] = (
                    link.time(kind, size, CALLS, deadline, call)
                    if same[j] == j
                    else found.seconds[(kind, same[j], size)]
                )

    for size in ends:
        at(size, ("FBW",))
    for kind, cut in (
        ("F", "F, B and W not timed apart (each taken as a third of the pass, as a Dense layer's three products)"),
        ("FB", "B and W not timed apart (each taken as half the backward)"),
    ):
        if not apart:
            break
        if time.perf_counter() > deadline:
            found.notes.append(f"placement.plan_budget_s: {cut}")
            break
        for size in ends:
            at(size, (kind,))
        found.kinds.append(kind)
    middle = _between([n for n in order[1:-1] if n not in ends])
    for i, size in enumerate(middle):
        if time.perf_counter() > deadline:
            found.notes.append(
                f"placement.plan_budget_s: microbatch sizes {sorted(middle[i:])} not measured "
                f"(interpolated from {sorted(found.sizes)})"
            )
            break
        at(size, found.kinds)
        found.sizes.append(size)
    found.sizes.sort()
    return found


def _passes(
    found: _Found, scale: Mapping[int, float], n: int, shares: Sequence[float] | None
) -> tuple[list[tuple[float, ...]], list[tuple[float, ...]], list[tuple[float, ...]]]:
    """Each link's F, B and W per measured size (`found`'s `n` timed links, each size's times by `scale`): B
    and W as differences of the passes, those not timed taken as shares of F+B+W; with `shares`, the one
    timed link's times shared out among the links."""
    seconds, kinds, sizes = found.seconds, found.kinds, found.sizes
    forward, input_grad, weight_grad = [], [], []
    for j in range(n):
        for kind in kinds:
            for size in sizes:
                seconds[(kind, j, size)] *= scale[size]
        fbw = [seconds[("FBW", j, size)] for size in sizes]
        f = [min(seconds[("F", j, size)], c) if "F" in kinds else c / 3 for size, c in zip(sizes, fbw)]
        fb = [
            min(max(seconds[("FB", j, size)], a), c) if "FB" in kinds else (a + c) / 2
            for size, a, c in zip(sizes, f, fbw)
        ]
        forward.append(tuple(f))
        input_grad.append(tuple(b - a for a, b in zip(f, fb)))
        weight_grad.append(tuple(c - b for b, c in zip(fb, fbw)))
    if shares is not None:  # the model timed as one link: each link its share
        forward, input_grad, weight_grad = (
            [tuple(t * share for t in row[0]) for share in shares] for row in (forward, input_grad, weight_grad)
        )
    return forward, input_grad, weight_grad


def _action_s(pool: Sequence[str]) -> float:
    """What an action costs beyond its work on `pool[0]` (`_action_cost`, by ACTION_SCALE)."""
    action = _action_cost(pool[:1])
    local = not canonical(pool[0]).startswith("/job:")  # this process's device, not a cluster worker's
    return action + (ACTION_SCALE - 1) * (action if local else _action_cost([play.host()]))


def _updates(given: Measuring, call: float) -> tuple[float, ...]:
    """Each link's update, its share by its weights of the whole's update when there is one (timed once, all
    the weights), else of the largest link's (a stage's update is one action more)."""
    models, params = given.models, given.params
    largest = max(range(len(models)), key=lambda j: params[j])
    held, held_params = (given.whole, sum(params)) if given.whole is not None else (models[largest], params[largest])
    per_param = _update(held, given.optimizer(), given.pool[0], call) / max(held_params, 1)
    return tuple(per_param * params[j] for j in range(len(models)))


def _copies(given: Measuring, sizes: Sequence[int], signatures: Sequence) -> tuple[float, float, float]:
    """(seconds per byte, latency) of a copy between `given.pool`'s first two devices, and the copies'
    exchange per byte of gradients, as a step runs them (at the smallest measured size; a crossing at the
    middle link's cut, its latency beyond its bytes' time, at the middle size)."""
    pool, models, twin = given.pool, given.models, given.twin
    if len(pool) < 2 or given.physical_of(pool[0]) == given.physical_of(pool[1]):
        return 0.0, 0.0, 0.0  # logical devices of one physical device: a copy is the sending device's tensor
    if twin is None or given.reduce is None:
        raise ValueError(
            "chain.autoplan.measure: two physical devices need the model's twin on the second and the "
            "copies' averaging, to time the exchange and a crossing as a step runs them"
        )
    per_byte, latency = _transfer(pool[0], pool[1])
    exchanged = _exchange([list(models), list(twin)], pool[:2], sizes[0], given.reduce, given.fed)
    exchange_per_byte = exchanged / max(4 * sum(given.params), 1)
    if len(models) > 1:
        cut = len(models) // 2
        size = sizes[len(sizes) // 2]
        ran = _crossing(models, twin, pool[:2], size, cut, given.fed)
        latency = max(latency, ran - per_byte * 4 * size * examples.values(signatures[cut]))
    return per_byte, latency, exchange_per_byte


def _scales(
    whole: keras.Model | None,
    measured: Sequence[int],
    found: Mapping[tuple[str, int, int], float],
    n: int,
    device: str,
    deadline: float,
    call: float,
    signature: tuple,
) -> dict[int, float]:
    """Per measured size, the factor the links' times take: the whole model's F+B+W over the links'
    summed F+B+W at that size (1 without a `whole`; `signature`: what it takes and gives, and the vocabulary).
    The whole is timed at least MIN_CALLS times at each size whatever the deadline: it is what the prediction
    stands on."""
    if whole is None:
        return {size: 1.0 for size in measured}
    link = _Link(whole, device, *signature)
    out = {}
    for size in measured:
        summed = sum(found[("FBW", j, size)] for j in range(n))  # about the whole's pass: its repeats from it
        repeat = min(MAX_REPEAT, max(REPEAT, math.ceil(OUTWEIGH * call / max(summed, 1e-6))))
        out[size] = link.time("FBW", size, CALLS, deadline, call, repeat) / summed if summed > 0 else 1.0
    return out


def _between(sizes: Sequence[int]) -> list[int]:
    """The sizes between the largest and the smallest, the middle ones first (each halves a gap)."""
    out, rest = [], list(sizes)
    while rest:
        out.append(rest.pop(len(rest) // 2))
    return out
