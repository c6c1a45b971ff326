"""The run-time records (`chain.records`): what crosses module boundaries is typed, defined once,
and serialized in one module.

- No module of chain/ reads a record's field by string key (`x["loss_last"]`, `x.get("stages")`)
  but `chain/records/serial.py`, the one module that turns records into JSON and back. What the
  check covers: every JSON key of a step's result, the loss records, summary.json (its stages,
  sections, out-of-memory events and ranking), timeline.json and a sweep job's outcome, found by `ast` as a subscript
  read or a `.get`/`.pop`/`.setdefault` call with that key as a string constant. What it cannot
  tell apart: a dict of another format that happens to use the same key. Those reads are listed
  in OTHER_FORMATS below, each with the format it reads (config dicts, checkpoint.json's file
  lists, evaluation metrics, TF_CONFIG, ...); a new one must be added there, with its reason.
- summary.json and timeline.json round-trip through the records; a value of another type is an
  error naming its key.
- The docs' summary.json field list is the one generated from the records' definitions.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from chain.records import serial
from chain.records.measured import MeasuredTimeline
from chain.records.results import LossHistory, StepResult
from chain.records.summaries import Summary
from chain.records.sweeps import JobOutcome

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "chain"
SERIALIZER = PACKAGE / "records" / "serial.py"
RECORD_KEYS = set().union(*(serial.keys(r) for r in (StepResult, LossHistory, Summary, MeasuredTimeline, JobOutcome)))
READS = {"get", "pop", "setdefault"}

# module -> (keys, the format read): string-key reads of dicts that are NOT records, though the key
# is also a record's. Each names the other format; nothing here reads summary.json, timeline.json,
# a step's result or a loss record.
_MANIFEST = "checkpoint.json, the manifest (its step, complete steps, file lists, layout, stream settings)"
OTHER_FORMATS: dict[str, tuple[set[str], str]] = {
    "chain/state/manifest.py": ({"step", "complete", "grad_accum", "precision", "layers", "index"}, _MANIFEST),
    "chain/state/checkpoints.py": (
        {"step", "complete", "stages", "mode", "seed", "grad_accum", "precision"},
        _MANIFEST + " and the settings record's values",
    ),
    "chain/state/run_settings.py": (
        {"stages", "mode", "model"},
        "the settings record's values (a config as plain data)",
    ),
    "chain/state/remap.py": ({"step"}, _MANIFEST),
    "chain/training/run.py": ({"step"}, _MANIFEST),
    "chain/training/failures.py": ({"step"}, _MANIFEST),
    "chain/training/on_lost.py": ({"step"}, _MANIFEST),
    "chain/__main__.py": ({"step"}, _MANIFEST),
    "chain/restage.py": ({"step", "overrides"}, "the restage report of chain.state.remap.restage"),
    "chain/config/__init__.py": ({"stages", "grid"}, "a Hydra config dict (+grid: side-by-side variants)"),
    "chain/config/variants.py": ({"paused"}, "a variant's config dict"),
    "chain/training/profile.py": ({"model", "target"}, "a stage's spec as a config dict (the advised override)"),
    "chain/planning/cluster.py": ({"index"}, "TF_CONFIG's task"),
    "chain/steps/evaluate.py": ({"loss"}, "evaluation metrics, metric name -> mean (made here)"),
    "chain/strategies/objectives.py": ({"loss"}, "evaluation metrics, metric name -> mean"),
    "chain/training/validation.py": ({"loss", "best_step"}, "evaluation metrics; the tracker's checkpointed state"),
    "chain/data/sources/digits_data.py": ({"target"}, "the arrays of the shipped digits.npz"),
}


def string_key_reads(path: Path) -> list[tuple[int, str]]:
    """(line, key) of every read of a record key by string constant in `path`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        key = None
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            key = node.slice
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in READS
            and node.args
        ):
            key = node.args[0]
        if isinstance(key, ast.Constant) and isinstance(key.value, str) and key.value in RECORD_KEYS:
            found.append((node.lineno, key.value))
    return found


def test_no_module_reads_a_record_by_string_key():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == SERIALIZER:
            continue
        module = str(path.relative_to(ROOT))
        for line, key in string_key_reads(path):
            if key not in OTHER_FORMATS.get(module, (set(), ""))[0]:
                offenders.append(f"{module}:{line}: [{key!r}]")
    assert not offenders, "string-key reads of records (use the record's field):\n" + "\n".join(offenders)


def test_the_check_finds_a_string_key_read(tmp_path):
    """The check itself: a read of summary.json by key, as the report did, is found with its line."""
    path = tmp_path / "reader.py"
    path.write_text('summary = {}\nx = summary["loss_last"]\ny = summary.get("stages", [])\nsummary["steps"] = 3\n')
    assert string_key_reads(path) == [(2, "loss_last"), (3, "stages")]  # a write is not a read


def test_the_exempt_keys_are_still_read_there():
    """Every exemption is used (one that no longer matches any read is removed, not kept as a loophole)."""
    for module, (keys, _) in OTHER_FORMATS.items():
        read = {key for _, key in string_key_reads(ROOT / module)}
        assert keys <= read, (module, keys - read)


