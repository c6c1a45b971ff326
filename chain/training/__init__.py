"""Training: `build` (config -> placement -> strategy -> `Run`), the `Run` loop with its
checkpoints and summary, and what a run shows (`logs`: the placement table, TensorBoard)."""
