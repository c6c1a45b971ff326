"""The training loop's cadences (chain.training.cadence): which steps are due for a checkpoint,
an evaluation, a log line or a TensorBoard point, which are profiled, and how far each call of
the compiled step may run — from the start and from a step in the middle (resume)."""

from __future__ import annotations

import pytest

import chain
from chain.training.cadence import Cadences, Every, Logging, Span


def calls(c: Cadences, done: int = 0) -> list[int]:
    """The steps at which each call ends, from step `done` to the last step."""
    ends = []
    while done < c.steps:
        n = c.call_length(done)
        assert n >= 1
        done += n
        ends.append(done)
    return ends


def cadences(steps=10, per_call=4, checkpoint=0, evaluation=0, log_every=1, profile=None) -> Cadences:
    return Cadences(
        steps,
        per_call,
        Every(checkpoint),
        Every(evaluation),
        Logging(log_every, steps),
        Span(*profile) if profile else None,
    )


def test_every_is_due_at_its_multiples_and_never_at_period_zero():
    assert [s for s in range(1, 13) if Every(4).due(s)] == [4, 8, 12]
    assert not any(Every(0).due(s) for s in range(0, 20))
    assert [Every(4).limit(done, 10) for done in range(0, 9)] == [4, 3, 2, 1, 4, 3, 2, 1, 4]
    assert [Every(4).limit(done, 2) for done in range(0, 4)] == [2, 2, 2, 1]
    assert Every(0).limit(7, 5) == 5


def test_a_span_runs_one_step_per_call_and_ends_the_call_before_it():
    span = Span(5, 7)
    assert [s for s in range(1, 10) if span.due(s)] == [5, 6, 7]
    assert [span.limit(done, 8) for done in range(0, 9)] == [4, 3, 2, 1, 1, 1, 1, 8, 8]
    assert span.limit(0, 2) == 2


def test_logging_lines_at_multiples_and_points_also_at_both_ends():
    lg = Logging(every=4, last=10)
    assert [s for s in range(1, 11) if lg.due(s)] == [4, 8]
    assert [s for s in range(1, 11) if lg.point(s)] == [1, 4, 8, 10]
    assert lg.limit(3, 6) == 6  # logging ends no call


def test_calls_end_at_every_checkpoint_and_evaluation():
    c = cadences(steps=10, per_call=4, checkpoint=3, evaluation=5)
    assert calls(c) == [3, 5, 6, 9, 10]


def test_calls_are_as_long_as_steps_per_call_allows_and_never_pass_the_last_step():
    assert calls(cadences(steps=10, per_call=4)) == [4, 8, 10]
    assert calls(cadences(steps=10, per_call=1)) == list(range(1, 11))
    assert calls(cadences(steps=3, per_call=100, checkpoint=5, evaluation=7)) == [3]


def test_the_profiled_steps_are_calls_of_their_own():
    assert calls(cadences(steps=12, per_call=4, checkpoint=6, profile=(3, 4))) == [2, 3, 4, 6, 10, 12]


CONFIGS = [
    dict(steps=s, per_call=p, checkpoint=k, evaluation=e, profile=w)
    for s in (1, 7, 20)
    for p in (1, 3, 8)
    for k in (0, 1, 4)
    for e in (0, 3, 5)
    for w in (None, (2, 3), (6, 6))
]


@pytest.mark.parametrize("done", [0, 1, 4, 5])
@pytest.mark.parametrize("config", CONFIGS, ids=str)
def test_each_call_ends_at_the_first_due_step_and_is_otherwise_as_long_as_allowed(config, done):
    """From the start or from any step in the middle (a resumed run): a call never runs past a
    checkpoint or evaluation step, inside the profiled span runs one step, and ends early only
    for one of those reasons."""
    c = cadences(**config)
    if done >= c.steps:
        return
    start = done
    for end in calls(c, done):
        taken = range(start + 1, end + 1)
        due = [s for s in taken[:-1] if c.checkpoint.due(s) or c.evaluation.due(s)]
        assert due == [], (start, end)
        if c.profile and any(c.profile.due(s) for s in taken):
            assert end == start + 1 or not c.profile.due(end)  # inside: one step; a call never enters it
            assert len(taken) == 1 or not any(c.profile.due(s) for s in taken)
        full = len(taken) == c.per_call or end == c.steps
        at_due = c.checkpoint.due(end) or c.evaluation.due(end)
        at_span = c.profile is not None and (c.profile.due(end) or c.profile.due(end + 1))
        assert full or at_due or at_span, (start, end)
        start = end


@pytest.mark.parametrize("config", CONFIGS, ids=str)
def test_a_run_resumed_at_a_checkpoint_calls_as_the_uninterrupted_one_did(config):
    c = cadences(**config)
    ends = calls(c)
    for saved in [e for e in ends if c.checkpoint.due(e)]:
        assert calls(c, saved) == [e for e in ends if e > saved]


def test_the_cadences_of_a_config():
    settings = chain.compose(
        [
            "mode=e2e",
            "trainer.steps=9",
            "trainer.steps_per_call=4",
            "trainer.eval_every=3",
            "trainer.log_every=2",
            "trainer.profile=[5,6]",
        ]
    )
    c = Cadences.of(settings.trainer, checkpoint_every=4)
    assert c == Cadences(9, 4, Every(4), Every(3), Logging(2, 9), Span(5, 6))
    assert calls(c) == [3, 4, 5, 6, 8, 9]
    assert Cadences.of(settings.trainer, checkpoint_every=0).checkpoint == Every(0)
