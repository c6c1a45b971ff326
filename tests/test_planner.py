"""The planner, for machines we do not have: pure functions of an inventory, no TensorFlow runtime.

`pcfg(...)` composes the real packaged config with command-line overrides, so these
tests also check that every key is spelled as a user would spell it.
"""

import os
import re

import pytest

import chain
from chain.errors import ConfigError, DeviceError
from chain.planning.inventory import Card, Gpu, Inventory, inventory, parse_smi, visible_cards
from chain.planning.planner import MIRRORED, PIPELINE, assign
from chain.prepared.preparation import cut_batch

GB = 1024  # MB


def pcfg(*overrides: str):
    """The validated `placement` section for these overrides."""
    return chain.compose(list(overrides)).placement


def gpu_devices(n):
    return tuple(f"/device:GPU:{k}" for k in range(n))


def assert_limits_fit(p, inv, reserve=None):
    """Every split card has one limit per logical GPU, adding up to no more than the card."""
    memory = {g.index: g.memory_mb for g in inv.gpus}
    assert set(p.split) == set(p.memory_limits_mb)
    for index, n in p.split.items():
        limits = p.memory_limits_mb[index]
        assert len(limits) == n and all(m >= 1 for m in limits)
        if memory[index] is not None:
            assert sum(limits) <= memory[index] - (reserve or 0)


# --- G >= K: one GPU per stage ---------------------------------------------------------


def test_eight_80gb_gpus_eight_stages_one_card_each_no_split():
    inv = Inventory.of(8, 80 * GB)
    p = assign(pcfg(), 8, inv)
    assert p.topology == PIPELINE and p.kind == "GPU"
    assert p.devices == gpu_devices(8)
    assert p.split == {} and p.memory_limits_mb == {} and p.visible is None
    assert [p.physical[d] for d in p.devices] == [f"GPU:{k}" for k in range(8)]


def test_eight_80gb_gpus_three_stages_uses_three_and_hides_the_rest():
    inv = Inventory.of(8, 80 * GB)
    p = assign(pcfg(), 3, inv)
    assert p.devices == gpu_devices(3) and p.split == {}
    assert p.visible == (0, 1, 2)  # TensorFlow would otherwise reserve memory on all eight
    assert any("GPU 3, 4, 5, 6, 7 unused" in n for n in p.notes)


def test_one_number_limits_every_card_even_without_a_split():
    inv = Inventory.of(8, 80 * GB)
    p = assign(pcfg("placement.memory_limit_mb=40000"), 8, inv)
    assert p.split == {k: 1 for k in range(8)}
    assert p.memory_limits_mb == {k: [40000] for k in range(8)}
    assert not p.memory_growth


def test_memory_growth_applies_when_no_card_has_a_limit():
    p = assign(pcfg("placement.memory_growth=true"), 8, Inventory.of(8, 80 * GB))
    assert p.memory_growth and p.split == {}


# --- 0 < G < K: virtual split --------------------------------------------------------------


def test_one_24gb_gpu_three_stages_three_logical_gpus_sharing_the_card():
    inv = Inventory.of(1, 24 * GB)
    cfg = pcfg()
    p = assign(cfg, 3, inv)
    assert p.devices == gpu_devices(3)
    assert p.split == {0: 3}
    limits = p.memory_limits_mb[0]
    assert len(set(limits)) == 1  # an even share
    free = 24 * GB - cfg.reserve_mb
    assert free - 3 < sum(limits) <= free  # all of it but the reserve (and rounding)
    assert {p.physical[d] for d in p.devices} == {"GPU:0"}
    assert_limits_fit(p, inv, cfg.reserve_mb)


def test_reserve_changes_the_share():
    inv = Inventory.of(1, 24 * GB)
    small = assign(pcfg("placement.reserve_mb=0"), 3, inv).memory_limits_mb[0]
    large = assign(pcfg("placement.reserve_mb=3000"), 3, inv).memory_limits_mb[0]
    assert small[0] - large[0] == 1000


@pytest.mark.parametrize("given, expected", [("[4000,8000,2000]", [4000, 8000, 2000]), ("6000", [6000] * 3)])
def test_given_limits_per_stage_or_one_number(given, expected):
    p = assign(pcfg("+stages=3", f"placement.memory_limit_mb={given}"), 3, Inventory.of(1, 24 * GB))
    assert p.memory_limits_mb == {0: expected}


def test_memory_growth_is_not_applied_to_a_split_card_and_says_so():
    p = assign(pcfg("placement.memory_growth=true"), 3, Inventory.of(1, 24 * GB))
    assert not p.memory_growth
    assert any("memory_growth not applied" in n for n in p.notes)


