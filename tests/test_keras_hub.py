"""keras_hub models as shipped (tiny configs, random weights, no download) cut into stages: their dict
inputs with padding masks, their graphs' ops, the backbone nested in the task model, and the tied
embedding the keras_hub way (`token_embedding(x, reverse=True)`, the same layer called on the first and
last stage). Oracles: `model.predict` on padded inputs, and Keras' own `train_on_batch` (SGD)."""

from __future__ import annotations

import glob
import os
import re

import keras
import keras_hub  # the `lm` extra and keras-hub without its dependencies (README's test command)
import numpy as np
import pytest

import chain
from compare import assert_trained_like_keras, by_path, microbatch_sgd_step, paths, rel_diff
from conftest import EXTENDED

VOCAB, SEQ, BATCH = 50, 8, 16
RUN = [
    "mode=e2e",
    "pipeline.microbatches=4",
    "data=synthetic",
    "data.features=6",
    f"data.classes={VOCAB}",
    "data.samples=64",
    f"data.batch_size={BATCH}",
    "trainer.progress=false",
    "checkpoint.export=false",
    "optim=sgd",
    "optim.lr=0.1",
]


def gpt2_lm() -> keras.Model:
    """GPT2CausalLM as shipped: logits per position, `(batch, seq, vocab)`."""
    keras.utils.set_random_seed(1)
    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=VOCAB,
        num_layers=2,
        num_heads=2,
        hidden_dim=8,
        intermediate_dim=16,
        max_sequence_length=SEQ,
        dropout=0.0,
    )
    return keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)


def gemma_lm() -> keras.Model:
    """GemmaCausalLM as shipped (its graph scales the embedding by an op, `x * c`)."""
    keras.utils.set_random_seed(3)
    backbone = keras_hub.models.GemmaBackbone(
        vocabulary_size=VOCAB,
        num_layers=2,
        num_query_heads=2,
        num_key_value_heads=1,
        hidden_dim=8,
        intermediate_dim=16,
        head_dim=4,
        dropout=0.0,
    )
    return keras_hub.models.GemmaCausalLM(backbone=backbone, preprocessor=None)


def llama_lm() -> keras.Model:
    """LlamaCausalLM as shipped: keras_hub 0.32's LlamaTransformerDecoder cannot be re-created from its config
    (`get_config` raises), so its stage reuses the layer object, its variables re-created on the stage's device."""
    keras.utils.set_random_seed(4)
    backbone = keras_hub.models.LlamaBackbone(
        vocabulary_size=VOCAB,
        num_layers=2,
        num_query_heads=2,
        num_key_value_heads=1,
        hidden_dim=8,
        intermediate_dim=16,
        dropout=0.0,
    )
    return keras_hub.models.LlamaCausalLM(backbone=backbone, preprocessor=None)


def next_token(make):
    """The causal LM `make()` read at its last position: one label per example."""

    def read_last() -> keras.Model:
        lm = make()
        return keras.Model(lm.input, lm(lm.input)[:, -1, :], name=f"{lm.name}_next_token")

    return read_last


def bert_classifier() -> keras.Model:
    """BertBackbone as shipped (three named inputs, two outputs) with a classifier head on its pooled output."""
    keras.utils.set_random_seed(2)
    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=VOCAB,
        num_layers=2,
        num_heads=2,
        hidden_dim=8,
        intermediate_dim=16,
        max_sequence_length=SEQ,
        dropout=0.0,
    )
    pooled = backbone(backbone.input)["pooled_output"]
    return keras.Model(backbone.input, keras.layers.Dense(VOCAB, name="head")(pooled), name="bert_classifier")


# The done-when's models, each read as one label per example: (the model, whether it takes segment ids).
MODELS = {
    "gpt2": (next_token(gpt2_lm), False),
    "bert": (bert_classifier, True),
    "gemma": (next_token(gemma_lm), False),
    "llama": (next_token(llama_lm), False),
}


