"""Keep the Colab (launch) button only on pages Colab can open.

sphinx-book-theme adds a launch button to every page that executes code, and for a MyST text
notebook it links the paired ``.ipynb`` if one exists, else the ``.md`` itself, which Colab cannot
open. The labs are paired; the chapters execute code but are not, so their button is dropped.
"""

from pathlib import Path


def drop_unpaired_launch_buttons(app, pagename, templatename, context, doctree):
    source = Path(app.env.doc2path(pagename))
    if source.suffix == ".md" and not source.with_suffix(".ipynb").exists():
        buttons = context.get("header_buttons", [])
        buttons[:] = [b for b in buttons if b.get("label") != "launch-buttons"]


def setup(app):
    # After the theme's add_launch_buttons (priority 501), before the page is rendered.
    app.connect("html-page-context", drop_unpaired_launch_buttons, priority=502)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
