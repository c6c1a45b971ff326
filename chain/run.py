"""A run: the planned placement, the built stages, the data, and the training loop."""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import numpy as np
from omegaconf import DictConfig

from chain import data as data_lib
from chain import memory, planner, schedules
from chain.atomic import write_json
from chain.config import settings as validate
from chain.errors import ChainError

log = logging.getLogger("chain")


class Run:
    """Everything one training run needs; `step` trains one batch, `fit` the whole run.

    `global_step` counts the optimizer steps taken (restored from a checkpoint on
    resume); `fit` trains until it reaches `trainer.steps`.
    """

    def __init__(self, settings: dict[str, Any], placement: planner.Placement, run_dir: str | None):
        import keras

        from chain.engine import make_step
        from chain.numerics import Watch
        from chain.stages import build_stages

        self.settings = settings
        self.placement = placement
        self.run_dir = run_dir
        keras.utils.set_random_seed(settings["seed"])
        self.dataset = data_lib.load(settings["data"], settings["seed"])
        self.stages = build_stages(settings, placement.devices, self.dataset.input_shape, self.dataset.target)
        self.schedule: schedules.Schedule | None = None
        if self.e2e:
            p = settings["pipeline"]
            self.schedule = schedules.build(p["schedule"], len(self.stages), p["microbatches"])
        self._step = make_step(settings, self.stages, self.schedule)
        self.watch = Watch(self.stages)
        self.global_step = 0
        self._iterator = None
        self._checkpoints = {}

    @property
    def e2e(self) -> bool:
        """The chain is one network with one loss (mode=e2e), trained by `self.schedule`."""
        return self.settings["mode"] == "e2e"

    def timeline(self) -> schedules.Timeline | None:
        """mode=e2e: the schedule played with unit-time actions (for its bubble and the plan)."""
        return schedules.simulate(self.schedule) if self.schedule else None

    @property
    def batch_size(self) -> int:
        """`data.batch_size`: examples per chunk (per step without gradient accumulation)."""
        return self.settings["data"]["batch_size"]

    @property
    def grad_accum(self) -> int:
        """`trainer.grad_accum`: chunks of `batch_size` examples per optimizer step."""
        return self.settings["trainer"]["grad_accum"]

    @property
    def examples_per_step(self) -> int:
        """Examples behind one optimizer step: `grad_accum` x `batch_size`."""
        return self.grad_accum * self.batch_size

    def batches(self):
        """The shared `tf.data` pipeline of training batches, one per step (`examples_per_step` each)."""
        return data_lib.training_batches(self.dataset, self.settings)

    @property
    def iterator(self):
        """The run's iterator over `batches()`: the data stream that checkpoints save."""
        if self._iterator is None:
            self._iterator = iter(self.batches())
        return self._iterator

    def checkpoints(self, run_dir: str | None = None):
        """The `Checkpoints` of `run_dir` (default: this run's directory) for this chain."""
        from chain.checkpoints import Checkpoints

        run_dir = run_dir or self.run_dir
        if run_dir is None:
            raise ChainError("this run has no directory: build it with chain.build(cfg, run_dir=...) to checkpoint")
        if run_dir not in self._checkpoints:
            self._checkpoints[run_dir] = Checkpoints(run_dir, self.stages, self.iterator, self.settings)
        return self._checkpoints[run_dir]

    def restore(self, run_dir: str | None = None) -> dict[str, Any]:
        """Restore the newest complete checkpoint of `run_dir` (default: this run's); returns its manifest."""
        m = self.checkpoints(run_dir).restore()
        self.global_step = m["step"]
        self.watch.sync()
        return m

    def _targets(self, y: Any) -> dict:
        import tensorflow as tf

        if isinstance(y, dict):
            return {k: tf.convert_to_tensor(v) for k, v in y.items()}
        if self.e2e:  # one loss: a bare array is the chain's target
            return {self.stages[-1].target.name: tf.convert_to_tensor(y)}
        # A bare array is the data set's first target; every stage must learn that one.
        names = {s.target.name for s in self.stages}
        first = self.dataset.targets[0].name
        if names - {first}:
            raise ValueError(f"stages learn targets {sorted(names)}; pass y as a dict of them")
        return {first: tf.convert_to_tensor(y)}

    def step(self, x: Any, y: Any) -> dict[str, Any]:
        """One optimizer step on one batch (of `examples_per_step` examples, as `batches()` yields).

        With `trainer.grad_accum=N` the batch is cut into N equal chunks whose gradients
        are summed before the one update. Returns `loss`, `stage_losses` and `skipped`.
        mode=local: each stage's own loss, and their sum. mode=e2e: the chain's mean loss
        over the batch; `stage_losses` is empty, because no stage has a loss of its own.
        `skipped` lists the stages whose update the numerics guard dropped; under
        `trainer.on_nan=stop` a dropped update raises `NonFiniteError` naming the stages
        and the step instead (a float16 loss-scale overflow is neither: see `chain.loss_scale`).
        """
        import tensorflow as tf

        x = tf.convert_to_tensor(x)
        if self.e2e:
            from chain.pipeline import split_batch

            split_batch(int(x.shape[0]), self.schedule.microbatches, self.grad_accum)
        else:
            check_chunks(int(x.shape[0]), self.grad_accum)
        return self._finish_step(self._step(x, self._targets(y)))

    def _finish_step(self, losses: dict[str, Any]) -> dict[str, Any]:
        """Count the step, let the numerics guard judge it, and turn its losses into floats."""
        self.global_step += 1
        skipped = self.watch.after_step(self.global_step, self.settings["trainer"]["on_nan"])
        if self.e2e:
            return {"loss": float(losses["loss"]), "stage_losses": [], "skipped": skipped}
        per_stage = [float(losses[f"stage_{s.index}"]) for s in self.stages]
        return {"loss": float(np.sum(per_stage)), "stage_losses": per_stage, "skipped": skipped}

    def forward(self, x: Any) -> dict[str, Any]:
        """Inference outputs of every stage: `body_k` (stage k's model) and `head_k` (its head)."""
        from chain.engine import forward

        return forward(self.stages, x)

    def _start(self) -> tuple[Any, dict | None, dict | None]:
        """Checkpoints of this run and, on resume, the restored state: (checkpoints, loss_first, loss_last)."""
        if not self.run_dir:
            if self.settings["resume"]:
                raise ChainError("resume=true needs a run directory to resume from")
            return None, None, None
        ckpts = self.checkpoints()
        if self.settings["resume"]:
            m = self.restore()
            steps = self.settings["trainer"]["steps"]
            if m["step"] > steps:
                raise ChainError(f"the checkpoint is at step {m['step']}, past trainer.steps={steps}; "
                                 f"set trainer.steps to {m['step']} or more")
            log.info("resumed from step %d (%s)", m["step"], os.path.join(self.run_dir, "checkpoint.json"))
            return ckpts, m["loss_first"], m["loss_last"]
        existing = ckpts.latest()
        if existing is not None:
            raise ChainError(f"{self.run_dir} already holds a checkpoint at step {existing['step']}; "
                             "pass resume=true to continue it, or choose another hydra.run.dir")
        return ckpts, None, None

    # Hooks of `fit`'s summary; the mirrored run (chain.mirrored) measures replicas.
    def _summary_extras(self) -> dict[str, Any]:
        return {}

    def _memory_devices(self) -> list[str]:
        return [s.device for s in self.stages]

    def fit(self) -> dict[str, Any]:
        """Train until `trainer.steps`; write checkpoints, TensorBoard, exports and summary.json.

        With `resume=true` the run first restores the newest complete checkpoint of its
        directory. Returns the summary (also written to `summary.json` when the run has
        a directory).
        """
        from tqdm import tqdm
        from tqdm.contrib.logging import logging_redirect_tqdm

        from chain import testhooks
        from chain.logs import Writers
        from chain.numerics import NonFiniteError, finite_or_none

        t = self.settings["trainer"]
        ckpts, first, last = self._start()
        resumed_from = self.global_step if self.settings["resume"] else None
        every = self.settings["checkpoint"]["every"]
        saved_at = self.global_step if resumed_from is not None else None
        writers = Writers(self.run_dir, len(self.stages)) if self.run_dir else None
        started, timed_steps = None, 0
        memory.reset(self._memory_devices())
        bar = tqdm(range(self.global_step + 1, t["steps"] + 1), desc="train", unit="step",
                   disable=not t["progress"] or None, leave=False)
        try:
            # Log lines go through tqdm, so they do not break the progress bar.
            with logging_redirect_tqdm(loggers=[logging.getLogger()]):
                for step in bar:
                    try:
                        out = self.step(*next(self.iterator))
                    except NonFiniteError as e:
                        saved = ckpts.latest() if ckpts else None
                        detail = (f"; the last complete checkpoint (step {saved['step']}) is intact" if saved
                                  else "; no checkpoint had been saved")
                        raise NonFiniteError(e.stages, e.step, detail) from None
                    if started is None:
                        started = time.perf_counter()  # speed excludes this process's first step, which traces
                    else:
                        timed_steps += 1
                    record = {"loss": finite_or_none(out["loss"]),
                              "stage_losses": [finite_or_none(v) for v in out["stage_losses"]]}
                    if step == 1:
                        first = record
                    last = record
                    bar.set_postfix(loss=f"{out['loss']:.4f}")
                    if writers and (step % t["log_every"] == 0 or step == 1 or step == t["steps"]):
                        per_stage = [{"loss": v} for v in out["stage_losses"]] or [{} for _ in self.stages]
                        writers.scalars(step, per_stage, {"loss": out["loss"]})
                    if step % t["log_every"] == 0:
                        log.info("step %d  loss %s", step, "  ".join(f"{v:.4f}" for v in out["stage_losses"] or [out["loss"]]))
                    if ckpts and every and step % every == 0:
                        ckpts.save(step, first, last)
                        saved_at = step
                    testhooks.after_step(step)
            elapsed = time.perf_counter() - started if started is not None else 0.0
            summary = self._summary(first, last, resumed_from, timed_steps, elapsed)
            if writers:
                writers.scalars(t["steps"], [{} for _ in self.stages],
                                {"examples_per_second": summary["examples_per_second"] or 0.0})
        finally:
            if writers:
                writers.close()
        if ckpts and saved_at != t["steps"]:
            ckpts.save(t["steps"], first, last)
        if self.run_dir:
            if self.settings["checkpoint"]["export"]:
                from chain.export import export

                summary["exports"] = [os.path.basename(p) for p in export(self.stages, self.run_dir)]
            write_json(os.path.join(self.run_dir, "summary.json"), summary)
        return summary

    def _summary(self, first, last, resumed_from, timed_steps, elapsed) -> dict[str, Any]:
        skipped = [int(s.skipped.numpy()) for s in self.stages]
        none = {"loss": None, "stage_losses": [None] * len(self.stages)}
        first, last = first or none, last or none
        return {
            "mode": self.settings["mode"],
            "strategy": self.placement.strategy,
            "steps": self.settings["trainer"]["steps"],
            "resumed_from": resumed_from,
            "batch_size": self.batch_size,
            "grad_accum": self.grad_accum,
            "examples_per_step": self.examples_per_step,
            "precision": self.settings["precision"],
            "jit_compile": self.settings["trainer"]["jit_compile"],
            "seed": self.settings["seed"],
            # Every example of every chunk counts: a step is one optimizer update.
            "examples_per_second": (timed_steps * self.examples_per_step / elapsed) if timed_steps and elapsed > 0 else None,
            "loss_first": first["loss"],
            "loss_last": last["loss"],
            **self._pipeline_summary(),
            "skipped_steps": sum(skipped),
            "peak_memory_scope": memory.scope(self._memory_devices()[0]),
            "stages": [self._stage_summary(s, first, last, skipped[s.index]) for s in self.stages],
            **self._summary_extras(),
        }

    def _pipeline_summary(self) -> dict[str, Any]:
        """mode=e2e: the chain's loss and target, and (pipelined) the schedule and its own bubble fraction."""
        if not self.e2e:
            return {}
        out = {"loss_fn": self.settings["loss"], "target": self.stages[-1].target.name}
        if self.schedule is not None:  # a mirrored run has none
            out.update(schedule=self.schedule.name, microbatches=self.schedule.microbatches,
                       bubble_fraction=self.timeline().bubble_fraction)
        return out

    def _stage_summary(self, s, first: dict, last: dict, skipped: int) -> dict[str, Any]:
        out = {
            "index": s.index,
            "device": s.device,
            "variable_devices": s.variable_devices(),
            "params": s.params,
            "peak_memory_bytes": memory.peak_bytes(s.device) if s.device else None,  # None: mirrored
            "skipped_steps": skipped,
            # precision=mixed_float16: the stage's loss scale now, and steps skipped for overflow
            # (the same for every stage in mode=e2e, where the chain shares one scale).
            "loss_scale": float(s.loss_scale.scale.numpy()) if s.loss_scale is not None else None,
            "overflow_steps": int(s.loss_scale.overflows.numpy()) if s.loss_scale is not None else 0,
        }
        if not self.e2e:  # only mode=local has a target and a loss per stage
            out.update(target=s.target.name, loss_first=first["stage_losses"][s.index],
                       loss_last=last["stage_losses"][s.index])
        return out