def batches(n: int, segments: bool = False):
    rng = np.random.default_rng(0)
    out = []
    for _ in range(n):
        pad = (np.arange(SEQ)[None, :] < rng.integers(3, SEQ + 1, BATCH)[:, None]).astype("int32")
        ids = rng.integers(1, VOCAB, (BATCH, SEQ)).astype("int32") * pad
        x = {"token_ids": ids, "padding_mask": pad}
        if segments:
            x["segment_ids"] = (np.arange(SEQ)[None, :] >= SEQ // 2).astype("int32") * pad
        out.append((x, rng.integers(0, VOCAB, BATCH).astype("int32")))
    return out


def _cases(rows: list[tuple], extended: set[tuple]) -> list:
    """`rows` as pytest params, those in `extended` marked EXTENDED."""
    return [pytest.param(*row, marks=EXTENDED if row in extended else ()) for row in rows]


@pytest.mark.parametrize(
    "name, stages, schedule",
    _cases(
        [(name, k, schedule) for name in MODELS for k, schedule in ((2, "gpipe"), (4, "1f1b"))],
        # the suite's time: gemma's cut between blocks, a decoder with its tied read-out, is llama's; 4 stages of
        # GPT2 train like Keras every time in test_adam_equals_keras_adam_with_its_sparse_embedding_update
        {(name, 4, "1f1b") for name in MODELS} | {("gpt2", 2, "gpipe"), ("gemma", 2, "gpipe")},
    ),
)
def test_keras_hub_model_cut_between_blocks_predicts_and_trains_like_keras(name, stages, schedule):
    """Each model of issue 36's done-when, as shipped, in 2 stages (GPipe) and 4 (1F1B) at M=4."""
    make, segments = MODELS[name]
    run = predicts_and_trains_like_keras(make, batches(3, segments), stages, schedule, between_blocks(make, stages))
    names = [[layer.name for layer in s.model.layers] for s in run.stages]
    blocks = [[n for n in stage if n.startswith(BLOCKS)] for stage in names]
    assert sum(map(len, blocks)) == 2 and max(map(len, blocks)) == 1  # the two blocks on two stages: cut between them
    if name != "bert":  # the tied read-out (`token_embedding(x, reverse=True)`) on the last stage
        assert "token_embedding" in names[0] and names[-1][-1] == "token_embedding"
    if name == "llama":
        from chain.planning.devices import canonical

        for s in run.stages:  # the reused blocks' variables live on their stage's device
            assert {canonical(v.value.device) for v in s.model.weights} == {canonical(s.device)}


def test_gpt2_tied_embedding_on_two_stages_of_one_device_is_one_variable_and_trains_like_keras(tmp_path):
    """GPT2CausalLM in 2 stages on ONE device (`placement.devices=[/CPU:0,/CPU:0]`): the read-out
    (`token_embedding(h, reverse=True)`) on stage 1 reads stage 0's embedding itself (`Stage.borrowed`, no copy),
    whose one optimizer applies both uses' gradients: 3 SGD steps equal Keras' `train_on_batch` (M=4, GPipe).
    Stage 1 saved alone (its `stage_01.keras`) loads and computes as it does, the embedding saved with it."""
    make = next_token(gpt2_lm)
    run = predicts_and_trains_like_keras(
        make, batches(3), 2, "gpipe", [*between_blocks(make, 2), "placement.devices=[/CPU:0,/CPU:0]"]
    )
    first, last = run.stages
    assert first.device == last.device and not first.borrowed and not last.shared
    (embedding,) = [v for v in first.trainable_variables if v.path == "token_embedding/embeddings"]
    assert [b.variable for b in last.borrowed] == [embedding]  # one variable, read by both stages
    assert all(v.path != "token_embedding/embeddings" for v in last.model.variables)
    last.model.save(tmp_path / "stage_01.keras")
    (h,) = (run.stages[0].model(x) for x, _ in batches(1))
    np.testing.assert_allclose(
        keras.models.load_model(tmp_path / "stage_01.keras")(h), last.model(h), rtol=0, atol=1e-6
    )


BLOCKS = ("transformer_layer_", "decoder_block_")  # the transformer blocks' names in these models


def between_blocks(make, stages: int, blocks: tuple[str, ...] = BLOCKS) -> list[str]:
    """2 stages: `placement.split` cutting between the first two transformer blocks (their names begin with one
    of `blocks`; `even` keeps both on stage 0, the cut after them being the one where a single tensor crosses);
    4 stages: `even` cuts between them."""
    if stages != 2:
        return []
    from chain.stages.cut import analyse

    layers = [layer.name for layer in analyse(make(), "model").layers]
    first = [i for i, n in enumerate(layers) if n.startswith(blocks)][1]
    return [f"placement.split=[{first},{len(layers) - first}]"]


def predicts_and_trains_like_keras(
    make,
    data,
    stages: int,
    schedule: str,
    overrides=(),
    per_token: bool = False,
    adam: bool = False,
    tied: str = "token_embedding/embeddings",
    numbered: str = "",
    base: list[str] | None = None,
):
    """`make()` cut into `stages` under `schedule`: predictions equal `model.predict` on padded inputs, and
    3 steps equal Keras' own `train_on_batch` (losses and every weight within 1e-5), the weight `tied` (its path)
    moved by them (`numbered`: `assert_trained_like_keras`'s); returns the run.

    `per_token`: the causal LM's logits per position learn a label per position (`data=tokens`' target `next`),
    padding positions (label PAD) left out, in the chain by `ignore_class` and in Keras by its loss's own.
    `adam`: `optim=adam` against Adam of the same settings in Keras' `train_on_batch`, whose update of an
    Embedding's sparse gradient is the reference (docs/optimizers.md): `keras.optimizers.Adam` under
    `optim.fused=false`, and under the fused default Keras' Adam whose dense update is TensorFlow's kernel
    (`chain.stages.fused.FusedAdam`: the kernel rounds `1 - beta` apart from Keras, which moves a weight of
    BERT by 1.25e-5 of Keras' Adam after 3 steps, on one device as in the chain); SGD otherwise.
    `base`: the run's config instead of `RUN` (a data set whose examples fit a model of one image input)."""
    model = make()
    target = "next" if per_token else "label"
    optim = ["optim=adam", f"optim.lr={ADAM_LR}"] if adam else ["optim=sgd", "optim.lr=0.1"]
    base = base or (per_token_data() if per_token else RUN)
    run = chain.build(
        chain.compose([f"+stages={stages}", f"pipeline.schedule={schedule}", *base, *optim, *overrides]), model=model
    )
    x = data[0][0]
    np.testing.assert_allclose(
        run.forward(x)[f"body_{stages - 1}"].numpy(), model.predict(x, verbose=0), rtol=0, atol=1e-6
    )
    reference = make()
    if adam:
        from chain.stages.fused import FusedAdam

        fused = "optim.fused=false" not in overrides
        optimizer = FusedAdam(ADAM_LR) if fused else keras.optimizers.Adam(ADAM_LR)
    else:
        optimizer = keras.optimizers.SGD(0.1)
    reference.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=PAD if per_token else None),
        jit_compile=False,
    )
    start = by_path(reference.trainable_variables, numbered)
    assert run.stages[-1].target.name == target
    assert_trained_like_keras(run, reference, data, start, leave_out=("key/bias",) if adam else (), numbered=numbered)
    want = by_path(reference.trainable_variables, numbered)
    assert rel_diff(want[tied], start[tied]) > 1e-3
    return run


PAD = 0  # the padding id of the per-token tests (real tokens are 1..VOCAB-1)
ADAM_LR = 0.01


