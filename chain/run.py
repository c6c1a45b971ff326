"""A run: the planned placement, the built stages, the data, and the training loop."""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any, Iterator

import numpy as np
from omegaconf import DictConfig

from chain import data as data_lib
from chain import memory, planner, schedules
from chain.config import settings as validate

log = logging.getLogger("chain")


class Run:
    """Everything one training run needs; `step` trains one batch, `fit` the whole run."""

    def __init__(self, settings: dict[str, Any], placement: planner.Placement, run_dir: str | None):
        import keras

        from chain.engine import make_step
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

    @property
    def e2e(self) -> bool:
        """The chain is one network with one loss (mode=e2e), trained by `self.schedule`."""
        return self.settings["mode"] == "e2e"

    def timeline(self) -> schedules.Timeline | None:
        """mode=e2e: the schedule played with unit-time actions (for its bubble and the plan)."""
        return schedules.simulate(self.schedule) if self.schedule else None

    @property
    def batch_size(self) -> int:
        return self.settings["data"]["batch_size"]

    def batches(self):
        """The shared `tf.data` pipeline of training batches."""
        d = self.settings["data"]
        return data_lib.pipeline(self.dataset, d["batch_size"], self.settings["seed"], d["shuffle"])

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
        """One optimizer step on one batch.

        Returns `loss` and `stage_losses`. mode=local: each stage's own loss, and their
        sum. mode=e2e: the chain's mean loss over the batch; `stage_losses` is empty,
        because no stage has a loss of its own.
        """
        import tensorflow as tf

        x = tf.convert_to_tensor(x)
        if self.e2e:
            from chain.pipeline import split_batch

            split_batch(int(x.shape[0]), self.schedule.microbatches)
            return {"loss": float(self._step(x, self._targets(y))["loss"]), "stage_losses": []}
        losses = self._step(x, self._targets(y))
        per_stage = [float(losses[f"stage_{s.index}"]) for s in self.stages]
        return {"loss": float(np.sum(per_stage)), "stage_losses": per_stage}

    # Hooks of `fit`; the mirrored run (chain.mirrored) distributes batches and steps.
    def _fit_batches(self) -> Iterator:
        return iter(self.batches())

    def _fit_step(self, batch: tuple) -> dict[str, Any]:
        return self.step(*batch)

    def _summary_extras(self) -> dict[str, Any]:
        return {}

    def _memory_devices(self) -> list[str]:
        return [s.device for s in self.stages]

    def fit(self) -> dict[str, Any]:
        """Train `trainer.steps` steps; write checkpoints, TensorBoard and summary.json.

        Returns the summary (also written to `summary.json` when the run has a directory).
        """
        from tqdm import tqdm

        from chain.checkpoints import Checkpoints
        from chain.logs import Writers

        t = self.settings["trainer"]
        writers = Writers(self.run_dir, len(self.stages)) if self.run_dir else None
        ckpts = Checkpoints(self.run_dir, self.stages, self.settings["checkpoint"]["keep"]) if self.run_dir else None
        every = self.settings["checkpoint"]["every"]
        iterator = self._fit_batches()
        first = last = None
        started = None
        memory.reset(self._memory_devices())
        bar = tqdm(range(1, t["steps"] + 1), desc="train", unit="step", disable=not t["progress"] or None, leave=False)
        for step in bar:
            out = self._fit_step(next(iterator))
            if step == 1:
                first = out
                started = time.perf_counter()  # speed excludes the first step, which traces
            last = out
            bar.set_postfix(loss=f"{out['loss']:.4f}")
            if writers and (step % t["log_every"] == 0 or step == 1 or step == t["steps"]):
                per_stage = [{"loss": v} for v in out["stage_losses"]] or [{} for _ in self.stages]
                writers.scalars(step, per_stage, {"loss": out["loss"]})
            if step % t["log_every"] == 0:
                log.info("step %d  loss %s", step, "  ".join(f"{v:.4f}" for v in out["stage_losses"] or [out["loss"]]))
            if ckpts and every and step % every == 0:
                ckpts.save(step)
        elapsed = time.perf_counter() - started
        timed_steps = t["steps"] - 1
        summary = {
            "mode": self.settings["mode"],
            "strategy": self.placement.strategy,
            "steps": t["steps"],
            "batch_size": self.batch_size,
            "seed": self.settings["seed"],
            "examples_per_second": (timed_steps * self.batch_size / elapsed) if timed_steps and elapsed > 0 else None,
            "loss_first": first["loss"],
            "loss_last": last["loss"],
            **self._pipeline_summary(),
            "peak_memory_scope": memory.scope(self._memory_devices()[0]),
            "stages": [self._stage_summary(s, first, last) for s in self.stages],
        }
        summary.update(self._summary_extras())
        if writers:
            writers.scalars(t["steps"], [{} for _ in self.stages], {"examples_per_second": summary["examples_per_second"] or 0.0})
            writers.close()
        if ckpts:
            ckpts.save(t["steps"])
        if self.run_dir:
            write_json(os.path.join(self.run_dir, "summary.json"), summary)
        return summary


    def _pipeline_summary(self) -> dict[str, Any]:
        """mode=e2e: the chain's loss and target, the schedule and its own bubble fraction."""
        if not self.e2e:
            return {}
        return {
            "loss_fn": self.settings["loss"],
            "target": self.stages[-1].target.name,
            "schedule": self.schedule.name,
            "microbatches": self.schedule.microbatches,
            "bubble_fraction": self.timeline().bubble_fraction,
        }

    def _stage_summary(self, s, first: dict, last: dict) -> dict[str, Any]:
        out = {
            "index": s.index,
            "device": s.device,
            "variable_devices": s.variable_devices(),
            "params": s.params,
            "peak_memory_bytes": memory.peak_bytes(s.device) if s.device else None,  # None: mirrored
        }
        if not self.e2e:  # only mode=local has a target and a loss per stage
            out.update(target=s.target.name, loss_first=first["stage_losses"][s.index],
                       loss_last=last["stage_losses"][s.index])
        return out


def write_json(path: str, obj: Any) -> None:
    """Write JSON atomically: a reader sees the old file or the whole new one."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)


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
