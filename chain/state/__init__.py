"""State on disk: checkpoints (one directory per stage, all or nothing), the run's manifest
`checkpoint.json`, exports (`.keras` files), re-staging a checkpoint into another split,
and atomic writes."""