def per_token_data() -> list[str]:
    """A `data=tokens` config whose target `next` is a label per position (`(SEQ,)`, VOCAB classes), PAD
    ignored: the batches are the test's own (`run.step`), the file only describes them."""
    import tempfile

    path = os.path.join(tempfile.mkdtemp(prefix="keras_hub_tokens_"), "train.bin")
    (np.arange(20 * SEQ) % VOCAB).astype(np.uint16).tofile(path)
    return [
        *[o for o in RUN if not o.startswith(("data", "optim"))],
        "data=tokens",
        f"data.path={path}",
        f"data.seq_len={SEQ}",
        f"data.vocab={VOCAB}",
        f"data.batch_size={BATCH}",
        f"ignore_class={PAD}",
    ]


def token_batches(n: int):
    """`n` padded batches with a next-token label per position, PAD where the input is padding: the
    microbatches (M=4) hold different numbers of real tokens."""
    out = []
    for x, _ in batches(n):
        rng = np.random.default_rng(len(out))
        y = rng.integers(1, VOCAB, (BATCH, SEQ)).astype("int32") * x["padding_mask"]
        assert len({int(c) for c in (y != PAD).reshape(4, -1).sum(-1)}) > 1  # unequal real tokens per microbatch
        out.append((x, y))
    return out


@pytest.mark.parametrize(
    "name, stages, schedule",
    _cases(
        [("gpt2", 2, "gpipe"), ("gpt2", 4, "1f1b"), ("gemma", 4, "1f1b"), ("llama", 2, "gpipe")],
        # GPT2's per-token cases below stay; the suite's time: gemma's runs every time, llama's learns the same way
        {("gpt2", 4, "1f1b"), ("gpt2", 2, "gpipe"), ("llama", 2, "gpipe")},
    ),
)
def test_causal_lm_as_shipped_learns_every_position_with_padding_ignored_like_keras(name, stages, schedule):
    """The causal LM's own `(batch, seq, vocab)` output against integer labels per position, padding ignored
    (`ignore_class`): the mean over the batch's real tokens, though the microbatches hold unequal numbers."""
    make = {"gpt2": gpt2_lm, "gemma": gemma_lm, "llama": llama_lm}[name]
    predicts_and_trains_like_keras(
        make, token_batches(3), stages, schedule, between_blocks(make, stages), per_token=True
    )


@pytest.mark.parametrize(
    "name, stages, schedule, fused",
    _cases(
        [
            (m, k, schedule, fused)
            for m, k, schedule in (("gpt2", 4, "1f1b"), ("bert", 2, "gpipe"))
            for fused in (True, False)
        ],
        {("gpt2", 4, "1f1b", False), ("bert", 2, "gpipe", True), ("bert", 2, "gpipe", False)},
    ),
)
def test_adam_equals_keras_adam_with_its_sparse_embedding_update(name, stages, schedule, fused):
    """optim=adam (the fused kernel, and Keras' own update) against Keras' Adam in `train_on_batch`: GPT2's tied
    embedding (the read-out's dense gradient summed with the input's, dense as on one device) and BERT's
    untied ones (sparse, Keras' sparse update)."""
    make, segments = MODELS[name]
    predicts_and_trains_like_keras(
        make,
        batches(3, segments),
        stages,
        schedule,
        [*between_blocks(make, stages), f"optim.fused={str(fused).lower()}"],
        adam=True,
    )


def test_gpt2_tied_read_out_trains_like_keras_with_copies_of_the_pipeline_and_mirrored():
    """GPT2CausalLM (`token_embedding(h, reverse=True)` on the last stage): 2 stages x 2 copies learning every
    position with padding ignored (each copy's microbatches weighed by the whole batch's real tokens), and the
    mirrored fallback reading the last position: 3 SGD steps equal Keras' `train_on_batch`."""
    run = predicts_and_trains_like_keras(
        gpt2_lm,
        token_batches(3),
        2,
        "gpipe",
        [*between_blocks(gpt2_lm, 2), "pipeline.microbatches=2", "placement.replicas=2"],
        per_token=True,
    )
    assert len(run.strategy.copies) == 2 and [len(s.shared) for s in run.stages] == [1, 1]
    make = next_token(gpt2_lm)  # data=tokens streams, which the mirrored replicas do not read
    run = predicts_and_trains_like_keras(
        make, batches(3), 2, "gpipe", [*between_blocks(make, 2), "placement.fallback=mirrored"]
    )
    assert [len(s.shared) for s in run.stages] == [1, 1]


def mixtral_lm() -> keras.Model:
    """MixtralCausalLM as shipped: each block's sparse mixture of 4 experts (top 2) adds its load-balancing loss
    with `add_loss` in training. Its coefficient stays the default 0.02: keras_hub 0.32's
    `MixtralTransformerDecoder.get_config` leaves `router_aux_loss_coef` out, so a block re-created from its
    config (a cut stage's) has 0.02 whatever the model was built with (docs/your-models.md)."""
    keras.utils.set_random_seed(6)
    backbone = keras_hub.models.MixtralBackbone(
        vocabulary_size=VOCAB,
        num_layers=2,
        num_query_heads=2,
        num_key_value_heads=1,
        hidden_dim=8,
        intermediate_dim=16,
        num_experts=4,
        top_k=2,
        dropout=0.0,
    )
    return keras_hub.models.MixtralCausalLM(backbone=backbone, preprocessor=None)


def qwen3_moe_lm() -> keras.Model:
    """Qwen3MoeCausalLM as shipped: a mixture of 4 experts (top 2) per block, its load-balancing loss by `add_loss`
    (its coefficient 1, not 0.001, so the term moves the weights visibly)."""
    keras.utils.set_random_seed(7)
    backbone = keras_hub.models.Qwen3MoeBackbone(
        vocabulary_size=VOCAB,
        num_layers=2,
        num_query_heads=2,
        num_key_value_heads=1,
        hidden_dim=8,
        intermediate_dim=16,
        moe_intermediate_dim=8,
        num_experts=4,
        top_k=2,
        head_dim=4,
        router_aux_loss_coefficient=1.0,
        dropout=0.0,
    )
    return keras_hub.models.Qwen3MoeCausalLM(backbone=backbone, preprocessor=None)


