"""The code a config names: every `_target_` (a stage's builder, a stage's optimizer, the data
function) resolved and its kind checked in the preparation pass (`chain.targets`), before anything
calls it or a run directory is written. A target of the wrong kind is one line naming its key; the
build resolves each again (its module imported already) and calls only what passed."""

from __future__ import annotations

from chain import targets
from chain.config.schema import Builder, KerasOptimizer, Settings
from chain.data.sources.function.callable_data import FromCallable


def _optimizer_key(s: Settings, i: int) -> str:
    """The key that set stage `i`'s optimizer: `optim._target_`, or `stages[i].optim._target_` when the
    stage names its own."""
    return "optim._target_" if s.stages[i].optim == s.optim else f"stages[{i}].optim._target_"


def check(s: Settings) -> None:
    """Resolve every `_target_` of `s` and check its kind; nothing is called. A target's module may
    import TensorFlow (a Keras optimizer's does): it is imported quietly first, as the run would."""
    named = [st for st in s.stages if isinstance(st.model, Builder) or isinstance(st.optim, KerasOptimizer)]
    if not named and not isinstance(s.data, FromCallable):
        return
    from chain.cli import import_tensorflow_quietly

    try:
        import_tensorflow_quietly()
    except ImportError:  # without TensorFlow, a target that needs it says so when it is imported
        pass
    if isinstance(s.data, FromCallable):
        targets.function("data._target_", s.data._target_, targets.DATA_FUNCTION_RETURNS)
    for i, st in enumerate(s.stages):
        if isinstance(st.model, Builder):
            targets.function(f"stages[{i}].model._target_", st.model.target, targets.BUILDER_RETURNS)
        if isinstance(st.optim, KerasOptimizer):
            targets.optimizer_class(_optimizer_key(s, i), st.optim._target_)
