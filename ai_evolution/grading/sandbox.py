"""Supervise untrusted processes: isolation, limits, and killing everything a run started.

What runs under it, for one submission::

    grader (this process)
      ├─ [bwrap] worker that executes the notebook (:mod:`.notebook`)
      │    └─ kernel (ipykernel, started by papermill)
      └─ zygote (trusted, one per grading run, :mod:`.zygote`): the checker's imports, once
           └─ checker (trusted, runs no submitted code): a fork of the zygote (where there is
              │         none, ``python -m ai_evolution.grading.checker``)
              └─ [bwrap] function worker: ``python -m ai_evolution.grading.worker functions``,
                         the exercise statements rebuilt from the submitted file, on a library
                         without the reference answers (``checker``, ``proxy``, ``stripped``)

Isolation (:func:`isolation`): where ``bwrap`` (bubblewrap) works, each process runs in its own
PID, network, IPC and UTS namespaces, with the library, the virtual environment and the Python
installation read-only, a scratch folder of its own as the only writable path (plus a private
``/tmp``), and ``--die-with-parent``: the notebook cannot see other submissions, the hidden
checks, the grader's outputs or any process outside the sandbox, and nothing it starts survives
it. Elsewhere the processes run in a session of their own (``"session"``): the limits below
still hold, but a notebook can read and write whatever the grading user can.

Limits (:func:`run_untrusted`): wall clock for a whole run (``timeout_s``: the tree is killed),
memory (``RLIMIT_AS`` on every process, and the resident memory of the whole tree), file size
(``RLIMIT_FSIZE``). Around them, per submission (:func:`submission_limits`, set by the grader
for everything one submission runs): one wall-clock budget that every process of that
submission (its notebook and every start of its checker) draws from, and the bytes on disk of
each scratch folder (polled; the process is killed past ``disk_mb``). Under bubblewrap ``/tmp``
and ``/dev/shm`` are tmpfs (RAM that no RSS shows) of ``TMPFS_BYTES`` each and the rest of
``/dev`` is read-only, so RAM outside the RSS bound is capped too; in the session fallback
``/tmp`` is the machine's and only ``RLIMIT_FSIZE`` bounds a file there. Everything the run
started is killed when it ends: the process tree (sampled every poll), any process that carries
the run's token in its environment, and (where the grader is a child subreaper, as the CLI
is) any orphan re-parented to the grader.
"""

from __future__ import annotations

import os
import resource
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

TOKEN_ENV = "AI_EVOLUTION_GRADING_RUN"
FSIZE_LIMIT_BYTES = 512 * 2**20
TMPFS_BYTES = 64 * 2**20  # each of /tmp and /dev/shm under bubblewrap (RAM, in no RSS)
DISK_POLL_S = 1.0
PACKAGE_DIR = Path(__file__).resolve().parents[1]
PACKAGE_ROOT = PACKAGE_DIR.parent

# --- isolation -----------------------------------------------------------------------------------

