"""Run one submitted notebook in its own processes, in a scratch folder, within limits.

Process tree of one submission::

    grader (this process)
      └─ worker: ``python -m ai_evolution.grading.worker JOB.json``  (new session; sets its
         own rlimits, which the kernel inherits; runs papermill)
           └─ kernel (ipykernel, started by papermill/nbclient in its own session)

Limits and what each one produces:

- wall clock (``timeout_s``, whole submission): the grader kills every process of the tree
  (each process and its process group; the tree is sampled every poll, so a kernel that has
  left the worker's session is still found) -> status ``timeout``, every criterion 0;
- per cell (``cell_timeout_s``): nbclient interrupts the kernel (``KeyboardInterrupt`` in the
  cell) and execution goes on with the next cell, so a loop in one cell costs that cell only;
- memory: ``RLIMIT_AS`` of ``memory_mb`` on the worker and the kernel (an allocation beyond it
  raises ``MemoryError`` in the cell), and the grader also kills the tree if the resident memory
  of all its processes together passes ``memory_mb`` -> status ``memory``;
- files: the notebook's working folder is a scratch copy of the lab's folder (without its
  notebooks); the result, the executed notebook and the log live in another scratch tree;
  ``RLIMIT_FSIZE`` caps any single file it writes; ``HOME`` and ``TMPDIR`` point into the scratch.

This is a fence against mistakes (an exception, a loop, a runaway allocation, a stray
``os.remove``), not a security sandbox: a notebook can still read or write any path the user
running the grader can. Grade untrusted submissions inside a container.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

GRADING_TAG = "ai-evolution-grading"
CELL_KEY = "ai_evolution_cell"  # cell metadata: 1-based index among the submission's code cells
FSIZE_LIMIT_BYTES = 512 * 2**20
_MEMORY_WORDS = ("can't allocate memory", "cannot allocate memory", "out of memory",
                 "not enough memory", "bad_alloc")


@dataclass
class RunInfo:
    """What happened when one notebook ran (the grader's view; nothing here comes from the
    student's kernel except the result file's content)."""

    status: str = "ok"            # ok | error | timeout | memory | invalid | crashed
    reason: str = ""
    errors: list[dict] = field(default_factory=list)  # {"cell", "ename", "evalue"}
    result: dict | None = None    # the grading cell's JSON, if it was written
    executed: Path | None = None  # the executed notebook, if any


def prepare(nb_path: Path, job: dict) -> "object":
    """Read a submission, number its cells, clear outputs, append the grading cell."""
    import nbformat

    nb = nbformat.read(str(nb_path), as_version=4)
    nb.cells = [c for c in nb.cells if GRADING_TAG not in c.get("metadata", {}).get("tags", [])]
    code = [c for c in nb.cells if c.cell_type == "code"]
    for i, cell in enumerate(code, start=1):
        cell.setdefault("metadata", {})[CELL_KEY] = i
        cell.outputs, cell.execution_count = [], None
    source = ("# Celda añadida por el corrector automático (ai_evolution.grading).\n"
              "from ai_evolution.grading.kernel import grading_cell as _ai_evolution_grade\n"
              f"_ai_evolution_grade(globals(), {job!r})\n")
    cell = nbformat.v4.new_code_cell(source)
    cell.metadata["tags"] = ["raises-exception", GRADING_TAG]
    nb.cells.append(cell)
    nb.metadata.setdefault("kernelspec", {"name": "python3", "display_name": "Python 3",
                                          "language": "python"})
    nb.metadata.setdefault("language_info", {"name": "python"})
    return nb


def cell_errors(nb) -> list[dict]:
    """Every error output of the submission's own cells, in order."""
    out = []
    for cell in nb.cells:
        meta = cell.get("metadata", {})
        if cell.cell_type != "code" or GRADING_TAG in meta.get("tags", []):
            continue
        for o in cell.get("outputs", []):
            if o.get("output_type") == "error":
                out.append({"cell": meta.get(CELL_KEY), "snippet": snippet(cell.source),
                            "ename": o.get("ename", ""), "evalue": o.get("evalue", "")})
    return out


def snippet(source: str) -> str:
    """The first line of a cell that is not blank or a comment (how a reader finds the cell)."""
    for line in source.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            line = line.strip()
            return line if len(line) <= 60 else line[:59] + "…"
    return ""


