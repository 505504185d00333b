"""The suite's closing lines about its own schedule (tests/conftest.py): busy seconds and the
last report per worker, and the costliest modules."""

from __future__ import annotations

from conftest import schedule_lines


def test_schedule_lines_add_up_each_worker_and_rank_the_modules():
    reports = [("gw0", "tests/test_book.py", 500.0, 520.0), ("gw0", "tests/test_a.py", 2.0, 530.0),
               ("gw1", "tests/test_grading.py", 60.0, 300.0),
               ("gw1", "tests/test_grading.py", 40.5, 340.0)]
    lines = schedule_lines(reports, top=2)
    assert lines[0] == "worker gw0: 502 s in 2 test phases, last at 530 s"
    assert lines[1] == "worker gw1: 100 s in 2 test phases, last at 340 s"
    assert lines[2].split() == ["500.0", "s", "tests/test_book.py", "(gw0)"]
    assert lines[3].split() == ["100.5", "s", "tests/test_grading.py", "(gw1)"]
    assert len(lines) == 4 and schedule_lines([]) == []
