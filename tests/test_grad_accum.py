"""trainer.grad_accum=N: one optimizer step from N chunks of data.batch_size equals one step
on the N-times larger batch, in every mode, and the chunks run one at a time."""

import pytest

import chain
from chain.config.schema import plain
from chain.state import manifest
from graph_audit import ancestors
from compare import assert_trains_alike
from conftest import EXTENDED

B, N = 16, 4
BASE = [
    "+stages=3",
    "model.depth=1",
    "model.width=16",
    "optim=sgd",
    "optim.lr=0.1",
    "data=synthetic",
    "data.features=6",
    "data.classes=4",
    "data.samples=256",
    "trainer.progress=false",
]
CASES = {
    "local": ["mode=local"],
    "e2e-gpipe-M2": ["mode=e2e", "pipeline.schedule=gpipe", "pipeline.microbatches=2"],
    "e2e-1f1b-M4": ["mode=e2e", "pipeline.schedule=1f1b", "pipeline.microbatches=4"],
    "mirrored-local": ["mode=local", "placement.fallback=mirrored"],
    "mirrored-e2e": ["mode=e2e", "placement.fallback=mirrored"],
}
RTOL = 1e-6
STEPS = 5


# The suite's time: local, e2e's 1f1b and the mirrored e2e run accumulate every time.
EXTENDED_CASES = {"e2e-gpipe-M2", "mirrored-local"}


@pytest.mark.parametrize("case", [pytest.param(c, marks=EXTENDED if c in EXTENDED_CASES else ()) for c in CASES])
def test_accumulated_update_equals_the_update_on_the_larger_batch(case):
    """Tolerance 1e-6 relative (per variable: largest difference over largest magnitude; per
    step loss), after 5 SGD steps. Both runs compute the mean loss and gradient over the
    same N x B examples: the accumulating run as N chunk sums of B examples (each chunk's
    loss weighted 1/N), the reference as one sum over the whole batch (in e2e over its
    own M microbatches; mirrored over the same two replicas). Only the order of float32
    additions differs (unit roundoff 6e-8), so the results agree to a few units of it;
    the mathematics is identical. Measured: 1-2e-7.
    """
    accumulating = chain.build(chain.compose(BASE + CASES[case] + [f"data.batch_size={B}", f"trainer.grad_accum={N}"]))
    larger = chain.build(chain.compose(BASE + CASES[case] + [f"data.batch_size={N * B}"]))
    assert accumulating.examples_per_step == larger.examples_per_step == N * B
    mine, theirs = iter(accumulating.batches()), iter(larger.batches())  # each run's own stream
    pairs = ((next(mine), next(theirs)) for _ in range(STEPS))
    assert_trains_alike(accumulating, larger, pairs, RTOL, moved=1000)
    # trainer.steps counts optimizer updates: one per step, whatever N is.
    assert [int(s.optimizer.iterations.numpy()) for s in accumulating.stages] == [STEPS] * 3


def test_local_chunks_run_one_at_a_time():
    """Chunk 2's forward pass waits for chunk 1's gradient, so only one chunk's activations
    are alive per stage (the memory bound gradient accumulation is for)."""
    run = chain.build(chain.compose(BASE + ["data.batch_size=8", "trainer.grad_accum=2"]))
    x, ys = next(iter(run.batches()))
    ops = run.trace(x, ys).graph.get_operations()
    for k in range(3):
        forward = [op for op in ops if op.type == "MatMul" and op.name.startswith(f"stage_{k:02d}")]
        assert len(forward) == 2  # one Dense, two chunks
        first_chunk = forward[0].name.split("/")[0]
        grads = [op.name for op in ops if op.type == "MatMul" and op.name.startswith(f"gradient_tape/{first_chunk}/")]
        assert grads and set(grads) <= ancestors(forward[1])


def test_e2e_rounds_run_one_after_another():
    """Round 2 (microbatches M..2M-1) starts on every stage only after that stage finished round 1."""
    m = 2
    run = chain.build(
        chain.compose(
            BASE
            + [
                "mode=e2e",
                "pipeline.schedule=gpipe",
                f"pipeline.microbatches={m}",
                "data.batch_size=8",
                "trainer.grad_accum=2",
            ]
        )
    )
    x, ys = next(iter(run.batches()))
    ops = run.trace(x, ys).graph.get_operations()
    for k in range(3):
        round_2 = [op for op in ops if op.name.startswith(f"s{k}_F{m}/") and op.type == "MatMul"]
        assert round_2
        for op in round_2:  # gpipe: round 1 ends with the backward of microbatch m-1
            assert any(a.startswith((f"s{k}_B{m - 1}/", f"gradient_tape/s{k}_F{m - 1}/")) for a in ancestors(op))
        assert len([op for op in ops if op.name.startswith(f"s{k}_update/") and op.type == "If"]) == 1


def test_a_batch_that_does_not_cut_into_the_chunks_is_refused():
    run = chain.build(chain.compose(BASE + ["data.batch_size=8", "trainer.grad_accum=2"]))
    x, ys = next(iter(run.batches()))
    with pytest.raises(ValueError, match=r"a batch of 15 examples does not cut into trainer.grad_accum=2 equal chunks"):
        run.step(x[:15], {k: v[:15] for k, v in ys.items()})
    e2e = chain.build(
        chain.compose(BASE + ["mode=e2e", "pipeline.microbatches=4", "data.batch_size=8", "trainer.grad_accum=2"])
    )
    # The same mistake, the same error in every mode: a ValueError about the argument.
    with pytest.raises(
        ValueError,
        match=r"a batch of 12 examples does not cut into trainer.grad_accum=2 chunks of "
        r"pipeline.microbatches=4 equal microbatches",
    ):
        e2e.step(x[:12], {k: v[:12] for k, v in ys.items()})


def test_more_examples_per_step_than_the_data_set_has_is_a_config_error():
    with pytest.raises(chain.ConfigError) as e:
        chain.compose(BASE + ["data.batch_size=64", "trainer.grad_accum=8"])
    assert str(e.value) == (
        "trainer.grad_accum=8 x data.batch_size=64 = 512 examples per step is more than "
        "data=synthetic has (230 training examples)"
    )


def test_resume_needs_the_same_grad_accum():
    settings = chain.compose(BASE + ["trainer.grad_accum=2"])
    saved = {"mode": settings.mode, "seed": settings.seed, "data": plain(settings.data), "grad_accum": 4}
    with pytest.raises(chain.ChainError) as e:
        manifest.check_stream(saved, settings)
    assert str(e.value).startswith(
        "the checkpoint was written with trainer.grad_accum=4, the config has "
        "trainer.grad_accum=2; resume needs the same trainer.grad_accum"
    )
    manifest.check_stream({**saved, "grad_accum": 2}, settings)  # the same: accepted
