"""chain: train a sequence of Keras models, each bound to its own device.

    import chain
    cfg = chain.compose(["+stages=3", "trainer.steps=20"])
    run = chain.build(cfg)          # plans devices, builds stages on them
    run.step(x, y)                  # one optimizer step on one batch
    summary = run.fit()             # trains trainer.steps steps

Importing this package does not import TensorFlow; `build` does.
"""

from chain.config import compose
from chain.errors import ChainError, ConfigError, DeviceError

__all__ = ["compose", "build", "ChainError", "ConfigError", "DeviceError"]


def build(cfg, run_dir=None):
    """Plan devices and build every stage on its device; returns a `chain.run.Run`.

    `run_dir` is where checkpoints, TensorBoard logs and summary.json go; None writes
    nothing to disk.
    """
    from chain.run import build as _build

    return _build(cfg, run_dir=run_dir)
