"""The pipeline's shape worked out once (issue 40, item 1): the preparation pass builds a run's
schedule once and keeps it on the `RunSpec`; the planning, the memory estimate and the strategy
read that one."""

from __future__ import annotations

import pytest

import chain
from chain.config.hydra import compose_config
from chain.schedule import schedules

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


@pytest.mark.parametrize("replicas", ["2", "auto"])
def test_the_batch_rule_is_one_line_whether_the_config_or_the_plan_finds_it(replicas):
    """`data.batch_size` cut into R shares of M microbatches: the config's check (R given) and the
    planner's (R planned: `auto` makes 2 copies of a 2-stage pipeline on 4 GPUs) give the same line."""
    from chain.config.checks import BatchCut, batch_cut
    from chain.planning.inventory import Inventory
    from chain.planning.planner import plan
    from chain.prepared import cut_batch

    line = ("data.batch_size=12 does not cut into 2 replicas' shares (placement.replicas) of pipeline.microbatches=4 "
            "equal microbatches: use a multiple of 8, e.g. data.batch_size=8")
    ok = [*SMALL, "+stages=2", f"placement.replicas={replicas}", "pipeline.microbatches=4", "data.batch_size=16"]
    with pytest.raises(chain.ConfigError) as planned:
        cut_batch(12, plan(chain.compose(ok).placement, 2, Inventory.of(4, 80 * 1024)), microbatches=4)
    assert str(planned.value) == line
    if replicas == "2":
        with pytest.raises(chain.ConfigError) as given:
            chain.compose([*ok, "data.batch_size=12"])
        assert str(given.value) == line
    assert batch_cut(16, 2, 4) == BatchCut(replicas=2, microbatches=4, per_replica=8, per_microbatch=2)
    assert batch_cut(16, microbatches=4).per_replica == 16 and batch_cut(16, 2, mirrored=True).per_replica == 8
