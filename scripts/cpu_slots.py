"""CPU slots: at most one CPU-bound stream per core across the processes of one test run.

`make test` runs two pytest workers on a 2-core machine, and some of their work starts more
processes: the book build executes two notebook pages at once (`scripts/execute_book.py`) and
lab 2's grading run grades two submissions at once. Left alone, three or four CPU-bound
processes share the two cores; each then takes more CPU seconds for the same work (lab 5's
kernel 19 % more, lab 9's 23 % more, measured four at once against two at once), so the whole
suite takes longer. Here each stream first takes a slot from a pool of ``os.cpu_count()``:

- a test takes one for its setup, call and teardown (``tests/conftest.py``), or two for a
  fixture that runs two streams (the grading run);
- each book page takes one while it executes, with priority: the book is the suite's critical
  path, so its pages go before the next test when both wait;
- a test that only waits (for the book another worker is building) holds none.

Requests are served in order (priority first, then arrival): one that needs two slots is not
overtaken by later requests for one. The state is a small JSON file under a file lock; a slot
held or requested by a process that has died is given back when the next request looks.
Outside `make test` (no ``AI_EVOLUTION_CPU_SLOTS`` in the environment) nothing waits.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import json
import os
import time
from pathlib import Path

ENV = "AI_EVOLUTION_CPU_SLOTS"
POLL_S = 0.02
_counter = itertools.count()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class CpuSlots:
    """A pool of ``capacity`` slots shared through ``folder`` by every process that opens it."""

    def __init__(self, folder: Path | str, capacity: int | None = None):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.capacity = max(1, int(capacity or os.cpu_count() or 1))

    @contextlib.contextmanager
    def _state(self):
        with open(self.folder / "slots.lock", "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            path = self.folder / "slots.json"
            state = (json.loads(path.read_text(encoding="utf-8")) if path.is_file()
                     else {"held": {}, "queue": [], "next": 0})
            state["held"] = {t: h for t, h in state["held"].items() if _alive(h[0])}
            state["queue"] = [q for q in state["queue"] if _alive(q[1])]
            yield state
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(state), encoding="utf-8")
            tmp.replace(path)

    def held(self) -> int:
        """Slots held now, by live processes."""
        with self._state() as state:
            return sum(h[1] for h in state["held"].values())

    def acquire(self, n: int = 1, priority: bool = False) -> str:
        """Wait for ``n`` slots (at most the capacity); returns the token to release them with."""
        n = max(1, min(int(n), self.capacity))
        token = f"{os.getpid()}-{next(_counter)}"
        with self._state() as state:
            ticket = state["next"]
            state["next"] += 1
            state["queue"].append([ticket, os.getpid(), n, int(priority), token])
        try:
            while True:
                with self._state() as state:
                    head = min(state["queue"], key=lambda q: (-q[3], q[0]))
                    free = self.capacity - sum(h[1] for h in state["held"].values())
                    if head[4] == token and free >= n:
                        state["queue"].remove(head)
                        state["held"][token] = [os.getpid(), n]
                        return token
                time.sleep(POLL_S)
        except BaseException:  # interrupted while waiting: leave the queue
            self.release(token)
            raise

    def release(self, token: str) -> None:
        with self._state() as state:
            state["held"].pop(token, None)
            state["queue"] = [q for q in state["queue"] if q[4] != token]

    @contextlib.contextmanager
    def hold(self, n: int = 1, priority: bool = False):
        token = self.acquire(n, priority)
        try:
            yield token
        finally:
            self.release(token)


def from_env() -> CpuSlots | None:
    """The pool named by ``AI_EVOLUTION_CPU_SLOTS``, if any."""
    folder = os.environ.get(ENV)
    return CpuSlots(folder) if folder else None


def hold_from_env(n: int = 1, priority: bool = False):
    """``hold`` on the environment's pool, or a context that waits for nothing."""
    slots = from_env()
    return slots.hold(n, priority) if slots is not None else contextlib.nullcontext()