@pytest.mark.parametrize("name", _cases([("mixtral",), ("qwen3_moe",)], {("qwen3_moe",)}))
def test_mixture_of_experts_trains_with_microbatches_its_load_balancing_loss_per_microbatch(name):
    """A mixture of experts (read at its last position) in 2 stages, GPipe, M=4: refused by default in one line
    naming `pipeline.add_loss=per_microbatch` (its load-balancing loss is an `add_loss` term over the batch's
    tokens); with it, the forward equals `model.predict`, and one SGD step equals a one-device tape loop over the
    same 4 microbatches, each's loss and load-balancing terms weighed 1/4 (not the whole batch's loss), loss and
    every weight within 1e-5. (Tracing the pipelined step is most of the test's time: one step.)"""
    make = next_token({"mixtral": mixtral_lm, "qwen3_moe": qwen3_moe_lm}[name])
    model, reference = make(), make()
    overrides = ["+stages=2", "pipeline.schedule=gpipe", *RUN, *between_blocks(make, 2)]
    with pytest.raises(chain.ConfigError) as e:
        chain.build(chain.compose(overrides), model=model)
    assert str(e.value).startswith("stage 0 (") and "use pipeline.add_loss=per_microbatch" in str(e.value)
    run = chain.build(chain.compose([*overrides, "pipeline.add_loss=per_microbatch"]), model=model)
    assert any(
        n.startswith("pipeline.add_loss=per_microbatch: the add_loss terms of stage(s) 0, 1 ")
        for n in run.assignment.notes
    )
    ((x, y),) = batches(1)
    np.testing.assert_allclose(run.forward(x)["body_1"].numpy(), model.predict(x, verbose=0), rtol=0, atol=1e-6)
    whole = keras.losses.SparseCategoricalCrossentropy(from_logits=True)(y, reference(x, training=True))
    whole = float(whole + sum(reference.losses))  # the batch's one load-balancing term per block
    start = {v.path: v.numpy() for v in reference.trainable_variables}
    got, oracle = float(run.step(x, {"label": y})["loss"]), microbatch_sgd_step(reference, "/CPU:0", 0.1, 4)(x, y)
    np.testing.assert_allclose(got, oracle, rtol=1e-5)
    assert abs(got - whole) > 1e-4 * abs(whole)  # the microbatches' terms, not the batch's
    trained = {unnumbered(v.path): v.numpy() for s in run.stages for v in s.trainable_variables}
    want = {unnumbered(v.path): v.numpy() for v in reference.trainable_variables}
    start = {unnumbered(path): value for path, value in start.items()}
    assert trained.keys() == want.keys() == start.keys() and len(want) == len(reference.trainable_variables)
    for path, value in want.items():
        if np.abs(value - start[path]).max() < 1e-8:  # attention's key bias: 0 in exact arithmetic
            assert np.abs(trained[path] - start[path]).max() < 1e-6, path
            continue
        assert rel_diff(trained[path], value) <= 1e-5, path
    router = [path for path in want if path.endswith("sparse_feedforward_gate_dense/kernel")]
    assert len(router) == 2 and all(rel_diff(want[path], start[path]) > 1e-4 for path in router)


def unnumbered(path: str) -> str:
    """A variable's path without the numbers Keras appends to a nested layer's default name (each block's
    `mixtral_sparse_moe_block_8`, another in the copy): the model's own layers keep their names."""
    first, *rest = path.split("/")
    return "/".join([first, *[re.sub(r"_\d+$", "", part) for part in rest]])


HUBNETS = f'''
import keras, keras_hub


def gpt2(input_shape=None, seed=1):
    """GPT2CausalLM from a tiny config, as test_keras_hub.gpt2_lm makes it: a builder (`model._target_`)."""
    keras.utils.set_random_seed(seed)
    backbone = keras_hub.models.GPT2Backbone(vocabulary_size={VOCAB}, num_layers=2, num_heads=2, hidden_dim=8,
                                             intermediate_dim=16, max_sequence_length={SEQ}, dropout=0.0)
    return keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)
'''