def where(error: dict) -> str:
    cell = f"la celda de código {error['cell']}" if error.get("cell") else "una celda añadida"
    return f"{cell} (`{error['snippet']}`)" if error.get("snippet") else cell


def is_memory_error(ename: str, evalue: str) -> bool:
    return ename in ("MemoryError", "OutOfMemoryError") or \
        any(w in evalue.lower() for w in _MEMORY_WORDS)


# --- the worker ----------------------------------------------------------------------------------

def _set_limits(memory_mb: int) -> None:
    limit = memory_mb * 2**20
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard == resource.RLIM_INFINITY or hard > limit:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    resource.setrlimit(resource.RLIMIT_FSIZE, (FSIZE_LIMIT_BYTES, FSIZE_LIMIT_BYTES))


def worker_main(job_path: str) -> int:
    """Execute one prepared job; always writes ``run.json`` next to the job file."""
    job = json.loads(Path(job_path).read_text(encoding="utf-8"))
    out = Path(job["out"])
    run = {"crash": None, "errors": [], "invalid": None}

    def save():
        (out / "run.json").write_text(json.dumps(run, ensure_ascii=False), encoding="utf-8")

    save()
    try:
        nb = prepare(Path(job["notebook"]), job["cell_job"])
    except Exception as err:  # noqa: BLE001 - not a notebook
        run["invalid"] = f"{type(err).__name__}: {err}"
        save()
        return 0
    import nbformat
    import papermill

    prepared = out / "prepared.ipynb"
    nbformat.write(nb, str(prepared))
    executed = out / "executed.ipynb"
    _set_limits(job["memory_mb"])
    try:
        papermill.execute_notebook(
            str(prepared), str(executed), parameters={"seed": job["seed"], "profile": "ci"},
            cwd=job["work"], kernel_name="python3", language="python", progress_bar=False,
            allow_errors=True, interrupt_on_timeout=True, execution_timeout=job["cell_timeout_s"],
            start_timeout=120)
    except papermill.PapermillExecutionError:
        pass  # errors stay in the cells' outputs; they are read below
    except BaseException as err:  # noqa: BLE001 - dead kernel, kernel that did not start, ...
        run["crash"] = f"{type(err).__name__}: {err}"
    if executed.is_file():
        try:
            run["errors"] = cell_errors(nbformat.read(str(executed), as_version=4))
        except Exception as err:  # noqa: BLE001
            run["crash"] = run["crash"] or f"{type(err).__name__}: {err}"
    save()
    return 0


# --- the grader's side ---------------------------------------------------------------------------

def _tree(proc_pid: int) -> list:
    import psutil

    try:
        root = psutil.Process(proc_pid)
        return [root] + root.children(recursive=True)
    except psutil.Error:
        return []


def _kill(processes) -> None:
    import psutil

    own = os.getpgid(0)
    for p in processes:
        try:
            pgid = os.getpgid(p.pid)
            if pgid != own:
                os.killpg(pgid, 9)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            p.kill()
        except psutil.Error:
            pass


def _rss(processes) -> int:
    import psutil

    total = 0
    for p in processes:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


