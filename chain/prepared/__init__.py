"""The preparation pass (`preparation`): a config becomes one frozen `RunSpec` (`run_spec`) of
checked settings, the data set's description and the placement, before TensorFlow's runtime
starts; every config error that needs no TensorFlow is raised here. `estimate`: the settings'
memory estimate per stage, kept on the placement (`placement.footprints`).

    spec = chain.prepared.prepare(cfg)      # RunSpec(settings, data_info, placement, inventory)
    spec = chain.prepared.check_config(cfg)   # the same without planning: no TensorFlow imported
"""

from chain.prepared.preparation import check_config, prepare, with_loaded_data
from chain.prepared.run_spec import RunSpec

__all__ = ["RunSpec", "check_config", "prepare", "with_loaded_data"]
