"""The gradebook (CSV an LMS can import), one Spanish feedback file per student and the run's
record (``grading.json``: the library version the grader used, the lab, the seed).

All are deterministic: no dates, no timings, rows sorted by student id, so grading the same
folder twice writes the same files. A text cell of the gradebook that a spreadsheet would read
as a formula (it starts with ``=``, ``+``, ``-``, ``@``, a tab or a carriage return) is written
with a leading ``'`` (:func:`csv_cell`); the point columns are plain numbers. A file name in
the feedback is shown as a code span that nothing inside can close (:func:`md_code`).
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from .assessment import Assessment
from .score import Grade
from .similarity import for_instructor, for_student

ISOLATION_ES = {
    "bwrap": "bubblewrap: procesos, red y archivos propios; la biblioteca, de solo lectura",
    "session": "una sesión de procesos propia, sin bubblewrap: límites de tiempo y memoria, pero "
               "el cuaderno podía leer los archivos del usuario que corrige",
}

STATUS_ES = {
    "ok": "corregido sin incidencias",
    "error": "alguna celda lanzó una excepción",
    "timeout": "se agotó un límite de tiempo",
    "memory": "se superó el límite de memoria",
    "crashed": "el kernel o la celda de corrección terminaron antes de tiempo",
    "invalid": "el archivo no es un cuaderno legible",
    "no_contract": "el cuaderno no produjo el contrato",
    "disk": "se superó el límite de disco",
    "refused": "el corrector rechazó la entrega sin ejecutarla",
    "grader_error": "el corrector falló con esta entrega",
}
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
RECORD = "grading.json"


def points(x: float) -> str:
    """Points as an LMS reads them: ``2``, ``1.5`` (a dot: CSV, not prose)."""
    return f"{x:g}"


def points_es(x: float) -> str:
    return f"{x:g}".replace(".", ",")


def csv_cell(text: str) -> str:
    """A text cell no spreadsheet runs as a formula (OWASP's rule: a leading ``'``)."""
    text = str(text)
    return "'" + text if text.startswith(FORMULA_START) else text


def md_code(text: str) -> str:
    """``text`` as a Markdown code span: fenced by more backticks than any run inside, so no
    markup in it takes effect (and, shown by :func:`intake.shown_name`, no newline)."""
    text = " ".join(str(text).splitlines())
    longest, run = 0, 0
    for ch in text:
        run = run + 1 if ch == "`" else 0
        longest = max(longest, run)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def gradebook_csv(grades: list[Grade], assessment: Assessment) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["student_id", *[c.id for c in assessment.criteria], "total", "max_total",
                     "status", "reason", "isolation", "similarity", "notes"])
    for g in sorted(grades, key=lambda g: g.student_id):
        by_id = {s.id: s for s in g.scores}
        writer.writerow([csv_cell(g.student_id),
                         *[points(by_id[c.id].earned) for c in assessment.criteria],
                         points(g.total), points(g.max_total),
                         *map(csv_cell, (g.status, g.reason, g.isolation,
                                         for_instructor(g.similarity), "; ".join(g.notes)))])
    return buf.getvalue()


def feedback_md(g: Grade, assessment: Assessment, seed: int) -> str:
    lines = [f"# Corrección automática: {g.student_id}", "",
             f"- Laboratorio: `{assessment.kind}` (semilla {seed}, perfil `ci`)",
             f"- Archivo entregado: {md_code(g.source)}",
             f"- Puntuación automática: **{points_es(g.total)} de {points_es(g.max_total)}**",
             f"- Estado: `{g.status}` ({STATUS_ES.get(g.status, g.status)})",
             f"- Aislamiento: `{g.isolation}` ({ISOLATION_ES.get(g.isolation, g.isolation)})"]
    if g.reason:
        lines.append(f"- Motivo: {g.reason}")
    lines += [f"- Aviso: {note}" for note in g.notes]
    ok = [s for s in g.scores if s.passed]
    bad = [s for s in g.scores if not s.passed]
    lines += ["", "## Lo que pasó", ""]
    lines += [f"- ✔ {s.title} ({points_es(s.earned)} de {points_es(s.points)}): {s.message}"
              for s in ok] or ["- Ningún criterio automático."]
    lines += ["", "## Lo que falló", ""]
    if bad:
        lines.append("Cada comprobación se detiene en el primer caso que falla; corrija ese caso y "
                     "vuelva a ejecutar la autocomprobación del cuaderno.")
        lines.append("")
        lines += [f"- ✘ {s.title} (0 de {points_es(s.points)}): {s.message}" for s in bad]
    else:
        lines.append("- Nada: todos los criterios automáticos están completos.")
    lines += ["", "## Pendiente de lectura humana", "",
              f"Estos puntos ({points_es(sum(m.points for m in g.manual))} en total) los califica "
              "una persona con la rúbrica de `assessment.md`; no están en la puntuación de arriba.",
              ""]
    lines += [f"- {m.title} ({points_es(m.points)} {'punto' if m.points == 1 else 'puntos'})"
              for m in g.manual]
    if g.flags:
        lines += ["", "## Señales para quien corrige", "",
                  "Líneas que tocan el corrector, la biblioteca o el kernel, y ejercicios que "
                  "delegan en la biblioteca. Las líneas por sí solas no restan puntos (lo que "
                  "resta ya está en la nota, con su motivo); conviene leerlas antes de dar por "
                  "buena la nota automática.", ""]
        lines += [f"- {f}" for f in g.flags]
    if g.similarity:
        lines += ["", "## Parecido con otro código", "",
                  "El código de sus ejercicios se parece mucho al de la solución publicada o al "
                  "de otra entrega. No resta puntos: lo revisa una persona.", ""]
        lines += [f"- {line}" for line in for_student(g.similarity)]
    return "\n".join(lines) + "\n"


def run_record(assessment: Assessment, seed: int, grades: list[Grade]) -> dict:
    """What the gradebook was made with: enough to tell which library graded it."""
    from .. import __version__

    return {"ai_evolution": __version__, "lab": assessment.kind, "seed": seed,
            "students": len(grades)}


def _write(path: Path, text: str) -> None:
    # A lone surrogate (from a kernel's output) becomes U+FFFD rather than stopping the run.
    path.write_bytes(text.encode("utf-8", errors="replace"))


def write_reports(grades: list[Grade], assessment: Assessment, seed: int, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    gradebook = out / "gradebook.csv"
    _write(gradebook, gradebook_csv(grades, assessment))
    _write(out / RECORD, json.dumps(run_record(assessment, seed, grades), indent=1) + "\n")
    feedback = out / "feedback"
    feedback.mkdir(exist_ok=True)
    for g in grades:
        _write(feedback / f"{g.student_id}.md", feedback_md(g, assessment, seed))
    return gradebook