def test_two_gpus_five_stages_neighbours_share_a_card():
    inv = Inventory.of(2, 16 * GB)
    p = assign(pcfg(), 5, inv)
    assert p.devices == gpu_devices(5)
    assert p.split == {0: 3, 1: 2}
    cards = [p.physical[d] for d in p.devices]
    assert cards == ["GPU:0"] * 3 + ["GPU:1"] * 2
    assert_limits_fit(p, inv, pcfg().reserve_mb)
    assert p.memory_limits_mb[0][0] < p.memory_limits_mb[1][0]  # three share card 0, two card 1


@pytest.mark.parametrize("n_gpus", range(1, 8))
def test_every_split_is_even_contiguous_and_uses_every_card(n_gpus):
    for n_stages in range(n_gpus + 1, 13):
        p = assign(pcfg(), n_stages, Inventory.of(n_gpus, 40 * GB))
        counts = [p.split.get(i, 1) for i in range(n_gpus)]  # absent: TensorFlow's one logical GPU
        assert sum(counts) == n_stages and max(counts) - min(counts) <= 1 and min(counts) >= 1
        owner = [int(p.physical[d].split(":")[1]) for d in p.devices]
        assert owner == sorted(owner)  # neighbouring stages on the same card
        assert len(set(p.devices)) == n_stages


def test_split_card_of_unknown_memory_needs_a_limit():
    inv = Inventory.of(1, None)
    with pytest.raises(DeviceError, match=r"placement.memory_limit_mb: GPU 0 is split into 3 logical GPUs"):
        assign(pcfg(), 3, inv)
    p = assign(pcfg("placement.memory_limit_mb=5000"), 3, inv)
    assert p.memory_limits_mb == {0: [5000] * 3}


def test_unsplit_card_of_unknown_memory_gets_no_limit():
    p = assign(pcfg(), 2, Inventory.of(2, None))
    assert p.split == {} and p.memory_limits_mb == {}


def test_fallback_error_refuses_too_few_cards():
    with pytest.raises(DeviceError, match=r"placement.fallback=error: 3 stages need 3 GPUs, 1 visible"):
        assign(pcfg("placement.fallback=error"), 3, Inventory.of(1, 24 * GB))
    assert assign(pcfg("placement.fallback=error"), 2, Inventory.of(2, 24 * GB)).devices == gpu_devices(2)


# --- G = 0 ---------------------------------------------------------------------------------


def test_no_gpu_splits_the_cpu_one_logical_device_per_stage():
    p = assign(pcfg(), 3, Inventory())
    assert p.kind == "CPU" and p.split == {0: 3} and p.memory_limits_mb == {}
    assert p.devices == tuple(f"/device:CPU:{k}" for k in range(3))
    assert {p.physical[d] for d in p.devices} == {"CPU:0"}


def test_no_gpu_fallback_error_refuses():
    with pytest.raises(DeviceError, match=r"placement.fallback=error: 2 stages need 2 GPUs, 0 visible"):
        assign(pcfg("placement.fallback=error"), 2, Inventory())


# --- mirrored ------------------------------------------------------------------------------


def test_mirrored_without_gpu_two_cpu_replicas_by_default():
    p = assign(pcfg("placement.fallback=mirrored"), 3, Inventory())
    assert p.topology == MIRRORED and p.kind == "CPU"
    assert p.mirrored_devices == ("/device:CPU:0", "/device:CPU:1") and p.split == {0: 2}
    assert p.devices == (None,) * 3


def test_mirrored_replica_count_from_the_command_line():
    p = assign(pcfg("placement.fallback=mirrored", "placement.replicas=3", "data.batch_size=63"), 5, Inventory())
    assert p.mirrored_devices == tuple(f"/device:CPU:{i}" for i in range(3)) and p.split == {0: 3}


def test_mirrored_on_two_gpus_uses_both_cards_whole():
    p = assign(pcfg("placement.fallback=mirrored"), 5, Inventory.of(2, 16 * GB))
    assert p.topology == MIRRORED and p.mirrored_devices == gpu_devices(2)
    assert p.split == {} and p.visible is None
    p = assign(
        pcfg("placement.fallback=mirrored", "placement.replicas=1", "placement.memory_limit_mb=9000"),
        5,
        Inventory.of(2, 16 * GB),
    )
    assert p.mirrored_devices == gpu_devices(1) and p.visible == (0,) and p.memory_limits_mb == {0: [9000]}


def test_mirrored_is_not_used_when_there_are_enough_cards():
    p = assign(pcfg("placement.fallback=mirrored"), 2, Inventory.of(2, 16 * GB))
    assert p.topology == PIPELINE and p.devices == gpu_devices(2)


