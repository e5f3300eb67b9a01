"""Processes end with their parent and with Ctrl-C: no orphan workers, no waiting for queued
jobs, no traceback from the interpreter's exit handlers.

Each test starts a real parent process (a pool of spawned workers, or a command that is
interrupted) and waits on the kernel's answer (pidfds, pipes) with a bounded deadline; no
fixed sleeps."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from repo_root import REPO, TESTS


POOL_PARENT = """
import sys
from circuitfade.train.jobs import run_jobs
from planted_jobs import hold

jobs = [(sys.argv[1], sys.argv[2])] * int(sys.argv[3])
try:
    for _ in run_jobs(hold, jobs, workers=2, inline=False):
        pass
except KeyboardInterrupt:
    print("pool: interrupted", file=sys.stderr)
    sys.exit(130)
"""


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(TESTS)])}


def _read_pids(fd: int, n: int, parent: subprocess.Popen, deadline: float) -> list[int]:
    """The ``n`` worker pids written to the FIFO ``fd``; fails at once if the parent exits first."""
    buf = b""
    parent_fd = os.pidfd_open(parent.pid)
    try:
        while buf.count(b"\n") < n:
            left = deadline - time.monotonic()
            assert left > 0, "the workers did not start in time"
            ready, _, _ = select.select([fd, parent_fd], [], [], left)
            assert parent_fd not in ready, f"the parent exited: {parent.stderr.read().decode()}"
            if ready:
                buf += os.read(fd, 4096)
    finally:
        os.close(parent_fd)
    return [int(x) for x in buf.split()]


def _watch(pids: list[int]) -> dict[int, int]:
    """A pidfd per live process (opened while they surely run, so a reused pid cannot fool us)."""
    return {os.pidfd_open(p): p for p in pids}


def _still_running(fds: dict[int, int], timeout: float) -> list[int]:
    """Wait (on the pidfds, up to ``timeout`` s) until every watched process has exited; return
    the pids still running, and close the pidfds."""
    try:
        deadline = time.monotonic() + timeout
        pending = set(fds)
        while pending and (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select(list(pending), [], [], left)
            pending -= set(ready)
        return sorted(fds[f] for f in pending)
    finally:
        for f in fds:
            os.close(f)


def _start_pool(tmp_path: Path, n_jobs: int):
    ready, block = tmp_path / "ready", tmp_path / "block"
    os.mkfifo(ready)
    os.mkfifo(block)
    fd = os.open(ready, os.O_RDWR)  # a reader (us) and a writer (us): workers' opens never block
    parent = subprocess.Popen([sys.executable, "-c", POOL_PARENT, str(ready), str(block), str(n_jobs)],
                              env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              start_new_session=True)  # its own process group, as a shell job
    return parent, fd


def _ppid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _cleanup(parent: subprocess.Popen, workers: list[int], fd: int) -> None:
    for pid in [parent.pid, *workers]:  # only the processes this test started
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    parent.wait()
    os.close(fd)


pytestmark = pytest.mark.skipif(not hasattr(os, "pidfd_open") or sys.platform != "linux",
                                reason="pidfds and PR_SET_PDEATHSIG are Linux features")


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_pool_workers_die_with_their_parent(tmp_path, sig):
    parent, fd = _start_pool(tmp_path, n_jobs=2)
    workers: list[int] = []
    try:
        workers = _read_pids(fd, 2, parent, time.monotonic() + 300)
        watched = _watch(workers)
        # they are the pool's workers: children of the caller, or of its fork server (a child of the caller)
        assert all(parent.pid in (_ppid(p), _ppid(_ppid(p))) for p in workers)
        os.kill(parent.pid, sig)
        parent.wait(timeout=60)
        assert _still_running(watched, timeout=30) == []  # none is left training queued runs
    finally:
        _cleanup(parent, workers, fd)


@pytest.mark.slow
def test_ctrl_c_stops_the_pool_without_waiting_for_queued_jobs(tmp_path):
    """Ctrl-C in a terminal signals the whole process group: the workers ignore it, the parent
    cancels the queued jobs, kills its workers and ends with one line, exit 130."""
    parent, fd = _start_pool(tmp_path, n_jobs=4)  # two running, two queued
    workers: list[int] = []
    try:
        workers = _read_pids(fd, 2, parent, time.monotonic() + 300)
        watched = _watch(workers)
        os.killpg(parent.pid, signal.SIGINT)
        try:  # the jobs block forever, so any finite wait tells "stopped" from "kept waiting"; 180 s
            # leaves room for a machine busy with other tests (60 s was once not enough there)
            out, err = parent.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            pytest.fail("the parent kept waiting for its jobs after Ctrl-C")
        assert parent.returncode == 130
        assert err.decode().strip() == "pool: interrupted", err.decode()
        assert _still_running(watched, timeout=30) == []
    finally:
        _cleanup(parent, workers, fd)


INTERRUPTED_WHILE_EXITING = """
import atexit, sys
from circuitfade.commands.boundary import guarded

