"""The e2e step reads like its schedule (issue 40): a short driver walks the actions and calls one
handler per kind of action from a table; what passes between handlers is a named, frozen record."""

import dataclasses
import inspect

from chain.pipeline import play
from chain.schedule.schedules import KINDS

DRIVER_LINES = 40  # play_schedule and play_action together
HANDLER_LINES = 35  # each handler, and each helper a handler calls


def lines(fn) -> int:
    return len(inspect.getsource(fn).rstrip("\n").split("\n"))


def test_the_driver_is_at_most_40_lines():
    counted = {fn.__name__: lines(fn) for fn in (play.play_schedule, play.play_action)}
    assert sum(counted.values()) <= DRIVER_LINES, counted


def test_every_kind_of_action_has_one_handler_of_at_most_35_lines():
    assert set(play.HANDLERS) == set(KINDS) | {play.INPUT_GRADIENT}
    assert len(set(play.HANDLERS.values())) == len(play.HANDLERS)  # one each, no shared if/elif
    helpers = [play._taped, play._retaped, play._output_gradient, play._start, play.playbook]
    too_long = {fn.__name__: lines(fn) for fn in [*play.HANDLERS.values(), *helpers] if lines(fn) > HANDLER_LINES}
    assert not too_long


def test_what_passes_between_actions_and_the_options_are_frozen_named_records():
    for record in (
        play.StepOptions,
        play.Playbook,
        play.Taped,
        play.Forwarded,
        play.Replayable,
        play.Waiting,
        play.Halfway,
    ):
        assert dataclasses.is_dataclass(record) and record.__dataclass_params__.frozen, record
    # The F -> B and B -> W stores hold those records, not tuples.
    hints = {f.name: f.type for f in dataclasses.fields(play.PlayState)}
    assert "Forwarded | Replayable | Waiting" in hints["saved"] and "Halfway" in hints["halfway"]
    assert "tuple" not in str(inspect.signature(play._taped).return_annotation)


def test_every_parameter_of_the_step_is_one_the_trainer_passes():
    """No benchmark-only switch in the step's signatures: each parameter of `e2e_step` and `e2e_play` is
    passed by some call in chain/ (a benchmark leaves a piece out by patching: scripts/ablations.py)."""
    import ast
    from pathlib import Path

    calls = {"e2e_step": set(), "e2e_play": set()}
    for path in (Path(play.__file__).parents[1]).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            name = getattr(node.func, "id", getattr(node.func, "attr", None)) if isinstance(node, ast.Call) else None
            if name in calls:
                params = list(inspect.signature(getattr(play, name)).parameters)
                calls[name] |= set(params[: len(node.args)]) | {k.arg for k in node.keywords}
    for name, passed in calls.items():
        assert set(inspect.signature(getattr(play, name)).parameters) <= passed, name
