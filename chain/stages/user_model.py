"""The user's one model that the build cuts into stages and `placement.plan=auto` measures: `model=keras`'s
file (`load_model`: `model.imports` first; what Keras cannot rebuild is one line) and `model=gpt`'s transformer
(`gpt_model`, taking ids of the width the data gives them).
"""

from __future__ import annotations

import re

import keras

from chain.config.schema import KerasModel, Settings
from chain.errors import ConfigError, first_line


def load_model(spec: KerasModel) -> keras.Model:
    """The model of `model.path`, after importing `model.imports`; what Keras cannot rebuild is one line."""
    import importlib

    for module in spec.imports:
        try:
            importlib.import_module(module)
        except Exception as e:  # an import runs the user's code: anything may be raised
            raise ConfigError(f"model.imports: cannot import {module!r} ({type(e).__name__}: {e})") from None
    path = spec.path
    try:
        return keras.models.load_model(path, compile=False, safe_mode=spec.safe_mode)
    except Exception as e:  # Keras raises many kinds for a file it cannot read
        text = str(e).strip()
        if "deserialization of a `Lambda`" in text:
            raise ConfigError(
                f"model.path={path!r} holds Python code (a Lambda layer) that Keras runs only when told "
                "to: if you trust the file, set model.safe_mode=false"
            ) from None
        unknown = re.search(r"Could not locate (?:class|function) '([^']+)'", text)
        if unknown:
            raise ConfigError(
                f"model.path={path!r} uses a layer class Keras does not know ({unknown.group(1)!r}): "
                "register it with @keras.saving.register_keras_serializable() in a module and name "
                "that module in model.imports=[...]"
            ) from None
        raise ConfigError(f"model.path={path!r} cannot be loaded: {first_line(e)}") from None


def gpt_model(settings: Settings) -> keras.Model:
    """`model=gpt`'s transformer (`chain.stages.gpt`), taking ids of the width the data gives them."""
    from chain.data.token_ids import ids as token_ids
    from chain.data.verify import input_dtype
    from chain.stages import gpt

    ids = input_dtype(token_ids(settings.data).dtype)  # as the data's stream gives them (bytes: int32)
    return gpt.build(settings.stages[0].model, ids.name, settings.data.lengths_vary, settings.data.packed)