def test_mirrored_global_batch_is_split_over_replicas():
    p = assign(pcfg("placement.fallback=mirrored", "placement.replicas=4"), 3, Inventory())
    assert cut_batch(64, p).per_replica == 16
    assert cut_batch(63, assign(pcfg(), 3, Inventory())).per_replica == 63  # pipelined: no split


# --- explicit devices ----------------------------------------------------------------------


def test_explicit_devices_without_gpu_are_canonical():
    p = assign(pcfg("+stages=3", "placement.devices=[/cpu:0,CPU:0,/CPU:1]"), 3, Inventory())
    assert p.devices == ("/device:CPU:0", "/device:CPU:0", "/device:CPU:1")


def test_explicit_devices_within_the_cards_need_no_split():
    p = assign(pcfg("+stages=3", "placement.devices=[/GPU:0,/GPU:0,/GPU:1]"), 3, Inventory.of(2, 16 * GB))
    assert p.split == {} and p.devices == ("/device:GPU:0", "/device:GPU:0", "/device:GPU:1")


def test_explicit_devices_beyond_the_cards_split_each_card_evenly():
    inv = Inventory.of(2, 16 * GB)
    p = assign(pcfg("+stages=3", "placement.devices=[/GPU:0,/GPU:3,/GPU:1]"), 3, inv)
    assert p.split == {0: 2, 1: 2}  # GPU:0-1 on card 0, GPU:2-3 on card 1
    assert [p.physical[d] for d in p.devices] == ["GPU:0", "GPU:1", "GPU:0"]
    assert_limits_fit(p, inv)


def test_explicit_devices_per_stage_limits_go_to_each_stages_device():
    inv = Inventory.of(2, 16 * GB)
    p = assign(
        pcfg("+stages=3", "placement.devices=[/GPU:0,/GPU:3,/GPU:1]", "placement.memory_limit_mb=[1000,2000,3000]"),
        3,
        inv,
    )
    assert p.memory_limits_mb[0] == [1000, 3000]
    assert p.memory_limits_mb[1][1] == 2000
    assert p.memory_limits_mb[1][0] > 2000  # GPU:2, used by no stage, gets what is left


def test_explicit_devices_and_mirrored_exclude_each_other():
    with pytest.raises(ConfigError, match=r"placement.devices .* placement.fallback=mirrored"):
        assign(pcfg("placement.devices=[/CPU:0,/CPU:1]", "placement.fallback=mirrored"), 2, Inventory())


def test_stages_sharing_a_device_must_agree_on_its_limit():
    with pytest.raises(ConfigError, match=r"stages 0 and 1 share /device:GPU:0 but ask for 1000 and 2000 MB"):
        assign(
            pcfg("+stages=3", "placement.devices=[/GPU:0,/GPU:0,/GPU:1]", "placement.memory_limit_mb=[1000,2000,3000]"),
            3,
            Inventory.of(2, 16 * GB),
        )


# --- visible and CUDA_VISIBLE_DEVICES -------------------------------------------------------


def test_visible_picks_cards_in_tensorflows_order():
    p = assign(pcfg("placement.visible=[3,1]"), 2, Inventory.of(4, 16 * GB))
    assert p.devices == gpu_devices(2)
    assert [p.physical[d] for d in p.devices] == ["GPU:1", "GPU:3"]  # TensorFlow numbers visible cards in order
    assert p.visible == (1, 3)


def test_visible_one_card_split_for_three_stages():
    p = assign(pcfg("placement.visible=[2]"), 3, Inventory.of(4, 16 * GB))
    assert p.split == {2: 3} and {p.physical[d] for d in p.devices} == {"GPU:2"}
    assert p.visible == (2,)


SMI = """0, GPU-aaaa1111, NVIDIA A100-SXM4-80GB, 81920
1, GPU-bbbb2222, NVIDIA A100-SXM4-80GB, 81920
2, GPU-cccc3333, NVIDIA A100-SXM4-80GB, 81920
3, GPU-dddd4444, NVIDIA A100-SXM4-80GB, 81920
"""


def test_cuda_visible_devices_renumbering_shows_the_card_behind_each_gpu():
    inv = inventory(2, parse_smi(SMI), "3,1")
    assert [g.card for g in inv.gpus] == ["3", "1"] and inv.gpus[0].memory_mb == 81920
    p = assign(pcfg(), 3, inv)
    assert [p.physical[d] for d in p.devices] == ["GPU:0 (card 3)", "GPU:0 (card 3)", "GPU:1 (card 1)"]
    assert "CUDA_VISIBLE_DEVICES=3,1: GPU:0 is card 3, GPU:1 is card 1" in p.notes


