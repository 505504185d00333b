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
"""

from __future__ import annotations

from pathlib import Path

from docutils import nodes

STUDENT = "notebook_student.ipynb"
STATIC = Path(__file__).resolve().parent / "static"


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


def student_box(theme_options: dict, path: str) -> nodes.Element:
    """The box under a lab page's title."""
    box = nodes.admonition(classes=["tip", "student-notebook"])
    box += nodes.title(text="Cuaderno del estudiante")
    para = nodes.paragraph()
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
    section.insert(1, student_box(app.config.html_theme_options, path))


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
                items[i] = dict(item, text="Colab (resuelto)")
                items.insert(i + 1, student)
                break


def add_static_path(app):
    app.config.html_static_path.append(str(STATIC))


def setup(app):
    app.connect("builder-inited", add_static_path)
    app.add_css_file("book.css")
    app.connect("doctree-resolved", add_student_box)
    # After the theme's add_launch_buttons (priority 501) and launch_only_labs (502).
    app.connect("html-page-context", add_student_launch_button, priority=503)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
