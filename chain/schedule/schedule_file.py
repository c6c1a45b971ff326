"""A pipeline schedule as a CSV file: `pipeline.schedule=file pipeline.schedule_file=my.csv`.

One row per device, one action per cell, in the order the device runs them: `F3` (forward of microbatch 3), `B3` (its backward; in a split schedule only the
input's gradient), `W3` (the weights' gradients of a split schedule). A cell may name its stage,
`F3@s2` (a cell without it is the stage of its row's number: row 1 is stage 0's); a row
may hold several stages (interleaved's loop, zbv's V, or any other map: the planner puts each
stage on its row's device), and torch.distributed.pipelining's compute-only form is read too (`2F3`: stage first;
its `I3`, the input-gradient half, is our `B3`). Empty cells are skipped, so a grid with idle
slots reads as its order. `write` puts any schedule into this form
(`plan_only=true pipeline.schedule_out=x.csv`), and `read` gives back the same `Schedule`.

`read` checks everything before training: every action exactly once (each microbatch of
`pipeline.microbatches`, F and B, and W for all or none), each after what it needs on its own
stage, and no deadlock (`schedules.simulate` names the first action that can never run). Its
errors are one line (`ScheduleFileError`); the config turns them into a ConfigError naming
`pipeline.schedule_file`. No TensorFlow, and nothing of chain but `chain.schedule.schedules`.
"""

from __future__ import annotations

import csv
import io

from chain.schedule.schedules import BACKWARD, FORWARD, KINDS, WEIGHT, Action, Schedule, simulate, validate

MAX_BYTES = 16 << 20  # a schedule of 4096 microbatches x 512 stages is far below this
MAX_CELL = 32  # characters: the longest action, torch's `511F4095` or `F4095@s511`, has 10


class ScheduleFileError(ValueError):
    """A schedule file that cannot be run, in one line (without the file's name: the caller adds it)."""


def cell(action: Action, shared: bool = False) -> str:
    """`action` as a cell: `F3`, or `F3@s2` when its device holds several stages (`shared`)."""
    return f"{action}@s{action.stage}" if shared else str(action)


