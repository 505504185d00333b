"""The student edition of the book (``make book EDITION=student``, issue 26 item 8): no solution code
anywhere in the built site. Lab 2's page is built alone in both editions, without executing it
(``lab_page_editions`` in tests/conftest.py, about 40 s): the full edition shows every solution
line (so the check below can fail), the student edition none, in any file of the site."""

from __future__ import annotations

import html
import re
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
LAB = ROOT / "labs" / "02-kv-cache"
PAGE = Path("labs") / "02-kv-cache" / "notebook_solution.html"


def solution_only_lines() -> list[str]:
    """Lines of code inside the solution regions of lab 2 that the student notebook does not
    have (long enough to be unmistakable)."""
    text = (LAB / "notebook_solution.md").read_text(encoding="utf-8")
    student = nbformat.read(LAB / "notebook_student.ipynb", as_version=4)
    student_lines = {ln.strip() for c in student.cells for ln in c.source.splitlines()}
    out = []
    for region in re.findall(r"# BEGIN SOLUTION\n(.*?)# END SOLUTION", text, re.S):
        for line in region.splitlines():
            line = line.strip()
            if len(line) >= 30 and not line.startswith("#") and line not in student_lines:
                out.append(line)
    assert len(out) >= 10, out
    return out


def visible_text(path: Path) -> str:
    """A file of the site as a reader (or a search) sees its text: tags removed, entities
    decoded, so code split into highlighted tokens reads as written."""
    return html.unescape(re.sub(r"<[^>]+>", "", path.read_text(encoding="utf-8", errors="replace")))


def test_the_full_edition_shows_the_solutions(lab_page_editions):
    page = visible_text(lab_page_editions["full"] / PAGE)
    assert all(line in page for line in solution_only_lines())
    assert "Colab (resuelto)" in page


def test_the_student_edition_has_no_solution_code_anywhere(lab_page_editions):
    site = lab_page_editions["student"]
    lines = solution_only_lines()
    page = visible_text(site / PAGE)
    assert 'raise NotImplementedError("Ejercicio sin resolver.' in page
    assert "def kv_bytes_per_token" in page and "def fit_growth" in page
    for path in site.rglob("*"):
        if path.is_file() and path.suffix in (".html", ".js", ".txt", ".md", ".ipynb", ".json"):
            text = visible_text(path)
            leaked = [line for line in lines if line in text]
            assert not leaked, (path, leaked[:3])
            assert "BEGIN SOLUTION" not in text, path
    assert not (site / "_sources").exists()
    raw = (site / PAGE).read_text(encoding="utf-8")
    assert "notebook_solution.ipynb" not in raw  # no Colab or GitHub link to the solved notebook
    assert "notebook_student.ipynb" in raw and "Colab (resuelto)" not in raw