def test_memory_follows_cuda_visible_devices_to_the_right_card():
    smi = "0, GPU-a, NVIDIA T4, 15360\n1, GPU-b, NVIDIA L4, 23034\n"
    inv = inventory(2, parse_smi(smi), "1,0", device_order="PCI_BUS_ID")
    assert [g.memory_mb for g in inv.gpus] == [23034, 15360]
    unsure = inventory(2, parse_smi(smi), "1,0")  # mixed cards, CUDA's default fastest-first order
    assert all(g.memory_mb is None for g in unsure.gpus) and "CUDA_DEVICE_ORDER" in unsure.notes[0]


@pytest.mark.parametrize(
    "cvd, expected",
    [
        (None, [0, 1, 2, 3]),
        ("2", [2]),
        ("3,0", [3, 0]),
        ("GPU-cccc", [2]),
        ("1,7,2", [1]),
        ("", []),
        ("-1", []),
    ],
)
def test_cuda_visible_devices_follows_cudas_rules(cvd, expected):
    assert [c.index for c in visible_cards(parse_smi(SMI), cvd)] == expected


def test_memory_unknown_without_nvidia_smi_or_when_counts_disagree():
    no_smi = inventory(2, None, "5,6")
    assert [g.memory_mb for g in no_smi.gpus] == [None, None] and [g.card for g in no_smi.gpus] == ["5", "6"]
    assert "nvidia-smi not found" in no_smi.notes[0]
    disagree = inventory(3, parse_smi(SMI), "0,1")
    assert all(g.memory_mb is None for g in disagree.gpus) and "TensorFlow sees 3" in disagree.notes[0]
    cpu_build = inventory(0, parse_smi(SMI))
    assert cpu_build.gpus == () and "TensorFlow sees none" in cpu_build.notes[0]
    assert parse_smi("0, GPU-x, Some GPU, [N/A]\n") == [Card(0, "GPU-x", "Some GPU", None)]


# --- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides, n_stages, inv, error, message",
    [
        (
            ["placement.memory_limit_mb=[1000,2000]"],
            3,
            Inventory.of(1, 24 * GB),
            ConfigError,
            "placement.memory_limit_mb has 2 entries, but there are 3 stages",
        ),
        (
            ["placement.memory_limit_mb=[1000,2000]"],
            3,
            Inventory(),
            ConfigError,
            "placement.memory_limit_mb has 2 entries, but there are 3 stages",
        ),
        (
            ["+stages=3", "placement.memory_limit_mb=[10000,10000,5000]"],
            3,
            Inventory.of(1, 24 * GB),
            DeviceError,
            "placement.memory_limit_mb: limits on GPU 0 add up to 25000 MB, more than its 24576 MB",
        ),
        (
            ["placement.memory_limit_mb=9000"],
            5,
            Inventory.of(2, 16 * GB),
            DeviceError,
            "placement.memory_limit_mb: limits on GPU 0 add up to 27000 MB, more than its 16384 MB",
        ),
        (
            ["placement.visible=[0,4]"],
            3,
            Inventory.of(4, 16 * GB),
            DeviceError,
            "placement.visible[1]=4: no such GPU; TensorFlow sees GPUs 0, 1, 2, 3",
        ),
        (
            ["placement.visible=[0]"],
            3,
            Inventory(),
            DeviceError,
            "placement.visible[0]=0: no such GPU; TensorFlow sees no GPU",
        ),
        (
            ["placement.visible=[1,1]"],
            3,
            Inventory.of(4, 16 * GB),
            ConfigError,
            "placement.visible[1]=1 is listed twice",
        ),
        (
            ["placement.reserve_mb=30000"],
            3,
            Inventory.of(1, 24 * GB),
            DeviceError,
            "placement.reserve_mb=30000 leaves no memory",
        ),
        (
            ["placement.fallback=mirrored", "placement.replicas=3", "data.batch_size=63"],
            5,
            Inventory.of(2, 16 * GB),
            DeviceError,
            "placement.replicas=3: only 2 GPU(s) visible",
        ),
        (
            ["+stages=3", "placement.fallback=mirrored", "placement.memory_limit_mb=[1,2,3]"],
            3,
            Inventory.of(1, 16 * GB),
            ConfigError,
            "placement.memory_limit_mb: a list gives one limit per stage",
        ),
    ],
)
def test_bad_input_names_the_key(overrides, n_stages, inv, error, message):
    with pytest.raises(error) as e:
        assign(pcfg(*overrides), n_stages, inv)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_visible_error_mentions_cuda_visible_devices():
    inv = inventory(2, parse_smi(SMI), "3,1")
    with pytest.raises(DeviceError, match=r"placement.visible\[0\]=2: .* \(after CUDA_VISIBLE_DEVICES=3,1\)"):
        assign(pcfg("placement.visible=[2]"), 2, inv)