def dumps(schedule: Schedule) -> str:
    """The CSV text of `schedule`: one line per device, its actions in order."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for row in schedule.actions:
        writer.writerow([cell(a, len({b.stage for b in row}) > 1) for a in row])
    return out.getvalue()


def write(schedule: Schedule, path: str) -> None:
    """Write `schedule` to `path` (`dumps`), whole or not at all (a temporary file renamed over it)."""
    import os
    import tempfile

    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".schedule-", suffix=".csv")
    try:
        with os.fdopen(fd, "w", newline="") as f:
            f.write(dumps(schedule))
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def parse_cell(text: str, row: int) -> Action:
    """One cell as an action of stage `row` unless it names another (`F3@s2`, `2F3`)."""
    t = text.strip()
    if len(t) > MAX_CELL:  # shown cut short; and no int() of thousands of digits (Python refuses past 4300)
        raise ScheduleFileError(
            f"{t[:12]!r}... ({len(t)} characters) is not an action; a cell is F3, B3 or W3, F3@s2 for stage 2"
        )
    stage = row
    if "@" in t:
        t, _, where = t.partition("@")
        if not (where.startswith("s") and where[1:].isdecimal() and where[1:].isascii()):
            raise ScheduleFileError(f"{text.strip()!r} names its stage as {where!r}; write F3@s2 for stage 2")
        stage = int(where[1:])
    elif t[:1].isdecimal():  # torch's compute-only form: stage, kind, microbatch
        digits = len(t) - len(t.lstrip("0123456789"))
        stage, t = int(t[:digits]), t[digits:]
    kind, number = t[:1].upper(), t[1:]
    kind = BACKWARD if kind == "I" else kind  # torch's BACKWARD_INPUT
    if kind not in KINDS or not (number.isdecimal() and number.isascii()):
        raise ScheduleFileError(
            f"{text.strip()!r} is not an action; a cell is F3, B3 or W3 (forward, backward, "
            "weight gradients of microbatch 3), F3@s2 for stage 2"
        )
    return Action(stage, int(number), kind)


def loads(text: str, stages: int, microbatches: int, name: str = "file") -> Schedule:
    """The schedule in `text` for `stages` stages and `microbatches` microbatches, checked (see the
    module's docstring); ScheduleFileError otherwise."""
    # Trailing blank lines and empty cells are no rows; past `stages` rows the file is refused as soon
    # as the row is read: the csv module is slow to reach the end of a large file (docs/benchmarks-in-code.md).
    reader = csv.reader(io.StringIO(text.rstrip(" \t\r\n,")))
    rows: list[list[str]] = []
    try:
        for line in reader:
            if len(rows) == stages:
                raise ScheduleFileError(
                    f"has more than {stages} rows, but the chain has {stages} stages: one row per "
                    f"device, at most {stages}"
                )
            rows.append([c for c in line if c.strip()])
    except csv.Error as e:  # a cell past the csv module's field limit (128 KiB): no action is like that
        what = (
            f"holds a cell of more than {csv.field_size_limit()} characters"
            if "field limit" in str(e)
            else f"is not CSV ({e})"
        )
        raise ScheduleFileError(f"line {reader.line_num} {what}; a cell is F3, B3 or W3, F3@s2 for stage 2") from None
    if not rows or not rows[0] and len(rows) == 1:
        raise ScheduleFileError("has no rows: one row per device, its actions in order (F3, B3, W3)")
    home: dict[int, int] = {}  # stage -> the row (device) that runs it
    actions = []
    for r, line in enumerate(rows):
        seen: dict[Action, int] = {}
        out = []
        for c, text_cell in enumerate(line):
            try:
                a = parse_cell(text_cell, r)
            except ScheduleFileError as e:
                raise ScheduleFileError(f"row {r + 1}, cell {c + 1}: {e}") from None
            where = f"row {r + 1}, cell {c + 1}: {cell(a, True)}"
            if a.stage >= stages:
                raise ScheduleFileError(f"{where}: stage {a.stage}, but the chain has stages 0..{stages - 1}")
            if home.setdefault(a.stage, r) != r:
                raise ScheduleFileError(
                    f"{where}: stage {a.stage} is on row {home[a.stage] + 1}'s device already; "
                    "each stage runs on one device"
                )
            if a.microbatch >= microbatches:
                raise ScheduleFileError(
                    f"{where}: microbatch {a.microbatch}, but pipeline.microbatches="
                    f"{microbatches} numbers them 0..{microbatches - 1}"
                )
            if a in seen:
                raise ScheduleFileError(f"{where} runs twice (cells {seen[a] + 1} and {c + 1})")
            seen[a] = c
            out.append(a)
        actions.append(tuple(out))
    missing = [k for k in range(stages) if k not in home]
    if missing:
        raise ScheduleFileError(f"no row runs stage {missing[0]}: every stage's actions are on the row of its device")
    split = any(a.kind == WEIGHT for row in actions for a in row)
    kinds = KINDS if split else (FORWARD, BACKWARD)
    for k in range(stages):
        have = set(actions[home[k]])
        for m in range(microbatches):
            for kind in kinds:
                if Action(k, m, kind) not in have:
                    why = (
                        " (a W anywhere splits every backward: each stage needs W of every microbatch)"
                        if kind == WEIGHT
                        else ""
                    )
                    raise ScheduleFileError(f"row {home[k] + 1} never runs {cell(Action(k, m, kind), True)}{why}")
    stage_rows = tuple(home[k] for k in range(stages))
    identity = stage_rows == tuple(range(stages))
    schedule = Schedule(name, stages, microbatches, tuple(actions), () if identity else stage_rows)
    try:
        validate(schedule)
        simulate(schedule)
    except ValueError as e:
        raise ScheduleFileError(str(e).removeprefix(f"{name}: ")) from None
    return schedule


def read(path: str, stages: int, microbatches: int) -> Schedule:
    """The schedule in the file at `path` (`loads`); ScheduleFileError for a file that cannot be read."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError as e:
        raise ScheduleFileError(f"cannot be read: {e.strerror or e}") from None
    if len(data) > MAX_BYTES:
        raise ScheduleFileError(f"is larger than {MAX_BYTES >> 20} MiB; a schedule file is a few lines")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise ScheduleFileError("is not UTF-8 text (a CSV file: one row per device, cells like F3, B3, W3)") from None
    return loads(text, stages, microbatches)
