"""Checkpoints: one directory and one `tf.train.CheckpointManager` per stage, saved all or nothing.

Two managers in one directory share its `checkpoint` index file and restore each
other's steps, so every stage gets its own `stage_NN/` directory; the data stream
(the `tf.data` iterator) gets `data/`. A save writes every stage, then the data
stream, then the run-level manifest `checkpoint.json` (atomically), and only then
deletes checkpoints older than the `keep` newest complete ones. The managers never
delete anything themselves (`max_to_keep=None`): with their own pruning, a save killed
half-way could already have deleted the only step every stage still shares.

A weight several stages hold (a cut model's tied weight) is saved once, by its first holder
with its slots, and the later copies take those values on restore (`chain.state.tied_copies`).
Each stage also holds its weights by layer (`chain.state.by_layer`): a model cut into other stages
(another count, another split) restores from those, whatever stage saved them.

A stage's checkpoint holds its model, head, optimizer (with slot variables), the
state of its dropout seed generators (which `tf.train.Checkpoint(model=...)` leaves
out), its count of skipped updates, its loss scale (precision=mixed_float16: scale,
finite steps since it last changed, overflow count), the step, and its identity
(`RUN/PART`: which run and which stage wrote it).

What is restored is what this run saved, or nothing: the manifest records the sha256 of
every file of every complete step, and a restore verifies the step's files first. A file
that differs is named, with what it holds instead when it can be read (another stage's
checkpoint, another run's, another step's); the newest older complete step that verifies
is offered (`checkpoint.fallback=true` resumes from it). A damaged `checkpoint.json` is
rebuilt from the stage directories when every part agrees on a step that reads back whole.
The data part also holds the step's `Record` (the run's settings, losses and evaluations, and a
streamed data set's files as the run found them at its start: `chain.data.identity`), so what a
resume checks and continues from is verified with the weights, not read from the manifest. A
resume over files that changed is refused before anything is restored, or, with
`checkpoint.accept_changed_files=true`, restores everything but the stream's position.
A save that fails (disk full, read-only) removes what it wrote of that step and raises a
`StorageError`; the previous complete checkpoint stays the newest.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import uuid
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import tensorflow as tf

from chain import testhooks
from chain.config.schema import Conv, Mlp, Settings
from chain.data import identity
from chain.errors import ChainError, CheckpointError, ConfigError, StorageError
from chain.records.results import LossHistory, LossRecord
from chain.records.serial import from_json, to_json
from chain.records.stream_files import StreamFiles
from chain.records.summaries import Layout, Layouts
from chain.stages import lr_schedules
from chain.stages.stage import Stage, stage_name
from chain.state import manifest as manifest_lib
from chain.state import by_layer, tied_copies
from chain.state.atomic import reason, uninterrupted, write_text
from chain.state.run_settings import RunSettings, built_layout, check_resume

DATA_DIR = "data"
PREFIX = manifest_lib.PREFIX
_NUMBERED = manifest_lib.NUMBERED
IDENTITY_KEY = "identity/.ATTRIBUTES/VARIABLE_VALUE"
STEP_KEY = "step/.ATTRIBUTES/VARIABLE_VALUE"
RECORD_KEY = "record/.ATTRIBUTES/VARIABLE_VALUE"  # in data/: the run's settings and progress (`Record`)
IDENTITY_DEVICE = "/device:CPU:0"  # string variables live on a CPU

log = logging.getLogger("chain")


@dataclass(frozen=True)
class Record:
    """What a checkpoint holds besides the state it restores (as JSON, in `data/ckpt-N`, whose
    digest the save records): the settings the run was trained with, its first and last
    losses, what its evaluations had found by that step and the files of a streamed data set
    (`files`: None when not streamed from files, or recorded before files were). A resume reads
    these from the verified checkpoint, not from `checkpoint.json`, which may be torn (and rebuilt)
    or edited."""

    settings: RunSettings
    losses: LossHistory
    validation: dict | None
    files: StreamFiles | None = None
    layouts: tuple[Layout, ...] = ()  # the layouts the run trained on, oldest first (none: recorded before them)

    def to_json(self) -> str:
        """The record as a checkpoint stores it."""
        return json.dumps(
            {
                "settings": self.settings.values,
                **to_json(self.losses),
                "validation": self.validation,
                **to_json(self.files or StreamFiles(None)),
                **to_json(Layouts(list(self.layouts))),
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> Record:
        """A record read back from a checkpoint (`CheckpointError` if it is not one)."""
        try:
            raw = json.loads(text)
            files = from_json(StreamFiles, raw)
            return cls(
                RunSettings(dict(raw["settings"])),
                from_json(LossHistory, raw),
                raw["validation"],
                files if files.files is not None else None,
                tuple(from_json(Layouts, raw).layouts or ()),
            )
        except (ValueError, KeyError, TypeError):
            raise CheckpointError("the checkpoint's record of its settings cannot be read") from None


def _write_index(directory: str, steps: Sequence[int]) -> None:
    """Point the directory's `checkpoint` index at exactly `steps` (what the manifest keeps)."""
    names = [f"{PREFIX}-{n}" for n in steps]
    lines = [f'model_checkpoint_path: "{names[-1]}"'] + [f'all_model_checkpoint_paths: "{n}"' for n in names]
    write_text(os.path.join(directory, "checkpoint"), "\n".join(lines) + "\n")


