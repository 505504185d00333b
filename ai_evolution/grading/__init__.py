"""The autograder: execute each submitted notebook, grade its functions apart, write a gradebook.

``python -m ai_evolution.grading --lab kv_cache FOLDER`` (or :func:`grade_folder`) grades every
``*.ipynb`` in FOLDER, one per student:

1. **Execute** (``notebook``, under ``sandbox``): a worker process runs the notebook with papermill (``seed`` and
   ``profile="ci"`` injected, ``allow_errors``) in a scratch copy of the lab's folder, on CPU,
   isolated (bubblewrap where it works, else a session of its own), under a wall-clock limit
   for the whole notebook, a per-cell limit and a memory bound. Nothing the kernel writes is a
   result: the grader keeps only each cell's errors and the contract a last, appended cell
   prints, returned by the worker through a channel the kernel cannot reach.
2. **Check** (``rebuild``, ``delegation``, ``checker``, ``worker``, ``proxy``): the exercise
   functions are rebuilt from the submitted file itself (its definition statements, screened,
   on top of the lab's setup imports) in a jailed *function worker* whose library lacks the
   reference answers (``stripped``); the trusted checker, which runs no submitted code, draws the
   hidden cases of ``assessments/NN-name/hidden_checks.py`` from the instructor's secret
   (``secret``), computes the expected values and calls the worker through proxies that carry
   plain data only (``codec``). A notebook that times out or crashes still has every function
   graded.
3. **Score** (``score``): the contract is validated against the library's schema (kind, seed,
   profile, parameters; no cell may rebind the injected parameters) and the challenge's
   ``student_extension`` is checked; each criterion of ``rubric.json`` earns all its points
   or none.
4. **Report** (``report``): ``gradebook.csv`` (student_id, one column per criterion, total,
   max_total, status, reason, isolation, similarity, notes), ``grading.json`` (the library
   version used) and ``feedback/<student_id>.md`` in Spanish.

Before any of it, ``intake`` lists the folder as bytes, refuses what is not a regular file and
code the grader's parser cannot take, and gives bounded, unique ids; each submission runs under
:func:`.sandbox.submission_limits` (one wall clock for everything it starts, a disk bound), and
any exception while grading it becomes its own ``grader_error`` row. After all of them,
``similarity`` flags copies of the published solution and between submissions (never points).

Everything written is deterministic for one folder, one seed, one secret and one nonce (no
dates or timings), so grading twice with them gives the same files (``run.json`` records the
nonce). ``--shard i/n`` grades a deterministic subset and
``python -m ai_evolution.grading merge`` joins the shards' outputs. The instructor's guide
(``book/instructor-guide.md``) explains the workflow and how to add a lab.
"""

from __future__ import annotations

import csv
import hashlib
import json
import re
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from pathlib import Path
from typing import TextIO

from .assessment import (Assessment, AssessmentError, Criterion, Stage, find_assessment, hidden,
                         load_assessment, public)
from .intake import Refused, list_submissions, parse_problem, read_submission, student_ids
from .namespace import clean, grade_namespace
from .report import RECORD, gradebook_csv, write_reports
from .notebook import RunInfo, run_notebook
from .sandbox import budget_reason, submission_limits
from .score import Grade, flags_for, score, version_notes

__all__ = ["Assessment", "AssessmentError", "Criterion", "DEFAULTS", "Grade", "Stage",
           "find_assessment", "grade_folder", "grade_namespace", "gradebook_csv", "hidden",
           "load_assessment", "merge_outputs", "public", "score", "shard_of", "student_ids"]

# Per notebook: the whole run, one cell (interrupted, then the next cell runs), the memory of the
# kernel (address space of each process and resident memory of them all), one hidden check, the
# bytes in each scratch folder. The slowest lab notebook takes about 70 s under `ci` on a 2-core
# CPU, its kernel peaks at about 3.4 GiB of address space and 2.2 GiB resident (lab 1's
# bandwidth probe). Per submission, everything (notebook and every checker start) shares one
# wall-clock budget: ``budget_s``, by default ``BUDGET_FACTOR`` times ``timeout_s``.
DEFAULTS = {"timeout_s": 900.0, "cell_timeout_s": 300.0, "memory_mb": 6144, "stage_limit_s": 120.0,
            "disk_mb": 1024}
BUDGET_FACTOR = 2


@lru_cache(maxsize=None)
def setup_lines(lab_folder: Path) -> tuple[str, ...]:
    """The import lines of the lab's trusted setup: the solution's first code cell after the
    one tagged ``parameters``."""
    import nbformat

    from .rebuild import setup_imports

    nb = nbformat.read(str(lab_folder / "notebook_solution.ipynb"), as_version=4)
    cells = [c for c in nb.cells if c.cell_type == "code"]
    params = next((i for i, c in enumerate(cells) if "parameters" in c.metadata.get("tags", [])),
                  None)
    if params is None or params + 1 >= len(cells):
        raise AssessmentError(f"{lab_folder}/notebook_solution.ipynb no tiene una celda "
                              "`parameters` seguida de la de preparación")
    return tuple(setup_imports(cells[params + 1].source))


