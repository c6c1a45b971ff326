"""`model=gpt`: the built-in decoder-only transformer, cut into the chain's stages. Oracles: the same Keras
model on one device (`model.predict`, and Keras' own `train_on_batch` with SGD and the per-token loss);
config errors are one line naming the key."""

from __future__ import annotations

import keras
import numpy as np
import pytest

import chain
from chain.errors import ConfigError
from compare import assert_trained_like_keras, rel_diff
from conftest import EXTENDED

SEQ, BATCH = 8, 8


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A few KB of UTF-8 text (data=text's bytes)."""
    d = tmp_path_factory.mktemp("corpus")
    words = "the quick brown fox jumps over the lazy dog; naïve café, déjà vu\n"
    (d / "a.txt").write_text(words * 40)
    return str(d / "*.txt")


def gpt_run(corpus: str, *extra: str) -> list[str]:
    return [
        "mode=e2e",
        "model=gpt",
        "data=text",
        f"data.path={corpus}",
        f"data.seq_len={SEQ}",
        f"data.batch_size={BATCH}",
        "model.width=8",
        "model.heads=2",
        "model.depth=2",
        "trainer.progress=false",
        "checkpoint.export=false",
        "optim=sgd",
        "optim.lr=0.5",
        *extra,
    ]


def batches(n: int):
    rng = np.random.default_rng(0)
    return [
        (rng.integers(0, 256, (BATCH, SEQ)).astype("int32"), rng.integers(0, 256, (BATCH, SEQ)).astype("int32"))
        for _ in range(n)
    ]


@pytest.mark.parametrize(
    "stages, schedule, tied",
    # the suite's time: the tied read-out trains like one device every time (copies and mirrored, below)
    [pytest.param(2, "1f1b", True, marks=EXTENDED), (3, "gpipe", False)],
)
def test_gpt_cut_into_stages_predicts_and_trains_like_the_same_model_on_one_device(corpus, stages, schedule, tied):
    from chain.stages import gpt

    cfg = chain.compose(
        gpt_run(
            corpus,
            f"+stages={stages}",
            f"pipeline.schedule={schedule}",
            "pipeline.microbatches=4",
            f"model.tied={str(tied).lower()}",
        )
    )
    run = chain.build(cfg)
    spec = cfg.stages[0].model
    assert spec.seq_len == SEQ  # taken from data.seq_len
    keras.utils.set_random_seed(cfg.seed)  # as the chain seeds its models
    reference = gpt.build(spec)
    data = batches(3)
    x = data[0][0]
    np.testing.assert_allclose(
        run.forward(x)[f"body_{stages - 1}"].numpy(), reference.predict(x, verbose=0), rtol=0, atol=1e-6
    )
    reference.compile(
        optimizer=keras.optimizers.SGD(0.5),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=False,
    )
    start = {v.path: v.numpy() for v in reference.trainable_variables}
    assert_trained_like_keras(run, reference, data, start)
    want = {v.path: v.numpy() for v in reference.trainable_variables}
    assert rel_diff(want["token_embedding/embeddings"], start["token_embedding/embeddings"]) > 1e-3  # it learned
    names = [[layer.name for layer in s.model.layers] for s in run.stages]
    assert ("token_embedding" in names[-1]) == tied  # tied: the read-out is the embedding, on the last stage too


@pytest.mark.parametrize("copies", ["replicas", "mirrored"])
def test_gpt_with_its_tied_read_out_trains_like_one_device_with_copies_of_the_pipeline_and_mirrored(
    corpus, copies, tmp_path
):
    """model=gpt's default tied read-out on 2 stages x 2 copies (4 devices), and its network under the mirrored
    fallback: 3 SGD steps equal Keras' own on one device. (The mirrored replicas read only TFRecord streams
    of their own, and data=text is a stream: the network is given as the user's model, on `.npz` token ids.)"""
    from chain.stages import gpt

    cfg = chain.compose(gpt_run(corpus, "+stages=2", "placement.replicas=2"))
    keras.utils.set_random_seed(cfg.seed)  # as the chain seeds its models
    reference = gpt.build(cfg.stages[0].model)
    if copies == "replicas":
        run = chain.build(cfg)
    else:
        ids = np.random.default_rng(1).integers(0, 256, (4 * BATCH, SEQ + 1)).astype("int32")
        np.savez(tmp_path / "ids.npz", x=ids[:, :-1], y=ids[:, 1:])
        keras.utils.set_random_seed(cfg.seed)  # the reference's weights
        run = chain.build(
            chain.compose(
                [
                    *[o for o in gpt_run(corpus) if not o.startswith(("model", "data"))],
                    "+stages=2",
                    "data=npz",
                    f"data.path={tmp_path / 'ids.npz'}",
                    "data.x=x",
                    "data.y=y",
                    f"data.batch_size={BATCH}",
                    "data.val_fraction=0",
                    "placement.fallback=mirrored",
                ]
            ),
            model=gpt.build(cfg.stages[0].model),
        )
    reference.compile(
        optimizer=keras.optimizers.SGD(0.5),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=False,
    )
    start = {v.path: v.numpy() for v in reference.trainable_variables}
    assert_trained_like_keras(run, reference, batches(3), start)
    assert [len(s.shared) for s in run.stages] == [1, 1]  # the embedding on both stages


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["mode=local"], "model=gpt is one network trained by one per-token loss: it needs mode=e2e (is local)"),
        (["data=digits"], "model=gpt reads token ids: it needs data=text, tokens, npz or tfrecord (is data=digits)"),
        (["model.seq_len=16"], "model.seq_len=16 differs from data.seq_len=8"),
        (["model.vocab=300"], "model.vocab=300 differs from data=text's 256 token ids"),
        (["model.heads=3"], "model.width=8 must be a multiple of model.heads=3"),
        (["+stages=[{},{model: mlp}]"], "model=gpt cuts one model into every stage"),
    ],
)
def test_model_gpt_refuses_what_it_cannot_train_in_one_line(corpus, overrides, message):
    base = gpt_run(corpus)
    if overrides == ["data=digits"]:
        base = [o for o in base if not o.startswith("data.")]
    with pytest.raises(ConfigError) as e:
        chain.compose([*base, *overrides])
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.fixture(scope="module")
def trained(corpus, tmp_path_factory):
    """A short model=gpt run on 2 stages (its exports: stage_NN.keras, chain.keras)."""
    from conftest import run_cli

    cwd = tmp_path_factory.mktemp("gpt_run")
    r = run_cli(
        cwd,
        *gpt_run(
            corpus,
            "+stages=2",
            "pipeline.microbatches=2",
            "optim=adamw",
            "optim.lr=0.01",
            "trainer.steps=30",
            "checkpoint.export=true",
            "hydra.run.dir=run",
        ),
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return cwd


def generate(cwd, *args: str):
    from conftest import run_cli

    return run_cli(cwd, *args, module="chain.generate")


def oracle(path, prompt: bytes, n: int) -> bytes:
    """The argmax loop over the exported whole model's `predict` (the window: the last SEQ bytes, padded
    on the right; read at the context's last position)."""
    model = keras.models.load_model(path)
    ids = list(prompt)
    for _ in range(n):
        context = ids[-SEQ:]
        x = np.zeros((1, SEQ), "int32")
        x[0, : len(context)] = context
        ids.append(int(np.argmax(model.predict(x, verbose=0)[0, len(context) - 1])))
    return bytes(ids)


def test_generate_continues_the_prompt_greedily_as_the_exported_model_predicts(trained):
    first = generate(trained, "run", "--prompt", "the qu", "--tokens", "12")
    again = generate(trained, "run", "--prompt", "the qu", "--tokens", "12")
    assert first.returncode == 0, first.stderr
    assert first.stdout == again.stdout
    assert first.stdout == oracle(trained / "run" / "chain.keras", b"the qu", 12).decode(errors="replace") + "\n"


def test_the_exports_load_with_plain_keras_in_a_fresh_interpreter_after_import_chain(trained):
    """`import chain` imports no Keras, yet registers chain's Keras classes once Keras is imported (here by
    TensorFlow's import, which looks Keras up before it imports it): a fresh interpreter loads the run's
    chain.keras (its TokenEmbedding) and stage files with `keras.models.load_model`, and the whole model
    computes as it does here."""
    import json
    import os
    import subprocess
    import sys

    run = trained / "run"
    paths = [str(run / name) for name in ("chain.keras", "stage_00.keras", "stage_01.keras")]
    code = (
        "import json, sys, numpy as np, chain\n"
        "assert 'keras' not in sys.modules\n"
        "import tensorflow, keras\n"
        f"models = [keras.models.load_model(p) for p in {paths!r}]\n"
        f"x = np.arange({SEQ}, dtype='int32')[None]\n"
        "print(json.dumps(np.asarray(models[0](x)).tolist()))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
    )
    assert out.returncode == 0, out.stderr[-2000:]
    here = np.asarray(keras.models.load_model(paths[0])(np.arange(SEQ, dtype="int32")[None]))
    np.testing.assert_allclose(np.array(json.loads(out.stdout.splitlines()[-1])), here, rtol=1e-5, atol=1e-6)


def test_a_module_of_chain_that_imports_keras_first_registers_chains_classes_without_an_import_cycle():
    """Keras' import may end inside the import of any module of chain (here `chain.stages.stage`, the first to
    import Keras): registering chain's classes then imports only `chain.stages.savable`, never a module half
    imported (before, `chain.stages.cut` imported the half-imported `stage`: ImportError)."""
    import os
    import subprocess
    import sys

    code = (
        "import chain.stages.stage, keras\n"
        "names = keras.saving.get_custom_objects()\n"
        "assert all(f'chain>{n}' in names for n in ('TokenEmbedding', 'Lent', 'MaskOf', 'WithMask', 'Warmup'))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
    )
    assert out.returncode == 0, out.stderr[-2000:]


def test_generate_samples_reproducibly_at_a_temperature_and_crops_a_long_prompt(trained):
    runs = [
        generate(
            trained,
            "run",
            "--prompt",
            "the lazy dog jumps",
            "--tokens",
            "20",
            "--temperature",
            "1.5",
            "--seed",
            str(seed),
        )
        for seed in (1, 1, 2)
    ]
    assert all(r.returncode == 0 for r in runs), runs[0].stderr
    assert runs[0].stdout == runs[1].stdout != runs[2].stdout
    assert runs[0].stdout.startswith("the lazy dog jumps")
    assert "note: the prompt is 18 bytes, the model reads 8 (model.seq_len): it continues the last 8" in runs[0].stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["nowhere", "--prompt", "x"], "error: nowhere: no such run directory"),
        (["run", "--prompt", ""], "error: --prompt is empty"),
        (["run", "--prompt", "x", "--tokens", "0"], "error: --tokens=0 must be at least 1"),
        (["run", "--prompt", "x", "--temperature", "-1"], "error: --temperature=-1.0 must be a finite number >= 0"),
        (["run"], "error: the following arguments are required: --prompt"),
    ],
)
def test_generate_refuses_bad_input_in_one_line(trained, args, message):
    r = generate(trained, *args)
    assert r.returncode == 2 and r.stderr.startswith(message) and r.stderr.count("\n") == 1, r.stderr


