"""The autograder: execute each submitted notebook, re-run the checks, write a gradebook.

``python -m ai_evolution.grading --lab kv_cache FOLDER`` (or :func:`grade_folder`) grades every
``*.ipynb`` in FOLDER, one per student:

1. **Execute** (``sandbox``): a worker process runs the notebook with papermill (``seed`` and
   ``profile="ci"`` injected, ``allow_errors``: a failing cell does not stop the next ones) in
   a scratch copy of the lab's folder, on CPU, under a wall-clock limit for the whole notebook,
   a per-cell limit (the cell is interrupted and execution goes on) and a memory bound.
2. **Check** (``kernel``): a cell appended to the notebook looks up the student's functions in
   the kernel's globals and runs, for each, the public self-check and the hidden checks of
   ``assessments/NN-name/hidden_checks.py``; it writes the outcomes and the contract as JSON.
3. **Score** (``score``): in the grader's process, the contract is validated against the
   library's schema (kind, seed, profile, parameters) and the challenge's ``student_extension``
   is checked; each criterion of ``rubric.json`` earns all its points or none.
4. **Report** (``report``): ``gradebook.csv`` (student_id, one column per criterion, total,
   max_total, status, reason) and ``feedback/<student_id>.md`` in Spanish (what passed, what
   failed with its first failing case, what needs a human reading with the rubric).

Everything written is deterministic for one folder and one seed (no dates or timings), so
grading twice gives the same files. A submission that raises, loops, prints nothing, writes or
deletes files, fills memory or lacks the contract gets a status and a reason, zeros where it
failed, and the other submissions are still graded. The instructor's guide
(``book/instructor-guide.md``) explains the workflow and how to add a lab.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TextIO

from .assessment import (Assessment, AssessmentError, Criterion, Stage, find_assessment, hidden,
                         load_assessment, public)
from .kernel import grade_namespace
from .report import gradebook_csv, write_reports
from .sandbox import RunInfo, run_submission
from .score import Grade, flags_for, score

__all__ = ["Assessment", "AssessmentError", "Criterion", "DEFAULTS", "Grade", "Stage",
           "find_assessment", "grade_folder", "grade_namespace", "gradebook_csv", "hidden",
           "load_assessment", "public", "score", "student_ids"]

# Per notebook: the whole run, one cell (interrupted, then the next cell runs), the memory of the
# kernel (address space of each process and resident memory of them all), one hidden check.
# The slowest lab notebook takes about 70 s under `ci` on a 2-core CPU, its kernel peaks at
# about 3.4 GiB of address space and 2.2 GiB resident (lab 1's bandwidth probe).
DEFAULTS = {"timeout_s": 900.0, "cell_timeout_s": 300.0, "memory_mb": 6144, "stage_limit_s": 120.0}


def student_ids(paths: list[Path]) -> list[tuple[str, Path]]:
    """(student id, path) for each submission: the file name without extension, every run of
    characters other than letters, digits, ``.``, ``_`` and ``-`` replaced by ``_``; repeated ids
    get ``-2``, ``-3``... in file-name order."""
    out, used = [], set()
    for path in sorted(paths, key=lambda p: p.name):
        base = re.sub(r"[^\w.-]+", "_", path.stem).strip("._-") or "entrega"
        sid, n = base, 1
        while sid in used:
            n += 1
            sid = f"{base}-{n}"
        used.add(sid)
        out.append((sid, path))
    return out


def grade_one(sid: str, path: Path, scratch: Path, assessment: Assessment, seed: int,
              timeout_s: float, cell_timeout_s: float, memory_mb: int,
              stage_limit_s: float) -> tuple[Grade, RunInfo]:
    info = run_submission(path, scratch, sid, assessment, seed, timeout_s, cell_timeout_s,
                          memory_mb, stage_limit_s)
    flags = flags_for(None if info.status == "invalid" else scratch / "out" / sid / "prepared.ipynb")
    return score(sid, path.name, info, assessment, seed, flags), info


def grade_folder(kind: str, folder: str | Path, out: str | Path | None = None,
                 timeout_s: float = DEFAULTS["timeout_s"],
                 cell_timeout_s: float = DEFAULTS["cell_timeout_s"],
                 memory_mb: int = DEFAULTS["memory_mb"], jobs: int = 1, seed: int = 0,
                 assessments_dir: str | Path | None = None, keep_scratch: bool = False,
                 stage_limit_s: float = DEFAULTS["stage_limit_s"],
                 log: TextIO | None = None) -> list[Grade]:
    """Grade every ``*.ipynb`` in ``folder``; write the reports under ``out``
    (default ``folder/grading``); return the grades sorted by student id."""
    assessment = find_assessment(kind, assessments_dir)
    folder = Path(folder)
    out = Path(out) if out else folder / "grading"
    submissions = student_ids([p for p in folder.glob("*.ipynb") if p.is_file()])
    scratch = Path(tempfile.mkdtemp(prefix="ai-evolution-grading-"))
    for name in ("feedback", "executed"):
        shutil.rmtree(out / name, ignore_errors=True)
    (out / "executed").mkdir(parents=True, exist_ok=True)

    def job(item: tuple[int, tuple[str, Path]]) -> Grade:
        n, (sid, path) = item
        grade, info = grade_one(sid, path, scratch, assessment, seed,
                                timeout_s, cell_timeout_s, memory_mb, stage_limit_s)
        if info.executed is not None:
            shutil.copyfile(info.executed, out / "executed" / f"{sid}.ipynb")
        if log is not None:
            print(f"[{n + 1}/{len(submissions)}] {sid}: {grade.status}, "
                  f"{grade.total:g} de {grade.max_total:g}", file=log, flush=True)
        return grade

    try:
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            grades = list(pool.map(job, enumerate(submissions)))
    finally:
        if not keep_scratch:
            shutil.rmtree(scratch, ignore_errors=True)
        elif log is not None:
            print(f"copias de trabajo en {scratch}", file=log)
    grades.sort(key=lambda g: g.student_id)
    write_reports(grades, assessment, seed, out)
    return grades