@lru_cache(maxsize=1)
def _bwrap_sizes_tmpfs() -> bool:
    """Whether this bubblewrap has ``--size`` (0.5 and later)."""
    try:
        return "--size" in subprocess.run(["bwrap", "--help"], capture_output=True, text=True,
                                          timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return False


def _bwrap_base(writable: list[Path], readonly: list[Path],
                library: Path = PACKAGE_DIR) -> list[str]:
    """``library``: the package folder bound read-only (the function worker binds its stripped
    copy instead, and never sees the real one)."""
    # /tmp and /dev/shm: tmpfs of a fixed size (an older bubblewrap cannot size one: both stay
    # read-only, TMPDIR is in the scratch folder); the rest of /dev (a tmpfs) read-only.
    cmd = ["bwrap", "--proc", "/proc", "--dev", "/dev"]
    if _bwrap_sizes_tmpfs():
        size = str(TMPFS_BYTES)
        cmd += ["--size", size, "--tmpfs", "/dev/shm", "--remount-ro", "/dev",
                "--size", size, "--tmpfs", "/tmp"]
    else:
        cmd += ["--remount-ro", "/dev", "--dir", "/tmp"]
    for path in ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/etc", "/sys"):
        cmd += ["--ro-bind-try", path, path]
    prefixes = {Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve(),
                Path(sys.executable).resolve().parent.parent}
    for path in sorted({*prefixes, Path(library), *readonly}):
        cmd += ["--ro-bind", str(path), str(path)]
    for path in writable:
        cmd += ["--bind", str(path), str(path)]
    cmd += ["--remount-ro", "/"]  # bubblewrap's root is a tmpfs too: nothing to write there
    cmd += ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
            "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    return cmd


@lru_cache(maxsize=1)
def _bwrap_works() -> bool:
    if os.environ.get("AI_EVOLUTION_NO_BWRAP") or not shutil.which("bwrap") or \
            not sys.platform.startswith("linux"):
        return False
    try:
        with tempfile.TemporaryDirectory() as tmp:
            done = subprocess.run(_bwrap_base([Path(tmp)], []) +
                                  ["--", sys.executable, "-c", "import ai_evolution, os; "
                                   "print(os.getpid())"], capture_output=True, text=True,
                                  timeout=60, env=_base_env(Path(tmp), "probe"))
        return done.returncode == 0 and done.stdout.strip() != ""
    except (OSError, subprocess.SubprocessError):
        return False


def isolation() -> str:
    """``"bwrap"`` where bubblewrap works on this machine, else ``"session"``."""
    return "bwrap" if _bwrap_works() else "session"


def _base_env(scratch: Path, token: str) -> dict:
    home = scratch / "home"
    env = {k: v for k, v in os.environ.items()
           if k in ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "SYSTEMROOT")}
    env.update({
        "AI_EVOLUTION_PROFILE": "ci", "CUDA_VISIBLE_DEVICES": "", "MPLBACKEND": "Agg",
        "PYTHONHASHSEED": "0", "HOME": str(home), "TMPDIR": str(home / "tmp"),
        "MPLCONFIGDIR": str(home / "mplconfig"), "MALLOC_ARENA_MAX": "2",
        "PYTHONPATH": str(PACKAGE_ROOT), "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
        "PYDEVD_DISABLE_FILE_VALIDATION": "1", "PYTHONDONTWRITEBYTECODE": "1",
        TOKEN_ENV: token,
    })
    env.setdefault("PATH", "/usr/bin:/bin")
    return env


def command(module: str, scratch: Path, isolated: str, readonly: list[Path] = ()) -> list[str]:
    """``python -m module``, inside bubblewrap when ``isolated == "bwrap"``."""
    inner = [sys.executable, "-P", "-m", module]  # -P: the working folder is not on sys.path
    if isolated != "bwrap":
        return inner
    return _bwrap_base([scratch], list(readonly)) + ["--chdir", str(scratch / "work"), "--"] + inner


def new_scratch() -> Path:
    """A scratch folder of one process: ``work/`` (its working directory) and ``home/``."""
    scratch = Path(tempfile.mkdtemp(prefix="ai-evolution-"))
    for sub in ("work", "home/tmp", "home/runtime", "home/mplconfig"):
        (scratch / sub).mkdir(parents=True, exist_ok=True)
    return scratch


# --- inside a jailed process: its own limits and its private answer channel ---------------------

def set_limits(memory_mb: int) -> None:
    limit = memory_mb * 2**20
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard == resource.RLIM_INFINITY or hard > limit:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    resource.setrlimit(resource.RLIMIT_FSIZE, (FSIZE_LIMIT_BYTES, FSIZE_LIMIT_BYTES))


def private_stdout() -> int:
    """A copy of stdout that no child inherits; fd 1 then points at stderr (the log). The
    process also becomes non-dumpable, so a child cannot reopen the copy through /proc."""
    fd = os.dup(1)  # non-inheritable by default
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 0
    except Exception:  # noqa: BLE001 - not Linux
        pass
    return fd


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


