"""The checker's zygote (ai_evolution/grading/zygote.py): each checker of a grading run is a fork
of one process that has done the checker's imports. A fork is a checker of its own: its own
session and working folder, an exit status that reaches the grader (a killed one loses only the
criterion it was checking), and nothing outlives the run."""

from __future__ import annotations

import ast
import json
import os
import threading
import time

import nbformat
import psutil
import pytest

from ai_evolution.grading import find_assessment, setup_lines
from ai_evolution.grading.checker import check_functions
from ai_evolution.grading.rebuild import extract
from ai_evolution.grading.sandbox import _base_env, new_scratch
from ai_evolution.grading.zygote import checker_zygote, current

HANGS = ("def kv_bytes_per_token(config, dtype):\n"
         "    while True:\n"
         "        pass\n")


def _children(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children()
    except psutil.Error:
        return []


def _worker_cpu(fork: psutil.Process) -> float:
    total = 0.0
    try:
        for p in fork.children(recursive=True):
            total += sum(p.cpu_times()[:2])
    except psutil.Error:
        pass
    return total


def test_a_fork_that_fails_reports_its_status_and_its_traceback_in_its_log(tmp_path):
    with checker_zygote() as zygote:
        assert zygote is not None and current() is zygote
        scratch = new_scratch()
        log_path = tmp_path / "checker.log"
        with open(log_path, "ab") as log:
            child = zygote.spawn(_base_env(scratch, "t"), scratch / "work",
                                 json.dumps({"assessment": str(tmp_path / "nada")}).encode(), log)
        assert child.wait(120) == 1
        assert child.poll() == 1
        assert "AssessmentError" in log_path.read_text(encoding="utf-8")
        child.kill()  # after its exit: a no-op, not a signal to a recycled pid
    assert current() is None


def test_a_killed_fork_loses_only_its_criterion_and_the_run_leaves_nothing(tmp_path):
    """One exercise hangs; its checker, forked from the zygote, runs in a session of its own in
    its scratch folder. Killed, it costs that criterion only: the next fork checks the rest."""
    a = find_assessment("kv_cache")
    setup = list(setup_lines(a.lab_folder))
    names = {n for line in setup for stmt in ast.parse(line).body
             for n in [x.asname or x.name.split(".")[0] for x in stmt.names]}
    nb = nbformat.read(a.lab_folder / "notebook_solution.ipynb", as_version=4)
    cell = next(c for c in nb.cells if c.cell_type == "code"
                and c.source.lstrip().startswith("def kv_bytes_per_token"))
    cell.source = HANGS
    found = extract(nb, names)
    result: dict = {}
    with checker_zygote() as zygote:
        run = threading.Thread(target=lambda: result.update(out=check_functions(
            a, 0, found, 120, 4096, tmp_path / "logs", setup)))
        run.start()
        deadline = time.monotonic() + 120
        while not (forks := _children(zygote.pid)) and time.monotonic() < deadline:
            time.sleep(0.1)
        (fork,) = forks
        assert psutil.Process(zygote.pid).ppid() == psutil.Process().pid
        assert fork.cwd().endswith("/work") and os.getsid(fork.pid) == fork.pid  # its own session
        # Killed once the function worker spins in the hanging exercise (its imports take
        # about 3 s of CPU; the loop then adds a second per second).
        while _worker_cpu(fork) < 8 and time.monotonic() < deadline:
            time.sleep(0.2)
        fork.kill()
        run.join(300)
        assert not run.is_alive()
        results, _ = result["out"]
        assert not results["kv_bytes_per_token"]["passed"]
        assert "terminó mientras se corregía" in results["kv_bytes_per_token"]["message"]
        others = {cid: r for cid, r in results.items() if cid != "kv_bytes_per_token"}
        assert others and all(r["passed"] for r in others.values()), results
        pid = zygote.pid
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_without_its_zygote_a_run_starts_fresh_checkers(tmp_path):
    with checker_zygote() as zygote:
        zygote.proc.kill()
        zygote.proc.wait()
        assert current() is None  # check_functions then starts `python -m ...checker`
        scratch = new_scratch()
        with open(tmp_path / "log", "ab") as log, pytest.raises(OSError):
            zygote.spawn(_base_env(scratch, "t"), scratch / "work", b"{}", log)