def _files(directory: str, step: int) -> list[str]:
    """The files of checkpoint `step` in `directory` (index and data shards), sorted."""
    names = os.listdir(directory) if os.path.isdir(directory) else []
    return sorted(n for n in names if (m := _NUMBERED.match(n)) and int(m.group(1)) == step and m.group(2) != "_temp")


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _prune(directory: str, keep: Sequence[int]) -> None:
    """Delete every numbered checkpoint (and `ckpt-N_temp` leftover) not in `keep`."""
    for entry in os.listdir(directory) if os.path.isdir(directory) else ():
        m = _NUMBERED.match(entry)
        if m and (int(m.group(1)) not in keep or m.group(2) == "_temp"):
            full = os.path.join(directory, entry)
            shutil.rmtree(full) if os.path.isdir(full) else os.remove(full)


class Checkpoints:
    """All-or-nothing, verified checkpoints of a chain and its data stream in one run directory.

    `iterator` is the `tf.data` iterator the run draws batches from: saving it is what
    makes the first batch after a resume the batch the run would have seen. `files` are the
    stamps of the files it streams (`chain.data.identity.stamps`; None: not streamed from
    files), recorded with every save and compared on restore. `run_id` is the run's identity:
    drawn here, replaced by the manifest's on restore.
    """

    def __init__(
        self,
        run_dir: str,
        stages: Sequence[Stage],
        iterator: Any,
        settings: Settings,
        keep: int | None = None,
        files: StreamFiles | None = None,
    ):
        self.run_dir = run_dir
        self.stages = list(stages)
        self.settings = settings
        self.files = files
        self.keep = keep or settings.checkpoint.keep
        self.run_id = uuid.uuid4().hex
        self.parts: dict[str, tf.train.Checkpoint] = {}
        self.steps: dict[str, tf.Variable] = {}
        self.identities: dict[str, tf.Variable] = {}
        self.managers: dict[str, tf.train.CheckpointManager] = {}  # made once: a new one would retrace its saver
        tied_copies.leave_out(self.stages)  # a tied weight is saved once, by its first holder
        for s, keyed in zip(self.stages, by_layer.keyed(self.stages)):
            objects = {"model": s.model, "optimizer": s.optimizer, "random": s.random_variables(), "skipped": s.skipped}
            if s.head is not None:
                objects["head"] = s.head
            if s.loss_scale is not None:
                objects["loss_scale"] = s.loss_scale
            objects[by_layer.KEY] = keyed  # the same variables by layer: what another layout restores from
            self._part(stage_name(s.index), s.device, objects)
        self.layouts: tuple[Layout, ...] = (self.layout(0),)  # a resume replaces it with the run's history
        self.regrouped = by_layer.Regrouped()  # a resume on another layout: what became of the heads
        with tf.device(IDENTITY_DEVICE):
            self.record = tf.Variable("", dtype=tf.string, trainable=False, name="record")
        self._part(DATA_DIR, IDENTITY_DEVICE, {"iterator": iterator, "record": self.record})
        # A checkpoint written before records were kept restores without one.
        self.unrecorded = tf.train.Checkpoint(
            step=self.steps[DATA_DIR], identity=self.identities[DATA_DIR], iterator=iterator
        )
        # The data part without the stream's position: a resume over changed files on purpose.
        self.restarted = tf.train.Checkpoint(
            step=self.steps[DATA_DIR], identity=self.identities[DATA_DIR], record=self.record
        )

    def _part(self, name: str, device: str | None, objects: dict[str, Any]) -> None:
        with tf.device(device):
            self.steps[name] = tf.Variable(0, dtype=tf.int64, trainable=False, name=f"step_{name}")
        with tf.device(IDENTITY_DEVICE):
            self.identities[name] = tf.Variable("", dtype=tf.string, trainable=False, name=f"identity_{name}")
        self.parts[name] = tf.train.Checkpoint(step=self.steps[name], identity=self.identities[name], **objects)

    def directory(self, name: str) -> str:
        return os.path.join(self.run_dir, name)

    def latest(self) -> dict[str, Any] | None:
        """The manifest of the newest complete checkpoint, or None (`ManifestDamaged` if unreadable)."""
        return manifest_lib.read(self.run_dir)

    # --- saving --------------------------------------------------------------------------------

    def save(
        self, step: int, loss_first: LossRecord | None, loss_last: LossRecord | None, validation: dict | None = None
    ) -> dict[str, Any]:
        """`_save`, with Ctrl-C held off until it is complete (never a half-written step)."""
        with uninterrupted():
            return self._save(step, loss_first, loss_last, validation)

    def _save(
        self, step: int, loss_first: LossRecord | None, loss_last: LossRecord | None, validation: dict | None = None
    ) -> dict[str, Any]:
        """Save every stage and the data stream at `step`, then commit the manifest; returns it.

        `validation` is what the run's evaluations had found by `step` (best loss and step,
        evaluations since: `chain.training.validation`), kept per complete step so that a
        resume from any of them continues best-checkpoint tracking and early stopping
        exactly. Raises `StorageError` (with nothing of `step` left behind that a restore
        would use) when a write fails.
        """
        previous = self.latest()
        checkpoints, digests = {}, {}
        record = RunSettings.of(self.settings)
        losses = LossHistory(loss_first, loss_last)
        self.record.assign(Record(record, losses, validation, self.files, self.layouts).to_json())
        try:
            for name, ckpt in self.parts.items():
                self.steps[name].assign(step)
                self.identities[name].assign(f"{self.run_id}/{name}")
                testhooks.before_part_saved(step, name)
                if name not in self.managers:
                    self.managers[name] = tf.train.CheckpointManager(
                        ckpt, self.directory(name), max_to_keep=None, checkpoint_name=PREFIX
                    )
                saved = self.managers[name].save(checkpoint_number=step)
                checkpoints[name] = os.path.relpath(saved, self.run_dir)
                digests[name] = {
                    f: _sha256(os.path.join(self.directory(name), f)) for f in _files(self.directory(name), step)
                }
                testhooks.after_part_saved(step, name)
            complete = [n for n in (previous["complete"] if previous else []) if n < step] + [step]
            complete = complete[-self.keep :]
            kept = {str(n): d for n, d in (previous or {}).get("digests", {}).items() if int(n) in complete}
            found = {str(n): v for n, v in (previous or {}).get("validation", {}).items() if int(n) in complete}
            m = self._manifest(
                step,
                complete,
                checkpoints,
                {**kept, str(step): digests},
                losses,
                record,
                {**found, str(step): validation},
            )
            manifest_lib.write(self.run_dir, m)  # the commit point
        except (OSError, tf.errors.OpError) as e:
            self._discard(step)
            where = f"; the last complete checkpoint (step {previous['step']}) is intact" if previous else ""
            raise StorageError(
                f"cannot save the checkpoint of step {step} in {self.run_dir}: {reason(e, file=True)}{where}"
            ) from None
        self.clean(m)
        return m

    def _manifest(
        self,
        step: int,
        complete: list[int],
        checkpoints: dict,
        digests: dict,
        losses: LossHistory,
        record: RunSettings | None,
        validation: dict | None = None,
    ) -> dict[str, Any]:
        """The manifest of `step`; its settings fields are `record`'s (what the checkpoints hold;
        None: a checkpoint from before settings were recorded, described by this run's)."""
        values = record.values if record is not None else RunSettings.of(self.settings).values
        return {
            "format": manifest_lib.FORMAT,
            "run": self.run_id,
            "step": step,
            "complete": complete,
            "mode": values["mode"],
            "seed": values["seed"],
            "data": values["data"],
            "grad_accum": values["trainer"]["grad_accum"],
            "precision": values["precision"],
            "settings": values,  # for reading only: a resume checks the copy inside data/ckpt-STEP
            "stages": manifest_lib.layout(self.stages),
            "checkpoints": checkpoints,
            "digests": digests,
            **to_json(losses),  # loss_first, loss_last
            "validation": validation or {},
        }

    def _discard(self, step: int) -> None:
        """Best effort: remove what a failed save of `step` wrote (the manifest never named it)."""
        for name in self.parts:
            for f in _files(self.directory(name), step) + [f"{PREFIX}-{step}_temp"]:
                full = os.path.join(self.directory(name), f)
                try:
                    shutil.rmtree(full) if os.path.isdir(full) else os.remove(full)
                except OSError:
                    pass

    def clean(self, m: dict[str, Any]) -> None:
        """Remove what the manifest does not name: older steps, half-written steps, `_temp` folders."""
        try:
            for name in sorted(set(self.parts) | set(manifest_lib.part_directories(self.run_dir))):
                directory = self.directory(name)  # another layout's stages too: a resume may have changed it
                _prune(directory, m["complete"])
                held = [n for n in m["complete"] if _files(directory, n)]
                if held:
                    _write_index(directory, held)
                elif name not in self.parts and os.path.isdir(directory):
                    shutil.rmtree(directory)  # a stage of an older layout whose steps are all gone
        except OSError as e:
            raise StorageError(f"cannot tidy the checkpoints of {self.run_dir}: {reason(e, file=True)}") from None

    # --- verifying -----------------------------------------------------------------------------

    def _read_identity(self, prefix: str) -> tuple[str, int]:
        reader = tf.train.load_checkpoint(prefix)
        return reader.get_tensor(IDENTITY_KEY).decode(), int(reader.get_tensor(STEP_KEY))

    def _holds(self, name: str, prefix: str, run_id: str | None, step: int) -> str | None:
        """What is wrong with `prefix` as part `name` of `run_id`'s step `step`, from the identity it holds."""
        rel = os.path.relpath(prefix, self.run_dir)
        try:
            identity, held_step = self._read_identity(prefix)
        except (tf.errors.OpError, ValueError, KeyError) as e:
            return f"{rel} cannot be read ({reason(e, file=True)})"
        their_run, _, their_part = identity.partition("/")
        if run_id is not None and their_run != run_id:
            return f"{rel} was written by another run (run {their_run[:8]}), not this one (run {run_id[:8]})"
        if their_part != name:
            return f"{rel} holds {their_part} of this run, not {name}"
        if held_step != step:
            return f"{rel} holds step {held_step}, not step {step}"
        return None

    def verify(self, m: dict[str, Any], step: int) -> str | None:
        """None when every file of `step` is what the manifest says was saved; else what is wrong, in one line."""
        digests = m.get("digests", {}).get(str(step))
        for name in self._names(m, step):
            prefix = os.path.join(self.directory(name), f"{PREFIX}-{step}")
            rel = os.path.relpath(prefix, self.run_dir)
            if not os.path.exists(f"{prefix}.index"):
                return f"{rel}.index is missing"
            if digests is None:  # a format-1 manifest: nothing recorded to compare with
                continue
            want = digests.get(name, {})
            for f in sorted(set(want) | set(_files(self.directory(name), step))):
                full = os.path.join(self.directory(name), f)
                if f not in want:
                    return f"{name}/{f} was not part of the saved step {step}"
                if not os.path.exists(full):
                    return f"{name}/{f} is missing"
                if _sha256(full) != want[f]:
                    held = self._holds(name, prefix, m.get("run"), step)  # another stage's, run's or step's?
                    if held and "cannot be read" not in held:
                        return held
                    return f"{name}/{f} is damaged: its contents differ from what was saved at step {step}"
            held = self._holds(name, prefix, m.get("run"), step)  # the files are as saved: but saved by whom?
            if held:
                return held
        return None

    # --- restoring -----------------------------------------------------------------------------

    def manifest(self) -> dict[str, Any]:
        """The run's manifest; a damaged one is rebuilt from the stage directories when they agree."""
        manifest_lib.require_some(self.run_dir)
        try:
            m = self.latest()
        except manifest_lib.ManifestDamaged as e:
            return self._rebuild(str(e))
        if m is None:  # stage directories without their manifest (require_some found their files)
            return self._rebuild(f"{manifest_lib.path(self.run_dir)} is missing")
        return m

    def recorded(self, step: int) -> Record | None:
        """The record of the checkpoint of `step` (verify it first); None when it predates records."""
        prefix = os.path.join(self.directory(DATA_DIR), f"{PREFIX}-{step}")
        try:
            reader = tf.train.load_checkpoint(prefix)
            if not reader.has_tensor(RECORD_KEY):
                return None
            return Record.from_json(reader.get_tensor(RECORD_KEY).decode())
        except (tf.errors.OpError, ValueError) as e:
            raise CheckpointError(
                f"{os.path.relpath(prefix, self.run_dir)} cannot be read: {reason(e, file=True)}"
            ) from None

    def restore(self, clean: bool = True, fallback: bool = False) -> dict[str, Any]:
        """Restore the newest complete checkpoint that verifies into the built stages and the data stream.

        Checks the manifest's layout against the built chain first: a model cut into other stages
        (another count or split) is restored by layer (`chain.state.by_layer`); any other
        difference is one line naming the stage and variable. Every file of the step is checked
        against its digest; a damaged or foreign newest step is refused, naming the file and the
        newest older step that verifies, unless `fallback` (then that step is restored and the
        newer ones are dropped). Each part is restored with `assert_consumed`, so nothing is ever
        restored partially. With `clean`, removes what the manifest does not name (steps of a save
        that was killed, `ckpt-N_temp` folders). Returns the manifest.
        """
        m = self.manifest()
        moved = self._moved(m)
        m, problem = self._newest_verified(m, fallback)
        moved = moved or set(self._names(m, m["step"])) != set(self.parts)
        m, record, notes, restart = self._checked(m)
        self.run_id = m.get("run") or self.run_id
        if moved:
            stages = {n: os.path.join(self.run_dir, f"{n}/{PREFIX}-{m['step']}") for n in self._names(m, m["step"])}
            self.regrouped = by_layer.restore({n: p for n, p in stages.items() if n != DATA_DIR}, self.stages)
            m = {**m, **to_json(regrouped_losses(from_json(LossHistory, m), self.regrouped, self.stages))}
        for name in [DATA_DIR] if moved else self.parts:
            self._restore_part(name, m, record, restart)
        tied_copies.take_from_first(self.stages)  # the copies a checkpoint leaves out: exactly the first's values
        notes += self._apply_learning_rates(m["step"], quiet=record is not None)
        notes += self._layouts(m, record) + self.regrouped.lines()
        for note in notes:
            log.info(note)
        if problem:
            manifest_lib.write(self.run_dir, m)  # the fallback is now the newest complete step
        if clean:
            self.clean(m)
        return m

    def _moved(self, m: dict[str, Any]) -> bool:
        """Whether the checkpoint's layout differs from the built chain's in a way a restore by layer
        bridges (a model cut into other stages, no heads); any other difference raises its one line."""
        built = manifest_lib.layout(self.stages)
        try:
            manifest_lib.check_layout(m["stages"], built)
        except ChainError:
            cut = all(s.whole is not None and s.head is None for s in self.stages)
            if cut and all(st.get("head") is None for st in m["stages"]):
                return True
            if self._regroupable(len(m["stages"])):
                return True
            raise
        return False

    def _regroupable(self, saved: int) -> bool:
        """Whether the built chain regroups the layers of `saved` stages into another count: the chain's own
        mlp/conv stages in a chain (mode=side_by_side's models are independent). With as many stages, the
        layout's own line names what differs."""
        from chain.strategies.objectives import objective

        bodies = all(isinstance(spec.model, (Mlp, Conv)) for spec in self.settings.stages)
        return saved != len(self.stages) and bodies and objective(self.settings.mode).chained

    def _names(self, m: dict[str, Any], step: int) -> list[str]:
        """The parts the checkpoint of `step` holds (its digests'; a format-1 manifest: the built chain's)."""
        digests = m.get("digests", {}).get(str(step))
        return sorted(digests) if digests else list(self.parts)

    def _newest_verified(self, m: dict[str, Any], fallback: bool) -> tuple[dict[str, Any], str | None]:
        """The manifest of the step to restore, and what is wrong with the newest step (None: it verifies)."""
        problem = self.verify(m, m["step"])
        if not problem:
            return m, None
        older = next((n for n in reversed(m["complete"][:-1]) if self.verify(m, n) is None), None)
        if older is None:
            raise CheckpointError(f"{problem}; no older complete checkpoint of {self.run_dir} verifies")
        if not fallback:
            raise CheckpointError(f"{problem}; step {older} verifies: resume from it with checkpoint.fallback=true")
        log.warning(
            "%s; resuming from step %d, the newest complete checkpoint that verifies (checkpoint.fallback=true)",
            problem,
            older,
        )
        complete = [n for n in m["complete"] if n <= older]
        m = {
            **m,
            "step": older,
            "complete": complete,
            "loss_last": None,
            "checkpoints": {name: f"{name}/{PREFIX}-{older}" for name in self._names(m, older)},
            "digests": {k: v for k, v in m.get("digests", {}).items() if int(k) in complete},
        }
        return m, problem

    def _checked(self, m: dict[str, Any]) -> tuple[dict[str, Any], Record | None, list[str], bool]:
        """The settings the verified step was written with (not the manifest's copy, which may be edited)
        checked against this run's: the manifest with the record's losses and evaluations, the record,
        the notes of what changes, and whether the stream restarts (its files changed, accepted)."""
        record = self.recorded(m["step"])
        if record is None:
            manifest_lib.check_stream(m, self.settings)
            return m, None, [], False
        cut = all(s.whole is not None for s in self.stages)
        notes = check_resume(record.settings, self.settings, m["step"], cut)
        changed = self._changed_files(record, m["step"])
        if changed:
            notes.append(changed)
        m = {
            **m,
            **to_json(record.losses),
            "validation": {**m.get("validation", {}), str(m["step"]): record.validation},
        }
        return m, record, notes, changed is not None

    def _restore_part(self, name: str, m: dict[str, Any], record: Record | None, restart: bool) -> None:
        """Restore part `name` of the step `m` names, all of it, and check the identity it holds."""
        where = f"{name}/{PREFIX}-{m['step']}"  # the files verify() checked; read() refuses a manifest naming others
        ckpt = self.unrecorded if name == DATA_DIR and record is None else self.parts[name]
        try:
            if name == DATA_DIR and restart:  # the stream restarts: its saved position is left unread
                self.restarted.restore(
                    os.path.join(self.run_dir, where)
                ).assert_existing_objects_matched().expect_partial()
            else:
                ckpt.restore(os.path.join(self.run_dir, where)).assert_consumed()
        except AssertionError as e:
            raise CheckpointError(f"{where} does not match the built chain ({name}): {reason(e, file=True)}") from None
        except (tf.errors.OpError, ValueError) as e:
            if name == DATA_DIR and "dataset definition has not changed" in str(e):
                # TensorFlow's own words name the stages of the stream, not why they differ
                raise CheckpointError(
                    f"{where} holds the position of another input stream than this run builds: the stream of "
                    "these data settings changed since the run was saved (another version of chain reads them "
                    "differently); resume with the version that started the run, or start a new run"
                ) from None
            raise CheckpointError(f"{where} cannot be restored: {reason(e, file=True)}") from None
        held = self.identities[name].numpy().decode()
        if held and held != f"{self.run_id}/{name}" or int(self.steps[name].numpy()) != m["step"]:
            raise CheckpointError(
                f"{where} holds {held or 'no identity'} at step {int(self.steps[name].numpy())}, "
                f"but {manifest_lib.FILENAME} says {self.run_id}/{name} at step {m['step']}"
            )

    def layout(self, step: int) -> Layout:
        """The built chain's layout, as from `step`."""
        return built_layout(self.settings, self.stages, step)

    def _layouts(self, m: dict[str, Any], record: Record | None) -> list[str]:
        """The run's layouts continued from the checkpoint's (`self.layouts`), and the line saying what
        moved when this run's layout is another (none when it is the same)."""
        if record is None:
            return []
        saved = record.layouts or (record.settings.layout(manifest_lib.split(m["stages"]), 0),)
        now = self.layout(m["step"])
        if saved[-1].same(now):
            self.layouts = saved
            return []
        self.layouts = (*saved, now)
        split = saved[-1].split != now.split
        return [f"resumed step {m['step']}: {saved[-1].describe(split)} -> {now.describe(split)}"]

    def _changed_files(self, record: Record, step: int) -> str | None:
        """None when the streamed files are those the checkpoint of `step` recorded (or either side
        has none to compare); the note of a resume that accepts changed ones
        (`checkpoint.accept_changed_files`); else a ConfigError naming the first change."""
        if record.files is None or self.files is None:
            return None
        found = identity.changes(record.files, self.files)
        if not found:
            return None
        if not self.settings.checkpoint.accept_changed_files:
            raise ConfigError(identity.refusal(found, step))
        return identity.accepted(found, step)

    def _apply_learning_rates(self, step: int, quiet: bool) -> list[str]:
        """Each stage's configured learning rate replaces the one its optimizer restored (a resume
        may lower it); without a settings record to name the change (`quiet` False), a note per
        stage that changed."""
        notes = []
        for s in self.stages:
            spec = self.settings.stages[s.index].optim
            if lr_schedules.scheduled(s.optimizer):  # made from the config's optim.lr; the restored step sets it
                continue
            variable = s.optimizer.learning_rate
            old = variable.numpy()
            if old != np.asarray(spec.lr, dtype=old.dtype):  # unchanged: untouched, bit for bit
                variable.assign(spec.lr)
                if not quiet:
                    notes.append(f"note: stages[{s.index}].optim.lr {float(old):g} -> {spec.lr:g} from step {step}")
        return notes

    def _rebuild(self, problem: str) -> dict[str, Any]:
        """A manifest from the stage directories: the newest step every part holds, of one run,
        that reads back whole. Written to disk; raises CheckpointError when they do not agree."""
        found = {
            name: {
                int(mt.group(1))
                for f in (os.listdir(self.directory(name)) if os.path.isdir(self.directory(name)) else [])
                if (mt := _NUMBERED.match(f)) and mt.group(2) == ".index"
            }
            for name in self.parts
        }
        shared = set.intersection(*found.values()) if found else set()
        good, run_id = [], None
        for step in sorted(shared, reverse=True):
            ids = set()
            for name in self.parts:
                prefix = os.path.join(self.directory(name), f"{PREFIX}-{step}")
                if self._holds(name, prefix, None, step) is not None or not self._reads_whole(prefix):
                    break
                ids.add(self._read_identity(prefix)[0].partition("/")[0])
            else:
                if len(ids) == 1 and (run_id is None or ids == {run_id}):
                    run_id = ids.pop()
                    good.append(step)
        if not good:
            held = "; ".join(f"{n}: {', '.join(map(str, sorted(v))) or 'none'}" for n, v in found.items())
            raise CheckpointError(
                f"{problem}, and the stage directories do not agree on a complete step that reads "
                f"back ({held}); restore {manifest_lib.FILENAME} from a copy or start a new run"
            )
        good.sort()
        complete = good[-self.keep :]
        step = complete[-1]
        checkpoints = {name: f"{name}/{PREFIX}-{step}" for name in self.parts}
        digests = {
            str(n): {
                name: {f: _sha256(os.path.join(self.directory(name), f)) for f in _files(self.directory(name), n)}
                for name in self.parts
            }
            for n in complete
        }
        self.run_id = run_id
        records = {n: self.recorded(n) for n in complete}
        newest = records[step]
        m = self._manifest(
            step,
            complete,
            checkpoints,
            digests,
            newest.losses if newest else LossHistory(None, None),
            newest and newest.settings,
            {str(n): r.validation for n, r in records.items() if r is not None},
        )
        manifest_lib.write(self.run_dir, m)
        log.warning("%s; rebuilt it from the stage directories: step %d of run %s", problem, step, run_id[:8])
        return m

    @staticmethod
    def _reads_whole(prefix: str) -> bool:
        """Every tensor of the checkpoint reads back (TensorFlow checks each one's checksum; the
        iterator's state is a variant NumPy cannot hold, so it is read when restored instead)."""
        try:
            reader = tf.train.load_checkpoint(prefix)
            for key, dtype in reader.get_variable_to_dtype_map().items():
                if dtype != tf.variant:
                    reader.get_tensor(key)
        except (tf.errors.OpError, ValueError):
            return False
        return True


def regrouped_losses(history: LossHistory, regrouped: by_layer.Regrouped, stages: Sequence[Stage]) -> LossHistory:
    """The loss records of a checkpoint restored into other stages: a kept head keeps its stage's loss, a
    new one has none; the chain's loss stays (the chain computes what it computed)."""

    def mapped(record: LossRecord | None) -> LossRecord | None:
        if record is None or not record.stage_losses:
            return record
        old = record.stage_losses
        kept = regrouped.kept
        losses = [old[kept[s.index]] if kept.get(s.index, len(old)) < len(old) else None for s in stages]
        return LossRecord(record.loss, losses, record.grad_norm)

    return LossHistory(mapped(history.loss_first), mapped(history.loss_last))
