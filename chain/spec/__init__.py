"""The preparation pass (`preparation`): a config becomes one frozen `RunSpec` (`run_spec`) of
checked settings, the data set's description and the placement, before TensorFlow's runtime
starts; every config error that needs no TensorFlow is raised here. `estimate`: the settings'
memory estimate per stage, kept on the placement (`placement.footprints`).

    spec = chain.spec.prepare(cfg)      # RunSpec(settings, data_info, placement, inventory)
    spec = chain.spec.check(cfg)        # the same without planning: no TensorFlow imported
"""

from chain.spec.preparation import check, prepare, with_data
from chain.spec.run_spec import RunSpec

__all__ = ["RunSpec", "check", "prepare", "with_data"]
