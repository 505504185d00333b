"""Lab pages in the book, checked on their sources (no build): boilerplate hidden, the code that
teaches shown, the student notebook whole, and the student-notebook link of ``_ext/lab_pages.py``
built from the same settings as the theme's Colab button. The built pages are checked by
``test_book.py`` (the link) and ``test_book_in_browser.py`` (the rendering)."""

from __future__ import annotations

import ast
import importlib.util
import re
import sys
from pathlib import Path

import jupytext
import nbformat
import pytest
import yaml
from docutils import nodes

from test_book import _colab_url, _config

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import make_student  # noqa: E402

SOLUTIONS = sorted((ROOT / "labs").glob("*/notebook_solution.md"))
IDS = [p.parent.name for p in SOLUTIONS]
HIDDEN = {"remove-cell", "remove-input", "hide-input"}  # what the book does not show at once


def _extension():
    spec = importlib.util.spec_from_file_location("lab_pages", ROOT / "_ext" / "lab_pages.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _theme_options() -> dict:
    """html_theme_options exactly as Jupyter Book derives them from _config.yml."""
    from jupyter_book.config import yaml_to_sphinx

    return yaml_to_sphinx(_config())[0]["html_theme_options"]


def _tags(cell) -> set[str]:
    return set(cell.metadata.get("tags", []))


def _python(source: str) -> ast.Module:
    """A cell's code without IPython magics (``%pip``), parsed."""
    return ast.parse("\n".join(ln[: len(ln) - len(ln.lstrip())] + "pass"
                               if ln.lstrip().startswith(("%", "!")) else ln
                               for ln in source.split("\n")))


def _names(tree, ctx) -> set[str]:
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ctx)}


@pytest.mark.parametrize("solution", SOLUTIONS, ids=IDS)
def test_lab_page_hides_its_boilerplate_and_shows_the_code_that_teaches(solution):
    code = [c for c in jupytext.read(solution).cells if c.cell_type == "code"]
    install = [c for c in code if make_student.INSTALL_MARKER in c.source]
    assert len(install) == 1 and "remove-cell" in _tags(install[0]), (
        "the Colab install cell must exist once and be tagged remove-cell")
    setup = [c for c in code if "from myst_nb import glue" in c.source]
    assert len(setup) == 1 and "hide-input" in _tags(setup[0]), (
        "the imports cell must be tagged hide-input (folded on the page, its output shown)")

    for cell in code:
        first = cell.source.strip().split("\n")[0][:70]
        if not _tags(cell) & HIDDEN:
            assert "glue(" not in cell.source, (
                f"a cell the page shows glues values (move the glue calls to a cell tagged "
                f"remove-cell right after it): {first!r}")
        if "# BEGIN SOLUTION" in cell.source or re.search(r"\bcheck_\w+\(", cell.source):
            assert not _tags(cell) & HIDDEN, f"an exercise or self-check cell is hidden: {first!r}"

    # A removed glue cell only publishes: nothing it defines is read by a later cell.
    for i, cell in enumerate(code):
        if "remove-cell" not in _tags(cell) or cell in install:
            continue
        assert "glue(" in cell.source, f"a removed cell that glues nothing: {cell.source[:70]!r}"
        defined = _names(_python(cell.source), ast.Store)
        for later in code[i + 1:]:
            tree = _python(later.source)
            leaked = (defined & _names(tree, ast.Load)) - _names(tree, ast.Store)
            assert not leaked, (f"{sorted(leaked)} defined in a removed cell and used by a later "
                                f"one: {later.source.strip()[:70]!r}")


@pytest.mark.parametrize("solution", SOLUTIONS, ids=IDS)
def test_student_notebook_shows_every_cell(solution):
    solution_cells = jupytext.read(solution).cells
    student = nbformat.read(solution.with_name("notebook_student.ipynb"), as_version=4)
    assert len(student.cells) == len(solution_cells)
    for cell in student.cells:
        assert not _tags(cell) & set(make_student.BOOK_ONLY_TAGS), (
            f"the student notebook keeps a book-only tag: {cell.source[:60]!r}")


def test_student_link_is_the_colab_button_url_for_the_student_notebook():
    ext, options = _extension(), _theme_options()
    config = _config()
    for solution in SOLUTIONS:
        path = ext.student_path(solution, ROOT)
        assert path == f"labs/{solution.parent.name}/notebook_student.ipynb"
        assert ext.colab_url(options, path) == _colab_url(config, path)
        # the solution's URL, as the theme's button builds it, differs only in the file name
        assert ext.colab_url(options, path).replace("notebook_student", "notebook_solution") == \
            _colab_url(config, f"labs/{solution.parent.name}/notebook_solution.ipynb")
    for chapter in (ROOT / "book").glob("*.md"):
        assert ext.student_path(chapter, ROOT) is None


def test_student_box_links_colab_and_the_file_and_says_which_notebook_is_which():
    ext, options = _extension(), _theme_options()
    path = f"labs/{SOLUTIONS[0].parent.name}/notebook_student.ipynb"
    box = ext.student_box(options, path)
    refs = [r["refuri"] for r in box.findall(nodes.reference)]
    assert ext.colab_url(options, path) in refs
    repo = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))["repository"]
    assert f"{repo['url'].rstrip('/')}/blob/{repo['branch']}/{path}" in refs
    text = box.astext()
    assert "notebook_solution.ipynb" in text and path in text and "estudiante" in text


def test_the_student_edition_shows_each_solution_region_as_the_student_stub(monkeypatch):
    ext = _extension()
    monkeypatch.setenv("AI_EVOLUTION_EDITION", "alumnos")
    with pytest.raises(ValueError, match="'full' o 'student', no 'alumnos'"):
        ext.edition()
    monkeypatch.delenv("AI_EVOLUTION_EDITION")
    assert ext.edition() == "full"
    code = ("def f(x):\n    # BEGIN SOLUTION\n    # PISTA: sume uno.\n    return x + 1\n"
            "    # END SOLUTION\n")
    tree = nodes.section()
    tree += nodes.literal_block(code, code, language="ipython3", classes=["cell_input"])
    tree += nodes.literal_block("print(1)", "print(1)")
    assert ext.strip_solutions(tree, "prueba") == 1
    first, second = tree.findall(nodes.literal_block)
    assert first.astext() == make_student.strip_solution(code, "prueba")[0]
    assert "return x + 1" not in first.astext() and "NotImplementedError" in first.astext()
    assert first["language"] == "ipython3" and first["classes"] == ["cell_input"]
    assert second.astext() == "print(1)"


def test_the_full_edition_shows_the_solution_code_without_its_markup_and_hints():
    """Issue 28: solved pages showed `# BEGIN SOLUTION` / `# END SOLUTION` and the student's
    hints, wrapped mid-line."""
    ext = _extension()
    code = ("def f(x):\n    # BEGIN SOLUTION\n    # PISTA: sume uno.\n    # PISTA: y nada más.\n"
            "    y = x + 1  # a comment of the solution stays\n    return y\n    # END SOLUTION\n")
    tree = nodes.section()
    tree += nodes.literal_block(code, code, language="ipython3", classes=["cell_input"])
    assert ext.strip_solutions(tree, "prueba", solved=True) == 1
    (block,) = tree.findall(nodes.literal_block)
    assert block.astext() == ("def f(x):\n    y = x + 1  # a comment of the solution stays\n"
                              "    return y\n")
    assert block["language"] == "ipython3"
    with pytest.raises(make_student.SolutionMarkupError):
        make_student.show_solution("    # BEGIN SOLUTION\n    return 1\n", "prueba")
