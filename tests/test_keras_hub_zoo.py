"""The keras_hub zoo (tests/keras_hub_zoo.py: keras_hub 0.32 architectures from tiny configs, random weights, no
download) cut into 2 stages (GPipe, M=2; between the first two transformer blocks) and, where the blocks are
layers of their own, 4 (1F1B, M=4): predictions equal `model.predict` on padded inputs and 3 SGD steps equal
Keras' own `train_on_batch` (losses and every weight within 1e-5; test_keras_hub's
`predicts_and_trains_like_keras`).

Every run takes `DEFAULT` (a decoder of ALiBi attention, a vision model; the encoders' kind is test_keras_hub's
BERT), the rest with `CHAIN_TEST_ZOO=all` (docs/your-models.md lists each model and its command): the suite's time
cannot carry all."""

from __future__ import annotations

import os

import pytest

from keras_hub_zoo import ZOO
from test_keras_hub import between_blocks, predicts_and_trains_like_keras

DEFAULT = {("bloom", 4), ("vit", 2)}  # (model, stages) in every run
SKIPPED = "the whole keras_hub zoo runs with CHAIN_TEST_ZOO=all (docs/your-models.md)"
SCHEDULES = {2: ("gpipe", 2), 4: ("1f1b", 4)}  # stages -> (schedule, microbatches)


def cases():
    """Each model in 2 stages and, unless its blocks are one layer, in 4; skipped outside `DEFAULT` unless
    `CHAIN_TEST_ZOO=all`."""
    rest = pytest.mark.skipif(os.environ.get("CHAIN_TEST_ZOO") != "all", reason=SKIPPED)
    for name, species in ZOO.items():
        for stages in (2, 4) if species.blocks else (2,):
            yield pytest.param(name, stages, id=f"{name}-K{stages}", marks=() if (name, stages) in DEFAULT else rest)


@pytest.mark.parametrize("name, stages", list(cases()))
def test_keras_hub_zoo_model_cut_into_stages_predicts_and_trains_like_keras(name, stages):
    species = ZOO[name]
    schedule, microbatches = SCHEDULES[stages]
    cut = between_blocks(species.make, stages, species.blocks) if species.blocks else []
    predicts_and_trains_like_keras(
        species.make,
        species.data(3),
        stages,
        schedule,
        [*cut, f"pipeline.microbatches={microbatches}"],
        tied=species.moved,
        numbered=species.numbered,
        base=species.base() if species.base else None,
    )
