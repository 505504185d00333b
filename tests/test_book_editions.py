"""The student edition of the book (``make book EDITION=student``, issue 26 item 8): no solution code
anywhere in the built site. Lab 2's page is built alone in both editions, without executing it
(``lab_page_editions`` in tests/conftest.py, about 40 s): the full edition shows every solution
line (so the check below can fail), the student edition none, in any file of the site."""

from __future__ import annotations

import html
from html.parser import HTMLParser
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


# --- every word of the theme in Spanish (issue 28 item 5) -----------------------------------------
# English words that Sphinx, sphinx-book-theme, pydata-sphinx-theme and myst-nb put on a page built
# with `language: es` (titles, aria-labels, tooltips, visible text): _ext/spanish_ui.py translates
# them. "Descarga esta pagina" is the theme's Spanish catalog, without its accent.
ENGLISH_UI = ("Link to this heading", "Link to this equation", "Link to this table",
              "Link to this image", "Link to this code", "Link to this definition",
              "Toggle primary sidebar", "Toggle secondary sidebar", "Toggle hidden content",
              "Toggle navigation", "Launch on", "Launch interactive content",
              "Descarga esta pagina", "Download this page", "Main", "Page", "Table of contents",
              "Contents", "By", "Copyright", "© Copyright", "Navegación de palanca")
UI_ATTRIBUTES = ("title", "aria-label", "data-bs-title", "alt", "placeholder", "data-tooltip")


class _PageWords(HTMLParser):
    """The words of a page outside its article (the theme's), and the UI attributes of the whole
    page; comments, scripts and styles left out."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.words: list[str] = []
        self._skip = 0
        self._article = 0

    def handle_starttag(self, tag, attrs):
        self.words += [value.strip() for name, value in attrs if name in UI_ATTRIBUTES and value]
        self._skip += tag in ("script", "style")
        self._article += tag == "article"

    def handle_endtag(self, tag):
        self._skip -= tag in ("script", "style")
        self._article -= tag == "article"

    def handle_data(self, data):
        if not self._skip and not self._article and data.strip():
            self.words.append(" ".join(data.split()))


def english_ui_words(page: Path) -> list[str]:
    """The theme's English words found on ``page``: an attribute or text equal to one of
    ``ENGLISH_UI`` or starting with it followed by a space or a dot."""
    parser = _PageWords()
    parser.feed(page.read_text(encoding="utf-8"))
    return sorted({w for w in parser.words for english in ENGLISH_UI
                   if w == english or w.startswith((english + " ", english + "."))})


def test_the_theme_speaks_spanish(lab_page_editions):
    for edition, site in lab_page_editions.items():
        pages = [site / PAGE, site / "search.html", site / "genindex.html"]
        for page in pages:
            assert page.is_file(), page
            assert not english_ui_words(page), (edition, page.name, english_ui_words(page))
        text = (site / PAGE).read_text(encoding="utf-8")
        assert 'aria-label="Mostrar u ocultar la parte oculta de la celda"' in text  # a hide-input cell
        assert "Abrir en Colab" in text and "Descargar esta página" in text


def test_one_footer_with_licences_repository_and_how_to_cite(lab_page_editions):
    text = (lab_page_editions["full"] / PAGE).read_text(encoding="utf-8")
    footer = text.split('<footer class="bd-footer-content', 1)[1].split("</footer>", 1)[0]
    assert footer.count("<p") == 2 and "component-author" not in footer, footer
    assert ">MIT</a>" in footer and ">CC BY-SA 4.0</a>" in footer
    assert '>ai-evolution/servir-un-llm</a>' in footer or "repositorio: <a" in footer
    assert "Cómo citar: AI Evolution, <em>Servir un LLM:" in footer and "CITATION.cff</a>" in footer
    assert "© 2026 AI Evolution" in footer
