"""Execute a submitted notebook: the kernel's run, and what the grader reads back from it.

Process tree of one run (the processes and their isolation and limits: :mod:`.sandbox`)::

    grader (this process): run_notebook
      └─ [bwrap] worker: ``python -m ai_evolution.grading.worker``   (job on stdin, the executed
           │              notebook back on a private copy of its stdout): worker_main
           └─ kernel (ipykernel, started by papermill), which runs the notebook

Before the run (:func:`prepare`) the submission's code cells are numbered, their outputs
cleared, any ``injected-parameters`` cell dropped and an export cell appended; papermill injects
``seed`` and ``profile="ci"``, with ``allow_errors``, a per-cell limit (``cell_timeout_s``:
nbclient interrupts the cell and goes on) and the whole run under :func:`.sandbox.run_untrusted`.

Trust: nothing the kernel writes is read as a result. The worker returns the executed notebook
through a copy of its stdout that no child inherits, after execution; the worker makes itself
non-dumpable, so the kernel cannot open that descriptor through ``/proc``. From that notebook
the grader reads only the errors of each cell and the contract the last (grader's) cell prints,
both validated in the grader (:func:`_read_answer` turns them into a :class:`RunInfo`). The
exercise functions are graded by the checker from the submitted file, not from the kernel,
calling them in the function worker.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .sandbox import (STOPPED_GRACE_S, Finished, _limits, budget_reason, command, isolation,
                      new_scratch, private_stdout, run_untrusted, set_limits, write_all)

GRADING_TAG = "ai-evolution-grading"
CELL_KEY = "ai_evolution_cell"  # cell metadata: 1-based index among the submission's code cells
CONTRACT_MARKER = "@@ai-evolution-contract@@"
_MEMORY_WORDS = ("can't allocate memory", "cannot allocate memory", "out of memory",
                 "not enough memory", "bad_alloc")

EXPORT_CELL = f"""# Celda añadida por el corrector automático (ai_evolution.grading): exporta el contrato.
def _ai_evolution_export(ns):
    import json
    out = {{"seed": repr(ns.get("seed")), "profile": repr(ns.get("profile"))}}
    if "contract" not in ns:
        out["error"] = "missing"
    elif not isinstance(ns["contract"], dict):
        out["error"] = "type:" + type(ns["contract"]).__name__
    else:
        def reject(obj):
            raise TypeError(type(obj).__name__ + " no es serializable en JSON")
        try:
            out["contract"] = json.dumps(ns["contract"], default=reject, allow_nan=True)
        except (TypeError, ValueError, RecursionError) as err:
            out["error"] = "json:" + str(err)
    print("\\n{CONTRACT_MARKER}" + json.dumps(out))
_ai_evolution_export(globals())
"""


@dataclass
class RunInfo:
    """What happened when one notebook ran (the grader's view)."""

    status: str = "ok"            # ok | error | timeout | memory | disk | invalid | crashed
    reason: str = ""
    errors: list[dict] = field(default_factory=list)  # {"cell", "snippet", "ename", "evalue"}
    contract: dict | None = None  # the contract the export cell printed, parsed here
    contract_error: str | None = None
    exported: bool = False        # the export cell printed its line
    kernel_seed: str | None = None     # repr() of `seed` / `profile` in the kernel at the end
    kernel_profile: str | None = None
    executed: dict | None = None  # the executed notebook (JSON), if the worker returned it
    isolation: str = "session"
    removed_cells: list[int] = field(default_factory=list)  # cells tagged injected-parameters


# --- preparing the notebook ----------------------------------------------------------------------

def prepare(nb):
    """Number the submission's code cells, clear outputs, drop any cell tagged
    ``injected-parameters`` (papermill would put the injected values there instead of after
    the ``parameters`` cell) and append the export cell. Returns (notebook, removed cells)."""
    import nbformat

    nb.cells = [c for c in nb.cells if GRADING_TAG not in c.get("metadata", {}).get("tags", [])]
    kept, removed, n = [], [], 0
    for cell in nb.cells:
        if cell.cell_type == "code":
            n += 1
            cell.setdefault("metadata", {})[CELL_KEY] = n
            cell.outputs, cell.execution_count = [], None
            if "injected-parameters" in cell.metadata.get("tags", []):
                removed.append(n)
                continue
        kept.append(cell)
    nb.cells = kept
    cell = nbformat.v4.new_code_cell(EXPORT_CELL)
    cell.metadata["tags"] = ["raises-exception", GRADING_TAG]
    nb.cells.append(cell)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nb.metadata.setdefault("language_info", {"name": "python"})
    return nb, removed


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
                            "ename": str(o.get("ename", "")), "evalue": str(o.get("evalue", ""))})
    return out


