"""The pipeline's shape worked out once (issue 40, item 1): the preparation pass builds a run's
schedule once and keeps it on the `RunSpec`; the planning, the memory estimate and the strategy
read that one."""

from __future__ import annotations

import pytest

import chain
from chain.config.hydra import compose_config
from chain.pipeline import schedules

SMALL = ["model.depth=1", "model.width=8", "data=synthetic", "data.features=6", "data.classes=4", "data.samples=256",
         "data.batch_size=16", "trainer.progress=false", "checkpoint.export=false", "mode=e2e"]


@pytest.mark.parametrize("overrides", [["+stages=3", "pipeline.schedule=1f1b", "pipeline.microbatches=2"],
                                       ["+stages=4", "pipeline.schedule=interleaved", "pipeline.virtual_stages=2",
                                        "pipeline.microbatches=4", "placement.replicas=2"]])
def test_a_build_builds_its_schedule_once(monkeypatch, overrides):
    built = []
    real = schedules.build

    def counted(*args, **kwargs):
        built.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(schedules, "build", counted)
    cfg = compose_config([*SMALL, *overrides])
    run = chain.build(cfg)  # checked, planned (its stages shared by interleaving), estimated, built
    assert len(built) == 1, built
    assert run.strategy.schedule.actions == real(*built[0]).actions
    spec = chain.prepared.prepare(cfg)
    assert chain.build(spec).strategy.schedule is spec.schedule  # the strategy runs the spec's, not a rebuilt one
