"""Lab pages: the student notebook one click away, and the book's own stylesheet.

A lab page is built from ``labs/NN-name/notebook_solution.md``; the Colab button of the header
opens its paired ``notebook_solution.ipynb``, the notebook with the solutions. What a student fills
in is ``notebook_student.ipynb`` in the same folder (``scripts/make_student.py``). On every page
that has one, this extension

- puts a box under the title with a button that opens the student notebook in Colab, a link to
  the file on GitHub, and a sentence saying which notebook is which;
- in the header's launch menu, renames the Colab entry "Colab (resuelto)" and adds "Colab
  (estudiante)".

Both links are built from the same settings as the theme's Colab button (``repository.url``,
``repository.branch`` (the course version, see ``_ext/course.py``), ``repository.path_to_book``
and ``launch_buttons.colab_url`` of ``_config.yml``). The extension also adds ``static/book.css`` (wide math and code scroll inside
their own box instead of overflowing the page's column).

**Student edition** (``make book EDITION=student``, the environment variable
``AI_EVOLUTION_EDITION=student``): the book an instructor publishes to a cohort. The labs
still execute from their solutions (the chapters quote their measured numbers), but every code
block of a lab page shows the student notebook's code: each solution region becomes its
``raise NotImplementedError(...)`` stub, by the same function that writes the student notebook
(``scripts/make_student.py``, ``strip_solution``), before the page is written or indexed for
search. The header's Colab button opens the student notebook only, and the pages' sources are
not copied into the site (``html_copy_source``), so no solution code is anywhere in
``_build/html``.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from docutils import nodes

STUDENT = "notebook_student.ipynb"
STATIC = Path(__file__).resolve().parent / "static"
EDITION_ENV = "AI_EVOLUTION_EDITION"
EDITIONS = ("full", "student")
MAKE_STUDENT = Path(__file__).resolve().parents[1] / "scripts" / "make_student.py"


def edition() -> str:
    """``full`` (default) or ``student``, from ``AI_EVOLUTION_EDITION``."""
    value = os.environ.get(EDITION_ENV, "").strip() or "full"
    if value not in EDITIONS:
        raise ValueError(f"{EDITION_ENV} (EDITION de make) debe ser "
                         f"{' o '.join(repr(e) for e in EDITIONS)}, no {value!r}")
    return value


def _make_student():
    spec = importlib.util.spec_from_file_location("make_student", MAKE_STUDENT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def student_path(source: Path, srcdir: Path) -> str | None:
    """The student notebook beside a lab's solution source, relative to the book root, or None
    when ``source`` is not a lab solution with a student notebook next to it."""
    student = source.with_name(STUDENT)
    if not source.stem.startswith("notebook_solution") or not student.is_file():
        return None
    return student.relative_to(srcdir).as_posix()


def repo_file_path(theme_options: dict, path: str) -> str:
    """``path`` (relative to the book root) relative to the repository root."""
    book = theme_options.get("path_to_docs", "").strip("/")
    return f"{book}/{path}" if book else path


def colab_url(theme_options: dict, path: str) -> str:
    """The Colab link for a notebook, as sphinx-book-theme builds its launch button's."""
    colab = theme_options["launch_buttons"]["colab_url"].rstrip("/")
    slug = theme_options["repository_url"].rstrip("/").split("github.com/", 1)[1]
    branch = theme_options.get("repository_branch") or "main"
    return f"{colab}/github/{slug}/blob/{branch}/{repo_file_path(theme_options, path)}"


def github_url(theme_options: dict, path: str) -> str:
    branch = theme_options.get("repository_branch") or "main"
    return (f"{theme_options['repository_url'].rstrip('/')}/blob/{branch}/"
            f"{repo_file_path(theme_options, path)}")


def _student(app, docname: str) -> str | None:
    return student_path(Path(app.env.doc2path(docname)), Path(app.srcdir))


