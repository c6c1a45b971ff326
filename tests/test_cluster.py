"""Stages on TensorFlow cluster workers (`python -m chain.worker`) on loopback: the same training as
on local logical devices, a lost worker (killed or stopped) stops the client fast with one line, a
resume after the worker is back is bit-exact, and an unreachable worker or an address that is not a
TensorFlow server fails at once; a traced run reads each worker's own trace. The workers are always
shut down (and continued), also when a test fails."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from chain.pipeline import timeline
from chain.worker import LocalCluster, free_addresses
from compare import assert_values_alike
from conftest import EXTENDED, manifest, read_summary, run_cli, stage_values
from servers import FakeServer

TINY = ["+stages=2", "model.width=16", "data.batch_size=32", "trainer.progress=false", "checkpoint.export=false"]
MODES = {"e2e": ["mode=e2e", "pipeline.schedule=1f1b", "pipeline.microbatches=2"], "local": ["mode=local"]}
# A run that loses a worker after step LOST_AFTER: shorter than the (40 steps, lost after 15,
# checkpoints every 5), which scripts/stress_lost.py runs: 16 more steps cost each run here 1.6 s.
LOST_ARGS = [*TINY, *MODES["e2e"], "trainer.steps=24", "checkpoint.every=4"]
LOST_AFTER = 9


@pytest.fixture(scope="module")
def cluster():
    # four workers, started once: the 2 x 2 grid uses all four, every other test the first two; each also
    # serves TensorFlow's profiler (for the traced run), which costs nothing until a run traces it
    with LocalCluster(4, profile=True) as started:
        yield started


class Workers:
    """The module's workers as a test uses them: `option` names the first `n` (in task order)."""

    def __init__(self, cluster: LocalCluster, n: int):
        self.cluster, self.n = cluster, n

    @property
    def option(self) -> str:
        return f"cluster.workers=[{','.join(self.addresses)}]"

    @property
    def addresses(self) -> list[str]:
        return self.cluster.addresses[: self.n]

    @property
    def profile_option(self) -> str:
        return f"cluster.profile_ports=[{','.join(map(str, self.profile_ports))}]"

    @property
    def profile_ports(self) -> list[int]:
        return self.cluster.profile_ports[: self.n]

    @property
    def pids(self) -> list[int]:
        return self.cluster.pids[: self.n]

    def kill(self, i: int) -> None:
        self.cluster.kill(i)

    def start(self, i: int) -> None:
        self.cluster.start(i)


def running(cluster: LocalCluster) -> LocalCluster:
    """Every worker of the module running (a test that killed or stopped one has restarted or continued it)."""
    for i, p in enumerate(cluster.procs):
        if p.poll() is not None:
            cluster.start(i)
    return cluster


@pytest.fixture
def workers(cluster):
    """The module's first two workers, each running."""
    return Workers(running(cluster), 2)


@pytest.fixture
def four_workers(cluster):
    """All four of the module's workers, each running."""
    return Workers(running(cluster), 4)


@pytest.fixture(scope="module")
def straight(cluster, tmp_path_factory) -> dict:
    """The final weights of LOST_ARGS' run on the first two workers that lost nothing (shared by the tests
    that lose one)."""
    where = tmp_path_factory.mktemp("straight")
    option = f"cluster.workers=[{','.join(running(cluster).addresses[:2])}]"
    r = run_cli(where, *LOST_ARGS, option, f"hydra.run.dir={where / 'run'}")
    assert r.returncode == 0, r.stderr
    return final(where / "run")


def final(run_dir) -> dict:
    return {k: stage_values(run_dir, f"stage_{k:02d}") for k in range(2)}


def assert_lost(code: int, stderr: str, address: str, ending: str, index: int = 1) -> None:
    """The client stopped with exit 5 and one line (test hooks aside): worker `index` at `address`
    is lost, ending with `ending`."""
    errors = [line for line in stderr.splitlines() if line.strip() and not line.startswith("test-hook")]
    assert code == 5 and len(errors) == 1, stderr
    assert errors[0].startswith(f"error: cluster worker {index} ({address}) is lost"), errors[0]
    assert errors[0].endswith(ending), errors[0]