def finished_summary() -> dict:
    """A summary.json as a pipelined, profiled, mode=e2e run writes it (values of every type)."""
    stage = {
        "index": 0,
        "device": "/device:CPU:0",
        "variable_devices": ["/device:CPU:0"],
        "params": 10,
        "peak_memory_bytes": None,
        "skipped_steps": 0,
        "loss_scale": None,
        "overflow_steps": 0,
        "model": "mlp(width=4, depth=1)",
        "physical": "CPU:0",
        "busy_fraction": 0.5,
        "busy_ms": 1.0,
        "forward_ms": 0.25,
        "backward_ms": 0.5,
        "copy_ms": 0.0,
        "copy_wait_ms": 0.0,
        "update_ms": 0.1,
    }
    return {
        "mode": "e2e",
        "strategy": "pipeline",
        "steps": 3,
        "early_stopped": False,
        "resumed_from": None,
        "batch_size": 8,
        "grad_accum": 1,
        "examples_per_step": 8,
        "train_examples": 64,
        "val_examples": 0,
        "precision": "float32",
        "jit_compile": False,
        "seed": 0,
        "examples_per_second": 100.5,
        "steps_per_second": 12.5,
        "data_wait_ms": {"mean": 0.5, "p95": 1.5, "steps": 2},
        "loss_first": 2.5,
        "loss_last": 1.25,
        "val": None,
        "best_step": None,
        "skipped_steps": 0,
        "peak_memory_scope": "process",
        "stages": [stage, {**stage, "index": 1}],
        "loss_fn": "auto",
        "target": "label",
        "schedule": "gpipe",
        "microbatches": 2,
        "bubble_fraction": 0.2,
        "measured_bubble_fraction": 0.3,
        "profiled_steps": [2, 3],
        "slowest_stage": 1,
        "balance_advice": None,
    }


def test_summary_json_reads_back_into_the_same_file():
    raw = finished_summary()
    summary = serial.from_json(Summary, raw)
    assert summary.pipeline.schedule == "gpipe" and summary.stages[1].measured.busy_ms == 1.0
    assert summary.mirrored is None and summary.side_by_side is None  # sections a run does not have stay out
    assert serial.to_json(summary) == raw
    assert json.dumps(serial.to_json(summary)) == json.dumps(raw)  # key order too


@pytest.mark.parametrize(
    "damage, named",
    [
        ({"steps": "many"}, "steps"),
        ({"stages": [{"index": "x"}]}, "stages[0].index"),
        ({"microbatches": 2.5}, "microbatches"),
        ({"replica_devices": [1]}, "replica_devices[0]"),
        ({"early_stopped": 1}, "early_stopped"),
        ({"loss_last": True}, "loss_last"),
    ],
)
def test_a_value_of_another_type_is_an_error_naming_its_key(damage, named):
    with pytest.raises(serial.RecordError, match=rf"^{re.escape(named)} must be"):
        serial.from_json(Summary, {**finished_summary(), **damage})


def test_timeline_json_reads_back_into_the_same_file():
    from chain.schedule import schedules
    from chain.pipeline import timeline
    from chain.pipeline.timeline import OpEvent

    s = schedules.build("1f1b", 2, 2)
    events = [
        OpEvent(
            f"{a.scope()}/x" if a.kind == "F" else f"gradient_tape/s{a.stage}_F{a.microbatch}/x",
            "MatMul",
            100 * t,
            100 * t + 50,
            "vm",
        )
        for t, a in enumerate(schedules.simulate(s).order())
    ]
    measured = timeline.measure(s, events, {1: (0, 10**6)}, ["/d:0", "/d:1"])
    raw = json.loads(json.dumps(serial.to_json(measured)))
    assert serial.from_json(MeasuredTimeline, raw) == measured
    assert [timeline.action(a) for a in measured.steps[0].actions] == [a for row in s.actions for a in row]


def test_the_docs_field_list_is_generated_from_the_records_without_tensorflow():
    code = (
        "import runpy, sys; sys.modules['tensorflow'] = None; sys.argv = ['summary_reference.py', '--check']; "
        "runpy.run_path('scripts/summary_reference.py', run_name='__main__')"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_every_summary_key_is_in_the_docs_with_a_meaning():
    page = (ROOT / "docs" / "run-directory.md").read_text()
    for record in (Summary,):
        for key, help, _ in serial.fields_of(record):
            assert help, key
    for key in serial.keys(Summary):
        assert f"| `{key}` |" in page, key


def test_the_records_are_a_leaf_without_tensorflow():
    """chain.records imports nothing of chain but chain.errors (and itself), and no TensorFlow."""
    for path in sorted((PACKAGE / "records").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            for name in names:
                top = name.split(".")[0]
                assert top != "tensorflow" and (
                    top != "chain" or name == "chain.errors" or name.startswith("chain.records")
                ), (path.name, name)