def grade_one(sid: str, source: str, data: bytes, assessment: Assessment, seed: int,
              timeout_s: float, cell_timeout_s: float, memory_mb: int, stage_limit_s: float,
              log_dir: Path, run_secret=None, budget_s: float | None = None,
              disk_mb: int | None = None) -> tuple[Grade, RunInfo]:
    """Grade one submission from ``data``, its bytes as read before grading started (another
    notebook rewriting the file meanwhile changes nothing). ``source`` is its file name as
    shown. Everything it runs shares ``budget_s`` seconds and ``disk_mb`` per scratch folder."""
    with submission_limits(budget_s, disk_mb):
        return _grade_one(sid, source, data, assessment, seed, timeout_s, cell_timeout_s,
                          memory_mb, stage_limit_s, log_dir, run_secret)


def _grade_one(sid: str, source: str, data: bytes, assessment: Assessment, seed: int,
               timeout_s: float, cell_timeout_s: float, memory_mb: int, stage_limit_s: float,
               log_dir: Path, run_secret=None) -> tuple[Grade, RunInfo]:
    import ast

    import nbformat

    from .checker import check_functions
    from .rebuild import extract, kernel_tampering, parameter_rebinds

    log_dir.mkdir(parents=True, exist_ok=True)
    try:
        nb = nbformat.reads(data.decode("utf-8"), as_version=4)
    except Exception:  # noqa: BLE001 - not a notebook: run_notebook says why
        nb = None
    if nb is not None and (problem := parse_problem(nb)):
        grade = not_graded(sid, source, "refused", problem, assessment, seed)
        return grade, RunInfo(status="refused", reason=problem, isolation=grade.isolation)
    info = run_notebook(data, assessment, seed, timeout_s, cell_timeout_s, memory_mb, log_dir)
    _redact_run(info, assessment)
    if info.status == "invalid" or nb is None:
        return score(sid, source, info, assessment, seed), info
    setup = list(setup_lines(assessment.lab_folder))
    setup_names = {n for line in setup for stmt in ast.parse(line).body
                   for n in ([a.asname or a.name.split(".")[0] for a in stmt.names])}
    found = extract(nb, setup_names)
    functions, check_flags = check_functions(
        assessment, seed, found, stage_limit_s, memory_mb, log_dir, setup,
        secret=run_secret.secret if run_secret else None,
        nonce=run_secret.nonce if run_secret else "")
    rebinds, tampering = parameter_rebinds(nb), kernel_tampering(nb)
    flags = flags_for(nb) + [f"{r} (la semilla o el perfil inyectados)" for r in rebinds] + \
        check_flags
    grade = score(sid, source, info, assessment, seed, functions, flags, rebinds, tampering)
    grade.notes += version_notes(info.contract)
    if grade.status != "timeout" and any(budget_reason() in r["message"]
                                         for r in functions.values()):
        grade.status, grade.reason = "timeout", budget_reason()
    return grade, info


def _redact_run(info: RunInfo, assessment: Assessment) -> None:
    """No text of the assessment's files in what the feedback quotes from the kernel (a
    notebook can read them only in the session fallback)."""
    from .proxy import assessment_redactor

    redact = assessment_redactor(assessment)
    info.reason = redact(info.reason) if info.reason else info.reason
    for error in info.errors:
        error["evalue"] = redact(error["evalue"])


def not_graded(sid: str, source: str, status: str, reason: str, assessment: Assessment,
               seed: int) -> Grade:
    """The row of a submission that was refused or that the grader failed on: zero, with
    the reason, nothing run."""
    from .sandbox import isolation

    return score(sid, source, RunInfo(status=status, reason=reason, isolation=isolation()),
                 assessment, seed)


def shard_of(student_id: str, n: int) -> int:
    """The shard (1..n) of a student: from a hash of the id, so it does not depend on the
    machine, the order of the files or which other students are in the folder."""
    return int(hashlib.sha256(student_id.encode("utf-8")).hexdigest(), 16) % n + 1


def parse_shard(text: str) -> tuple[int, int]:
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text or "")
    if not m or not (1 <= int(m.group(1)) <= int(m.group(2))):
        raise ValueError(f"--shard espera i/n con 1 <= i <= n (por ejemplo 2/8), no {text!r}")
    return int(m.group(1)), int(m.group(2))


