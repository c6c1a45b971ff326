"""chain: train a sequence of Keras models, each bound to its own device.

    import chain
    settings = chain.compose(["+stages=3", "trainer.steps=20"])  # validated, typed Settings
    chain.setup(settings)           # its logical devices, before any tensor or Keras model is made
    run = chain.build(settings)     # plans devices, builds stages on them
    spec = chain.prepare(["+stages=3"])  # or: checked settings, data description and placement
    run = chain.build(spec)         #   (chain.prepared.RunSpec), then the run
    run.step(x, y)                  # one optimizer step on one batch
    summary = run.fit()             # trains trainer.steps steps

Importing this package does not import TensorFlow; `setup`, `prepare` and `build` do, with its
start-up banner hidden and TensorFlow's C++ log level set to 3 unless TF_CPP_MIN_LOG_LEVEL is set
(`chain.cli.quiet_environment`, set here, before anything imports TensorFlow). Their errors (and
`compose`'s) are chain's exceptions (`chain.errors`), one line each, raised with a traceback of the
caller's frames and this module's only. Once Keras is imported (before or after this package), chain's
own Keras classes are registered with it (`chain.stages.registered`): a run's exports load with plain
`keras.models.load_model`.

The package, layer by layer, bottom first (each imports only the layers before it;
docs/architecture.md draws it, tests/test_structure.py checks it):

    errors, fields, cli, testhooks    leaves: exceptions, setting fields, command-line helpers, test hooks
    targets      a config's `_target_`s resolved and their kind checked before anything calls them
    data/        catalog (shapes, targets), sources (one module per source), loader (arrays), stream (tf.data)
    config/      settings: compose, schema, checks, shapes (no TensorFlow)
    planning/    devices, inventory, planner, cluster, balance, memory, footprint (estimated peaks), fit
    stages/      Stage, build_stages, bodies (user code), cut (one model into stages), gpt (model=gpt), precision, ...
    steps/       the compiled steps: local, replica, independent; update, numerics, xla, evaluate
    strategies/  one object per way of training: a distribution given an objective (local, e2e, side by side)
    pipeline/    schedules, mode=e2e's step, Scheduled (its distribution), a trace's measured actions
    state/       checkpoints, manifest, exports, remap (restage), atomic writes
    report/      python -m chain.report: a run directory as one HTML page
    prepared/    the preparation pass: config -> RunSpec (settings, data description, placement)
    training/    build (RunSpec -> Run), ways (the table of strategies), the Run loop, logs
    sweep, restage, generate, worker, __main__    the command lines
"""

import functools
from typing import Callable, Sequence, TypeVar

import chain.config  # noqa: F401 (TensorFlow-free; `chain.config` as an attribute of the package)
from chain.cli import import_tensorflow_quietly, quiet_environment
from chain.errors import ChainError, ConfigError, DeviceError
from chain.stages import registered

quiet_environment()  # before TensorFlow is imported, by chain or by the caller: its C++ level is read then
registered.when_keras_is_imported()  # a run's exports load with keras.models.load_model, Keras imported before or after

__all__ = ["compose", "prepare", "setup", "build", "ChainError", "ConfigError", "DeviceError"]

F = TypeVar("F", bound=Callable)


def _one_line(fn: F) -> F:
    """`fn`, raising its `ChainError`s from here: the message says all a user can act on, so a
    notebook shows it under the user's own call, not under chain's internal frames (an error the
    user's code raised inside it stays attached as the cause, with its own traceback)."""

    @functools.wraps(fn)
    def api(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except ChainError as e:
            raise e.with_traceback(None)  # noqa: B904 (the cause, if any, is kept)

    return api  # type: ignore[return-value]


@_one_line
def compose(overrides: Sequence[str] = ()):
    """Compose the packaged configs with command-line style overrides and check them as the command
    line does (`chain.prepared.check_config`: every error that needs no TensorFlow); returns the `Settings`.

    Example: `chain.compose(["+stages=3", "trainer.steps=5"])`.
    """
    from chain.config.hydra import compose_config
    from chain.prepared import check_config

    return check_config(compose_config(overrides)).settings


@_one_line
def prepare(overrides: Sequence[str] = ()):
    """Compose and prepare a run (`chain.prepared.prepare`): a `RunSpec` of the checked settings, the
    data set's description and the placement, before TensorFlow's runtime starts; `build` takes it
    without describing the data again."""
    from chain.config.hydra import compose_config
    from chain.prepared import prepare as _prepare

    cfg = compose_config(overrides)  # a bad override is one line before TensorFlow is imported
    import_tensorflow_quietly()  # the inventory asks TensorFlow for the GPUs
    return _prepare(cfg)


@_one_line
def setup(*cfgs) -> None:
    """Configure TensorFlow's logical devices for every config this process will build, now: call
    it before anything makes a tensor (building or loading a Keras model does), as a notebook's
    first cell. TensorFlow fixes its devices when its runtime starts, and a chain needs one per
    stage (on a machine without GPUs the CPU is split into logical devices).

    Each of `cfgs` is what `build` takes (`Settings`, a `RunSpec`, a composed config). The plan
    using the most devices is applied; every later `build` reuses those devices when its plan
    needs no more than exist (each stage still on a device of its own); one that needs more has its
    stages share them, with a note, or raises a one-line `DeviceError` when its layout names or
    fences its devices (`placement.devices`, GPU memory limits, copies, mirrored replicas).
    Example: `chain.setup(cfg)`, or `chain.setup(cfg, other)` before building both.
    """
    if not cfgs:
        raise ConfigError("chain.setup needs the config(s) this process will build: chain.setup(cfg, ...)")
    import_tensorflow_quietly()  # before chain.training, which imports Keras (and TensorFlow with it)
    from chain.training.build import setup as _setup

    _setup(cfgs)


@_one_line
def build(cfg, run_dir=None, *, stages=None, model=None):
    """Plan devices and build every stage on its device; returns a `chain.training.run.Run`.

    `cfg` is a `chain.config.Settings` (what `compose` returns), a `chain.prepared.RunSpec` (what
    `prepare` returns) or a composed config.
    `run_dir` is where checkpoints, TensorBoard logs and summary.json go; None writes
    nothing to disk. Your own models: `stages=[fn, ...]`, one callable per stage, each
    called as `fn(input_shape=...)` on its stage's device and returning a keras.Layer, a
    keras.Model or a list of layers; or `model=keras_model`, one model cut into the
    config's stages (`placement.split`, `placement.balance`), which may be built before this call:
    after `setup`, each stage on a device of its own; without it, the stages share the devices
    TensorFlow started with, and a note (on stderr and in `run.notes`) says what `setup` would have given.
    """
    import_tensorflow_quietly()
    from chain.training.build import build as _build

    return _build(cfg, run_dir=run_dir, stages=stages, model=model)
