"""A config's `_target_`s (Hydra's convention: a Python object by its import path) resolved and
checked before anything calls them.

`locate` imports the path's module and looks the object up; `optimizer_class` and `function` check
that it is what its key will call (a Keras optimizer class; a stage builder or a data function),
each a one-line `ConfigError` naming the key, the target and what is allowed. Nothing is called
here: a target of the wrong kind (`numpy.savez` as an optimizer) never runs. Importing the module
is what naming code in a config takes; this module itself imports no Keras (a Keras optimizer's
module has imported it)."""

from __future__ import annotations

import importlib
import inspect
import sys
import types
from typing import Any, Callable

from chain.errors import ConfigError, first_line

# What each kind of callable target must return (its error line says it).
BUILDER_RETURNS = "a keras.Layer, a keras.Model or a list of layers"
DATA_FUNCTION_RETURNS = "a tf.data.Dataset of (x, y) or (x, {name: y}) examples"


def locate(key: str, path: str) -> Any:
    """The object `path` names (`package.module.name`, or an attribute of it: `pkg.mod.Class.method`),
    its module imported; one ConfigError line naming `key` when it cannot be imported or is not there."""
    parts = path.split(".")
    for cut in range(len(parts) - 1, 0, -1):  # the longest importable module, then attributes
        module_name = ".".join(parts[:cut])
        try:
            obj: Any = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if cut > 1 and e.name is not None and (module_name + ".").startswith(e.name + "."):
                continue  # `pkg.mod.Class`: pkg.mod.Class is no module; try pkg.mod
            raise ConfigError(f"{key}={path}: cannot import it ({first_line(e)})") from None
        except Exception as e:  # noqa: BLE001 - importing runs the module's code: it may raise anything
            raise ConfigError(f"{key}={path}: cannot import it ({module_name} raised {first_line(e)})") from None
        for depth, name in enumerate(parts[cut:], start=cut):
            if not hasattr(obj, name):
                raise ConfigError(f"{key}={path}: cannot import it ({'.'.join(parts[:depth])} has no {name!r})")
            obj = getattr(obj, name)
        return obj
    raise ConfigError(f"{key}={path} must be an import path, package.module.name")


def kind(obj: Any) -> str:
    """What `obj` is, in words: `a function`, `a module`, `the class OrderedDict`, `an int`."""
    if isinstance(obj, type):
        return f"the class {obj.__qualname__}"  # its module may be a private one (keras.src...)
    if isinstance(obj, types.ModuleType):
        return "a module"
    if inspect.isroutine(obj):
        return "a function"
    name = type(obj).__name__
    return f"{'an' if name[:1] in 'aeiou' else 'a'} {name}"


def optimizer_class(key: str, path: str) -> type:
    """The Keras optimizer class `path` names (a subclass of keras.optimizers.Optimizer), or one line."""
    obj = locate(key, path)
    # A subclass of Keras' Optimizer exists only once its module has imported Keras: when Keras is not
    # imported, `obj` is none, and chain imports nothing to say so.
    keras = sys.modules.get("keras")
    if not (isinstance(obj, type) and keras is not None and issubclass(obj, keras.optimizers.Optimizer)):
        raise ConfigError(
            f"{key}={path} is {kind(obj)}, not a Keras optimizer class (a subclass of "
            "keras.optimizers.Optimizer): name one, e.g. keras.optimizers.RMSprop"
        )
    return obj


def function(key: str, path: str, returns: str) -> Callable:
    """The callable `path` names (a function, or a class that makes what it must), or one line saying
    it must be a function returning `returns`."""
    obj = locate(key, path)
    if not callable(obj):
        raise ConfigError(f"{key}={path} is {kind(obj)}, not a function: name a function that returns {returns}")
    return obj