def grade_folder(kind: str, folder: str | Path, out: str | Path | None = None,
                 timeout_s: float = DEFAULTS["timeout_s"],
                 cell_timeout_s: float = DEFAULTS["cell_timeout_s"],
                 memory_mb: int = DEFAULTS["memory_mb"], jobs: int = 1, seed: int = 0,
                 assessments_dir: str | Path | None = None, keep_scratch: bool = False,
                 stage_limit_s: float = DEFAULTS["stage_limit_s"],
                 log: TextIO | None = None, shard: tuple[int, int] | None = None,
                 secret_file: str | Path | None = None, nonce: str | None = None,
                 budget_s: float | None = None,
                 disk_mb: int | None = DEFAULTS["disk_mb"]) -> list[Grade]:
    """Grade every ``*.ipynb`` in ``folder`` (or, with ``shard=(i, n)``, those of shard ``i``);
    write the reports under ``out`` (default ``folder/grading``) and ``run.json`` (the nonce
    and the secret's fingerprint, :mod:`.secret`); return the grades sorted by student id.
    Whatever one submission is or does (a link, a FIFO, a name in any bytes, code the parser
    cannot take, an exception in the grader itself) costs its own row only. ``budget_s``:
    seconds per submission for everything it runs (default ``BUDGET_FACTOR`` times
    ``timeout_s``)."""
    from .secret import GENERATED_WARNING, resolve

    run_secret = resolve(secret_file, nonce)
    if run_secret.source == "generado" and log is not None:
        print(GENERATED_WARNING, file=log, flush=True)
    assessment = find_assessment(kind, assessments_dir)
    folder = Path(folder)
    out = Path(out) if out else folder / "grading"
    budget_s = budget_s if budget_s is not None else BUDGET_FACTOR * timeout_s
    if budget_s <= 0 or (disk_mb is not None and disk_mb <= 0):
        raise ValueError(f"el presupuesto por entrega y el disco deben ser positivos (presupuesto "
                         f"{budget_s!r} s, disco {disk_mb!r} MiB)")
    submissions = list_submissions(folder)
    if shard is not None:
        submissions = [s for s in submissions if shard_of(s.student_id, shard[1]) == shard[0]]
    contents: dict[str, bytes | Refused] = {}
    for sub in submissions:  # before any notebook runs
        try:
            contents[sub.student_id] = read_submission(sub.path)
        except Refused as why:
            contents[sub.student_id] = why
    executed: dict[str, dict] = {}
    logs = Path(tempfile.mkdtemp(prefix="ai-evolution-grading-"))
    for name in ("feedback", "executed"):
        shutil.rmtree(out / name, ignore_errors=True)
    (out / "executed").mkdir(parents=True, exist_ok=True)
    setup_lines(assessment.lab_folder)  # a broken lab fails here, before any student
    from .sandbox import isolation

    used = isolation()  # probed once, before any submission runs (and any orphan sweep)
    if log is not None:
        print(f"aislamiento: {used}", file=log, flush=True)

    def job(item) -> Grade:
        n, sub = item
        sid, data = sub.student_id, contents[sub.student_id]
        began = time.monotonic()
        try:
            if isinstance(data, Refused):
                grade = not_graded(sid, sub.shown, "refused", str(data), assessment, seed)
            else:
                grade, info = grade_one(sid, sub.shown, data, assessment, seed, timeout_s,
                                        cell_timeout_s, memory_mb, stage_limit_s, logs / sid,
                                        run_secret, budget_s, disk_mb)
                if info.executed is not None:
                    executed[sid] = info.executed
        except Exception as err:  # noqa: BLE001 - the grader's own failure on this file only
            grade = not_graded(sid, sub.shown, "grader_error",
                               f"el corrector falló con esta entrega ({type(err).__name__}: "
                               f"{clean(err, 200)}); el resto de la clase se corrigió. Avise "
                               "a quien mantiene el corrector.", assessment, seed)
        if log is not None:
            # The seconds go to the log only: the written files carry no timings. One write per
            # line, so that the lines of two jobs do not interleave.
            log.write(f"[{n + 1}/{len(submissions)}] {sid}: {grade.status}, "
                      f"{grade.total:g} de {grade.max_total:g} ({time.monotonic() - began:.0f} s)\n")
            log.flush()
        return grade

    from .zygote import checker_zygote

    try:
        # One zygote for the run: each checker is a fork of it, without its own imports.
        with checker_zygote(), ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            grades = list(pool.map(job, enumerate(submissions)))
    finally:
        if not keep_scratch:
            shutil.rmtree(logs, ignore_errors=True)
        elif log is not None:
            print(f"registros de ejecución en {logs}", file=log)
    grades.sort(key=lambda g: g.student_id)
    add_similarity(grades, contents, assessment, log)
    # Written once every submission has finished (and whatever it started is gone).
    for sid, nb in sorted(executed.items()):
        # Lone surrogates a kernel printed become JSON escapes: the file stays valid JSON.
        (out / "executed" / f"{sid}.ipynb").write_bytes(
            (json.dumps(nb, ensure_ascii=False, indent=1) + "\n").encode("utf-8",
                                                                         "backslashreplace"))
    write_reports(grades, assessment, seed, out)
    (out / "run.json").write_text(run_secret.record(kind, seed), encoding="utf-8")
    return grades