# EXTENDED: the suite's time; e2e runs every time, mode=local on the workers in the lost-during-a-save test below
@pytest.mark.parametrize("mode", [pytest.param(m, marks=EXTENDED if m == "local" else ()) for m in MODES])
def test_a_chain_on_two_workers_trains_like_on_local_devices(workers, tmp_path, mode):
    args = [*TINY, *MODES[mode], "trainer.steps=6"]
    r = run_cli(tmp_path, *args, workers.option, f"hydra.run.dir={tmp_path / 'cluster'}")
    assert r.returncode == 0, r.stderr
    for k, address in enumerate(workers.addresses):  # the placement table names each stage's worker
        assert f"/job:worker/replica:0/task:{k}/device:CPU:0  worker {k} {address} CPU:0" in r.stdout
    r = run_cli(tmp_path, *args, f"hydra.run.dir={tmp_path / 'local'}")
    assert r.returncode == 0, r.stderr
    a, b = final(tmp_path / "cluster"), final(tmp_path / "local")
    for k in range(2):
        assert_values_alike(a[k], b[k], rtol=1e-6)


def start_client(tmp_path, args, run_dir, **hooks: str) -> subprocess.Popen:
    """`python -m chain ARGS` announcing its steps on stderr, as a user runs it (TensorFlow's own logging
    level left to the CLI); `hooks`: more of `chain.testhooks`' variables."""
    env = dict(os.environ, CHAIN_TEST_ANNOUNCE="1", **hooks)
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    return subprocess.Popen(
        [sys.executable, "-m", "chain", *args, f"hydra.run.dir={run_dir}"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for_step(client: subprocess.Popen, step: int) -> None:
    said = []
    for line in client.stderr:
        if f"test-hook: step {step} done" in line:
            return
        said.append(line)
    raise AssertionError(f"the run ended before step {step}: exit {client.wait()}: {''.join(said[-20:])}")


def test_a_lost_worker_stops_the_run_with_one_line_and_the_resume_is_bit_exact(workers, tmp_path, straight):
    args = [*LOST_ARGS, workers.option]
    victim = str(tmp_path / "victim")
    client = start_client(tmp_path, args, victim)
    try:
        wait_for_step(client, LOST_AFTER)
        workers.kill(1)
        killed = time.monotonic()
        rest = client.stderr.read()
        code = client.wait(timeout=60)
        took = time.monotonic() - killed
    finally:
        client.kill()
    assert_lost(code, rest, workers.addresses[1], "is intact: resume with resume=true")
    assert took < 20, took  # seconds, not minutes
    saved = manifest(victim)["step"]
    assert 8 <= saved < 24
    workers.start(1)  # the worker is back (a fresh process: its variables come from the checkpoint)
    r = run_cli(tmp_path, *args, f"hydra.run.dir={victim}", "resume=true")
    assert r.returncode == 0, r.stderr
    b = final(victim)
    for k in range(2):
        assert_values_alike(straight[k], b[k])


def lose_worker_1(workers, tmp_path, on_lost: list[str], back_after: float | None = None) -> tuple[int, str, str]:
    """LOST_ARGS on two workers with `on_lost`'s settings, worker 1 killed after step 9 (and started again
    `back_after` seconds later); the exit code, the client's stderr after the kill, its run directory."""
    run_dir = str(tmp_path / "run")
    client = start_client(tmp_path, [*LOST_ARGS, workers.option, "cluster.lost_after_s=2", *on_lost], run_dir)
    try:
        wait_for_step(client, LOST_AFTER)
        workers.kill(1)
        if back_after is not None:
            time.sleep(back_after)
            workers.start(1)
        rest = client.stderr.read()
        code = client.wait(timeout=120)
    finally:
        client.kill()
    return code, rest, run_dir


def test_a_lost_worker_with_on_lost_replan_goes_on_on_the_other_worker(workers, tmp_path, straight):
    code, rest, run_dir = lose_worker_1(workers, tmp_path, ["cluster.on_lost=replan"])
    assert code == 0, rest
    (event,) = read_summary(run_dir)["lost_workers"]
    assert event["worker"] == 1 and event["address"] == workers.addresses[1] and event["action"] == "replanned"
    assert event["workers_before"] == workers.addresses and event["workers_after"] == workers.addresses[:1]
    assert 8 <= event["resumed_from"] <= event["step"] and event["recomputed"] == event["step"] - event["resumed_from"]
    assert event["layout_before"] == event["layout_after"] == "2 stages 1f1b M=2"  # the same rules as at start
    assert manifest(run_dir)["step"] == 24
    with open(os.path.join(run_dir, "chain.log")) as f:
        log = f.read()
    assert (
        f"worker 1 ({workers.addresses[1]}) lost at step {event['step']}: re-planned on 1 worker "
        "(2 stages 1f1b M=2, as before), resumed " in log
    )
    b = final(run_dir)
    for k in range(2):  # both stages on worker 0 now: the same sums, within the tolerance of the issue
        assert_values_alike(straight[k], b[k], rtol=1e-5)


@EXTENDED  # the suite's time: on_lost=replan runs every time, wait with scripts/stress_lost.py
def test_a_lost_worker_with_on_lost_wait_goes_on_bit_exact_once_it_is_back(workers, tmp_path, straight):
    code, rest, run_dir = lose_worker_1(workers, tmp_path, ["cluster.on_lost=wait"], back_after=2)
    assert code == 0, rest
    (event,) = read_summary(run_dir)["lost_workers"]
    assert event["action"] == "waited" and event["workers_after"] == workers.addresses
    b = final(run_dir)
    for k in range(2):
        assert_values_alike(straight[k], b[k])


@EXTENDED  # a third run of LOST_ARGS with plan=auto's measuring twice: the replan above covers the supervision
def test_a_lost_worker_with_on_lost_replan_plans_again_with_plan_auto(workers, tmp_path):
    code, rest, run_dir = lose_worker_1(workers, tmp_path, ["cluster.on_lost=replan", "placement.plan=auto"])
    assert code == 0, rest
    summary = read_summary(run_dir)
    (event,) = summary["lost_workers"]
    assert event["workers_after"] == workers.addresses[:1] and summary["plan"] is not None
    before, after = event["layout_before"], event["layout_after"]
    assert before and after and manifest(run_dir)["step"] == 24
    with open(os.path.join(run_dir, "chain.log")) as f:
        log = f.read()
    assert log.count("placement.plan=auto chose ") == 2, log  # planned again on the worker left
    said = f"({before} -> {after})" if before != after else f"({after}, as before)"
    assert f"lost at step {event['step']}: re-planned on 1 worker {said}, resumed " in log


def test_the_run_directory_stays_locked_between_the_supervised_processes(tmp_path, monkeypatch):
    # in process: the training processes are stood in for; a second run probes the lock in the gap
    import chain
    from chain.state import lock
    from chain.training import on_lost

    run_dir, addresses = str(tmp_path / "run"), free_addresses(2)
    probe = "import sys; from chain.state import lock; lock.acquire(sys.argv[1]); print(lock.held(sys.argv[1]))"
    seen: list[subprocess.CompletedProcess] = []

    def train(args, events, where):
        if not events:
            return 5, [f"error: cluster worker 1 ({addresses[1]}) is lost: unreachable; resume with resume=true"]
        env, fd = lock.handed_down(where)  # what the fresh process is given: it holds the lock too
        environ = {**os.environ, **env}
        seen.append(
            subprocess.run([sys.executable, "-c", probe, where], env=environ, pass_fds=(fd,), capture_output=True)
        )
        return 0, []

    def answering(workers):  # between the two processes: another run is refused
        seen.append(subprocess.run([sys.executable, "-c", probe, run_dir], capture_output=True, text=True))
        return [True, False]

    monkeypatch.setattr(on_lost, "_train", train)
    monkeypatch.setattr(on_lost, "_answering", answering)
    monkeypatch.setattr(on_lost.manifest, "exists", lambda d: True)
    monkeypatch.setattr(on_lost.manifest, "read", lambda d: {"step": 10})
    settings = chain.compose([f"cluster.workers=[{','.join(addresses)}]", "cluster.on_lost=replan"])
    lock.acquire(run_dir)  # as the command line's preflight does
    try:
        assert on_lost.supervise(settings, [], run_dir) == 0
        refused, handed = seen
        assert (
            refused.returncode != 0
            and "RunDirLocked" in refused.stderr
            and " is in use by another run (pid " in (refused.stderr)
        )
        assert handed.returncode == 0 and handed.stdout.strip() == b"True", handed.stderr
        assert lock.held(run_dir)  # the fresh process let go of its copy only
    finally:
        lock.release(run_dir)


def test_a_lost_worker_that_never_answers_again_stops_the_wait_with_one_line(tmp_path, monkeypatch, capsys):
    # in process: the run that lost it is stood in for, the worker's address is one where nothing listens
    import chain
    from chain.training import on_lost

    gone = free_addresses(1)[0]
    line = (
        f"error: cluster worker 0 ({gone}) is lost: unreachable for 2 s (Connection refused); resume with resume=true"
    )
    monkeypatch.setattr(on_lost, "_train", lambda args, events, run_dir: (5, [line]))
    (tmp_path / "checkpoint.json").write_text("{}")
    settings = chain.compose([f"cluster.workers=[{gone}]", "cluster.on_lost=wait", "cluster.on_lost_wait_s=1"])
    assert on_lost.supervise(settings, [], str(tmp_path)) == 5
    assert capsys.readouterr().err == f"{line} (waited 1 s for it to answer again: cluster.on_lost_wait_s)\n"
    with pytest.raises(chain.ConfigError, match=r"^cluster.on_lost=replan needs cluster.workers"):
        on_lost.supervises(chain.compose(["cluster.on_lost=replan"]))


def test_an_unreachable_worker_fails_fast_naming_it(tmp_path):
    port = free_addresses(1)[0].split(":")[1]
    started = time.monotonic()
    r = run_cli(tmp_path, *TINY, f"cluster.workers=[localhost:{port}]")
    assert time.monotonic() - started < 60
    assert r.returncode == 2 and r.stderr.strip() == (
        f"error: cluster.workers[0]=localhost:{port} is not reachable (Connection refused); start it with: "
        f"python -m chain.worker --index 0 --cluster localhost:{port}"
    )
    assert not (tmp_path / "outputs").exists()


def test_a_worker_lost_during_a_save_is_a_lost_worker_not_a_storage_error(workers, tmp_path):
    # worker 1 dies after stage 0 (on worker 0) is saved, before stage 1 (its variables on worker 1) is
    args = [
        *TINY,
        *MODES["local"],
        "trainer.steps=100",
        "checkpoint.every=4",
        "cluster.lost_after_s=60",
        workers.option,
    ]
    client = start_client(tmp_path, args, tmp_path / "run", CHAIN_TEST_SAVE_PAUSE="2@8")
    try:
        for line in client.stderr:
            if "test-hook: saved stage_00 of step 8" in line:
                break
        workers.kill(1)
        code = client.wait(timeout=60)
        rest = client.stderr.read()
    finally:
        client.kill()
    assert_lost(
        code, rest, workers.addresses[1], "the last complete checkpoint (step 4) is intact: resume with resume=true"
    )


@EXTENDED  # the suite's time: a killed worker's stop (the same watch) runs every time
def test_a_stopped_worker_stops_the_run_with_one_line(workers, tmp_path):
    # SIGSTOP: the worker's port still accepts connections (the kernel does), but its server answers nothing
    args = [
        *TINY,
        *MODES["e2e"],
        "trainer.steps=100000",
        "checkpoint.every=0",
        "cluster.lost_after_s=3",
        workers.option,
    ]
    client = start_client(tmp_path, args, tmp_path / "run")
    try:
        wait_for_step(client, 3)
        os.kill(workers.pids[1], signal.SIGSTOP)
        stopped = time.monotonic()
        code = client.wait(timeout=60)  # before reading to the end: a client that hangs never closes stderr
        took = time.monotonic() - stopped
        rest = client.stderr.read()
    finally:
        client.kill()
        os.kill(workers.pids[1], signal.SIGCONT)
    assert_lost(code, rest, workers.addresses[1], "")
    assert "does not answer" in rest, rest
    assert took < 30, took  # a few multiples of cluster.lost_after_s, not minutes


@EXTENDED  # the suite's time: a stalled step's report runs every time in one process (test_stall)
def test_a_stalled_step_on_workers_says_where_it_waits(workers, tmp_path):
    """trainer.stall_s: stage 1's forward of microbatch 2 held for 2 s in step 3 (CHAIN_TEST_HOLD, a
    wait on the client that the action depends on): the markers on the client name it, and stage 0
    (worker 0) waiting for its gradient; the run then goes on."""
    r = run_cli(
        tmp_path,
        *TINY,
        "mode=e2e",
        "pipeline.schedule=1f1b",
        "pipeline.microbatches=4",
        "trainer.steps=4",
        "trainer.steps_per_call=1",
        "trainer.stall_s=1",
        workers.option,
        f"hydra.run.dir={tmp_path / 'run'}",
        env={"CHAIN_TEST_HOLD": "s1_F2@3,2"},
    )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    at = [i for i, line in enumerate(lines) if "no step completed for" in line]
    assert len(at) == 1 and "step 3 waits" in lines[at[0]], r.stdout
    grid, said = lines[at[0] + 1 : at[0] + 3], lines[at[0] + 3 : at[0] + 5]
    assert grid[1].split()[:3] == ["stage", "1", "/job:worker/replica:0/task:1/device:CPU:0"], grid
    assert ">F2" in grid[1].split() and ">B2" in grid[0].split(), grid
    assert said == [
        "stage 0: finished s0_F3; waits in s0_B2 for s1_B2 (stage 1)",
        "stage 1: finished s1_B1; in s1_F2, which has every input: the wait is inside it",
    ], said


@pytest.mark.parametrize("kind", ["silent", "http"])
def test_an_address_that_is_not_a_tensorflow_server_fails_naming_it(tmp_path, kind):
    with FakeServer(kind) as server:
        started = time.monotonic()
        r = run_cli(tmp_path, *TINY, f"cluster.workers=[{server.address}]", "cluster.lost_after_s=2", timeout=90)
        took = time.monotonic() - started
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith(f"error: cluster.workers[0]={server.address} "), r.stderr
    assert ("does not answer within 2 s" if kind == "silent" else "not a TensorFlow server") in r.stderr, r.stderr
    assert took < 60, took
    assert not (tmp_path / "outputs").exists()


def test_a_grpc_server_that_is_not_a_worker_fails_naming_it(tmp_path):
    # a gRPC server (it answers the handshake) that serves no TensorFlow worker, as a profiler server does:
    # grpcio's own, without TensorFlow's import in the server
    address = free_addresses(1)[0]
    code = (
        "import time; from concurrent import futures; import grpc; "
        f"s = grpc.server(futures.ThreadPoolExecutor(1)); s.add_insecure_port({address!r}); s.start(); "
        "print('up', flush=True); time.sleep(300)"
    )
    server = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert server.stdout.readline().strip() == "up"
        env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}  # as a user runs it
        r = subprocess.run(
            [sys.executable, "-m", "chain", *TINY, f"cluster.workers=[{address}]"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=90,
        )
    finally:
        server.kill()
        server.wait()
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith(f"error: cluster.workers[0]={address} is not a TensorFlow worker"), r.stderr
    assert not (tmp_path / "outputs").exists()


def listening_on(port: int) -> set[str]:
    """The local addresses (hex, as /proc/net/tcp* writes them) that listen on `port`."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for row in f.readlines()[1:]:
                local, state = row.split()[1], row.split()[3]
                host, hex_port = local.rsplit(":", 1)
                if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                    found.add(host)
    return found


LOOPBACK = {"0100007F", "00000000000000000000000001000000", "0000000000000000FFFF00000100007F"}


def test_a_worker_of_a_localhost_cluster_listens_on_loopback_or_says_it_does_not():
    address = free_addresses(1)[0]
    worker = subprocess.Popen(
        [sys.executable, "-m", "chain.worker", "--index", "0", "--cluster", address],
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert worker.stdout.readline().startswith("worker 0 serving"), worker.stderr.read()
        bound = listening_on(int(address.rsplit(":", 1)[1]))
        worker.send_signal(signal.SIGTERM)
        out, err = worker.communicate(timeout=30)
    finally:
        worker.kill()
    assert bound, "the worker listens on nothing"
    if bound <= LOOPBACK:
        return  # TensorFlow could bind it to loopback: nothing to warn about
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "every network interface" in warnings[0] and "trusted" in warnings[0], err


def test_split_backwards_and_interleaved_stages_on_two_workers_train_like_on_local_devices(workers, tmp_path):
    """zb1's split backward and interleaved stages in one run (a CLI run costs ~10 s): a schedule
    file with 4 stages on the 2 workers (stage k on worker k mod 2, in Megatron's interleaved order)
    whose backwards are split into B and W, each W at the end of its row, after other stages' work on
    that worker. It trains like the same file on this process's logical devices."""
    import chain
    from chain.schedule import schedule_file, schedules
    from chain.schedule.schedules import WEIGHT, Action, Schedule

    inter = schedules.build("interleaved", 4, 2, 2)
    rows = tuple(
        row + tuple(Action(a.stage, a.microbatch, WEIGHT) for a in row if a.kind == schedules.BACKWARD)
        for row in inter.actions
    )
    path = str(tmp_path / "split-interleaved.csv")
    schedule_file.write(Schedule("file", 4, 2, rows, inter.stage_rows), path)
    args = [
        *[o for o in TINY if o != "+stages=2"],
        "+stages=4",
        "model.depth=1",
        "mode=e2e",
        "pipeline.schedule=file",
        f"pipeline.schedule_file={path}",
        "pipeline.microbatches=2",
        "trainer.steps=3",
    ]
    r = run_cli(tmp_path, *args, workers.option, f"hydra.run.dir={tmp_path / 'cluster'}")
    assert r.returncode == 0, r.stderr
    for k in range(4):  # the placement table: stage k on worker k mod 2
        worker = k % 2
        assert (
            f"{k}      /job:worker/replica:0/task:{worker}/device:CPU:0  worker {worker} "
            f"{workers.addresses[worker]} CPU:0"
        ) in r.stdout, r.stdout
    chain.build(chain.compose(args), run_dir=str(tmp_path / "local")).fit()
    for k in range(4):
        assert_values_alike(
            stage_values(tmp_path / "cluster", f"stage_{k:02d}"),
            stage_values(tmp_path / "local", f"stage_{k:02d}"),
            rtol=1e-6,
        )


@pytest.mark.parametrize("m", [4, pytest.param(8, marks=EXTENDED)])  # M = 2D and 4D
def test_zbv_on_two_workers_trains_like_on_local_devices(workers, tmp_path, m):
    """pipeline.schedule=zbv on 2 workers: stages 0 and 3 on worker 0, 1 and 2 on worker 1 (the V), each
    backward split into B and W. It trains like the same run on this process's logical devices (which
    train like one Keras model on one device: tests/test_pipeline.py)."""
    import chain

    args = [
        *[o for o in TINY if o != "+stages=2"],
        "+stages=4",
        "model.depth=1",
        "mode=e2e",
        "pipeline.schedule=zbv",
        f"pipeline.microbatches={m}",
        "trainer.steps=3",
    ]
    r = run_cli(tmp_path, *args, workers.option, f"hydra.run.dir={tmp_path / 'cluster'}")
    assert r.returncode == 0, r.stderr
    for k in range(4):  # the placement table: stage k on worker min(k, 3 - k)
        worker = min(k, 3 - k)
        assert (
            f"{k}      /job:worker/replica:0/task:{worker}/device:CPU:0  worker {worker} "
            f"{workers.addresses[worker]} CPU:0"
        ) in r.stdout, r.stdout
    chain.build(chain.compose(args), run_dir=str(tmp_path / "local")).fit()
    for k in range(4):
        assert_values_alike(
            stage_values(tmp_path / "cluster", f"stage_{k:02d}"),
            stage_values(tmp_path / "local", f"stage_{k:02d}"),
            rtol=1e-6,
        )


GRID = [
    "+stages=2",
    "model.width=8",
    "data.batch_size=16",
    "trainer.progress=false",
    "checkpoint.export=false",
    "mode=e2e",
    "pipeline.schedule=1f1b",
    "pipeline.microbatches=2",
    "placement.replicas=2",
]


def test_two_copies_of_two_stages_on_four_workers_train_like_the_same_grid_in_process(four_workers, tmp_path):
    """placement.replicas=2 of a two-stage pipeline on four workers (replica r's stage k on worker
    2r+k): the activations cross workers inside each copy, each stage's gradients are averaged
    across two workers, and both stages end as the same grid on this process's logical devices."""
    import chain

    args = [*GRID, "trainer.steps=2"]
    r = run_cli(tmp_path, *args, four_workers.option, f"hydra.run.dir={tmp_path / 'cluster'}")
    assert r.returncode == 0, r.stderr
    assert (
        "0        /job:worker/replica:0/task:0/device:CPU:0  /job:worker/replica:0/task:1/device:CPU:0\n"
        "1        /job:worker/replica:0/task:2/device:CPU:0  /job:worker/replica:0/task:3/device:CPU:0"
    ) in r.stdout, r.stdout
    chain.build(chain.compose(args), run_dir=str(tmp_path / "local")).fit()
    for k in range(2):
        assert_values_alike(
            stage_values(tmp_path / "cluster", f"stage_{k:02d}"),
            stage_values(tmp_path / "local", f"stage_{k:02d}"),
            rtol=1e-6,
        )


def test_a_cluster_run_is_traced_on_its_workers(workers, tmp_path):
    """trainer.profile: each stage's actions come from its own worker's trace (the workers serve
    TensorFlow's profiler), every action of every profiled step, and the step that compiles the
    one-step function (step 3: steps 1-2 ran as one call) is held whole however long it takes: the
    workers trace from before the window's first step until its last has ended. (That step is then left
    out of the figures, with a warning: its ops ran beside the compiling.)"""
    run_dir = tmp_path / "run"
    r = run_cli(
        tmp_path,
        *TINY,
        "mode=e2e",
        "pipeline.microbatches=2",
        "trainer.steps=4",
        "trainer.profile=[3,4]",
        workers.option,
        workers.profile_option,
        f"hydra.run.dir={run_dir}",
    )
    assert r.returncode == 0, r.stderr
    hosts = [f"localhost_{p}" for p in workers.profile_ports]
    with open(run_dir / "timeline.json") as f:
        measured = json.load(f)
    assert [(s["step"], s["complete"]) for s in measured["steps"]] == [(3, False), (4, True)]
    planned = {(k, m, kind) for k in range(2) for m in range(2) for kind in "FB"}
    for step in measured["steps"]:
        assert sorted((a["stage"], a["microbatch"], a["kind"]) for a in step["actions"]) == sorted(planned)
    files = timeline.trace_files(str(run_dir / "tb" / "chain"))
    assert sorted(timeline.source_of(f) for f in files if timeline.source_of(f) in hosts) == sorted(hosts)
    events, steps = timeline.read_trace(files)  # the steps' markers: in the client's trace, beside the workers'
    spans = timeline.trace_spans(files)
    for k, host in enumerate(hosts):  # worker k's own trace holds every action of stage k in both steps, whole
        assert spans[host][0] < steps[3][0] and steps[4][1] < spans[host][1], (host, spans[host], steps)
        for n in (3, 4):
            seen = {
                timeline.owner(e.name) for e in events if e.source == host and steps[n][0] <= e.start <= steps[n][1]
            }
            assert {(stage, m, kind) for kind, stage, m in seen - {None}} >= {p for p in planned if p[0] == k}, (
                host,
                n,
            )
    # each row's stall marker is set by its own worker (trainer.stall_s is on): no message to the client per action
    marked = {e.source for e in events if any(part.startswith("progress_") for part in e.name.split("/"))}
    assert marked == set(hosts), marked
    assert read_summary(run_dir)["measured_bubble_fraction"] is not None
    assert "measured bubble fraction" in r.stdout + r.stderr
    said = [line for line in (r.stdout + r.stderr).splitlines() if "profile:" in line]
    assert len(said) == 1 and "profile: step 3 traced and compiled the step function" in said[0], said
    assert "Starting to trace" not in r.stdout + r.stderr, r.stdout + r.stderr


def test_a_profile_port_where_no_profiler_answers_is_one_line_before_anything_is_written(workers, tmp_path):
    closed = int(free_addresses(1)[0].rsplit(":", 1)[1])
    run_dir = tmp_path / "run"
    r = run_cli(
        tmp_path,
        *TINY,
        "mode=e2e",
        "trainer.steps=2",
        "trainer.profile=[1,2]",
        workers.option,
        f"cluster.profile_ports=[{workers.profile_ports[0]},{closed}]",
        f"hydra.run.dir={run_dir}",
    )
    assert r.returncode == 2, r.stderr
    assert (
        r.stderr.strip()
        .splitlines()[-1]
        .startswith(
            f"error: cluster.profile_ports[1]={closed}: localhost:{closed} does not serve TensorFlow's profiler "
            f"(UNAVAILABLE: "
        )
    ), r.stderr
    assert r.stderr.strip().endswith(f"; start worker 1 with --profile-port {closed}") and "Traceback" not in r.stderr
    assert not run_dir.exists()


def test_a_profile_port_must_be_an_idle_profiler_whose_session_runs_from_start_to_stop(workers, tmp_path):
    """cluster.profile_ports checked at the start of a traced run: a port where no profiler answers and
    a profiler that is already tracing are each one line naming the key. A session runs from when
    `start` returns until `stop` is called, however long that is (no duration fixed in advance)."""
    from chain.errors import ConfigError
    from chain.training.worker_trace import WorkerTraces

    closed = free_addresses(1)[0]  # nothing listens there
    with pytest.raises(
        ConfigError,
        match=rf"^cluster.profile_ports\[0\]=7: {closed} does not serve TensorFlow's "
        rf"profiler \(UNAVAILABLE: .*\); start worker 0 with --profile-port "
        rf"{closed.rsplit(':', 1)[1]}$",
    ):
        WorkerTraces([closed], ["cluster.profile_ports[0]=7"]).check()
    profiler = f"localhost:{workers.profile_ports[1]}"
    busy = WorkerTraces([profiler], ["first"])
    busy.start("chain_test_busy", str(tmp_path))
    started = time.time_ns()
    try:
        with pytest.raises(ConfigError, match=r"^cluster.profile_ports\[1\]=\d+: the profiler at .* already tracing"):
            WorkerTraces([profiler], [f"cluster.profile_ports[1]={workers.profile_ports[1]}"]).check()
    finally:
        stopping = time.time_ns()
        assert busy.stop() == []
    WorkerTraces([profiler], ["again"]).check()  # idle once the session has ended
    written = tmp_path / "chain_test_busy" / f"{profiler.replace(':', '_')}.xplane.pb"
    begun, ended = timeline.trace_spans([str(written)])[profiler.replace(":", "_")]
    assert begun <= started < stopping <= ended  # the same host's clock


@EXTENDED  # the suite's time: the first copy's lost worker (the same watch, its index named) runs every time
def test_a_lost_worker_of_the_second_copy_stops_the_run_with_one_line(four_workers, tmp_path):
    # worker 3 holds replica 1's last stage: the client never reads that copy's report. The module's
    # last test: no later test needs worker 3, so it is not restarted.
    args = [*GRID, "trainer.steps=100000", "checkpoint.every=0", four_workers.option]
    client = start_client(tmp_path, args, tmp_path / "run")
    try:
        wait_for_step(client, 2)
        four_workers.kill(3)
        killed = time.monotonic()
        code = client.wait(timeout=60)
        took = time.monotonic() - killed
        rest = client.stderr.read()
    finally:
        client.kill()
    assert_lost(code, rest, four_workers.addresses[3], "", index=3)
    assert took < 20, took  # seconds, not minutes
