"""The checker's zygote: one trusted process per grading run that has already imported what
every checker imports (torch, the library, the grading modules) and forks a checker per request.

A checker started as ``python -m ai_evolution.grading.checker`` spends about 3 s of CPU on its
imports before it checks anything, and a grading run starts at least one per submission. The
zygote pays them once per run. It runs trusted code only (it is the grader's own process tree,
like the checker itself): it holds no job, no secret and no submitted byte before a request,
and each fork becomes a checker as a fresh one would be, with its own session, working folder,
environment, limits and private stdout (:func:`.checker.checker_main`). The function worker a
checker starts, the only process that runs submitted code, is still a fresh, jailed process.
Where the zygote cannot start, or dies, checkers start as fresh processes.

Protocol, on a Unix socket pair, one request at a time: the grader sends an 8-byte length, with
three file descriptors (the checker's stdout, its log, the write end of a status pipe), then a
JSON header (working folder, environment, job); the zygote forks, answers with the child's pid
(8 bytes) and, when it reaps the child, writes its exit status into the status pipe (as
``subprocess`` reports one: negative for a signal) and closes it.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
from pathlib import Path

# Modules every checker imports before its first check (the assessment's own modules are loaded
# after the fork, per checker, from the assessment folder).
PRELOAD = ("torch", "numpy", "psutil", "ai_evolution.labs", "ai_evolution.grading.assessment",
           "ai_evolution.grading.checker", "ai_evolution.grading.namespace",
           "ai_evolution.grading.proxy", "ai_evolution.grading.stripped",
           "ai_evolution.grading.codec", "ai_evolution.grading.delegation")
_SIZE = struct.Struct("!q")


# --- the zygote process --------------------------------------------------------------------------

def _read_exactly(sock: socket.socket, n: int, first: bytes = b"") -> bytes | None:
    data = bytearray(first)
    while len(data) < n:
        chunk = sock.recv(min(1 << 20, n - len(data)))
        if not chunk:
            return None
        data += chunk
    return bytes(data)


def _status(code: int) -> int:
    if os.WIFSIGNALED(code):
        return -os.WTERMSIG(code)
    return os.WEXITSTATUS(code) if os.WIFEXITED(code) else 1


def _become_checker(request: dict, fds: list[int], keep_closed: list[int]) -> None:
    """In the forked child: the process a fresh checker would be, then the checker itself."""
    code = 1
    try:
        os.setsid()
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in keep_closed:
            with contextlib.suppress(OSError):
                os.close(fd)
        stdout_fd, log_fd, status_fd = fds
        os.close(status_fd)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(stdout_fd, 1)
        os.dup2(log_fd, 2)
        for fd in (devnull, stdout_fd, log_fd):
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        import tempfile

        tempfile.tempdir = None  # recomputed from the checker's TMPDIR
        from .checker import checker_main

        code = checker_main(request["job"])
    except SystemExit as err:
        code = err.code if isinstance(err.code, int) else 1
    except BaseException:  # noqa: BLE001 - reported in the checker's log, as a fresh one would
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def zygote_main(fd: int) -> int:
    """Serve fork requests on the socket ``fd`` until the grader closes it."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    sock = socket.socket(fileno=fd)
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    statuses: dict[int, int] = {}  # child pid -> write end of its status pipe

    def reap() -> None:
        for pid in list(statuses):
            try:
                done, code = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done, code = pid, 9  # SIGKILL: lost without a status
            if done:
                with contextlib.suppress(OSError):
                    os.write(statuses[pid], str(_status(code)).encode())
                os.close(statuses.pop(pid))

    sock.sendall(_SIZE.pack(os.getpid()))  # ready: everything is imported
    while True:
        ready, _, _ = select.select([sock, wake_r], [], [])
        if wake_r in ready:
            with contextlib.suppress(BlockingIOError):
                while os.read(wake_r, 4096):
                    pass
        reap()
        if sock not in ready:
            continue
        msg, fds, _, _ = socket.recv_fds(sock, _SIZE.size, 3)
        head = _read_exactly(sock, _SIZE.size, msg) if msg else None
        if head is None or len(fds) != 3:
            for fd_ in fds:
                os.close(fd_)
            break  # the grader is gone (or broke the protocol): stop serving
        body = _read_exactly(sock, _SIZE.unpack(head)[0])
        if body is None:
            break
        request = json.loads(body.decode("utf-8"))
        pid = os.fork()
        if pid == 0:
            _become_checker(request, fds, [sock.fileno(), wake_r, wake_w, *statuses.values()])
        os.close(fds[0])
        os.close(fds[1])
        statuses[pid] = fds[2]
        sock.sendall(_SIZE.pack(pid))
    for pid in statuses:  # the grader left: nothing it started outlives it
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)
    return 0


