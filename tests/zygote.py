"""A process that has imported TensorFlow, Keras and Hydra, and forks a child for each command
line a test runs (`conftest.run_cli`): `python -m chain ...` without its ~4 s of imports.

Why: the suite runs the command line a few hundred times, and importing TensorFlow is more than
half of each small run's CPU time. The child is a fresh copy of this process taken before
TensorFlow's runtime starts (no devices, no threads of its own), so each run still sets up
its own logical devices, reads its own environment and arguments, and exits with its own code;
only the interpreter's start and the heavy imports are shared. `chain` itself is not imported
here: every child imports it fresh, under its own environment.

Protocol (one request at a time, on stdin / the fd named by argv[1]): a JSON line
`{"argv": [...], "module": "chain", "cwd": ..., "env": {...}, "out": path, "err": path}`;
answers, as JSON lines: `{"pid": N}` once the child runs, then `{"status": S}` when it ended
(S as `subprocess`: the exit code, or minus the signal that killed it). EOF on stdin ends it.
"""

from __future__ import annotations

import json
import os
import sys

import hydra  # noqa: F401  (imported to be shared)
import keras  # noqa: F401
import omegaconf  # noqa: F401
import tensorflow  # noqa: F401

BASE_PATH = [p for p in sys.path if p != os.path.dirname(os.path.abspath(__file__))]


def _unconfigure_tensorflow_logger() -> None:
    """Undo what importing TensorFlow did to logging: its logger, made on first use, adds its own
    stderr handler when the root logger has none, which is so here (nothing configured logging
    yet) but not in a `python -m chain` process, whose command line configures logging first."""
    import logging

    from tensorflow.python.platform import tf_logging

    logger = logging.getLogger("tensorflow")
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
    tf_logging._logger = None


_unconfigure_tensorflow_logger()


def child(request: dict) -> None:
    """Become `python -m MODULE ARGV` in `cwd` with `env`, writing to `out` and `err`; never returns."""
    import atexit
    import runpy

    code = 1
    try:
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        extra = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
        sys.path[:] = [os.getcwd(), *extra, *BASE_PATH]  # as `python -m` builds it: cwd, PYTHONPATH, the rest
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        for fd, path in ((1, request["out"]), (2, request["err"])):
            f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(f, fd)
            os.close(f)
        sys.argv = [request["module"], *request["argv"]]
        try:
            runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if not isinstance(e.code, (int, type(None))):
                print(e.code, file=sys.stderr)
        except BaseException:  # an uncaught error: the traceback and exit 1, as the interpreter does
            import traceback

            traceback.print_exc()
            code = 1
        atexit._run_exitfuncs()  # what a normal interpreter exit runs
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def main() -> None:
    answer = os.fdopen(int(sys.argv[1]), "w", buffering=1)
    for line in sys.stdin:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            answer.close()
            child(request)
        answer.write(json.dumps({"pid": pid}) + "\n")
        _, status = os.waitpid(pid, 0)
        answer.write(json.dumps({"status": os.waitstatus_to_exitcode(status)}) + "\n")


if __name__ == "__main__":
    main()