def export_output(nb) -> dict | None:
    """What the export cell printed (the last marker line of the grader's cell), or None."""
    for cell in reversed(nb.cells):
        if GRADING_TAG not in cell.get("metadata", {}).get("tags", []):
            continue
        text = "".join(str(o.get("text", "")) for o in cell.get("outputs", [])
                       if o.get("output_type") == "stream" and o.get("name") == "stdout")
        lines = [ln for ln in text.splitlines() if ln.startswith(CONTRACT_MARKER)]
        if not lines:
            return None
        try:
            data = json.loads(lines[-1][len(CONTRACT_MARKER):])
        except ValueError:
            return None
        return data if isinstance(data, dict) else None
    return None


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


# --- the worker (runs in the sandbox) ------------------------------------------------------------

def worker_main() -> int:
    """Execute the notebook of the job read from stdin; write one JSON answer, at the end, to
    the private stdout: {"crash", "errors", "executed"}."""
    job = json.loads(sys.stdin.buffer.read().decode("utf-8"))
    out = private_stdout()
    import nbformat
    import papermill

    import papermill.execute

    # Errors are read from the cells' outputs; papermill would raise them instead of returning
    # the executed notebook (it has no output file here: nothing the kernel could rewrite).
    papermill.execute.raise_for_execution_errors = lambda nb, output_path: None
    nb = nbformat.reads(job["notebook"], as_version=4)
    answer: dict = {"crash": None, "errors": [], "executed": None}
    set_limits(job["memory_mb"])
    executed = None

    def reply_errors(cell, cell_index, execute_reply):
        """A cell whose execute_reply says ``error`` but that shows no error output (a custom
        exception handler installed in the kernel swallowed it) gets one: ``runs`` is read from
        the reply nbclient received, not from what the kernel chose to display."""
        content = (execute_reply or {}).get("content", {})
        if content.get("status") == "error" and not any(
                o.get("output_type") == "error" for o in cell.get("outputs", [])):
            cell.setdefault("outputs", []).append(nbformat.v4.new_output(
                "error", ename=str(content.get("ename") or "Error"),
                evalue=str(content.get("evalue") or "") + " (el kernel no mostró este error)",
                traceback=[]))

    try:
        executed = papermill.execute_notebook(
            nb, None, parameters={"seed": job["seed"], "profile": "ci"}, cwd=job["work"],
            kernel_name="python3", language="python", progress_bar=False, allow_errors=True,
            interrupt_on_timeout=True, execution_timeout=job["cell_timeout_s"], start_timeout=120,
            on_cell_executed=reply_errors)
    except papermill.PapermillExecutionError:
        pass  # errors stay in the cells' outputs
    except BaseException as err:  # noqa: BLE001 - dead kernel, kernel that did not start, ...
        answer["crash"] = f"{type(err).__name__}: {err}"
    if executed is not None:
        answer["errors"] = cell_errors(executed)
        answer["executed"] = nbformat.writes(executed)
    write_all(out, json.dumps(answer, ensure_ascii=False).encode("utf-8"))
    os.close(out)
    return 0


# --- the grader's side -------------------------------------------------------------------------------