# --- the grader's side ---------------------------------------------------------------------------

class Forked:
    """A checker forked by the zygote, with the part of ``subprocess.Popen`` that
    :func:`.sandbox.run_untrusted` uses (it is the zygote's child, so its exit status comes
    through the status pipe, not ``waitpid``)."""

    stdin = None

    def __init__(self, pid: int, stdout, status_fd: int):
        self.pid, self.stdout, self._status, self.returncode = pid, stdout, status_fd, None

    def _collect(self, timeout: float | None) -> None:
        if self.returncode is not None:
            return
        ready, _, _ = select.select([self._status], [], [], timeout)
        if ready:
            data = os.read(self._status, 32)
            os.close(self._status)
            # No status: the zygote died first (run_untrusted then kills what is left).
            self.returncode = int(data) if data else -signal.SIGKILL

    def poll(self) -> int | None:
        self._collect(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._collect(timeout)
        if self.returncode is None:
            raise subprocess.TimeoutExpired("checker", timeout)
        return self.returncode

    def kill(self) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)


class Zygote:
    """The grader's handle on its zygote (see the module's docstring)."""

    def __init__(self):
        from .sandbox import TOKEN_ENV, _base_env, new_scratch

        self._lock = threading.Lock()
        self.scratch = new_scratch()  # the zygote's own HOME, TMPDIR and matplotlib folder
        env = _base_env(self.scratch, "")
        env.pop(TOKEN_ENV)  # each checker gets its run's token with its request
        ours, theirs = socket.socketpair()
        self.sock = ours
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-P", "-c",
                 "import sys; from ai_evolution.grading.zygote import zygote_main; "
                 "sys.exit(zygote_main(int(sys.argv[1])))", str(theirs.fileno())],
                pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                cwd=self.scratch / "work", start_new_session=True)
        finally:
            theirs.close()
        ready = _read_exactly(self.sock, _SIZE.size)
        if ready is None:
            self.close()
            raise OSError("the checker's zygote did not start")
        self.pid = self.proc.pid

    def spawn(self, cmd_env: dict, cwd: Path, job: bytes, log) -> Forked:
        """A checker running ``job`` (JSON bytes) in ``cwd`` with ``cmd_env``, its stderr on
        ``log`` (an open file)."""
        out_r, out_w = os.pipe()
        status_r, status_w = os.pipe()
        body = json.dumps({"cwd": str(cwd), "env": cmd_env,
                           "job": json.loads(job.decode("utf-8"))}).encode("utf-8")
        try:
            with self._lock:
                socket.send_fds(self.sock, [_SIZE.pack(len(body))], [out_w, log.fileno(), status_w])
                self.sock.sendall(body)
                answer = _read_exactly(self.sock, _SIZE.size)
            if answer is None:
                raise OSError("the checker's zygote is gone")
        except OSError:
            for fd in (out_r, status_r):
                os.close(fd)
            raise
        finally:
            os.close(out_w)
            os.close(status_w)
        return Forked(_SIZE.unpack(answer)[0], os.fdopen(out_r, "rb"), status_r)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        import shutil

        with contextlib.suppress(OSError):
            self.sock.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.scratch, ignore_errors=True)


_CURRENT: Zygote | None = None


def current() -> Zygote | None:
    """The zygote of the grading run in progress, if one is alive."""
    z = _CURRENT
    return z if z is not None and z.alive() else None


@contextlib.contextmanager
def checker_zygote():
    """A zygote for the checkers started inside the block (one grading run); without one (it
    cannot start here) checkers start as fresh processes."""
    global _CURRENT
    from .sandbox import _LIVE, _LIVE_LOCK

    if _CURRENT is not None or not hasattr(socket, "send_fds") or not hasattr(os, "fork"):
        yield _CURRENT
        return
    try:
        zygote = Zygote()
    except OSError:
        yield None
        return
    with _LIVE_LOCK:  # the grader's orphan sweep must not take it for an orphan
        _LIVE.add(zygote.pid)
    _CURRENT = zygote
    try:
        yield zygote
    finally:
        _CURRENT = None
        zygote.close()
        with _LIVE_LOCK:
            _LIVE.discard(zygote.pid)