def test_mirrored_batch_that_does_not_divide_names_both_keys():
    p = assign(pcfg("placement.fallback=mirrored", "placement.replicas=3", "data.batch_size=63"), 3, Inventory())
    with pytest.raises(ConfigError, match=r"data.batch_size=64 does not divide over 3 replicas \(placement.replicas\)"):
        cut_batch(64, p)


def test_gpu_dataclass_defaults_unknown_memory():
    assert Gpu(0).memory_mb is None and Inventory.of(2).gpus == (Gpu(0), Gpu(1))


# --- configure: what the plan asks of TensorFlow (recorded, since this machine has no GPU) ----


class FakeConfig:
    """Records the tf.config calls `configure` makes for a machine with `n` GPUs."""

    def __init__(self, monkeypatch, n):
        import tensorflow as tf

        self.gpus = [tf.config.PhysicalDevice(f"/physical_device:GPU:{i}", "GPU") for i in range(n)]
        self.visible, self.logical, self.growth = None, {}, []
        monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind=None: self.gpus if kind == "GPU" else [])
        monkeypatch.setattr(tf.config, "set_visible_devices", lambda devs, kind=None: setattr(self, "visible", devs))
        monkeypatch.setattr(
            tf.config,
            "set_logical_device_configuration",
            lambda dev, cfgs: self.logical.__setitem__(dev.name, [c.memory_limit for c in cfgs]),
        )
        monkeypatch.setattr(
            tf.config.experimental, "set_memory_growth", lambda dev, on: self.growth.append((dev.name, on))
        )


def test_configure_applies_visible_cards_and_limits(monkeypatch):
    from chain.planning.devices import configure

    fake = FakeConfig(monkeypatch, 4)
    cfg = pcfg("+stages=3", "placement.visible=[1,3]", "placement.memory_limit_mb=[1000,2000,3000]")
    assert configure(assign(cfg, 3, Inventory.of(4, 16 * GB)), cfg) == (True, None)
    assert [d.name for d in fake.visible] == ["/physical_device:GPU:1", "/physical_device:GPU:3"]
    # Stages 0-1 share card 1; stage 2 has card 3 to itself, limited as asked.
    assert fake.logical == {"/physical_device:GPU:1": [1000, 2000], "/physical_device:GPU:3": [3000]}
    assert fake.growth == []


def test_configure_sets_growth_on_every_visible_gpu_only(monkeypatch):
    from chain.planning.devices import configure

    fake = FakeConfig(monkeypatch, 8)
    cfg = pcfg("placement.memory_growth=true")
    configure(assign(cfg, 3, Inventory.of(8, 80 * GB)), cfg)
    assert [d.name for d in fake.visible] == [f"/physical_device:GPU:{i}" for i in range(3)]
    assert fake.growth == [(f"/physical_device:GPU:{i}", True) for i in range(3)] and fake.logical == {}


def test_discover_reads_a_real_nvidia_smi_process(tmp_path, monkeypatch):
    """nvidia-smi on PATH (a stand-in script) is queried; TensorFlow here sees no GPU, and the note says so."""
    from chain.planning.inventory import discover, query_smi

    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\ncat <<'END'\n" + SMI + "END\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    assert [c.index for c in query_smi()] == [0, 1, 2, 3]
    inv = discover()
    assert inv.gpus == () and inv.cuda_visible_devices == "2,0"
    assert "nvidia-smi shows 2 GPU(s) but TensorFlow sees none" in inv.notes[0]
    smi.write_text("#!/bin/sh\nexit 9\n")
    assert query_smi() is None


def test_mig_instances_leave_memory_unknown():
    inv = inventory(1, parse_smi(SMI), "MIG-0123abcd")
    assert inv.gpus[0].memory_mb is None and "MIG" in inv.notes[0]


# --- copies of the pipeline: placement.replicas without the mirrored fallback ----------------


