"""trainer.jit_compile=true: each stage's forward, gradient and update compiled by XLA on
the stage's own device; training equals uncompiled training."""

import pytest

import chain
from chain.steps import xla
from conftest import DEVICES, EXTENDED
from graph_audit import audit, body_devices, compiled_calls
from compare import assert_trains_alike, same_batches

K = 3
M = 2
BASE = [
    f"+stages={K}",
    "model.depth=1",
    "model.width=16",
    "optim=sgd",
    "optim.lr=0.1",
    "data=synthetic",
    "data.features=6",
    "data.classes=4",
    "data.samples=256",
    "data.batch_size=16",
    "trainer.progress=false",
]
CASES = {
    "local": ["mode=local"],
    "e2e-gpipe": ["mode=e2e", "pipeline.schedule=gpipe", f"pipeline.microbatches={M}"],
    "e2e-1f1b-accum": ["mode=e2e", "pipeline.schedule=1f1b", f"pipeline.microbatches={M}", "trainer.grad_accum=2"],
    "mirrored-e2e": ["mode=e2e", "placement.fallback=mirrored"],
}
RTOL = 1e-5
STEPS = 5


# EXTENDED: the suite's time; the pipelined e2e run compiles every time (1f1b with accumulation)
@pytest.mark.parametrize("case", [pytest.param(c, marks=EXTENDED if c == "e2e-gpipe" else ()) for c in CASES])
def test_xla_training_matches_uncompiled_training(case):
    """Tolerance 1e-5 relative (per variable: largest difference over largest magnitude;
    and per step loss), after 5 SGD steps. XLA computes the same functions but fuses and
    reorders floating-point operations (sums in another order, fused multiply-adds), so
    only rounding differs: float32's unit roundoff is 6e-8 and five steps of a three-
    stage chain accumulate a few hundred of them at most. Measured: 1-2e-7 in every case.
    The low precisions are not held to this: XLA on CPU keeps fused intermediates wider
    than bfloat16 (compiled and uncompiled bfloat16 runs differ at about 3e-4), and on a
    CPU with AVX512_FP16 TensorFlow's uncompiled float16 kernels (oneDNN) round
    differently from XLA's (measured 1.1e-5 on the loss; 1-2e-7 on CPUs without it). Both
    are differences at the low precision's own rounding, so test_precision holds the
    compiled bfloat16 and float16 runs to their precision's tolerance against float32.
    """
    compiled = chain.build(chain.compose(BASE + CASES[case] + ["trainer.jit_compile=true"]))
    plain = chain.build(chain.compose(BASE + CASES[case]))
    assert_trains_alike(compiled, plain, same_batches(plain, STEPS), RTOL, moved=100)


def calls_by_stage(a, run) -> dict[int, dict[str, list]]:
    """Compiled calls of each stage's forward, its gradient and its update, found by function name."""
    out = {}
    calls = compiled_calls(a)
    for s in run.stages:
        fwd, upd = xla.forward_name(s.index), xla.update_name(s.index)
        names = [(op, op.get_attr("f").name) for op in calls]
        out[s.index] = {
            "forward": [op for op, n in names if fwd in n and "backward" not in n],
            "backward": [op for op, n in names if f"backward_{fwd}" in n],
            "update": [op for op, n in names if upd in n],
        }
    return out


@pytest.mark.parametrize("case", ["local", "e2e-gpipe", "e2e-1f1b-float16-accum"])
def test_with_xla_each_stages_compiled_work_runs_on_its_device_and_copies_are_the_only_crossings(case):
    overrides = {
        "local": CASES["local"],
        "e2e-gpipe": CASES["e2e-gpipe"],
        "e2e-1f1b-float16-accum": [
            "mode=e2e",
            "pipeline.schedule=1f1b",
            f"pipeline.microbatches={M}",
            "precision=mixed_float16",
            "trainer.grad_accum=2",
        ],
    }[case]
    run = chain.build(chain.compose(BASE + overrides + ["trainer.jit_compile=true"]))
    n = run.grad_accum
    x, ys = next(iter(run.batches()))
    a = audit(run.trace(x, ys))
    devices = [s.device for s in run.stages]
    assert devices == DEVICES[:K]
    for op in a.ops():
        d = a.device[op]
        if d is None:  # only the boundary with the caller is unplaced
            assert op in a.args | a.outputs or op.type == "NoOp", op.name
        else:
            assert d in devices, (op.name, d)
    # All of the model's arithmetic sits inside compiled functions.
    assert not [op for op in a.ops() if op.type in ("MatMul", "BiasAdd", "Relu")]
    per_call = M if run.settings.mode == "e2e" else 1  # forward calls per chunk: one per microbatch in e2e
    for s in run.stages:
        mine = calls_by_stage(a, run)[s.index]
        assert len(mine["forward"]) == n * per_call
        assert len(mine["backward"]) == n * per_call
        assert len(mine["update"]) == 1  # one update per step, after all chunks
        for op in mine["forward"] + mine["backward"] + mine["update"]:
            assert a.device[op] == s.device, (op.name, a.device[op])
            assert body_devices(op) <= {s.device}, op.name  # nothing inside points elsewhere
    assert len(compiled_calls(a)) == sum(len(v) for c in calls_by_stage(a, run).values() for v in c.values())
    # The compiled calls read their variables on their own device: any other input would be a crossing.
    crossings = a.crossings()
    assert all(c.name.split("/")[-1].startswith("copy_to_") for c, _ in crossings), crossings
    reports = a.report_copies()  # each earlier stage's report, to the last stage
    assert len(reports) == K - 1 and {a.device[c] for c in reports} == {devices[-1]}
    crossings = [(c, p) for c, p in crossings if c not in reports]
    if run.settings.mode == "e2e":
        # Activations and gradients, 2(K-1) per microbatch; float16 adds the loss-scale
        # decision: K-1 finite flags to the last stage, K-1 outcomes back.
        decision = 2 * (K - 1) if run.stages[-1].loss_scale is not None else 0
        assert len(crossings) == 2 * (K - 1) * M * n + decision
    else:
        assert len(crossings) == K - 1
