"""`python -m chain.worker --index I --cluster host:port,host:port,...`: one worker of a cluster.

Starts a TensorFlow server (`tf.distribute.Server`) for task I of the job `worker`, prints
the address it serves, and serves until stopped (SIGTERM or Ctrl-C end it cleanly). A
training run then places stages on the workers' devices with `cluster.workers=[...]`
(the same list, in the same order): `/job:worker/replica:0/task:I/device:CPU:0` (or GPU:M).

    python -m chain.worker --index 0 --cluster localhost:2222,localhost:2223 &
    python -m chain.worker --index 1 --cluster localhost:2222,localhost:2223 &
    python -m chain +stages=2 mode=e2e cluster.workers=[localhost:2222,localhost:2223]

`--cpus 0,1` pins the worker to those cores (Linux); `--threads N` gives its executor N
intra-op and N inter-op threads: `--cpus 0 --threads 1` makes a CPU worker run one op at a
time, like one accelerator with one stream (how `scripts/bench_pipeline.py` measures overlap).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

from chain.cli import fail, import_tensorflow_quietly
from chain.errors import ConfigError


def parse_cluster(text: str) -> list[str]:
    """`host:port,host:port` -> the list, each checked (one ConfigError line naming the bad entry)."""
    from chain.config.fields import address

    return [address(f"--cluster[{i}]", a.strip()) for i, a in enumerate(text.split(",")) if a.strip()]


def main(argv: list[str] | None = None) -> None:
    """Entry point of `python -m chain.worker`."""
    ap = argparse.ArgumentParser(prog="python -m chain.worker", description=__doc__.split("\n\n")[0])
    ap.add_argument("--index", type=int, required=True, help="this worker's task index in --cluster")
    ap.add_argument("--cluster", required=True, help="every worker's host:port, comma-separated, in task order")
    ap.add_argument("--threads", type=int, default=None, help="intra-op and inter-op threads (default: TensorFlow's)")
    ap.add_argument("--cpus", default=None, help="pin to these cores, e.g. 0 or 0,1 (Linux)")
    a = ap.parse_args(argv)
    try:
        workers = parse_cluster(a.cluster)
        if not 0 <= a.index < len(workers):
            raise ConfigError(f"--index={a.index}: the cluster has {len(workers)} workers (0..{len(workers) - 1})")
        if a.threads is not None and a.threads < 1:
            raise ConfigError(f"--threads={a.threads} must be >= 1")
        if a.cpus is not None:
            try:
                cores = {int(c) for c in a.cpus.split(",")}
                os.sched_setaffinity(0, cores)
            except (ValueError, OSError) as e:
                raise ConfigError(f"--cpus={a.cpus}: cannot pin to those cores ({e})") from None
    except ConfigError as e:
        fail(str(e))
    import_tensorflow_quietly()
    import tensorflow as tf

    config = None
    if a.threads is not None:
        tf.config.threading.set_intra_op_parallelism_threads(a.threads)
        tf.config.threading.set_inter_op_parallelism_threads(a.threads)
        config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=a.threads,
                                          inter_op_parallelism_threads=a.threads)
    try:
        server = tf.distribute.Server(tf.train.ClusterSpec({"worker": workers}), job_name="worker",
                                      task_index=a.index, config=config, start=True)
    except (tf.errors.OpError, ValueError, RuntimeError) as e:
        fail(f"worker {a.index} cannot serve {workers[a.index]}: {str(e).strip().splitlines()[0]}")
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    print(f"worker {a.index} serving {workers[a.index]} ({server.target})", flush=True)
    try:
        while not stop:  # the server runs in its own threads; this thread only waits for a signal
            time.sleep(0.2)
    except KeyboardInterrupt:
        pass
    print(f"worker {a.index} stopped", flush=True)
    sys.stdout.flush()
    os._exit(0)  # the server's threads do not join; nothing is left to save


if __name__ == "__main__":
    main()