def test_replicas_auto_fills_the_gpus_with_copies_of_the_pipeline():
    from chain.planning.planner import REPLICATED

    p = assign(pcfg("mode=e2e", "placement.replicas=auto"), 2, Inventory.of(8, 80 * GB))
    assert p.topology == REPLICATED and p.devices == gpu_devices(2)
    assert p.copies == tuple(gpu_devices(8)[r * 2 : r * 2 + 2] for r in range(4))
    assert p.notes[0].startswith("topology: pipeline x replicas, 4 copies of the 2-stage pipeline")
    assert cut_batch(64, p, microbatches=4).per_replica == 16
    with pytest.raises(ConfigError, match="does not cut into 4 replicas' shares"):
        cut_batch(24, p, microbatches=4)
    one = assign(pcfg("mode=e2e", "placement.replicas=auto"), 2, Inventory.of(3, 80 * GB))
    assert (
        one.topology == PIPELINE
        and one.copies == ()
        and one.notes[0].startswith("topology: pipeline (a device per stage")
    )
    # A 16-bit exchange asked for where `auto` finds room for one copy only: said, not silently dropped.
    rounded = assign(
        pcfg("mode=e2e", "placement.replicas=auto", "placement.exchange_dtype=bfloat16"), 2, Inventory.of(3, 80 * GB)
    )
    assert "placement.exchange_dtype=bfloat16 unused: no copies exchange gradients" in rounded.notes[0]


def test_copies_split_fewer_gpus_or_refuse_with_fallback_error():
    p = assign(pcfg("mode=e2e", "data.batch_size=48", "placement.replicas=3"), 2, Inventory.of(2, 60 * GB))
    assert p.copies == tuple(gpu_devices(6)[r * 2 : r * 2 + 2] for r in range(3)) and p.split == {0: 3, 1: 3}
    with pytest.raises(DeviceError, match="placement.replicas=3: 3 copies of 2 stages need 6 GPUs, 2 visible"):
        assign(
            pcfg("mode=e2e", "data.batch_size=48", "placement.replicas=3", "placement.fallback=error"),
            2,
            Inventory.of(2, 60 * GB),
        )
    cpu = assign(pcfg("mode=e2e", "placement.replicas=2"), 3, Inventory())
    assert cpu.copies == tuple(
        tuple(f"/device:CPU:{k}" for k in range(r * 3, r * 3 + 3)) for r in range(2)
    ) and cpu.split == {0: 6}
    mirrored = assign(pcfg("placement.replicas=2", "placement.fallback=mirrored"), 3, Inventory.of(2))
    assert mirrored.topology == MIRRORED and mirrored.notes[0].startswith("topology: mirrored")


# --- issue 21: the memory estimate, a plan that says whether it fits ----------------------

from chain.schedule import schedules  # noqa: E402
from chain.planning import balance, footprint  # noqa: E402
from chain.prepared import prepare  # noqa: E402

WIDE = [
    "+stages=2",
    "mode=e2e",
    "pipeline.schedule=gpipe",
    "pipeline.microbatches=2",
    "model=mlp",
    "model.width=2048",
    "model.depth=4",
    "optim=sgd",
    "data=synthetic",
    "data.features=64",
    "data.samples=4096",
    "data.batch_size=2048",
    "data.val_fraction=0",
]


def test_a_plan_over_a_logical_gpus_limit_is_refused_before_training():
    """Two logical GPUs of 170 and 300 MiB on a synthetic 16 GB card: stage 0 (about 195 MB with GPipe's two
    microbatches held) is over its 170 MiB; the line names it, its device and limit, and the change that fits."""
    inv = Inventory.of(1, 16 * GB)
    with pytest.raises(DeviceError) as e:
        prepare(chain.compose([*WIDE, "placement.memory_limit_mb=[170,300]"]), inv)
    line = str(e.value)
    assert "\n" not in line
    assert re.match(
        r"stage 0 needs about [\d.]+ MB on /device:GPU:0 \(weights .*activations .* \(2 microbatches "
        r"held\).*\), more than its 178 MB \(its memory limit, 170 MiB",
        line,
    ), line
    assert "it would fit with pipeline.recompute=always (about" in line and "pipeline.microbatches=4" not in line, line
    fits = prepare(chain.compose([*WIDE, "placement.memory_limit_mb=[170,300]", "pipeline.recompute=always"]), inv)
    assert (
        fits.assignment.footprints[0].total
        <= 170 << 20
        < prepare(chain.compose(WIDE), inv).assignment.footprints[0].total
    )
    whole = prepare(chain.compose(WIDE), Inventory.of(2, 16 * GB))  # a card each: the same chain fits
    assert [f.held for f in whole.assignment.footprints] == [2, 2]


