"""Similarity flags (issue 26, item 8): a submission's own code against lab 2's published solution
and against the other submissions, with copydetect; a flag for a person, never points. In
process, on notebooks built here (about a second)."""

from __future__ import annotations

import copy
import csv
import io
import re
from pathlib import Path

import nbformat

from ai_evolution.grading import find_assessment
from ai_evolution.grading.report import feedback_md, gradebook_csv
from ai_evolution.grading.score import CriterionScore, Grade
from ai_evolution.grading.similarity import FLAG_SHARE, for_instructor, for_student, similarity_flags

ROOT = Path(__file__).resolve().parents[1]
KV = ROOT / "labs" / "02-kv-cache"

OWN = '''def kv_bytes_per_token(config, dtype):
    capas = config.num_layers
    total = 0
    for capa in range(capas):
        for parte in ("k", "v"):
            total += config.num_kv_heads * config.head_dim * dtype_bytes(dtype)
    return total


def fit_growth(n, t):
    A = np.stack([np.ones_like(n), n, n * n], axis=1)
    c, *_ = np.linalg.lstsq(A, t, rcond=None)
    c = np.clip(c, 0, None)
    share = c[2] * n[-1] ** 2 / (c[0] + c[1] * n[-1] + c[2] * n[-1] ** 2)
    return {"c0": c[0], "c1": c[1], "c2": c[2], "quadratic_share": share}
'''

OTHER = '''def kv_bytes_per_token(config, dtype):
    return sum(2 * config.head_dim * config.num_kv_heads * dtype_bytes(dtype)
               for _ in range(config.num_layers))


def fit_growth(n, t):
    best = None
    for c2 in np.linspace(0, 1e-3, 50):
        rest = t - c2 * n ** 2
        c1, c0 = np.polyfit(n, rest, 1)
        err = float(((c0 + c1 * n + c2 * n ** 2 - t) ** 2).sum())
        if best is None or err < best[0]:
            best = (err, max(c0, 0.0), max(c1, 0.0), c2)
    _, c0, c1, c2 = best
    return {"c0": c0, "c1": c1, "c2": c2, "quadratic_share": c2 * n[-1] ** 2 / t[-1]}
'''


def with_cell(nb, source: str):
    nb = copy.deepcopy(nb)
    nb.cells.append(nbformat.v4.new_code_cell(source))
    return nb


def test_copies_of_the_solution_and_between_students_are_flagged_and_nothing_else():
    solution = nbformat.read(KV / "notebook_solution.ipynb", as_version=4)
    student = nbformat.read(KV / "notebook_student.ipynb", as_version=4)
    renamed = copy.deepcopy(solution)
    for cell in renamed.cells:
        if cell.cell_type == "code":  # names changed: the token stream is the same
            cell.source = re.sub(r"\bconfig\b", "cfg", cell.source).replace("dtype", "tipo")
    subs = {"solucion": solution, "renombra": renamed, "solucion_2": copy.deepcopy(solution),
            "sin_tocar": student, "ana": with_cell(student, OWN),
            "bea": with_cell(student, OWN.replace("capas", "L").replace("total", "acc")),
            "carla": with_cell(student, OTHER)}
    flags = similarity_flags(subs, KV)
    against = {sid: sorted((other or "") for _, other in f) for sid, f in flags.items()}
    assert against == {"solucion": [""], "renombra": [""], "solucion_2": [""], "sin_tocar": [],
                       "ana": ["bea"], "bea": ["ana"], "carla": []}
    assert all(share >= FLAG_SHARE for f in flags.values() for share, _ in f)
    # The instructor sees who; the student does not.
    assert for_instructor(flags["ana"]) == "entrega bea: 100 %"
    assert "bea" not in " ".join(for_student(flags["ana"]))
    assert for_instructor(flags["solucion"]) == "la solución publicada: 100 %"


def test_a_flag_is_a_column_and_a_feedback_section_never_points():
    a = find_assessment("kv_cache")
    scores = [CriterionScore(c.id, c.title, c.points, c.points, "m") for c in a.criteria]
    g = Grade("ana", "ana.ipynb", "ok", "", scores, a.manual, similarity=[(0.93, "bea")])
    clean = Grade("bea", "bea.ipynb", "ok", "", scores, a.manual)
    rows = {r["student_id"]: r for r in csv.DictReader(io.StringIO(gradebook_csv([g, clean], a)))}
    assert rows["ana"]["similarity"] == "entrega bea: 93 %" and rows["bea"]["similarity"] == ""
    assert rows["ana"]["total"] == rows["bea"]["total"] == f"{g.max_total:g}"
    text = feedback_md(g, a, 0)
    assert "## Parecido con otro código" in text and "93 %" in text and "bea" not in text
    assert "## Parecido con otro código" not in feedback_md(clean, a, 0)