# --- process control (the grader's side) ---------------------------------------------------------

_LIMITS = threading.local()  # the limits of the submission this thread is grading


@contextmanager
def submission_limits(budget_s: float | None = None, disk_mb: int | None = None):
    """Limits shared by every untrusted process this thread starts until the block ends (one
    submission): ``budget_s`` seconds of wall clock in all, from now (a run is killed when
    either its own timeout or the budget runs out, and one started after the budget is spent
    does not start), and ``disk_mb`` MiB in each scratch folder."""
    previous = getattr(_LIMITS, "value", None)
    _LIMITS.value = {"deadline": None if budget_s is None else time.monotonic() + budget_s,
                     "budget_s": budget_s, "disk_mb": disk_mb}
    try:
        yield
    finally:
        _LIMITS.value = previous


def _limits() -> dict:
    return getattr(_LIMITS, "value", None) or {"deadline": None, "budget_s": None,
                                               "disk_mb": None}


def budget_left() -> float | None:
    """Seconds left in this submission's wall-clock budget (None: no budget)."""
    deadline = _limits()["deadline"]
    return None if deadline is None else deadline - time.monotonic()


def budget_reason() -> str:
    """Why a run was stopped by the submission's budget (Spanish)."""
    budget = _limits()["budget_s"]
    seconds = f"{budget:g} s" if budget is not None else "sin límite"
    return (f"se agotó el tiempo total de esta entrega ({seconds} para el cuaderno y la "
            "corrección de los ejercicios juntos).")


def disk_bytes(folder: Path) -> int:
    """Bytes the files under ``folder`` occupy on disk (allocated blocks: a sparse file counts
    what it really uses), without following links; files that vanish meanwhile count 0."""
    total, stack = 0, [str(folder)]
    while stack:
        try:
            with os.scandir(stack.pop()) as entries:
                for entry in entries:
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    total += st.st_blocks * 512
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
        except OSError:
            continue
    return total

def enable_subreaper() -> bool:
    """Make this process a child subreaper: orphans of anything it started become its children
    (and :func:`sweep_orphans` can kill them). Linux only; False elsewhere."""
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
    except Exception:  # noqa: BLE001
        return False


_SUBREAPER = False
_LIVE_LOCK = threading.Lock()
_LIVE: set[int] = set()  # pids of the workers and checkers this process is running now


def set_subreaper() -> None:
    global _SUBREAPER
    _SUBREAPER = enable_subreaper()


def sweep_orphans() -> None:
    """Kill and reap every child of this (subreaper) process that is not a worker or checker it
    is running now: in the CLI those can only be orphans a submission left behind."""
    if not _SUBREAPER:
        return
    import psutil

    with _LIVE_LOCK:
        for child in psutil.Process().children():
            if child.pid in _LIVE:
                continue
            try:
                child.kill()
            except psutil.Error:
                pass
            try:
                os.waitpid(child.pid, 0)
            except (ChildProcessError, OSError):
                pass


def _tree(pid: int) -> list:
    import psutil

    try:
        root = psutil.Process(pid)
        return [root] + root.children(recursive=True)
    except psutil.Error:
        return []


def _with_token(token: str) -> list:
    import psutil

    out = []
    for p in psutil.process_iter():
        try:
            if p.pid != os.getpid() and p.environ().get(TOKEN_ENV) == token:
                out.append(p)
        except psutil.Error:
            pass
    return out


def kill_all(processes) -> None:
    import psutil

    own = os.getpgid(0)
    for p in processes:
        try:
            pgid = os.getpgid(p.pid)
            if pgid != own:
                os.killpg(pgid, 9)
        except (ProcessLookupError, PermissionError, OSError):
            pass
        try:
            p.kill()
        except psutil.Error:
            pass


STOPPED_GRACE_S = 3.0


def _any_stopped(processes) -> bool:
    import psutil

    for p in processes:
        try:
            if p.status() in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP):
                return True
        except psutil.Error:
            pass
    return False


def _rss(processes) -> int:
    import psutil

    total = 0
    for p in processes:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