def test_generate_refuses_a_run_that_is_not_a_byte_level_language_model(tmp_path):
    import chain.config.hydra as hydra_config
    from omegaconf import OmegaConf

    (tmp_path / "digits" / ".hydra").mkdir(parents=True)  # the config a default run (digits, mode=local) writes
    OmegaConf.save(hydra_config.compose_config([]), tmp_path / "digits" / ".hydra" / "config.yaml")
    r = generate(tmp_path, "digits", "--prompt", "x")
    assert r.returncode == 2 and "is not a language model's run (mode=local, data=digits)" in r.stderr
    (tmp_path / "wordpiece" / ".hydra").mkdir(parents=True)  # text tokenized by keras_hub: its ids are not bytes
    OmegaConf.save(
        hydra_config.compose_config(["mode=e2e", "model=gpt", "data=text", "data.tokenizer=vocab.txt"]),
        tmp_path / "wordpiece" / ".hydra" / "config.yaml",
    )
    r = generate(tmp_path, "wordpiece", "--prompt", "x")
    assert r.returncode == 2 and r.stderr == (
        "error: wordpiece learned data.tokenizer=vocab.txt's ids, not bytes: generate "
        "continues a byte-level model's text (data=text with data.tokenizer=null) "
        "or ids (data=tokens)\n"
    ), r.stderr


