"""Exports: each stage as `stage_NN.keras` (and `head_NN.keras`), the whole chain as `chain.keras`.

The files hold layer configs and weights only, no device code: they load with plain
`keras.models.load_model` on any machine. `chain.keras` is one Sequential model (a functional one for named inputs) of
every stage's model in order, ending in what the last stage predicts (its head in
mode=local; in mode=e2e the last stage's model already ends in the read-out), so
`load_model("chain.keras").predict(x)` gives the chain's prediction. A model cut into stages
with a tied weight is exported as the user's own model (its weight once), not as nested stages.
"""

from __future__ import annotations

import os
from typing import Sequence

import keras

from chain.stages import named_inputs
from chain.stages.stage import Stage, stage_name

CHAIN_FILE = "chain.keras"


def chain_model(stages: Sequence[Stage]) -> keras.Model:
    """One Sequential model of the stages' models in order (shared, so the weights are the
    trained ones), ending in the last stage's head if it has one. Stage models nest whole,
    so a stage whose layers are not a plain sequence (a user's block with a skip
    connection) exports as it computes. A cut model with a tied weight (held by several
    stages, one copy each) exports as the user's own model instead (`uncut`): one copy."""
    if stages[0].whole is not None and any(s.shared for s in stages):
        return uncut(stages)
    parts = [s.model for s in stages] + ([stages[-1].head] if stages[-1].head is not None else [])
    first = named_inputs.named(stages[0].model)
    if first is not None:  # named inputs (a keras_hub model from a builder): one shape cannot say them
        inputs = {k: keras.Input(t.shape[1:], dtype=t.dtype, name=k) for k, t in first.items()}
        h = inputs
        for part in parts:
            h = part(h)
        return keras.Model(inputs, h, name="chain")
    return keras.Sequential([keras.Input(stages[0].model.input_shape[1:])] + parts, name="chain")


def _save(model: keras.Model, path: str) -> None:
    # Keras writes the zip in place; a temporary name plus rename keeps a killed export
    # from leaving a truncated file under the real name.
    tmp = f"{path[: -len('.keras')]}.tmp.keras"
    model.save(tmp)
    os.replace(tmp, path)


def export(stages: Sequence[Stage], run_dir: str, chained: bool = True) -> list[str]:
    """Write every stage, head and (`chained`) the whole chain into `run_dir`; returns the paths
    written. Independent models (mode=side_by_side) are no chain: each is its stage and head."""
    written = []
    for s in stages:
        parts = [(s.model, stage_name(s.index))]
        if s.head is not None:
            parts.append((s.head, f"head_{s.index:02d}"))
        for model, name in parts:
            path = os.path.join(run_dir, f"{name}.keras")
            _save(model, path)
            written.append(path)
    if chained:
        path = os.path.join(run_dir, CHAIN_FILE)
        _save(chain_model(stages), path)
        written.append(path)
    return written


def uncut(stages: Sequence[Stage]) -> keras.Model:
    """The cut model re-created uncut (`Stage.whole`), each layer given the trained weights of its
    stage's copy (layers keep the user's names across the cut). A tied weight is one variable
    there, set from whichever stage's copy comes last: the copies are equal. A layer inside another
    that the model also calls (OPT's read-out, its embedding layer's token embedding) takes its weights
    with its holder's when no stage holds it apart."""
    model = stages[0].whole()
    trained = {layer.name: layer for s in stages for layer in s.model.layers}
    for layer in model.layers:
        if layer.weights and layer.name in trained:
            layer.set_weights(trained[layer.name].get_weights())
    return model