def run_submission(nb_path: Path, scratch: Path, sid: str, assessment, seed: int,
                   timeout_s: float, cell_timeout_s: float, memory_mb: int,
                   stage_limit_s: float) -> RunInfo:
    """Run ``nb_path`` in ``scratch/work/SID`` (a copy of the lab's folder); the job, the log and
    the outputs go to ``scratch/out/SID``, a separate tree."""
    import psutil

    work, out, home = scratch / "work" / sid, scratch / "out" / sid, scratch / "home" / sid
    # The lab's own files (lab.py), not its notebooks: the solution is not handed to the kernel.
    shutil.copytree(assessment.lab_folder, work,
                    ignore=shutil.ignore_patterns("notebook_*", ".ipynb_checkpoints", "__pycache__"))
    out.mkdir(parents=True)
    (home / "tmp").mkdir(parents=True)
    cell_job = {"assessment": str(assessment.folder), "seed": seed,
                "result": str(out / "result.json"), "stage_limit_s": stage_limit_s}
    job = {"notebook": str(nb_path.resolve()), "work": str(work), "out": str(out), "seed": seed,
           "cell_timeout_s": cell_timeout_s, "memory_mb": memory_mb, "cell_job": cell_job}
    job_path = out / "job.json"
    job_path.write_text(json.dumps(job, ensure_ascii=False), encoding="utf-8")

    package_root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env.update({
        "AI_EVOLUTION_PROFILE": "ci", "CUDA_VISIBLE_DEVICES": "", "MPLBACKEND": "Agg",
        "PYTHONHASHSEED": "0", "HOME": str(home), "TMPDIR": str(home / "tmp"),
        "MPLCONFIGDIR": str(scratch / "mplconfig"), "MALLOC_ARENA_MAX": "2",
        "PYTHONPATH": os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p),
        "JUPYTER_RUNTIME_DIR": str(home / "runtime"), "PYDEVD_DISABLE_FILE_VALIDATION": "1",
    })
    info = RunInfo()
    with open(out / "worker.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "ai_evolution.grading.worker",
                                 str(job_path)], cwd=out, env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        seen: dict[int, psutil.Process] = {}
        killed = None
        while proc.poll() is None:
            tree = _tree(proc.pid)
            for p in tree:
                seen.setdefault(p.pid, p)
            if time.monotonic() > deadline:
                killed = "timeout"
            elif _rss(tree) > memory_mb * 2**20:
                killed = "memory"
            if killed:
                _kill(tree)
                break
            time.sleep(0.25)
        proc.wait()
        # Anything the run left behind (a kernel whose worker died, a student's subprocess).
        _kill([p for p in seen.values() if p.is_running()])
    if killed == "timeout":
        info.status = "timeout"
        info.reason = (f"superó el límite de {timeout_s:g} s para todo el cuaderno y se detuvo; "
                       "no se pudo corregir nada.")
    elif killed == "memory":
        info.status = "memory"
        info.reason = (f"superó el límite de {memory_mb} MiB de memoria y se detuvo; no se pudo "
                       "corregir nada.")
    _read_outputs(out, info, killed is not None, cell_timeout_s, memory_mb)
    return info


def _read_outputs(out: Path, info: RunInfo, killed: bool, cell_timeout_s: float,
                  memory_mb: int) -> None:
    result_path = out / "result.json"
    if result_path.is_file() and not killed:
        try:
            info.result = json.loads(result_path.read_text(encoding="utf-8"))
        except (ValueError, OSError):
            info.result = None
    if (out / "executed.ipynb").is_file():
        info.executed = out / "executed.ipynb"
    if killed:
        return
    try:
        run = json.loads((out / "run.json").read_text(encoding="utf-8"))
    except (ValueError, OSError):
        run = {"crash": "el proceso de ejecución terminó sin informe", "errors": [],
               "invalid": None}
    from .kernel import clean

    info.errors = [{**e, "evalue": clean(e["evalue"], 300)} for e in run["errors"]]
    if run.get("invalid"):
        info.status, info.reason = "invalid", \
            f"el archivo no es un cuaderno de Jupyter legible ({clean(run['invalid'], 200)})."
        return
    first_memory = next((e for e in info.errors if is_memory_error(e["ename"], e["evalue"])), None)
    first_interrupt = next((e for e in info.errors if e["ename"] == "KeyboardInterrupt"), None)
    if run.get("crash"):
        info.status = "crashed"
        info.reason = ("el kernel de Python terminó antes de acabar el cuaderno "
                       f"({clean(run['crash'], 200)}).")
    elif first_memory:
        info.status = "memory"
        info.reason = (f"{where(first_memory)} superó el límite de {memory_mb} MiB de memoria "
                       f"({first_memory['ename']}).")
    elif first_interrupt:
        info.status = "timeout"
        info.reason = (f"{where(first_interrupt)} superó el límite de {cell_timeout_s:g} s por "
                       "celda y se interrumpió; el resto del cuaderno se ejecutó.")
    elif info.errors:
        e = info.errors[0]
        extra = len(info.errors) - 1
        more = "" if not extra else \
            f" (y {extra} {'celda más' if extra == 1 else 'celdas más'} con error)"
        info.status = "error"
        info.reason = f"{where(e)} lanzó {e['ename']}: {clean(e['evalue'], 200)}{more}."
    if info.result is None and info.status in ("ok", "error"):
        info.status = "crashed" if info.status == "ok" else info.status
        info.reason = (info.reason + " " if info.reason else "") + \
            "La celda de corrección no llegó a escribir su resultado."