def run_notebook(data: bytes, assessment, seed: int, timeout_s: float, cell_timeout_s: float,
                 memory_mb: int, log_dir: Path) -> RunInfo:
    """Execute one submission (the bytes the grader read before grading anyone) in a fresh
    scratch copy of the lab's folder (without its notebooks), isolated; return what the
    grader saw."""
    import nbformat

    info = RunInfo(isolation=isolation())
    try:
        nb = nbformat.reads(data.decode("utf-8"), as_version=4)
        nb, info.removed_cells = prepare(nb)
        text = nbformat.writes(nb)
    except Exception as err:  # noqa: BLE001 - not a notebook
        from .namespace import clean

        info.status = "invalid"
        info.reason = f"el archivo no es un cuaderno de Jupyter legible ({clean(err, 200)})."
        return info
    scratch = new_scratch()
    try:
        work = scratch / "work"
        shutil.rmtree(work)
        # The lab's own files (lab.py), not its notebooks: the solution is not handed over.
        shutil.copytree(assessment.lab_folder, work, ignore=shutil.ignore_patterns(
            "notebook_*", ".ipynb_checkpoints", "__pycache__"))
        job = {"notebook": text, "work": str(work), "seed": seed,
               "cell_timeout_s": cell_timeout_s, "memory_mb": memory_mb}
        cmd = command("ai_evolution.grading.worker", scratch, info.isolation)
        done = run_untrusted(cmd, json.dumps(job).encode("utf-8"), scratch, timeout_s, memory_mb,
                             log_dir / "worker.log")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    _read_answer(done, info, timeout_s, cell_timeout_s, memory_mb)
    return info


def _read_answer(done: Finished, info: RunInfo, timeout_s: float, cell_timeout_s: float,
                 memory_mb: int) -> None:
    import nbformat

    from .namespace import clean

    lost = "los ejercicios se corrigieron aparte, pero el contrato y el reto se pierden."
    killed = {
        "timeout": ("timeout", f"superó el límite de {timeout_s:g} s para todo el cuaderno y se "
                               f"detuvo; {lost}"),
        "budget": ("timeout", f"el cuaderno se detuvo: {budget_reason()}"),
        "disk": ("disk", f"escribió más de {_limits()['disk_mb']} MiB en su carpeta de trabajo y "
                         f"se detuvo; {lost}"),
        "stopped": ("crashed", "el cuaderno detuvo un proceso del corrector (SIGSTOP) y se "
                               f"terminó tras {STOPPED_GRACE_S:g} s detenido; {lost}"),
        "memory": ("memory", f"superó el límite de {memory_mb} MiB de memoria y se detuvo; {lost}"),
    }
    if done.killed in killed:
        info.status, info.reason = killed[done.killed]
        return
    try:
        answer = json.loads(done.stdout.decode("utf-8"))
        executed = nbformat.reads(answer["executed"], as_version=4) if answer["executed"] else None
        crash = answer.get("crash")
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as err:
        answer, executed, crash = {}, None, None
        info.status = "crashed"
        info.reason = ("el proceso que ejecutaba el cuaderno terminó sin dar su informe (¿lo "
                       "detuvo el propio cuaderno?); los ejercicios se corrigieron aparte.")
        del err
        return
    if executed is not None:
        info.executed = json.loads(answer["executed"])
        info.errors = [{**e, "evalue": clean(e["evalue"], 300)} for e in cell_errors(executed)]
        exported = export_output(executed)
        if exported is not None:
            info.exported = True
            info.kernel_seed, info.kernel_profile = exported.get("seed"), exported.get("profile")
            if "contract" in exported:
                try:
                    info.contract = json.loads(str(exported["contract"]))
                except ValueError:
                    info.contract_error = "el contrato exportado no es JSON válido."
                if info.contract is not None and not isinstance(info.contract, dict):
                    info.contract, info.contract_error = None, "`contract` debe ser un dict."
            else:
                info.contract_error = _export_error(str(exported.get("error", "")))
    first_memory = next((e for e in info.errors if is_memory_error(e["ename"], e["evalue"])), None)
    first_interrupt = next((e for e in info.errors if e["ename"] == "KeyboardInterrupt"), None)
    if crash:
        info.status = "crashed"
        info.reason = ("el kernel de Python terminó antes de acabar el cuaderno "
                       f"({clean(crash, 200)}); los ejercicios se corrigieron aparte.")
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
    if not info.exported and info.status in ("ok", "error"):
        info.status = "crashed" if info.status == "ok" else info.status
        info.reason = (info.reason + " " if info.reason else "") + \
            "La celda que exporta el contrato no llegó a ejecutarse."


def _export_error(code: str) -> str:
    if code == "missing":
        return ("el cuaderno no definió la variable `contract` (la celda del contrato no se "
                "ejecutó o falló antes de crearla).")
    if code.startswith("type:"):
        return f"`contract` debe ser un dict y es {code[5:]}."
    if code.startswith("json:"):
        return f"el contrato no se puede escribir como JSON: {code[5:]}."
    return "el cuaderno no exportó el contrato."
