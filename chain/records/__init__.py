"""What crosses module boundaries at run time, as typed records defined once: a step's result and
the loss records a checkpoint keeps (`results`), summary.json and its per-stage entries
(`summaries`), the measured timeline (`measured`), the stamps of a stream's files a checkpoint
records (`stream_files`), a sweep job's outcome (`sweeps`), `placement.plan=auto`'s measurements, candidates
and choice (`auto_plan`). `serial` is the one module that turns them
into JSON and back (`to_json`, `from_json`) and lists their fields for the docs.

A leaf of the package order: no TensorFlow, nothing of chain but `chain.errors`. This
`__init__` imports nothing, so importing one record module loads only what it needs.
"""