@EXTENDED  # the suite's time: GPT2CausalLM trains like Keras in process (the tied read-out, the composition table)
def test_gpt2_from_a_keras_file_and_from_a_builder_trains_on_token_data_through_the_command_line_like_keras(tmp_path):
    """`model=keras` (a GPT2CausalLM saved to a `.keras` file, `model.imports=[keras_hub]`, cut in 2 stages) and
    `model=builder` (the same model from `model._target_`, one stage) trained by `python -m chain` on
    `data=tokens`, whose windows become the model's `token_ids` with a `padding_mask` of ones: the exported
    weights equal Keras' own `train_on_batch` on the batches the run streams (per token, SGD, 2 steps)."""
    from conftest import run_cli

    (tmp_path / "hubnets.py").write_text(HUBNETS)
    (np.arange(40 * SEQ + 1) * 7 % VOCAB).astype(np.uint16).tofile(tmp_path / "train.bin")
    path = str(tmp_path / "gpt2.keras")
    gpt2_lm().save(path)
    common = [
        "mode=e2e",
        "data=tokens",
        f"data.path={tmp_path / 'train.bin'}",
        f"data.seq_len={SEQ}",
        f"data.vocab={VOCAB}",
        f"data.batch_size={BATCH}",
        "data.shuffle=false",
        "pipeline.microbatches=4",
        "optim=sgd",
        "optim.lr=0.1",
        "trainer.steps=2",
        "trainer.progress=false",
    ]
    from_file = ["model=keras", f"model.path={path}", "model.imports=[keras_hub]", "+stages=2", *common]
    runs = {}
    for name, overrides in {
        "file": from_file,
        "builder": ["model._target_=hubnets.gpt2", "+stages=1", *common],
    }.items():
        (tmp_path / name).mkdir()
        r = run_cli(tmp_path / name, *overrides, env={"PYTHONPATH": str(tmp_path)})
        assert r.returncode == 0, r.stderr
        runs[name] = keras.models.load_model(glob.glob(str(tmp_path / name / "outputs" / "*" / "*" / "chain.keras"))[0])

    it = iter(chain.build(chain.compose(from_file)).batches())  # what the runs streamed: the same config
    data = [next(it) for _ in range(2)]
    ids = np.fromfile(tmp_path / "train.bin", np.uint16).astype(np.int32)
    for k, (x, _) in enumerate(data):
        windows = np.stack([ids[i * SEQ : (i + 1) * SEQ] for i in range(k * BATCH, (k + 1) * BATCH)])
        np.testing.assert_array_equal(x["token_ids"], windows)
        np.testing.assert_array_equal(x["padding_mask"], np.ones_like(windows))  # full windows: no padding
    reference = keras.models.load_model(path)
    reference.compile(
        optimizer=keras.optimizers.SGD(0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=False,
    )
    start = [v.numpy() for v in reference.trainable_variables]
    for x, ys in data:
        reference.train_on_batch({k: v.numpy() for k, v in x.items()}, ys["next"].numpy())
    assert rel_diff(reference.trainable_variables[0].numpy(), start[0]) > 1e-3  # the token embedding moved
    for name, trained in runs.items():
        got = [v.numpy() for v in trained.trainable_variables]
        assert len(got) == len(start), name
        for a, b, b0, v in zip(
            got, [v.numpy() for v in reference.trainable_variables], start, reference.trainable_variables
        ):
            if np.abs(b - b0).max() < 1e-8:  # attention's key bias: 0 in exact arithmetic
                continue
            assert rel_diff(a, b) <= 1e-5, (name, v.path)


def test_named_inputs_one_array_cannot_make_are_refused_in_one_line():
    """A model naming an input besides `token_ids`, `padding_mask` and `segment_ids` cannot take the config's
    one array of ids: one line naming the key, when the run's data first meets the model."""
    ids, other = keras.Input((SEQ,), dtype="int32", name="token_ids"), keras.Input((SEQ,), name="positions")
    h = keras.layers.Embedding(VOCAB, 4)(ids) + keras.layers.Dense(4)(keras.ops.expand_dims(other, -1))
    model = keras.Model({"token_ids": ids, "positions": other}, keras.layers.Dense(VOCAB)(h))
    run = chain.build(chain.compose(["+stages=1", *per_token_data()]), model=model)
    with pytest.raises(
        chain.ConfigError, match=r"named inputs \['positions', 'token_ids'\].*no other input \('positions'\)"
    ):
        run.batches()


WORDPIECE = ["[PAD]", "[UNK]", "the", "cat", "sat", "on", "mat", "##s", "a", "dog", ".", ","]
BPE_VOCAB = {
    "<|endoftext|>": 0,
    "a": 1,
    "b": 2,
    "c": 3,
    "Ġ": 4,
    "ab": 5,
    "Ġa": 6,
    "Ġab": 7,
    "d": 8,
    ".": 9,
    "Ċ": 10,
    "Ġc": 11,
}
BPE_MERGES = ["a b", "Ġ a", "Ġa b", "Ġ c"]
TEXTS = {
    "wordpiece": ["the cat sat on the mat. the cats sat, a dog sat on a cat.\n" * 3, "a dog. the mats sat.\n" * 4],
    "bpe": ["ab ab c d. cab dab\nab c\n" * 3, "d c ab. abc\n" * 4],
}


@pytest.mark.parametrize("kind", ["wordpiece", "bpe"])
def test_text_with_a_keras_hub_tokenizer_streams_the_tokenizers_own_ids(tmp_path, monkeypatch, kind):
    """`data=text data.tokenizer=PATH` (a local vocabulary: WordPiece's vocab.txt, byte-pair's vocab.json and
    merges.txt), without tensorflow-text: the ids of each file are keras_hub's own `tokenizer(text)`, the files'
    ids one after the other; the stream's windows are those ids, and the target has the vocabulary's classes."""
    import json

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    if kind == "wordpiece":
        (tmp_path / "vocab.txt").write_text("\n".join(WORDPIECE) + "\n")
        tokenizer = keras_hub.tokenizers.WordPieceTokenizer(vocabulary=str(tmp_path / "vocab.txt"))
        given = str(tmp_path / "vocab.txt")
    else:
        (tmp_path / "vocab.json").write_text(json.dumps(BPE_VOCAB))
        (tmp_path / "merges.txt").write_text("\n".join(BPE_MERGES) + "\n")
        tokenizer = keras_hub.tokenizers.BytePairTokenizer(
            vocabulary=str(tmp_path / "vocab.json"), merges=str(tmp_path / "merges.txt")
        )
        given = str(tmp_path)  # the folder holding both
    for k, text in enumerate(TEXTS[kind]):
        (tmp_path / f"corpus_{k}.txt").write_text(text)
    ids = np.concatenate([np.asarray(tokenizer(text)) for text in TEXTS[kind]])
    assert len(np.unique(ids)) > 5 and len(ids) > 40
    seq, batch = 4, 2
    cfg = chain.compose(
        [
            "+stages=1",
            "mode=e2e",
            "data=text",
            f"data.path={tmp_path / 'corpus_*.txt'}",
            f"data.tokenizer={given}",
            f"data.seq_len={seq}",
            f"data.batch_size={batch}",
            "data.shuffle=false",
            "data.val_fraction=0",
            "trainer.progress=false",
            "checkpoint.export=false",
        ]
    )
    vocab = tokenizer.vocabulary_size()
    model = keras.Sequential(
        [keras.Input((seq,), dtype="int32"), keras.layers.Embedding(vocab, 4), keras.layers.Dense(vocab)]
    )
    run = chain.build(cfg, model=model)
    assert run.dataset.info.target("next").classes == vocab
    it = iter(run.batches())
    for step in range(3):
        x, ys = next(it)
        starts = [(step * batch + i) * seq for i in range(batch)]
        np.testing.assert_array_equal(x, np.stack([ids[s : s + seq] for s in starts]))
        np.testing.assert_array_equal(ys["next"], np.stack([ids[s + 1 : s + seq + 1] for s in starts]))
    assert np.isfinite(run.step(x, ys)["loss"])


@pytest.mark.parametrize(
    "files, given, message",
    [
        ({"vocab.json": "{}"}, "vocab.json", "is a byte-pair vocabulary, which needs merges.txt beside it"),
        ({}, "missing.txt", "the file does not exist"),
        ({"vocab.bin": ""}, "vocab.bin", "is neither a vocab.txt"),
    ],
)
def test_a_bad_tokenizer_is_one_line_naming_the_key(tmp_path, files, given, message):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "corpus.txt").write_text("the cat sat\n" * 20)
    with pytest.raises(chain.ConfigError, match=rf"^data.tokenizer=.*{message}"):
        chain.prepare(
            [
                "+stages=1",
                "mode=e2e",
                "data=text",
                f"data.path={tmp_path / 'corpus.txt'}",
                f"data.tokenizer={tmp_path / given}",
                "data.seq_len=4",
            ]
        )


