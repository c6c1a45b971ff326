"""`placement.plan=auto`'s one check of a run's measured step against the chosen plan's prediction: when it
is due (`PlanCheck.due`, after the first `PLAN_CHECK_STEPS` timed steps, one of the loop's cadences,
`chain.training.cadence`) and whether the step is off (`PlanCheck.off`, by more than `PLAN_MARGIN`); the line
a run then writes is `chain.autoplan.table.mismatch`'s. No TensorFlow.
"""

from __future__ import annotations

from dataclasses import dataclass

# plan=auto: the timed steps (the first call, which traces, left out) the check waits for: three calls of the
# default trainer.steps_per_call=8, so that one slow call (the machine, a thread pool warming up) is not the median
PLAN_CHECK_STEPS = 24
PLAN_MARGIN = 0.25  # plan=auto: a measured step further than this share from the predicted one is reported


@dataclass(frozen=True)
class PlanCheck:
    """placement.plan=auto: the measured step against the predicted one, once a run: when the timed steps
    (every call's but the first's) first reach `after`, or at the end of a run that timed fewer."""

    predicted_ms: float
    after: int = PLAN_CHECK_STEPS
    margin: float = PLAN_MARGIN

    def due(self, before: int, now: int, last: bool) -> bool:
        """Whether the call that took the timed steps from `before` to `now` (`last`: the run's last
        call) is the one to check after."""
        return before < self.after <= now or (last and 0 < now < self.after)

    def off(self, measured_ms: float) -> bool:
        """Whether `measured_ms` is further from the prediction than `margin` of it, either way."""
        return abs(measured_ms - self.predicted_ms) > self.margin * self.predicted_ms
