"""The book builds warning-free, in Spanish, with Colab links for every lab and no CDN scripts.

The build runs exactly as `make book` does (`--all -W -n --keep-going`, labs in the `ci` profile),
but into a temporary folder (`--path-output DIR` writes DIR/_build/html and starts from an empty
execution cache there), so it also proves that every lab notebook executes from scratch.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _jupyter_book() -> str:
    candidate = Path(sys.executable).with_name("jupyter-book")
    if candidate.exists():
        return str(candidate)
    found = shutil.which("jupyter-book")
    assert found, "jupyter-book is not installed in this environment"
    return found


def _config() -> dict:
    return yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))


def _toc_files(node) -> list[str]:
    """Every `file:` entry of _toc.yml, in order (root included)."""
    found: list[str] = []
    if isinstance(node, dict):
        for key in ("root", "file"):
            if isinstance(node.get(key), str):
                found.append(node[key])
        for value in node.values():
            if isinstance(value, (list, dict)):
                found.extend(_toc_files(value))
    elif isinstance(node, list):
        for item in node:
            found.extend(_toc_files(item))
    return found


def _colab_url(config: dict, notebook: str) -> str:
    """The link sphinx-book-theme must generate for a lab, derived from _config.yml."""
    repo = config["repository"]
    slug = re.sub(r"^https://github\.com/", "", repo["url"]).strip("/")
    colab = config["launch_buttons"]["colab_url"].rstrip("/")
    prefix = f"{repo['path_to_book'].strip('/')}/" if repo.get("path_to_book") else ""
    return f"{colab}/github/{slug}/blob/{repo['branch']}/{prefix}{notebook}"


_EXTERNAL_SCRIPT = re.compile(r"<script\b[^>]*\bsrc=[\"'](?:https?:)?//", re.IGNORECASE)
_EXTERNAL_STYLESHEET = re.compile(
    r"<link\b(?=[^>]*\brel=[\"']stylesheet)[^>]*\bhref=[\"'](?:https?:)?//", re.IGNORECASE
)


def test_book_builds_in_spanish_with_colab_links_and_no_cdn(tmp_path):
    env = dict(os.environ, AI_EVOLUTION_PROFILE="ci")
    cmd = [_jupyter_book(), "build", "--all", "-W", "-n", "--keep-going",
           "--path-output", str(tmp_path), str(ROOT)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600)
    log = proc.stdout[-8000:] + "\n" + proc.stderr[-8000:]
    assert proc.returncode == 0, f"jupyter-book build failed (exit {proc.returncode}):\n{log}"

    html = tmp_path / "_build" / "html"
    intro = html / "book" / "intro.html"
    assert intro.is_file(), f"missing {intro}; output has: {sorted(p.name for p in html.iterdir())}"

    config = _config()
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
    pages = _toc_files(toc)
    for page in pages:
        built = html / f"{page}.html"
        assert built.is_file(), f"the TOC entry {page} produced no page"
        text = built.read_text(encoding="utf-8")
        assert re.search(r"<html[^>]*\blang=\"es\"", text), f"{page}.html is not lang=\"es\""

    labs = [page for page in pages if page.startswith("labs/")]
    assert labs, "the TOC lists no lab"
    for lab in labs:
        assert (ROOT / f"{lab}.ipynb").is_file(), (
            f"{lab}.ipynb is missing: without the paired notebook the Colab link points to the .md "
            "(run `make sync`)")
        text = (html / f"{lab}.html").read_text(encoding="utf-8")
        expected = _colab_url(config, f"{lab}.ipynb")
        assert expected in text, f"no Colab launch link {expected} in {lab}.html"

    # Colab cannot open a .md: pages without a paired .ipynb (the chapters) get no launch link.
    for page in pages:
        if not (ROOT / f"{page}.ipynb").is_file():
            text = (html / f"{page}.html").read_text(encoding="utf-8")
            assert "colab.research.google.com" not in text, f"{page}.html has a Colab link to a .md"

    # Glued values must be pasted, not left as roles, and every page must be free of errors.
    for page in pages:
        text = (html / f"{page}.html").read_text(encoding="utf-8")
        assert "{glue" not in text and "NotImplementedError" not in text, page

    for page in sorted(html.rglob("*.html")):
        text = page.read_text(encoding="utf-8")
        rel = page.relative_to(html)
        assert "cdn.jsdelivr.net" not in text, f"{rel} refers to cdn.jsdelivr.net"
        assert not _EXTERNAL_SCRIPT.search(text), f"{rel} loads a script from another host"
        assert not _EXTERNAL_STYLESHEET.search(text), f"{rel} loads a stylesheet from another host"

    intro_text = intro.read_text(encoding="utf-8")
    assert "_static/mathjax/tex-mml-chtml.js" in intro_text, "MathJax is not the vendored copy"
    assert (html / "_static" / "mathjax" / "tex-mml-chtml.js").is_file()