def gpt2_per_token(static: bool) -> keras.Model:
    """GPT2CausalLM as shipped (its `(batch, seq, vocab)` logits); `static`: called on token ids of a fixed
    length, its padding mask all ones (`ops.ones_like`, an op kept on the first stage), the backbone's own
    graph still open in its length (None) inside."""
    lm = gpt2_lm()
    if not static:
        return lm
    ids = keras.Input((SEQ,), dtype="int32", name="token_ids")
    return keras.Model(ids, lm({"token_ids": ids, "padding_mask": keras.ops.ones_like(ids)}), name="gpt2_static")


@pytest.mark.parametrize(
    "static",
    # the suite's time: as shipped runs every time; the static length is scripts/bench_lm.py's model
    [False, pytest.param(True, marks=EXTENDED)],
    ids=["as-shipped", "static-length"],
)
def test_gpt2_causal_lm_per_token_cut_between_blocks_trains_like_keras(tmp_path, static):
    """The next token learnt at every position (padding left out, `ignore_class=0`), the model cut between
    its blocks (the hidden states and the padding mask cross): stages built from a graph whose sequence
    length is open (None) take the length the stage before gives, or any. 3 SGD steps equal Keras' own
    `train_on_batch` with the same loss."""
    lm, reference = gpt2_per_token(static), gpt2_per_token(static)
    steps = [
        (x["token_ids"] if static else x, np.roll(x["token_ids"], -1, axis=1) * x["padding_mask"])
        for x, _ in batches(3)
    ]
    ids = np.arange(VOCAB * SEQ).reshape(VOCAB, SEQ) % VOCAB  # the data set declares the target: SEQ ids of VOCAB
    np.savez(tmp_path / "ids.npz", x=ids, y=ids)
    run = chain.build(
        chain.compose(
            [
                "+stages=2",
                "placement.split=[5,3]",
                "pipeline.schedule=gpipe",
                "mode=e2e",
                "pipeline.microbatches=4",
                "data=npz",
                f"data.path={tmp_path / 'ids.npz'}",
                "data.x=x",
                "data.y=y",
                f"data.batch_size={BATCH}",
                "data.val_fraction=0",
                "ignore_class=0",
                "trainer.progress=false",
                "checkpoint.export=false",
                "optim=sgd",
                "optim.lr=0.1",
            ]
        ),
        model=lm,
    )
    assert "transformer_layer_1" in [layer.name for layer in run.stages[1].model.layers]
    assert run.stages[-1].model.output_shape == (None, SEQ if static else None, VOCAB)
    reference.compile(
        optimizer=keras.optimizers.SGD(0.1),
        jit_compile=False,
        weighted_metrics=[],  # the loss alone
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=0),
    )
    start = {v.path: v.numpy() for v in reference.trainable_variables}
    assert_trained_like_keras(run, reference, steps, start)
    want = {v.path: v.numpy() for v in reference.trainable_variables}
    assert rel_diff(want["token_embedding/embeddings"], start["token_embedding/embeddings"]) > 1e-3


def esm2_classifier() -> keras.Model:
    """ESM2Backbone as shipped (its one input a dict of one key, `{"token_ids"}`: the padding is id 0) with a
    classifier head on its first position."""
    keras.utils.set_random_seed(5)
    backbone = keras_hub.models.ESM2Backbone(
        vocabulary_size=VOCAB,
        num_layers=2,
        num_heads=2,
        hidden_dim=8,
        intermediate_dim=16,
        max_sequence_length=SEQ,
        dropout=0.0,
    )
    first = backbone(backbone.input)[:, 0, :]
    return keras.Model(backbone.input, keras.layers.Dense(VOCAB, name="head")(first), name="esm2_classifier")


def one_key_encoder() -> keras.Model:
    """The smallest model of one named input, `{"token_ids"}`."""
    keras.utils.set_random_seed(6)
    ids = keras.Input((None,), dtype="int32", name="token_ids")
    h = keras.layers.GlobalAveragePooling1D(name="pool")(keras.layers.Embedding(VOCAB, 4, name="token_embedding")(ids))
    return keras.Model({"token_ids": ids}, keras.layers.Dense(VOCAB, name="head")(h), name="one_key")