@EXTENDED  # the suite's time: generate continues a text run's prompt as the exported model predicts every time
def test_generate_continues_ids_of_a_token_file_run_as_the_exported_model_predicts(tmp_path):
    """data=tokens (ids without a tokenizer): the prompt and the output are ids; greedy equals the oracle."""
    from conftest import run_cli

    rng = np.random.default_rng(0)
    rng.integers(0, 300, 4000).astype(np.uint16).tofile(tmp_path / "train.bin")
    r = run_cli(
        tmp_path,
        "mode=e2e",
        "model=gpt",
        "model.vocab=300",
        "model.width=8",
        "model.heads=2",
        "model.depth=1",
        "data=tokens",
        "data.path=train.bin",
        "data.vocab=300",
        f"data.seq_len={SEQ}",
        "trainer.steps=2",
        "trainer.progress=false",
        "hydra.run.dir=run",
    )
    assert r.returncode == 0, r.stderr[-2000:]
    out = generate(tmp_path, "run", "--prompt", "5 299 17", "--tokens", "6")
    assert out.returncode == 0, out.stderr
    model = keras.models.load_model(tmp_path / "run" / "chain.keras")
    ids = [5, 299, 17]
    for _ in range(6):
        x = np.zeros((1, SEQ), "int32")
        x[0, : len(ids[-SEQ:])] = ids[-SEQ:]
        ids.append(int(np.argmax(model.predict(x, verbose=0)[0, len(ids[-SEQ:]) - 1])))
    assert out.stdout == " ".join(map(str, ids)) + "\n"
    bad = generate(tmp_path, "run", "--prompt", "5 300")
    assert bad.returncode == 2 and bad.stderr == "error: --prompt holds the id 300, but the model's ids are 0..299\n"


def test_gpt_is_balanced_by_measured_time(corpus):
    """placement.balance=time times each piece's forward and backward (an embedding's gradient is sparse)."""
    run = chain.build(chain.compose(gpt_run(corpus, "+stages=2", "placement.balance=time")))
    assert any(n.startswith("placement.balance=time: split [") for n in run.notes)
