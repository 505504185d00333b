"""Ship plotly.js with the book, offline: the interactive figures (``ai_evolution.plots.interactive``)
expect ``window.Plotly``.

The ``plotly.min.js`` of the installed ``plotly`` package (pinned in requirements.txt) is copied
once into the build's ``_static/`` and added, as a script, only to the pages that hold an
interactive figure (their body has the ``ae-explorer`` class): no CDN, no kernel, and the other
pages do not load 4–5 MB of JavaScript they do not use. It is copied after the build rather than
placed in a ``_static/`` source folder, because Jupyter Book 1 would add every ``.js`` found there
to every page.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from ai_evolution.plots.interactive import CSS_CLASS, PLOTLY_JS, plotly_js_path


def add_plotly_where_needed(app, pagename, templatename, context, doctree) -> None:
    if f'class="{CSS_CLASS}"' in (context.get("body") or ""):
        app.add_js_file(PLOTLY_JS)


def copy_plotly(app, exception) -> None:
    if exception is None and app.builder.format == "html":
        static = Path(app.outdir) / "_static"
        static.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(plotly_js_path(), static / PLOTLY_JS)


def setup(app):
    app.connect("html-page-context", add_plotly_where_needed)
    app.connect("build-finished", copy_plotly)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
