"""A warm Python that forks: the docs-block tests start each page's interpreter and each shell command
as a copy of one process that has already imported torch, TransformerLens and circuitfade.

A fresh ``python`` spends seconds importing those before the first line of a block or a command runs;
a page with a dozen commands paid that a dozen times. :class:`WarmPython` starts one *zygote*
(a plain interpreter, not pytest) per test process; every request forks it. The child is set up as a
fresh interpreter would be where that matters - working folder, ``sys.argv``, ``sys.path[0]``, the
three standard streams, torch's, Python's and NumPy's global generators seeded from the OS - and exits as the interpreter does
(threads joined, ``atexit`` handlers run, streams flushed; the modules are not torn down one by one, which
takes over a second with torch loaded). What it shares with a fresh one by construction: the same
interpreter, environment and installed packages; what differs: modules are imported already (as in a
notebook whose first cell imported them).

Requests go over a Unix socket with the child's file descriptors attached (``socket.send_fds``), so
the test owns every pipe and file and can kill a child that hangs.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

# the zygote: imports the heavy modules once, then forks one child per request
_ZYGOTE = r'''
import json, os, runpy, socket, sys, traceback
import torch
torch.set_num_threads(1)
import numpy, pandas, transformer_lens  # noqa: F401  (the seconds a fresh interpreter spends)
import circuitfade, circuitfade.cli  # noqa: F401
for _name in ("circuitfade.model", "circuitfade.analysis", "circuitfade.train"):
    __import__(_name)


def _child(req, fds):
    """Become the requested process: never returns."""
    import random
    for target, fd in zip((0, 1, 2), fds[:3]):
        os.dup2(fd, target)
    for fd in fds[:3]:
        os.close(fd)
    extra = {"{fd:%d}" % i: str(fd) for i, fd in enumerate(fds) if i >= 3}  # further descriptors stay open
    sys.stdin = open(0, "r", closefd=False)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    torch.seed()  # a fresh interpreter seeds torch's, Python's and NumPy's generators from the OS
    random.seed()
    numpy.random.seed()
    argv = [extra.get(a, a) for a in req["argv"]]
    code = 0
    try:
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            sys.path[0] = req["cwd"]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        elif argv[0] == "-c":
            sys.argv = ["-c", *argv[2:]]
            sys.path[0] = ""
            exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__"})
        else:
            sys.argv = list(argv)
            sys.path[0] = str(os.path.dirname(os.path.abspath(argv[0])))
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as e:
        code = e.code
    except BaseException as e:
        traceback.print_exception(e.with_traceback(e.__traceback__.tb_next))  # from the program's first frame
        code = 1
    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    # the interpreter's own exit, less tearing down every module (over a second with torch loaded): threads
    # joined, atexit handlers run, streams flushed
    import atexit, threading
    threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(code)


def _serve(conn):
    while True:
        msg, fds, _, _ = socket.recv_fds(conn, 1 << 16, 8)
        if not msg:
            return
        while True:  # reap finished children
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except ChildProcessError:
                break
        req = json.loads(msg)
        pid = os.fork()
        if pid == 0:
            conn.close()
            _child(req, fds)
        for fd in fds:
            os.close(fd)
        conn.sendall((json.dumps({"pid": pid}) + "\n").encode())
        if req["wait"]:
            _, status = os.waitpid(pid, 0)
            conn.sendall((json.dumps({"exit": os.waitstatus_to_exitcode(status)}) + "\n").encode())


_serve(socket.socket(fileno=int(sys.argv[1])))
'''


class WarmPython:
    """One zygote started with ``env``; :meth:`run` is a blocking ``subprocess.run`` and :meth:`popen` a
    process whose three standard streams are the file descriptors given. A child's environment is
    ``env``, or the one its call names (import-time variables as the zygote had them)."""

    def __init__(self, env: dict[str, str]):
        self.env = dict(env)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.proc = subprocess.Popen([sys.executable, "-c", _ZYGOTE, str(theirs.fileno())], env=env,
                                     stdin=subprocess.DEVNULL, pass_fds=(theirs.fileno(),))
        theirs.close()
        self.sock = ours
        self.replies = ours.makefile("r")

    def _request(self, argv: list[str], cwd: Path, fds: list[int], wait: bool, env: dict[str, str] | None) -> int:
        if self.proc.poll() is not None:
            raise RuntimeError(f"the warm interpreter exited with code {self.proc.returncode}")
        req = {"argv": argv, "cwd": str(cwd), "wait": wait, "env": self.env if env is None else env}
        socket.send_fds(self.sock, [json.dumps(req).encode()], fds)
        line = self.replies.readline()
        if not line:
            raise RuntimeError(f"the warm interpreter died (exit code {self.proc.wait()})")
        return json.loads(line)["pid"]

    def popen(self, argv: list[str], cwd: Path, fds: list[int], env: dict[str, str] | None = None) -> int:
        """Start ``python *argv`` in ``cwd``; ``fds`` are its stdin, stdout, stderr and any further descriptors
        it keeps open, named in ``argv`` as ``{fd:3}``, ``{fd:4}``...; its pid (not waited for)."""
        return self._request(argv, cwd, fds, wait=False, env=env)

    def run(self, argv: list[str], cwd: Path, timeout: float,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        """``python *argv`` in ``cwd``: exit code, stdout and stderr, as ``subprocess.run`` gives them."""
        import tempfile

        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, open(os.devnull) as null:
            pid = self._request(argv, cwd, [null.fileno(), out.fileno(), err.fileno()], wait=True, env=env)
            self.sock.settimeout(timeout)
            try:
                line = self.replies.readline()
            except (socket.timeout, TimeoutError):
                os.kill(pid, signal.SIGKILL)
                self.close()
                raise subprocess.TimeoutExpired([sys.executable, *argv], timeout) from None
            finally:
                self.sock.settimeout(None)
            code = json.loads(line)["exit"]
            out.seek(0)
            err.seek(0)
            return subprocess.CompletedProcess([sys.executable, *argv], code, out.read().decode(errors="replace"),
                                               err.read().decode(errors="replace"))

    def close(self) -> None:
        self.sock.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# variables read when torch or the package is imported: a child with other values needs another zygote
IMPORT_TIME = ("PYTHONPATH", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "ATEN_CPU_CAPABILITY", "MKL_CBWR",
               "CIRCUITFADE_CACHE", "PYTHONHASHSEED", "TORCH_LOGS")
_ZYGOTES: dict[tuple, WarmPython] = {}


def warm_python(env: dict[str, str]) -> WarmPython:
    """This test process's warm interpreter for ``env`` (started with it at first use, ended at exit); one per
    set of values of :data:`IMPORT_TIME`."""
    key = tuple(env.get(k) for k in IMPORT_TIME)
    z = _ZYGOTES.get(key)
    if z is None or z.proc.poll() is not None:
        import atexit

        z = _ZYGOTES[key] = WarmPython(dict(env))
        atexit.register(z.close)
    return z


def default_env() -> dict[str, str]:
    """This process's environment with the repository first on ``PYTHONPATH`` and one OpenMP thread unless
    set: what the tests give the programs they start."""
    from repo_root import REPO

    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def run_python(argv: list[str], cwd: Path, env: dict[str, str] | None = None,
               timeout: float = 900) -> subprocess.CompletedProcess:
    """``subprocess.run([sys.executable, *argv], cwd=cwd, env=env, capture_output=True, text=True)``, forked
    from the warm interpreter (``env`` defaults to :func:`default_env`)."""
    env = default_env() if env is None else env
    return warm_python(env).run(argv, cwd, timeout, env=env)