@pytest.mark.parametrize(
    "make, stages",
    # the suite's time: a dict of one key runs every time (one-key-K1), named inputs cut between blocks in
    # test_structured_cuts
    [pytest.param(esm2_classifier, 2, marks=EXTENDED), (one_key_encoder, 1)],
    ids=["esm2-K2", "one-key-K1"],
)
def test_a_dict_of_one_key_is_matched_to_the_models_input_by_name(make, stages):
    """ESM2 takes `{"token_ids": x}` (before: Keras' `Missing data for input "input_layer"`, the first stage's
    input made unnamed, at every K): `run.forward` and `run.step` take the dict, equal to `model.predict` and
    Keras' own `train_on_batch`, cut between ESM2's blocks, and a model of one named input whole."""
    data = [({"token_ids": x["token_ids"]}, y) for x, y in batches(3)]
    predicts_and_trains_like_keras(make, data, stages, "gpipe", between_blocks(make, 2) if stages == 2 else [])


def test_gpt2_causal_lm_is_planned_by_plan_auto_cut_between_its_blocks_and_trains_bit_for_bit_like_by_hand(
    tmp_path, monkeypatch
):
    """Issue 51: placement.plan=auto times GPT2CausalLM's pieces on what they take (its dict of token ids within
    `data.vocab` and a padding mask of ones). Its `padding_mask` crosses every cut between its blocks beside the
    hidden state: plan=auto's links end there too (before: only after the last block, where one tensor crosses:
    a plan of two stages put every block on the first), each timed on both tensors, the mask's values counted in
    what the cut sends. Two stages asked of the search (on one physical device any K ties, and the fewest wins):
    the cut falls between the blocks, the plan table lists it, and the run trains bit for bit like its overrides
    written by hand."""
    from chain.autoplan import cache, choice, settle, table
    from chain.stages.cut import analyse

    monkeypatch.setattr(choice, "stage_counts", lambda settings, costs: [2])
    base = ["+stages=2", *per_token_data(), "placement.plan_budget_s=0.05"]
    auto = chain.build(chain.compose([*base, "placement.plan=auto"]), str(tmp_path), model=gpt2_lm())
    plan = auto.auto_plan
    text = table.render(plan)
    assert (
        text.startswith("placement.plan=auto: the best")
        and "chosen: " + " ".join(plan.chosen.candidate.overrides()) in text
    )
    layers = [layer.name for layer in analyse(gpt2_lm(), "gpt2").layers]
    second = [i for i, name in enumerate(layers) if name.startswith(BLOCKS)][1]
    assert plan.chosen.candidate.split == (second, len(layers) - second)
    costs = cache.read(str(tmp_path / settle.CACHE)).costs
    assert costs.crossing[[b for _, b in costs.links].index(second)] == SEQ + SEQ * 8  # the mask and the state
    hand = chain.build(chain.compose([*base, *plan.chosen.candidate.overrides()]), model=gpt2_lm())
    for x, y in token_batches(2):
        assert auto.step(x, {"next": y})["loss"] == hand.step(x, {"next": y})["loss"]
    for a, b in zip(auto.stages, hand.stages, strict=True):
        for u, v in zip(a.trainable_variables, b.trainable_variables, strict=True):
            np.testing.assert_array_equal(u.numpy(), v.numpy())


def shipped(seed: int, backbone: type, task: type, **config) -> keras.Model:
    """keras_hub's `task` as shipped (no preprocessor) over a tiny `backbone(**config)` of random weights."""
    keras.utils.set_random_seed(seed)
    return task(backbone=tiny(backbone, **config), preprocessor=None)


def tiny(backbone: type, **config) -> keras.Model:
    """`backbone` from a tiny config (random weights, the caller's seed): `config` over 1 block of width 8; a key
    `config` gives as None is left out (a backbone without it: Falcon's `num_heads`)."""
    small = {
        "vocabulary_size": VOCAB,
        "num_layers": 1,
        "num_heads": 2,
        "hidden_dim": 8,
        "intermediate_dim": 16,
        "dropout": 0.0,
    }
    return backbone(**{k: v for k, v in {**small, **config}.items() if v is not None})


def opt_lm() -> keras.Model:
    """OPTCausalLM as shipped: its read-out calls the token embedding inside its embedding layer
    (`embeddings.token_embedding(x, reverse=True)`), a tie through a nested layer. Two blocks: cut between them."""
    models = keras_hub.models
    return shipped(5, models.OPTBackbone, models.OPTCausalLM, num_layers=2, max_sequence_length=SEQ)


def bart_lm() -> keras.Model:
    """BartSeq2SeqLM as shipped: the encoder and the decoder call one `token_embedding`, the read-out again."""
    return shipped(6, keras_hub.models.BartBackbone, keras_hub.models.BartSeq2SeqLM, max_sequence_length=SEQ)


def t5_lm() -> keras.Model:
    """T5Seq2SeqLM as shipped: the encoder and the decoder call one `token_embedding`, the read-out again."""
    return shipped(7, keras_hub.models.T5Backbone, keras_hub.models.T5Seq2SeqLM, key_value_dim=4)


def albert_classifier() -> keras.Model:
    """AlbertBackbone as designed (`num_groups=1`, `num_inner_repetitions=1`: one block called at every depth,
    3 here) with a classifier head on its pooled output."""
    keras.utils.set_random_seed(8)
    backbone = keras_hub.models.AlbertBackbone(
        vocabulary_size=VOCAB,
        num_layers=3,
        num_heads=2,
        embedding_dim=4,
        hidden_dim=8,
        intermediate_dim=16,
        num_groups=1,
        num_inner_repetitions=1,
        max_sequence_length=SEQ,
        dropout=0.0,
    )
    pooled = backbone(backbone.input)["pooled_output"]
    return keras.Model(backbone.input, keras.layers.Dense(VOCAB, name="head")(pooled), name="albert_classifier")