@dataclass
class Finished:
    stdout: bytes
    killed: str | None      # None | "timeout" | "budget" | "memory" | "disk" | "stopped"
    returncode: int | None


def run_untrusted(cmd: list[str], job: bytes, scratch: Path, timeout_s: float, memory_mb: int,
                  log_path: Path, on_line=None, stop=None, spawn=None) -> Finished:
    """Run ``cmd`` (a worker or checker) with ``job`` on stdin; collect its stdout; kill it
    and everything it started at the deadline, past the memory bound, or when ``stop()`` says
    so; then kill whatever it left behind. A process of the run that stays stopped (SIGSTOP)
    for ``STOPPED_GRACE_S`` is killed at once rather than waited for until the deadline: nothing
    in the run can make progress again. ``on_line(bytes)`` sees each stdout line as it comes.
    Within :func:`submission_limits`, the submission's budget shortens the deadline (``killed
    == "budget"``; a run with no budget left does not start) and ``scratch`` is killed past its
    disk bound (``"disk"``). ``spawn(env, cwd, log)``, where given, starts the process in
    place of ``cmd`` (a checker forked by the zygote, :mod:`.zygote`, with the job already
    given); where it returns None, ``cmd`` starts."""
    import psutil

    left, disk_mb = budget_left(), _limits()["disk_mb"]
    if left is not None and left <= 0:
        return Finished(b"", "budget", None)
    by_budget = left is not None and left < timeout_s
    token = secrets.token_hex(16)
    env = _base_env(scratch, token)
    if memory_mb:
        env["AI_EVOLUTION_MEMORY_MB"] = str(memory_mb)
    chunks: list[bytes] = []
    killed = None
    with open(log_path, "ab") as log:
        with _LIVE_LOCK:  # a concurrent sweep must not take it for an orphan
            proc = spawn(env, scratch / "work", log) if spawn is not None else None
            if proc is None:
                proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=log, cwd=scratch / "work", env=env,
                                        start_new_session=True)
            _LIVE.add(proc.pid)

        def feed():
            if proc.stdin is None:  # the job went with the request
                return
            try:
                proc.stdin.write(job)
                proc.stdin.close()
            except OSError:
                pass

        def read():
            for line in iter(proc.stdout.readline, b""):
                chunks.append(line)
                if on_line is not None:
                    on_line(line)

        threads = [threading.Thread(target=feed, daemon=True),
                   threading.Thread(target=read, daemon=True)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + (left if by_budget else timeout_s)
        seen: dict[int, psutil.Process] = {}
        stopped_since: float | None = None
        next_disk = time.monotonic()
        try:
            while proc.poll() is None:
                tree = _tree(proc.pid)
                for p in tree:
                    seen.setdefault(p.pid, p)
                now = time.monotonic()
                stopped_since = (stopped_since or now) if _any_stopped(tree) else None
                if now > deadline:
                    killed = "budget" if by_budget else "timeout"
                elif stop is not None and stop():
                    killed = "timeout"
                elif memory_mb and _rss(tree) > memory_mb * 2**20:
                    killed = "memory"
                elif disk_mb and now >= next_disk and disk_bytes(scratch) > disk_mb * 2**20:
                    killed = "disk"
                elif stopped_since is not None and now - stopped_since >= STOPPED_GRACE_S:
                    killed = "stopped"
                if killed:
                    kill_all(tree)
                    break
                if disk_mb and now >= next_disk:
                    next_disk = now + DISK_POLL_S
                time.sleep(0.2)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            threads[1].join(timeout=10)
        finally:
            # Anything the run left behind: its tree, its token, orphans re-parented here.
            for _ in range(3):
                left = [p for p in seen.values() if p.is_running()] + _with_token(token)
                if not left:
                    break
                kill_all(left)
                time.sleep(0.05)
            with _LIVE_LOCK:
                _LIVE.discard(proc.pid)
            sweep_orphans()
    return Finished(b"".join(chunks), killed, proc.returncode)


