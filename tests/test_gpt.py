"""`model=gpt`: the built-in decoder-only transformer, cut into the chain's stages. Oracles: the same Keras
model on one device (`model.predict`, and Keras' own `train_on_batch` with SGD and the per-token loss);
config errors are one line naming the key."""

from __future__ import annotations

import keras
import numpy as np
import pytest

import chain
from chain.errors import ConfigError
from compare import rel_diff

SEQ, BATCH = 8, 8


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A few KB of UTF-8 text (data=text's bytes)."""
    d = tmp_path_factory.mktemp("corpus")
    words = "the quick brown fox jumps over the lazy dog; naïve café, déjà vu\n"
    (d / "a.txt").write_text(words * 40)
    return str(d / "*.txt")


def gpt_run(corpus: str, *extra: str) -> list[str]:
    return ["mode=e2e", "model=gpt", "data=text", f"data.files={corpus}", f"data.seq_len={SEQ}",
            f"data.batch_size={BATCH}", "model.width=8", "model.heads=2", "model.depth=2", "trainer.progress=false",
            "checkpoint.export=false", "optim=sgd", "optim.lr=0.5", *extra]


def batches(n: int):
    rng = np.random.default_rng(0)
    return [(rng.integers(0, 256, (BATCH, SEQ)).astype("int32"), rng.integers(0, 256, (BATCH, SEQ)).astype("int32"))
            for _ in range(n)]


@pytest.mark.parametrize("stages, schedule, tied", [(2, "1f1b", True), (3, "gpipe", False)])
def test_gpt_cut_into_stages_predicts_and_trains_like_the_same_model_on_one_device(corpus, stages, schedule, tied):
    from chain.stages import gpt

    cfg = chain.compose(gpt_run(corpus, f"+stages={stages}", f"pipeline.schedule={schedule}",
                                "pipeline.microbatches=4", f"model.tied={str(tied).lower()}"))
    run = chain.build(cfg)
    spec = cfg.stages[0].model
    assert spec.seq_len == SEQ  # taken from data.seq_len
    keras.utils.set_random_seed(cfg.seed)  # as the chain seeds its models
    reference = gpt.build(spec)
    data = batches(3)
    x = data[0][0]
    np.testing.assert_allclose(run.forward(x)[f"body_{stages - 1}"].numpy(), reference.predict(x, verbose=0),
                               rtol=0, atol=1e-6)
    reference.compile(optimizer=keras.optimizers.SGD(0.5),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=False)
    start = {v.path: v.numpy() for v in reference.trainable_variables}
    for x, y in data:
        np.testing.assert_allclose(run.step(x, {"next": y})["loss"], reference.train_on_batch(x, y), rtol=1e-5)
    want = {v.path: v.numpy() for v in reference.trainable_variables}
    seen = set()
    for s in run.stages:
        for v in s.trainable_variables:
            seen.add(v.path)
            if np.abs(want[v.path] - start[v.path]).max() < 1e-8:  # attention's key bias: 0 in exact arithmetic
                assert np.abs(v.numpy() - start[v.path]).max() < 1e-6, v.path
                continue
            assert rel_diff(v.numpy(), want[v.path]) <= 1e-5, v.path
    assert seen == set(want)
    names = [[layer.name for layer in s.model.layers] for s in run.stages]
    assert ("token_embedding" in names[-1]) == tied  # tied: the read-out is the embedding, on the last stage too


@pytest.mark.parametrize("overrides, message", [
    (["mode=local"], "model=gpt is one network trained by one per-token loss: it needs mode=e2e (is local)"),
    (["data=digits"], "model=gpt reads token ids: it needs data=text or data=tokens (is data=digits)"),
    (["model.seq_len=16"], "model.seq_len=16 differs from data.seq_len=8"),
    (["model.vocab=300"], "model.vocab=300 differs from data=text's 256 token ids"),
    (["model.heads=3"], "model.width=8 must be a multiple of model.heads=3"),
    (["+stages=[{},{model: mlp}]"], "model=gpt cuts one model into every stage"),
])
def test_model_gpt_refuses_what_it_cannot_train_in_one_line(corpus, overrides, message):
    base = gpt_run(corpus)
    if overrides == ["data=digits"]:
        base = [o for o in base if not o.startswith("data.")]
    with pytest.raises(ConfigError) as e:
        chain.compose([*base, *overrides])
    assert message in str(e.value) and "\n" not in str(e.value)
