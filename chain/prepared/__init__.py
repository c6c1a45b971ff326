"""The preparation pass (`preparation`): a config becomes one frozen `RunSpec` (`run_spec`) of
checked settings, the data set's description, the assignment, mode=e2e's schedule and how a batch
cuts over the replicas planned (`cut_batch`: `RunSpec.batch_cut`), before TensorFlow's runtime
starts; every config error that needs no TensorFlow is raised here. `estimate`: the settings'
memory estimate per stage, kept on the placement (`placement.footprints`).

    spec = chain.prepared.prepare(cfg)      # RunSpec(settings, data_info, assignment, inventory, schedule, batch_cut)
    spec = chain.prepared.check_config(cfg)   # the same without planning: no TensorFlow imported
"""

from chain.prepared.preparation import check_config, cut_batch, prepare, with_loaded_data
from chain.prepared.run_spec import RunSpec

__all__ = ["RunSpec", "check_config", "cut_batch", "prepare", "with_loaded_data"]