def student_box(theme_options: dict, path: str, student: bool = False) -> nodes.Element:
    """The box under a lab page's title (``student``: the student edition's wording)."""
    box = nodes.admonition(classes=["tip", "student-notebook"])
    box += nodes.title(text="Cuaderno del estudiante")
    para = nodes.paragraph()
    if student:
        para += nodes.Text("Esta página muestra el código del cuaderno del estudiante, con los "
                           "ejercicios por resolver; los resultados son los de una ejecución "
                           "resuelta. Usted trabaja en ese cuaderno, con sus autocomprobaciones (")
    else:
        para += nodes.Text("Esta página es el cuaderno resuelto (")
        para += nodes.literal(text="notebook_solution.ipynb")
        para += nodes.Text("), el que abre el botón de Colab de la cabecera. Usted trabaja en el "
                           "cuaderno del estudiante: el mismo laboratorio, con los ejercicios por "
                           "resolver y sus autocomprobaciones (")
    para += nodes.reference("", "", nodes.literal(text=path), refuri=github_url(theme_options, path))
    para += nodes.Text(").")
    box += para
    button = nodes.paragraph()
    button += nodes.reference("", "Abrir el cuaderno del estudiante en Colab",
                              refuri=colab_url(theme_options, path),
                              classes=["sd-btn", "sd-btn-primary", "student-notebook-button"])
    box += button
    return box


def add_student_box(app, doctree, docname):
    path = _student(app, docname)
    if path is None:
        return
    section = next(iter(doctree.findall(nodes.section)), None)
    if section is None or not isinstance(section[0], nodes.title):
        return
    section.insert(1, student_box(app.config.html_theme_options, path,
                                  student=edition() == "student"))


def strip_solutions(doctree, where: str, solved: bool = False) -> int:
    """Replace, in every code block of ``doctree``, each solution region by the student
    notebook's stub (``solved``: by its code without the markup and the hints, as the full
    edition shows it); return how many blocks changed."""
    module = _make_student()
    begin = module.BEGIN
    changed = 0
    for block in list(doctree.findall(nodes.literal_block)):
        text = block.astext()
        if begin not in text:
            continue
        student = (module.show_solution(text, where) if solved else
                   module.strip_solution(text, where)[0])
        new = block.copy()  # same attributes (language, classes), new text
        new += nodes.Text(student)
        new.rawsource = student
        block.replace_self(new)
        changed += 1
    return changed


def student_code_only(app, doctree):
    """Student edition: a lab page shows the student notebook's code (``doctree-read``, so the
    written page and the search index both get it). Full edition: the solutions without the
    ``# BEGIN SOLUTION`` / ``# END SOLUTION`` markers and the student's hints."""
    if _student(app, app.env.docname) is not None:
        strip_solutions(doctree, app.env.docname, solved=edition() != "student")


def no_copied_sources(app, config):
    if edition() == "student":
        config.html_copy_source = False


def add_student_launch_button(app, pagename, templatename, context, doctree):
    path = _student(app, pagename)
    if path is None:
        return
    for group in context.get("header_buttons", []):
        if group.get("label") != "launch-buttons":
            continue
        items = group["buttons"]
        for i, item in enumerate(items):
            if item.get("text") == "Colab":
                student = dict(item, text="Colab (estudiante)",
                               tooltip="Abrir en Colab el cuaderno del estudiante",
                               url=colab_url(app.config.html_theme_options, path))
                if edition() == "student":  # no way to the solved notebook
                    items[i] = student
                else:
                    items[i] = dict(item, text="Colab (resuelto)")
                    items.insert(i + 1, student)
                break


def add_static_path(app):
    app.config.html_static_path.append(str(STATIC))


def setup(app):
    edition()  # a wrong EDITION stops the build at once, with the accepted values
    app.connect("config-inited", no_copied_sources)
    app.connect("doctree-read", student_code_only)
    app.connect("builder-inited", add_static_path)
    app.add_css_file("book.css")
    app.connect("doctree-resolved", add_student_box)
    # After the theme's add_launch_buttons (priority 501) and launch_only_labs (502).
    app.connect("html-page-context", add_student_launch_button, priority=503)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