def test_the_estimate_counts_what_the_schedule_holds_and_the_optimizer():
    gpipe = prepare(chain.compose([*WIDE, "pipeline.microbatches=4"]), Inventory.of(2, 16 * GB)).assignment.footprints
    one = prepare(
        chain.compose([*WIDE, "pipeline.microbatches=4", "pipeline.schedule=1f1b"]), Inventory.of(2, 16 * GB)
    ).assignment.footprints
    adam = prepare(chain.compose([*WIDE, "optim=adam"]), Inventory.of(2, 16 * GB)).assignment.footprints
    assert [f.held for f in gpipe] == [4, 4] and [f.held for f in one] == [2, 1]
    assert one[0].activations < gpipe[0].activations and one[0].weights == gpipe[0].weights
    params = 64 * 2048 + 2048 + 3 * (2048 * 2048 + 2048)  # stage 0's Dense layers
    assert gpipe[0].weights == 4 * params and gpipe[0].optimizer == 0 and adam[0].optimizer == 2 * 4 * params
    micro = 2048 // 4
    assert gpipe[0].activations == 4 * (4 * 2048 * micro * 4) + 2048 * micro * 4  # 4 layers' outputs x 4 held
    # A backward holds one layer's weight gradients at a time (step.weights_first), compiled every layer's.
    assert gpipe[0].gradients == 4 * params + 4 * (2048 * 2048 + 2048)
    xla = prepare(
        chain.compose([*WIDE, "pipeline.microbatches=4", "trainer.jit_compile=true"]), Inventory.of(2, 16 * GB)
    ).assignment.footprints
    assert xla[0].gradients == 2 * 4 * params


def test_the_estimate_of_zb1_counts_the_output_gradients_held_between_b_and_w():
    """zb1 (K=2, M=4) holds 2 microbatches' activations on both stages, and between a B and its W the gradients at
    every layer's output (the last stage: up to 2 sets, as large as its outputs, beyond its busiest activations)."""
    assert schedules.output_gradients_held(schedules.build("zb1", 2, 4)) == [1, 2]
    assert schedules.output_gradients_held(schedules.build("1f1b", 2, 4)) == [0, 0]
    zb1 = prepare(
        chain.compose([*WIDE, "pipeline.microbatches=4", "pipeline.schedule=zb1"]), Inventory.of(2, 16 * GB)
    ).assignment.footprints
    micro, arriving = 2048 // 4, 2048 * (2048 // 4) * 4
    outputs = 4 * 2048 * micro * 4  # stage 0's 4 layers' outputs, one microbatch
    assert [f.held for f in zb1] == [2, 2]
    assert zb1[0].activations == (2 + 1) * outputs + arriving


def test_balance_by_memory_gives_earlier_stages_fewer_layers_under_1f1b():
    """Six equal layers, 3 stages: GPipe holds M microbatches on every stage (an even split); 1F1B holds
    3, 2, 1, so the memory split gives stage 0 the fewest layers."""
    rows = {
        name: footprint.layer_costs(
            [0] * 6, [100] * 6, schedules.held_counts(schedules.build(name, 3, 6)), slots=0, microbatch=8
        )
        for name in ("gpipe", "1f1b")
    }
    assert balance.partition(rows["gpipe"], 3, range(1, 6)) == [2, 2, 2]
    sizes = balance.partition(rows["1f1b"], 3, range(1, 6))
    assert sizes[0] < sizes[-1], sizes


def test_interleaved_stages_on_one_logical_gpu_add_up_against_its_limit():
    """Stages 0 and 2 share GPU:0 (interleaved, V=2): each under the 4 MiB limit alone, over it together."""
    cfg = [
        "mode=e2e",
        "+stages=4",
        "pipeline.schedule=interleaved",
        "pipeline.virtual_stages=2",
        "pipeline.microbatches=4",
        "model.width=256",
        "placement.memory_limit_mb=4",
    ]
    with pytest.raises(DeviceError) as e:
        prepare(chain.compose(cfg), Inventory.of(1, 8 * GB))
    assert re.match(r"stages 0, 2 need about [\d.]+ MB together on /device:GPU:0 \(the largest, stage 2", str(e.value))
    alone = prepare(chain.compose([*cfg, "placement.memory_limit_mb=null"]), Inventory.of(1, 8 * GB)).assignment
    assert max(f.total for f in alone.footprints) < 4 << 20 < alone.footprints[0].total + alone.footprints[2].total


