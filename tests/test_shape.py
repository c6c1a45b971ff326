"""The pipeline's shape worked out once (issue 40, item 1): the preparation pass builds a run's
schedule once and keeps it on the `RunSpec`; the planning, the memory estimate and the strategy
read that one."""

from __future__ import annotations

import pytest

import chain
from chain.config.hydra import compose_config
from chain.schedule import schedules

SMALL = [
    "model.depth=1",
    "model.width=8",
    "data=synthetic",
    "data.features=6",
    "data.classes=4",
    "data.samples=256",
    "data.batch_size=16",
    "trainer.progress=false",
    "checkpoint.export=false",
    "mode=e2e",
]


@pytest.mark.parametrize(
    "overrides",
    [
        ["+stages=3", "pipeline.schedule=1f1b", "pipeline.microbatches=2"],
        [
            "+stages=4",
            "pipeline.schedule=interleaved",
            "pipeline.virtual_stages=2",
            "pipeline.microbatches=4",
            "placement.replicas=2",
        ],
    ],
)
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
    from chain.planning.planner import assign
    from chain.prepared import cut_batch

    line = (
        "data.batch_size=12 does not cut into 2 replicas' shares (placement.replicas) of pipeline.microbatches=4 "
        "equal microbatches: use a multiple of 8, e.g. data.batch_size=8"
    )
    ok = [*SMALL, "+stages=2", f"placement.replicas={replicas}", "pipeline.microbatches=4", "data.batch_size=16"]
    with pytest.raises(chain.ConfigError) as planned:
        cut_batch(12, assign(chain.compose(ok).placement, 2, Inventory.of(4, 80 * 1024)), microbatches=4)
    assert str(planned.value) == line
    if replicas == "2":
        with pytest.raises(chain.ConfigError) as given:
            chain.compose([*ok, "data.batch_size=12"])
        assert str(given.value) == line
    assert batch_cut(16, 2, 4) == BatchCut(replicas=2, microbatches=4, per_replica=8, per_microbatch=2)
    assert batch_cut(16, microbatches=4).per_replica == 16 and batch_cut(16, 2, mirrored=True).per_replica == 8


@pytest.mark.parametrize(
    "overrides, gpus, replicas, microbatches",
    [
        (["placement.replicas=auto", "pipeline.microbatches=4"], 4, 2, 4),  # the planner's 2 copies on 4 GPUs
        (
            ["placement.fallback=mirrored", "pipeline.microbatches=4"],
            0,
            2,
            1,
        ),  # 2 CPU replicas, each runs its share whole
        (["pipeline.microbatches=4"], 0, 1, 4),
    ],
)
def test_the_batch_cut_is_worked_out_once_for_the_replicas_planned(overrides, gpus, replicas, microbatches):
    """`RunSpec.batch_cut` is the cut for the replicas the planner made (`auto` is known only once
    planned): as many shares as the placement has copies or mirrored devices, and the microbatches a
    replica's step plays (none on a mirrored replica, which runs its share whole)."""
    from chain.config.checks import BatchCut
    from chain.planning.inventory import Inventory

    inventory = Inventory.of(gpus, 80 * 1024) if gpus else Inventory()
    spec = chain.prepared.prepare(compose_config([*SMALL, "+stages=2", *overrides]), inventory=inventory)
    planned = len(spec.assignment.copies) or len(spec.assignment.mirrored_devices) or 1
    assert planned == replicas
    assert spec.batch_cut == BatchCut(replicas, microbatches, 16 // replicas, 16 // replicas // microbatches)


def test_pipeline_schedule_is_a_schema_choice():
    """`pipeline.schedule` is checked by its schema field, before anything is prepared: the schema's
    one line, the allowed names from `chain.schedule.schedules`, and its guess."""
    from chain.config import compose

    with pytest.raises(chain.ConfigError) as e:
        compose([*SMALL, "+stages=2", "pipeline.schedule=1fb1"])
    assert str(e.value) == (
        f"pipeline.schedule='1fb1' is not known; allowed: {', '.join(schedules.CHOICES)}; "
        "did you mean pipeline.schedule=1f1b?"
    )


def test_a_step_refuses_a_cut_its_schedule_does_not_play():
    from chain.config.checks import batch_cut
    from chain.pipeline.play import StepOptions, playbook

    schedule = schedules.build("1f1b", 2, 4)
    with pytest.raises(ValueError, match="1f1b plays 4 microbatches, the batch is cut into 2"):
        playbook([None, None], schedule, None, None, StepOptions(), batch_cut(16, microbatches=2))
