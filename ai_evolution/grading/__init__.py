"""The autograder: execute each submitted notebook, grade its functions apart, write a gradebook.

``python -m ai_evolution.grading --lab kv_cache FOLDER`` (or :func:`grade_folder`) grades every
``*.ipynb`` in FOLDER, one per student:

1. **Execute** (``sandbox``): a worker process runs the notebook with papermill (``seed`` and
   ``profile="ci"`` injected, ``allow_errors``) in a scratch copy of the lab's folder, on CPU,
   isolated (bubblewrap where it works, else a session of its own), under a wall-clock limit
   for the whole notebook, a per-cell limit and a memory bound. Nothing the kernel writes is a
   result: the grader keeps only each cell's errors and the contract a last, appended cell
   prints, returned by the worker through a channel the kernel cannot reach.
2. **Check** (``rebuild``, ``checker``, ``worker``, ``proxy``): the exercise functions are
   rebuilt from the submitted file itself (its definition statements, screened, on top of the
   lab's setup imports) in a jailed *function worker* whose library lacks the lab's graded
   references (``stripped``); the trusted checker, which runs no submitted code, draws the
   hidden cases of ``assessments/NN-name/hidden_checks.py`` from the instructor's secret
   (``secret``), computes the expected values and calls the worker through proxies that carry
   plain data only (``codec``). A notebook that times out or crashes still has every function
   graded.
3. **Score** (``score``): the contract is validated against the library's schema (kind, seed,
   profile, parameters; no cell may rebind the injected parameters) and the challenge's
   ``student_extension`` is checked; each criterion of ``rubric.json`` earns all its points
   or none.
4. **Report** (``report``): ``gradebook.csv`` (student_id, one column per criterion, total,
   max_total, status, reason, isolation) and ``feedback/<student_id>.md`` in Spanish.

Everything written is deterministic for one folder, one seed, one secret and one nonce (no
dates or timings), so grading twice with them gives the same files (``run.json`` records the
nonce). ``--shard i/n`` grades a deterministic subset and
``python -m ai_evolution.grading merge`` joins the shards' outputs. The instructor's guide
(``book/instructor-guide.md``) explains the workflow and how to add a lab.
"""

from __future__ import annotations

import csv
import hashlib
import re
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from pathlib import Path
from typing import TextIO

from .assessment import (Assessment, AssessmentError, Criterion, Stage, find_assessment, hidden,
                         load_assessment, public)
from .kernel import grade_namespace
from .report import gradebook_csv, write_reports
from .sandbox import RunInfo, run_notebook
from .score import Grade, flags_for, score

__all__ = ["Assessment", "AssessmentError", "Criterion", "DEFAULTS", "Grade", "Stage",
           "find_assessment", "grade_folder", "grade_namespace", "gradebook_csv", "hidden",
           "load_assessment", "merge_outputs", "public", "score", "shard_of", "student_ids"]

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


def grade_one(sid: str, path: Path, data: bytes, assessment: Assessment, seed: int,
              timeout_s: float, cell_timeout_s: float, memory_mb: int, stage_limit_s: float,
              log_dir: Path, run_secret=None) -> tuple[Grade, RunInfo]:
    """Grade one submission from ``data``, its bytes as read before grading started (another
    notebook rewriting the file meanwhile changes nothing)."""
    import ast

    import nbformat

    from .checker import check_functions
    from .rebuild import extract, kernel_tampering, parameter_rebinds

    log_dir.mkdir(parents=True, exist_ok=True)
    info = run_notebook(data, assessment, seed, timeout_s, cell_timeout_s, memory_mb, log_dir)
    _redact_run(info, assessment)
    if info.status == "invalid":
        return score(sid, path.name, info, assessment, seed), info
    nb = nbformat.reads(data.decode("utf-8"), as_version=4)
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
    grade = score(sid, path.name, info, assessment, seed, functions, flags, rebinds, tampering)
    return grade, info


def _redact_run(info: RunInfo, assessment: Assessment) -> None:
    """No text of the assessment's files in what the feedback quotes from the kernel (a
    notebook can read them only in the session fallback)."""
    from .proxy import assessment_redactor

    redact = assessment_redactor(assessment)
    info.reason = redact(info.reason) if info.reason else info.reason
    for error in info.errors:
        error["evalue"] = redact(error["evalue"])


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
                 secret_file: str | Path | None = None, nonce: str | None = None) -> list[Grade]:
    """Grade every ``*.ipynb`` in ``folder`` (or, with ``shard=(i, n)``, those of shard ``i``);
    write the reports under ``out`` (default ``folder/grading``) and ``run.json`` (the nonce
    and the secret's fingerprint, :mod:`.secret`); return the grades sorted by student id."""
    from .secret import GENERATED_WARNING, resolve

    run_secret = resolve(secret_file, nonce)
    if run_secret.source == "generado" and log is not None:
        print(GENERATED_WARNING, file=log, flush=True)
    assessment = find_assessment(kind, assessments_dir)
    folder = Path(folder)
    out = Path(out) if out else folder / "grading"
    submissions = student_ids([p for p in folder.glob("*.ipynb") if p.is_file()])
    if shard is not None:
        submissions = [(sid, p) for sid, p in submissions if shard_of(sid, shard[1]) == shard[0]]
    contents = {sid: p.read_bytes() for sid, p in submissions}  # before any notebook runs
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

    def job(item: tuple[int, tuple[str, Path]]) -> Grade:
        n, (sid, path) = item
        grade, info = grade_one(sid, path, contents[sid], assessment, seed, timeout_s,
                                cell_timeout_s, memory_mb, stage_limit_s, logs / sid, run_secret)
        if info.executed is not None:
            executed[sid] = info.executed
        if log is not None:
            print(f"[{n + 1}/{len(submissions)}] {sid}: {grade.status}, "
                  f"{grade.total:g} de {grade.max_total:g}", file=log, flush=True)
        return grade

    try:
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            grades = list(pool.map(job, enumerate(submissions)))
    finally:
        if not keep_scratch:
            shutil.rmtree(logs, ignore_errors=True)
        elif log is not None:
            print(f"registros de ejecución en {logs}", file=log)
    grades.sort(key=lambda g: g.student_id)
    # Written once every submission has finished (and whatever it started is gone).
    import json

    for sid, nb in sorted(executed.items()):
        (out / "executed" / f"{sid}.ipynb").write_text(
            json.dumps(nb, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    write_reports(grades, assessment, seed, out)
    (out / "run.json").write_text(run_secret.record(kind, seed), encoding="utf-8")
    return grades


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
    out.mkdir(parents=True, exist_ok=True)
    if runs:
        (out / "run.json").write_text(runs.pop(), encoding="utf-8")
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
