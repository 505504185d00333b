"""The gradebook (CSV an LMS can import) and one Spanish feedback file per student.

Both are deterministic: no dates, no timings, rows sorted by student id, so grading the same
folder twice writes the same files.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from .assessment import Assessment
from .score import Grade

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
}


def points(x: float) -> str:
    """Points as an LMS reads them: ``2``, ``1.5`` (a dot: CSV, not prose)."""
    return f"{x:g}"


def points_es(x: float) -> str:
    return f"{x:g}".replace(".", ",")


def gradebook_csv(grades: list[Grade], assessment: Assessment) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["student_id", *[c.id for c in assessment.criteria], "total", "max_total",
                     "status", "reason", "isolation"])
    for g in sorted(grades, key=lambda g: g.student_id):
        by_id = {s.id: s for s in g.scores}
        writer.writerow([g.student_id, *[points(by_id[c.id].earned) for c in assessment.criteria],
                         points(g.total), points(g.max_total), g.status, g.reason, g.isolation])
    return buf.getvalue()


def feedback_md(g: Grade, assessment: Assessment, seed: int) -> str:
    lines = [f"# Corrección automática: {g.student_id}", "",
             f"- Laboratorio: `{assessment.kind}` (semilla {seed}, perfil `ci`)",
             f"- Archivo entregado: `{g.source}`",
             f"- Puntuación automática: **{points_es(g.total)} de {points_es(g.max_total)}**",
             f"- Estado: `{g.status}` ({STATUS_ES.get(g.status, g.status)})",
             f"- Aislamiento: `{g.isolation}` ({ISOLATION_ES.get(g.isolation, g.isolation)})"]
    if g.reason:
        lines.append(f"- Motivo: {g.reason}")
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
    return "\n".join(lines) + "\n"


def write_reports(grades: list[Grade], assessment: Assessment, seed: int, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    gradebook = out / "gradebook.csv"
    gradebook.write_text(gradebook_csv(grades, assessment), encoding="utf-8")
    feedback = out / "feedback"
    feedback.mkdir(exist_ok=True)
    for g in grades:
        (feedback / f"{g.student_id}.md").write_text(feedback_md(g, assessment, seed),
                                                     encoding="utf-8")
    return gradebook