def add_similarity(grades: list[Grade], contents: dict, assessment: Assessment,
                   log: TextIO | None) -> None:
    """The similarity flags of every submission whose code was read (``similarity``): a
    failure here is logged and leaves the flags empty, never the gradebook unwritten."""
    import nbformat

    from .score import NOT_RUN
    from .similarity import similarity_flags

    notebooks = {}
    for g in grades:
        data = contents.get(g.student_id)
        if g.status in NOT_RUN or not isinstance(data, bytes):
            continue
        try:
            notebooks[g.student_id] = nbformat.reads(data.decode("utf-8"), as_version=4)
        except Exception:  # noqa: BLE001 - graded, but not a notebook to compare
            continue
    try:
        flags = similarity_flags(notebooks, assessment.lab_folder)
    except Exception as err:  # noqa: BLE001
        if log is not None:
            print(f"aviso: no se pudo calcular el parecido entre entregas ({type(err).__name__}: "
                  f"{clean(err, 200)})", file=log)
        return
    for g in grades:
        g.similarity = flags.get(g.student_id, [])


def merged_record(parts: list[str | Path]) -> dict | None:
    """The run record of shards that must have been graded alike (same library version, lab
    and seed); None when no part has one."""
    seen = {}
    for part in map(Path, parts):
        path = (part if part.is_dir() else part.parent) / RECORD
        if path.is_file():
            record = json.loads(path.read_text(encoding="utf-8"))
            seen[str(path)] = {k: record.get(k) for k in ("ai_evolution", "lab", "seed")}
    if len({json.dumps(r, sort_keys=True) for r in seen.values()}) > 1:
        raise ValueError("los fragmentos no se corrigieron igual (versión de ai_evolution, "
                         "laboratorio o semilla): " + "; ".join(f"{k}: {v}" for k, v in seen.items()))
    return next(iter(seen.values()), None)


def merge_outputs(parts: list[str | Path], out: str | Path) -> int:
    """Join the outputs of several shards (``gradebook.csv``, ``feedback/``, ``executed/``)
    into ``out``; rows sorted by student id. Returns the number of students. The gradebooks
    must have the same columns (same lab and rubric) and no student may appear twice."""
    out = Path(out)
    header, rows = None, {}
    for part in map(Path, parts):
        book = part / "gradebook.csv" if part.is_dir() else part
        with open(book, newline="", encoding="utf-8") as fh:
            reader = csv.reader(fh)
            head = next(reader)
            if header is None:
                header = head
            elif head != header:
                raise ValueError(f"{book}: las columnas no coinciden con las del primer libro de "
                                 "notas (¿otro laboratorio u otra rúbrica?)")
            for row in reader:
                if row[0] in rows:
                    raise ValueError(f"{book}: {row[0]!r} aparece en dos libros de notas")
                rows[row[0]] = row
    if header is None:
        raise ValueError("no hay libros de notas que unir")
    runs = set()  # the shards of one run share its secret and nonce (run.json)
    for part in map(Path, parts):
        run = (part if part.is_dir() else part.parent) / "run.json"
        if run.is_file():
            runs.add(run.read_text(encoding="utf-8"))
    if len(runs) > 1:
        raise ValueError("los fragmentos se corrigieron con secretos o nonces distintos (run.json "
                         "no coincide): corrija todos con el mismo --secret-file y --nonce")
    record = merged_record(parts)
    out.mkdir(parents=True, exist_ok=True)
    if runs:
        (out / "run.json").write_text(runs.pop(), encoding="utf-8")
    if record is not None:
        (out / RECORD).write_text(json.dumps(record | {"students": len(rows)}, indent=1) + "\n",
                                  encoding="utf-8")
    for part in map(Path, parts):
        folder = part if part.is_dir() else part.parent
        for sub in ("feedback", "executed"):
            if (folder / sub).is_dir() and (folder / sub).resolve() != (out / sub).resolve():
                (out / sub).mkdir(exist_ok=True)
                for f in sorted((folder / sub).iterdir()):
                    shutil.copyfile(f, out / sub / f.name)
    with open(out / "gradebook.csv", "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh, lineterminator="\n")
        writer.writerow(header)
        for sid in sorted(rows):
            writer.writerow(rows[sid])
    return len(rows)