def seq2seq_batches(n: int):
    """`n` batches of a sequence-to-sequence model's four named inputs, both sides padded."""
    rng = np.random.default_rng(1)
    out = []
    for (enc, _), (dec, _) in zip(batches(n), batches(n + 1)[1:]):
        x = {
            "encoder_token_ids": enc["token_ids"],
            "encoder_padding_mask": enc["padding_mask"],
            "decoder_token_ids": dec["token_ids"],
            "decoder_padding_mask": dec["padding_mask"],
        }
        out.append((x, rng.integers(0, VOCAB, BATCH).astype("int32")))
    return out


# Shared weights in every form, each model in 2 stages: (the model, its batches, the layers of each stage, the
# layer stage 1 begins with, the shared weight's path).
SHARED = {
    # the read-out (stage 1) calls the token embedding inside stage 0's embedding layer
    "opt": (next_token(opt_lm), batches(3), [2, 3], "transformer_layer_1", "embeddings/token_embedding/embeddings"),
    # both embedding calls on stage 0 (the decoder's right after the encoder's), the read-out's on stage 1
    "bart": (
        next_token(bart_lm),
        seq2seq_batches(3),
        [10, 3],
        "transformer_encoder_layer_0",
        "token_embedding/embeddings",
    ),
    "t5": (next_token(t5_lm), seq2seq_batches(3), [7, 4], "transformer_decoder_layer_0", "token_embedding/embeddings"),
    # the block's first call on stage 0, its second and third on stage 1
    "albert": (
        albert_classifier,
        batches(3, segments=True),
        [8, 4],
        "group_0_inner_layer_0",
        "group_0_inner_layer_0/feedforward_output_dense/kernel",
    ),
}


@pytest.mark.parametrize(
    "name, devices",
    _cases(
        [*((name, "two") for name in SHARED), ("opt", "one"), ("albert", "one")],
        # the suite's time: OPT on two devices runs every time, a borrowed weight on one device
        # test_gpt2_tied_embedding_on_two_stages_of_one_device_is_one_variable_and_trains_like_keras
        {("t5", "two"), ("albert", "one"), ("opt", "one")},
    ),
)
def test_a_layer_called_again_or_inside_another_is_one_weight_and_trains_like_keras(name, devices):
    """OPT's tie through a nested layer, BART's and T5's embedding shared by encoder and decoder (and the read-out),
    ALBERT's one block called at every depth: cut into 2 stages with calls of the shared layer on both, they
    predict like `model.predict` and 3 SGD steps (GPipe, M=1) equal Keras' `train_on_batch`. On two devices each stage holds
    a copy (`Stage.shared`, gradients summed); on one device (`placement.devices=[/CPU:0,/CPU:0]`) the later
    stage reads the earlier one's variable (`Stage.borrowed`) and holds none. Checkpoints save the weight once
    (the later copy is one `tied_copies` leaves out) and the export (the model uncut) holds each weight once,
    predicting what the chain predicts."""
    from chain.state.export import uncut
    from chain.steps.tied import groups

    make, data, split, begins, tied = SHARED[name]
    one = ["placement.devices=[/CPU:0,/CPU:0]"] if devices == "one" else []
    run = predicts_and_trains_like_keras(
        make,
        data,
        2,
        "gpipe",
        [f"placement.split={split}", *one, "pipeline.microbatches=1"],
        tied=tied,
        numbered="t5_layer_norm",
    )
    first, last = run.stages
    assert [x for x in last.model.layers if not isinstance(x, keras.layers.InputLayer)][0].name.startswith(begins)
    if devices == "one":
        assert tied in [b.name for b in last.borrowed] and not last.shared and not groups(run.stages)
        assert all(v.path != tied for v in last.trainable_variables)
    else:
        assert tied in groups(run.stages)  # a copy on each stage: the later one's value is the first's
    whole = uncut(run.stages)  # the stages' weights (the reference's, as compared above), each once (a second
    shared = {c.name for s in run.stages for c in s.shared}  # variable of a path would be `path#1`)
    assert set(paths(whole.trainable_variables, "t5_layer_norm")) == set(
        paths([v for s in run.stages for v in s.trainable_variables], "t5_layer_norm", shared)
    )
    x = data[0][0]
    np.testing.assert_allclose(whole(x), run.forward(x)["body_1"], rtol=0, atol=1e-6)


def test_gpt2_causal_lm_balanced_by_time_is_cut_between_its_blocks(monkeypatch):
    """Issue 51: `placement.balance=time` timed only the links where one tensor crosses. GPT2CausalLM's
    `padding_mask` crosses every cut between its blocks beside the hidden state, so its blocks were one link,
    and the split put every block on the first stage (bench_lm's model: [8, 2]). In mode=e2e it now times
    plan=auto's links (`Cuttable.points(several=True)`): the cut falls between the two blocks. A link's time
    is set (1 per block it holds, else 0.01): on this tiny model measured times are close enough that a loaded
    machine's noise moved the split."""
    from chain.stages import timing
    from chain.stages.cut import analyse

    def blocks_held(model, x, device, overhead):
        return sum(layer.name.startswith(BLOCKS) for layer in model.layers) or 0.01, 1

    monkeypatch.setattr(timing, "_time_link", blocks_held)
    run = chain.build(chain.compose(["+stages=2", *per_token_data(), "placement.balance=time"]), model=gpt2_lm())
    layers = [layer.name for layer in analyse(gpt2_lm(), "gpt2").layers]
    second = [i for i, name in enumerate(layers) if name.startswith(BLOCKS)][1]
    (note,) = [n for n in run.assignment.notes if n.startswith("placement.balance=time: split ")]
    assert note.startswith(f"placement.balance=time: split [{second}, {len(layers) - second}]"), note