def check_chunks(n: int, grad_accum: int) -> None:
    """Raise ValueError unless a batch of `n` examples cuts into `grad_accum` equal chunks."""
    if n % grad_accum:
        raise ValueError(f"a batch of {n} examples does not cut into trainer.grad_accum={grad_accum} equal chunks")


def plan(cfg: DictConfig | dict) -> tuple[dict[str, Any], planner.Placement]:
    """Validate the config and plan devices; configures logical devices (before the runtime starts)."""
    s = validate(cfg)
    placement = planner.plan(s["placement"], len(s["stages"]), planner.discover())
    planner.check_batch(s["data"]["batch_size"], placement)
    planner.configure(placement, s["placement"])
    if placement.strategy == planner.MIRRORED:
        placement.replicas = planner.check_devices(placement.replicas, given=False, role="replica")
    else:
        given = s["placement"]["devices"]  # checked as the user wrote them, so errors quote them
        placement.devices = planner.check_devices(given or placement.devices, given=bool(given))
    return s, placement


def build(cfg: DictConfig | dict, run_dir: str | None = None) -> Run:
    """Validate, plan and build a run (see `chain.build`): pipelined, or mirrored (`chain.mirrored`)."""
    s, placement = plan(cfg)
    if placement.strategy == planner.MIRRORED:
        from chain.mirrored import MirroredRun

        return MirroredRun(s, placement, run_dir)
    return Run(s, placement, run_dir)