def test_zbv_puts_the_first_and_last_stage_on_one_logical_gpu_and_adds_them_up_against_its_limit():
    """zbv (4 stages, M=4): stages 0 and 3 share GPU:0, 1 and 2 GPU:1 (the V); stage k holds 2D-k = 4-k
    microbatches' activations; each under the limit alone, stages 0 and 3 over it together."""
    cfg = [
        "mode=e2e",
        "+stages=4",
        "pipeline.schedule=zbv",
        "pipeline.microbatches=4",
        "model.width=256",
        "placement.memory_limit_mb=4",
    ]
    with pytest.raises(DeviceError) as e:
        prepare(chain.compose(cfg), Inventory.of(1, 8 * GB))
    assert re.match(r"stages 0, 3 need about [\d.]+ MB together on /device:GPU:0 ", str(e.value)), str(e.value)
    alone = prepare(chain.compose([*cfg, "placement.memory_limit_mb=null"]), Inventory.of(1, 8 * GB)).assignment
    assert [d.split("device:")[-1] for d in alone.devices] == ["GPU:0", "GPU:1", "GPU:1", "GPU:0"]
    assert [f.held for f in alone.footprints] == [4, 3, 2, 1]
    assert max(f.total for f in alone.footprints) < 4 << 20 < alone.footprints[0].total + alone.footprints[3].total


def test_side_by_side_says_variants_in_its_layout_note_and_memory_table():
    """mode=side_by_side's models are variants, not stages of a pipeline (issue 38)."""
    from chain.planning import fit
    from chain.planning.footprint import Footprint

    p = assign(pcfg(), 3, Inventory(), side_by_side=True)
    assert p.notes[0] == "topology: side by side (3 independent models, a device per variant)"
    shared = assign(pcfg("+stages=3", "placement.devices=[/CPU:0,/CPU:0,/CPU:1]"), 3, Inventory(), side_by_side=True)
    assert shared.notes[0] == "topology: side by side (3 independent models, on 2 devices)"
    assert assign(pcfg(), 3, Inventory()).notes[0].startswith("topology: pipeline (a device per stage")
    sizes = Footprint(weights=1024, gradients=1024, optimizer=2048, activations=512, inputs=256, held=1)
    text = fit.table(p, [sizes] * 3, Inventory(), unit="variant")
    assert text.startswith("memory estimate (per variant:") and "  variant 2: " in text and "stage" not in text


def test_a_runtime_started_first_has_the_stages_share_the_devices_that_exist(monkeypatch):
    """`share_existing` (the runtime started before `configure`): 6 planned CPU devices onto this session's 4
    in contiguous runs; one GPU split in 3 onto the one logical GPU that exists, the limits chain.setup would
    have set in the note; a layout that needs its devices (named, limited, copied, mirrored) is not shared."""
    import tensorflow as tf

    from chain.planning.devices import share_existing

    cfg = pcfg("+stages=6")
    p = share_existing(assign(cfg, 6, Inventory.of(0, 0)), cfg)  # the test session has CPU:0-3 (conftest.py)
    assert p.devices == tuple(f"/device:CPU:{k}" for k in (0, 0, 1, 2, 2, 3)) and p.split == {}
    assert p.physical == {f"/device:CPU:{k}": "CPU:0" for k in range(4)}
    assert p.notes[-1].startswith(
        "TensorFlow's runtime had started before chain could split the CPU into 6 logical "
        "devices (a model or tensor made first, or an earlier build): the 6 stages share the "
        "4 devices that exist, neighbouring stages together (/device:CPU:0, "
    )
    assert share_existing(assign(pcfg("+stages=4"), 4, Inventory.of(0, 0)), pcfg("+stages=4")) is None  # all exist
    needs_its_devices = (
        ["placement.devices=[/CPU:0,/CPU:1,/CPU:2,/CPU:3,/CPU:4,/CPU:5]"],
        ["mode=e2e", "placement.replicas=2"],
        ["placement.fallback=mirrored", "placement.replicas=8"],
    )
    for needs in needs_its_devices:
        cfg = pcfg("+stages=6", *needs)
        assert share_existing(assign(cfg, 6, Inventory.of(0, 0)), cfg) is None, needs

    monkeypatch.setattr(
        tf.config,
        "list_logical_devices",
        lambda kind=None: [tf.config.LogicalDevice("/device:GPU:0", "GPU")] if kind == "GPU" else [],
    )
    cfg = pcfg("+stages=3")
    p = share_existing(assign(cfg, 3, Inventory.of(1, 16 * GB)), cfg)
    assert p.devices == ("/device:GPU:0",) * 3 and p.physical == {"/device:GPU:0": "GPU:0"}
    assert (p.split, p.memory_limits_mb) == ({}, {})
    assert p.notes[-1] == (
        "TensorFlow's runtime had started before chain could make 3 logical GPUs (a model or tensor "
        "made first, or an earlier build): the 3 stages share /device:GPU:0 instead, with no memory "
        "limit between them; chain.setup(cfg) first would have made them, each with a memory limit "
        "(GPU 0: 5290, 5290, 5290 MB)"
    )
    cfg = pcfg("+stages=3", "placement.memory_limit_mb=4000")
    assert share_existing(assign(cfg, 3, Inventory.of(1, 16 * GB)), cfg) is None
