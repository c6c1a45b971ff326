"""The Keras classes of chain's own that its saved files hold (`chain.stages.savable`), registered with
Keras by `import chain`. A run's exports (`chain.keras`, `stage_NN.keras`) then load with plain
`keras.models.load_model` in any process that imported chain, before Keras or after it.

Keras 3 finds a custom class only in its registry (a file names the class's module, but Keras imports
a module itself only from its own packages: keras, keras_hub), and registering takes the class, so
Keras. `import chain` imports no Keras: `when_keras_is_imported` registers now if Keras is imported
already, else once Keras' own import has ended (a finder on `sys.meta_path` that wraps Keras' loader).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys


def register() -> None:
    """Import the module of chain's saved classes (Keras imported): its decorators
    (`@keras.saving.register_keras_serializable(package="chain")`) register them."""
    from chain.stages import savable  # noqa: F401


class _AfterKeras(importlib.abc.MetaPathFinder):
    """Finds `keras` as the path finder does, with a loader that runs `register` once Keras is loaded
    (and takes this finder off the meta path). A find alone loads nothing: TensorFlow asks for Keras'
    spec (`importlib.util.find_spec`) before it imports Keras."""

    def find_spec(self, name, path=None, target=None):
        if name != "keras":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        load = spec.loader.exec_module

        def exec_module(module):
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            load(module)
            register()

        spec.loader.exec_module = exec_module  # this spec's own loader object (each find makes one)
        return spec


def when_keras_is_imported() -> None:
    """Register chain's saved classes now if Keras is imported, else right after Keras' import."""
    if "keras" in sys.modules:
        register()
    elif not any(isinstance(f, _AfterKeras) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterKeras())