def wind_down():  # an exit handler still at work (a pool's shutdown, a progress bar's thread)
    print("winding down", flush=True)
    sys.stdin.read()

atexit.register(wind_down)

def interrupted():
    raise KeyboardInterrupt

sys.exit(guarded("circuitfade train", interrupted))
"""


def test_second_ctrl_c_during_exit_handlers_prints_no_traceback():
    proc = subprocess.Popen([sys.executable, "-c", INTERRUPTED_WHILE_EXITING], env=_env(), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 120)
        assert ready and proc.stdout.readline() == b"winding down\n", proc.stderr.read().decode()
        proc.send_signal(signal.SIGINT)  # the second Ctrl-C
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    err = err.decode()
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert err.strip() == ("circuitfade train: interrupted; finished checkpoints are kept: "
                           "run the same command again to resume")
    assert proc.returncode == 130


def test_the_start_method_is_chosen_by_its_environment_variable(monkeypatch):
    """``CIRCUITFADE_START_METHOD=spawn``: the worker is this process's own child (not the fork
    server's); an unknown method is refused before any worker starts."""
    from circuitfade.train.jobs import START_METHOD_ENV, run_jobs
    from planted_jobs import environ_and_parent

    monkeypatch.setenv(START_METHOD_ENV, "spawn")
    [(_, (value, ppid, _))] = list(run_jobs(environ_and_parent, [START_METHOD_ENV], workers=1, inline=False))
    assert value == "spawn" and ppid == os.getpid()
    monkeypatch.setenv(START_METHOD_ENV, "fork")
    with pytest.raises(ValueError, match="CIRCUITFADE_START_METHOD='fork': expected 'forkserver' or 'spawn'"):
        list(run_jobs(environ_and_parent, [START_METHOD_ENV], workers=1, inline=False))


def test_workers_start_from_the_fork_server_with_the_callers_environment(monkeypatch):
    """Every pool's workers are forked from one fork server that imported torch once (Linux), and see the
    caller's environment as it is when the pool is made, as spawned workers would."""
    from multiprocessing import get_all_start_methods

    from circuitfade.train.jobs import run_jobs
    from planted_jobs import environ_and_parent

    if "forkserver" not in get_all_start_methods():  # pragma: no cover - Windows
        pytest.skip("no fork server on this platform")
    seen = []
    for value in ("first", "second"):
        monkeypatch.setenv("CIRCUITFADE_TEST_VALUE", value)
        results = [r for _, r in run_jobs(environ_and_parent, ["CIRCUITFADE_TEST_VALUE"] * 2, workers=2)]
        assert [r[0] for r in results] == [value, value]
        seen += results
    servers = {ppid for _, ppid, _ in seen}
    assert len(servers) == 1 and os.getpid() not in servers  # one server for both pools, not this process
    assert _ppid(servers.pop()) == os.getpid()  # ... started by this process
    assert all(preloaded for _, _, preloaded in seen)
