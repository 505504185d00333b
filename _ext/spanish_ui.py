"""Every word the theme shows in Spanish.

The book is built with ``language: es``, but three parts of the toolchain leave English words on
every page (titles, aria-labels, tooltips). Each is translated where it comes from:

- Sphinx's own messages ("Link to this heading"): ``_ext/locale/es/LC_MESSAGES/sphinx.po``.
  ``locale_dirs`` in ``_config.yml`` names that folder; Sphinx reads it before its own catalog and
  compiles the ``.po`` itself.
- sphinx-book-theme's messages ("Launch on Colab", "Descarga esta pagina"):
  ``_ext/locale/es/LC_MESSAGES/booktheme.po``. Sphinx would read a second catalog of the same name
  only as a fallback, after the theme's (so a wrong translation there would win); this extension
  compiles ours and puts it first, with the theme's behind it.
- Strings written into templates or Python code, which no catalog reaches: the theme's
  templates copied in ``_ext/templates`` (``templates_path``) with their words in Spanish, and the
  ``aria-label`` of the toggle of cells tagged ``hide-input``, written by myst-nb's HTML visitor,
  which this extension replaces.

``tests/test_book_editions.py`` fails on any English word of the theme found on a built page.
"""

from __future__ import annotations

import gettext
from html import escape
from pathlib import Path

LOCALE = Path(__file__).resolve().parent / "locale"
THEME_CATALOG = "booktheme"  # sphinx_book_theme.MESSAGE_CATALOG_NAME
HIDDEN_CELL_LABEL = "Mostrar u ocultar la parte oculta de la celda"


def _theme_catalog_first(app) -> None:
    """Our ``booktheme`` messages before the theme's: ours answer, the theme's fill the rest."""
    from sphinx import locale
    from sphinx.util.i18n import CatalogRepository

    language = app.config.language
    repo = CatalogRepository(str(LOCALE.parent), [LOCALE.name], language, "utf-8")
    for catalog in repo.catalogs:
        if catalog.domain == THEME_CATALOG and catalog.is_outdated():
            catalog.write_mo(language)
    try:
        ours = gettext.translation(THEME_CATALOG, str(LOCALE), languages=[language])
    except OSError:  # no catalog of ours for this language
        return
    key = ("general", THEME_CATALOG)
    theirs = locale.translators.get(key)
    if theirs is not None and theirs is not ours:
        ours.add_fallback(theirs)
    locale.translators[key] = ours


def _visit_hidden_cell(self, node) -> None:
    """myst-nb's ``visit_HideCellInput`` with a Spanish ``aria-label``."""
    classes = " ".join(node["classes"])
    self.body.append(f'<details class="admonition hide {classes}">\n')
    self.body.append(f'<summary aria-label="{HIDDEN_CELL_LABEL}">\n')
    self.body.append(f'<p class="collapsed admonition-title">{escape(node["prompt_show"])}</p>\n')
    self.body.append(f'<p class="expanded admonition-title">{escape(node["prompt_hide"])}</p>\n')
    self.body.append("</summary>\n")


def setup(app):
    from myst_nb.sphinx_ import HideCodeCellNode, depart_HideCellInput

    _theme_catalog_first(app)
    app.add_node(HideCodeCellNode, override=True,
                 html=(_visit_hidden_cell, depart_HideCellInput))
    return {"parallel_read_safe": True, "parallel_write_safe": True}
