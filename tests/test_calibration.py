"""The book build's calibration: a fixed workload's CPU seconds on this machine, against which the
labs' `ci` budgets (stated for the reference machine) are scaled (scripts/execute_book.py)."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from execute_book import REFERENCE_CALIBRATION_CPU_S, calibrate, over_budget  # noqa: E402


def test_calibration_times_the_workload_in_a_fresh_process_and_keeps_the_fastest_run():
    found = calibrate(repeats=2)
    assert len(found["samples"]) == 2 and found["cpu_s"] == min(found["samples"]) > 0
    assert found["reference_cpu_s"] == REFERENCE_CALIBRATION_CPU_S
    assert found["factor"] == round(found["cpu_s"] / REFERENCE_CALIBRATION_CPU_S, 3)
    # Lab-like work on one core: neither nothing nor minutes, on any machine that runs the book.
    assert 0.05 < found["factor"] < 20, found


def test_a_slower_core_scales_the_budget_and_a_faster_one_shrinks_it():
    budgets = {"01-a": 60.0, "02-b": 30.0}
    seconds = {"01-a": 110.0, "02-b": 70.0}
    assert over_budget(seconds, budgets, 1.0) == {"02-b": "70 s > 2 × 30 s × 1.00"}
    assert over_budget(seconds, budgets, 1.2) == {}  # a core 20 % slower: 72 s allowed for 02-b
    assert set(over_budget(seconds, budgets, 0.9)) == {"01-a", "02-b"}  # 108 s allowed for 01-a
