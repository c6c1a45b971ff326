"""Planning: where every stage runs and in what order its work happens, decided before
anything is built.

- `inventory`: the machine's GPUs (TensorFlow's count, nvidia-smi's memory).
- `planner`: `assign(placement settings, stages, inventory) -> Assignment` (the planner's decision), pure.
- `devices`: device names (`canonical`, pure), `configure` (apply a plan to TensorFlow)
  and `check_devices` (the devices that exist).
- `memory`: each device's peak memory, as far as TensorFlow can report it.
- `footprint`: each stage's estimated peak memory (`Footprint`), pure; `fit`: a plan against
  its devices' memory (the one-line refusal, the `plan_only` table).
"""
