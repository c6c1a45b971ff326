"""chain: train a sequence of Keras models, each bound to its own device.

    import chain
    settings = chain.compose(["+stages=3", "trainer.steps=20"])  # validated, typed Settings
    run = chain.build(settings)     # plans devices, builds stages on them
    run.step(x, y)                  # one optimizer step on one batch
    summary = run.fit()             # trains trainer.steps steps

Importing this package does not import TensorFlow; `build` does.

The package, layer by layer (each imports only the layers above it in this list):

    config/      settings: compose, schema, checks, shapes (no TensorFlow)
    planning/    devices, inventory, planner, schedules, memory
    data/        catalog (shapes, targets), sources (arrays), pipeline (tf.data)
    stages/      Stage, build_stages, bodies (user code), cut (one model into stages), precision, ...
    steps/       the compiled steps: local, pipeline, replica; update, numerics, xla
    strategies/  one object per way of training (pipelined/mirrored x local/e2e)
    state/       checkpoints, manifest, exports, restage, atomic writes
    training/    build (config -> Run), the Run loop, logs
    __main__, restage, cli    the command lines
"""

from chain.config import compose
from chain.errors import ChainError, ConfigError, DeviceError

__all__ = ["compose", "build", "ChainError", "ConfigError", "DeviceError"]


def build(cfg, run_dir=None, *, stages=None, model=None):
    """Plan devices and build every stage on its device; returns a `chain.training.run.Run`.

    `cfg` is a `chain.config.Settings` (what `compose` returns) or a composed config.
    `run_dir` is where checkpoints, TensorBoard logs and summary.json go; None writes
    nothing to disk. Your own models: `stages=[fn, ...]`, one callable per stage, each
    called as `fn(input_shape=...)` on its stage's device and returning a keras.Layer, a
    keras.Model or a list of layers; or `model=keras_model`, one model cut into the
    config's stages (`placement.split`, `placement.balance`).
    """
    from chain.training.build import build as _build

    return _build(cfg, run_dir=run_dir, stages=stages, model=model)
