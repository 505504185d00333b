"""The suite's own schedule (tests/conftest.py): the closing lines (busy seconds and the last
report per worker, and the costliest modules) and the CPU slots its processes share
(scripts/cpu_slots.py)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

import cpu_slots
from conftest import schedule_lines
from cpu_slots import CpuSlots

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def test_schedule_lines_add_up_each_worker_and_rank_the_modules():
    reports = [("gw0", "tests/test_book.py", 500.0, 520.0, 30.0),
               ("gw0", "tests/test_a.py", 2.0, 530.0, 1.5),
               ("gw1", "tests/test_grading.py", 60.0, 300.0, 12.0),
               ("gw1", "tests/test_grading.py", 40.5, 340.0, 8.25)]
    lines = schedule_lines(reports, top=2)
    assert lines[0] == "worker gw0: 502 s (32 s CPU) in 2 test phases, last at 530 s"
    assert lines[1] == "worker gw1: 100 s (20 s CPU) in 2 test phases, last at 340 s"
    assert lines[2].split() == ["500.0", "s", "(", "30.0", "s", "CPU)", "tests/test_book.py", "(gw0)"]
    assert lines[3].split() == ["100.5", "s", "(", "20.2", "s", "CPU)", "tests/test_grading.py",
                                "(gw1)"]
    assert len(lines) == 4 and schedule_lines([]) == []


def _phase_cpu(phase) -> float:
    """The ``cpu_s`` that conftest's makereport hook writes into the report of a phase that runs
    ``phase()``, driving the hook wrapper the way pluggy does."""
    import conftest

    item = SimpleNamespace(_cpu_mark=conftest._cpu_s())
    phase()
    report = SimpleNamespace(user_properties=[("otra", 1)])
    wrapper = conftest.pytest_runtest_makereport(item, None)
    next(wrapper)
    with contextlib.suppress(StopIteration):
        wrapper.send(SimpleNamespace(get_result=lambda: report))
    assert report.user_properties[0] == ("otra", 1)
    return dict(report.user_properties)["cpu_s"]


def test_each_phase_report_carries_the_cpu_seconds_it_spent():
    """A phase's CPU seconds, in the worker and in the children it reaped, reach its report: a
    phase that computes shows them, one that sleeps almost none."""
    spin = "import time\nend = time.process_time() + 0.4\nwhile time.process_time() < end: pass"
    assert _phase_cpu(lambda: exec(spin, {})) >= 0.35
    assert _phase_cpu(lambda: subprocess.run([sys.executable, "-c", spin], check=True)) >= 0.35
    assert _phase_cpu(lambda: time.sleep(0.4)) < 0.1


# --- CPU slots (scripts/cpu_slots.py) ------------------------------------------------------------

def _waiter(slots, n=1, priority=False, order=None, name=""):
    """A thread that acquires ``n`` slots and records when it got them; returns (thread, state)."""
    state = {"token": None, "got": threading.Event()}

    def run():
        state["token"] = slots.acquire(n, priority)
        if order is not None:
            order.append(name)
        state["got"].set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, state


def test_slots_never_exceed_the_capacity_and_a_release_lets_the_next_in(tmp_path):
    slots = CpuSlots(tmp_path, capacity=2)
    a, b = slots.acquire(), slots.acquire()
    assert slots.held() == 2
    _, third = _waiter(slots)
    assert not third["got"].wait(0.3)  # both slots are taken
    slots.release(a)
    assert third["got"].wait(5)
    assert slots.held() == 2
    slots.release(b), slots.release(third["token"])
    assert slots.held() == 0


def test_a_priority_request_goes_first_and_a_two_slot_request_is_not_overtaken(tmp_path):
    slots = CpuSlots(tmp_path, capacity=2)
    first, second = slots.acquire(), slots.acquire()
    order: list[str] = []
    _, low = _waiter(slots, order=order, name="test")
    time.sleep(0.1)
    _, high = _waiter(slots, priority=True, order=order, name="page")
    time.sleep(0.1)
    slots.release(first)
    assert high["got"].wait(5) and not low["got"].wait(0.3)
    assert order == ["page"]  # the later page went before the waiting test
    # A request for two is served before a later request for one, even with one slot free.
    slots.release(high["token"])
    assert low["got"].wait(5)
    _, pair = _waiter(slots, n=2, order=order, name="pair")
    time.sleep(0.1)
    _, single = _waiter(slots, order=order, name="single")
    slots.release(second)  # one slot free: the pair still waits, and so does the single
    assert not pair["got"].wait(0.3) and not single["got"].is_set()
    slots.release(low["token"])
    assert pair["got"].wait(5) and not single["got"].wait(0.3)
    slots.release(pair["token"])
    assert single["got"].wait(5)
    assert order == ["page", "test", "pair", "single"]
    slots.release(single["token"])


def test_slots_of_a_process_that_died_are_given_back(tmp_path):
    code = ("import sys, os; sys.path.insert(0, sys.argv[1]); from cpu_slots import CpuSlots; "
            "CpuSlots(sys.argv[2], capacity=1).acquire(); os._exit(0)")
    subprocess.run([sys.executable, "-c", code, str(SCRIPTS), str(tmp_path)], check=True,
                   timeout=60)
    slots = CpuSlots(tmp_path, capacity=1)
    with slots.hold():  # would wait forever if the dead process still held the only slot
        assert slots.held() == 1
    assert slots.held() == 0


def test_without_the_environment_variable_nothing_waits(tmp_path, monkeypatch):
    monkeypatch.delenv(cpu_slots.ENV, raising=False)
    assert cpu_slots.from_env() is None
    with cpu_slots.hold_from_env():
        pass
    monkeypatch.setenv(cpu_slots.ENV, str(tmp_path / "pool"))
    with cpu_slots.hold_from_env(priority=True):
        assert cpu_slots.from_env().held() == 1
    assert cpu_slots.from_env().held() == 0


def test_under_xdist_each_test_holds_one_slot_and_holding_swaps_it(request):
    import conftest

    if not os.environ.get("PYTEST_XDIST_WORKER"):
        pytest.skip("the slots are taken only by xdist workers (make test, make check)")
    slots, token = conftest._SLOT["slots"], conftest._SLOT["token"]
    assert slots is not None and token is not None
    state = json.loads((slots.folder / "slots.json").read_text(encoding="utf-8"))
    assert state["held"][token] == [os.getpid(), 1]
    with conftest.holding(0):  # e.g. waiting for the book another worker builds
        assert conftest._SLOT["token"] is None
        state = json.loads((slots.folder / "slots.json").read_text(encoding="utf-8"))
        assert token not in state["held"]
    assert conftest._SLOT["token"] is not None  # the test's slot again
