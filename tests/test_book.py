"""The book builds warning-free, in Spanish, with Colab links for every lab and no CDN scripts.

The build (the session fixture `built_book` in conftest.py) runs exactly as `make book` does
(`--all -W -n --keep-going`, labs in the `ci` profile), but into a temporary folder
(`--path-output DIR` writes DIR/_build/html and starts from an empty execution cache there), so it
also proves that every lab notebook executes from scratch.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from execute_book import TIMES_FILE, over_budget, toc_files as _toc_files  # noqa: E402


def _config() -> dict:
    return yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))


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


def test_book_builds_in_spanish_with_colab_links_and_no_cdn(built_book):
    assert built_book["returncode"] == 0, (
        f"jupyter-book build failed (exit {built_book['returncode']}):\n{built_book['log']}")

    html = built_book["html"]
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


def lab_cpu_seconds(out: Path) -> dict[str, float | None]:
    """CPU seconds each lab notebook's kernel used in the build under ``out`` (its
    execution-cache record: `scripts/execute_book.py` stores them as it caches each page), by
    lab folder name."""
    from jupyter_cache import get_cache

    records = get_cache(str(out / "_build" / ".jupyter_cache")).list_cache_records()
    return {Path(r.uri).relative_to(ROOT).parent.name: r.data.get("cpu_seconds")
            for r in records if Path(r.uri).name == "notebook_solution.md"}


def test_each_lab_executes_within_twice_its_ci_budget(built_book):
    """Each lab declares what its notebook takes under `ci` on the reference machine's core
    (``LabSpec.ci_budget_s``); one whose kernel uses more than twice that in CPU time, scaled
    by this machine's calibration against the reference (`scripts/execute_book.py`: a slow
    core takes longer for the lab and the calibration alike), has outgrown its budget (measured
    by this build, not guessed; CPU time, because the wall time of a kernel that shares two
    cores with the rest of the suite says more about the suite than about the lab). The wall
    and CPU times and the calibration are printed at the end of `make test`."""
    from ai_evolution.labs import get_spec, list_labs

    assert built_book["returncode"] == 0, built_book["log"]
    seconds = lab_cpu_seconds(built_book["out"])
    report = json.loads((built_book["out"] / "_build" / TIMES_FILE).read_text(encoding="utf-8"))
    factor = report["calibration"]["factor"]
    assert 0.05 < factor < 20, report["calibration"]  # a calibration that ran, on a real CPU
    budgets = {Path(get_spec(k).folder).name: get_spec(k).ci_budget_s for k in list_labs()}
    labs = sorted(p.parent.name for p in ROOT.glob("labs/*/notebook_solution.md"))
    assert sorted(budgets) == labs, f"labs without a registered kind: {set(labs) - set(budgets)}"
    assert sorted(seconds) == labs, f"labs without an execution record: {set(labs) - set(seconds)}"
    assert all(s is not None and s > 0 for s in seconds.values()), seconds  # a kernel really ran
    over = over_budget(seconds, budgets, factor)
    assert not over, (f"labs over twice their `ci` budget in CPU time (scaled by this machine's "
                      f"calibration): {over}; shrink their `ci` parameters")


_STUDENT_BOX = re.compile(r'<div class="(?:[^"]*\s)?student-notebook(?:\s[^"]*)?">(.*?)</div>', re.S)


def test_each_lab_page_opens_its_student_notebook_in_colab(built_book):
    """Under each lab's title, a box (``_ext/lab_pages.py``) links the student notebook on Colab,
    the one the student fills in, and says which notebook the page is; the header's launch menu
    offers it too. Chapters have neither. The toggles of folded cells are in Spanish."""
    assert built_book["returncode"] == 0, built_book["log"]
    html, config = built_book["html"], _config()
    pages = _toc_files(yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8")))
    for page in pages:
        text = (html / f"{page}.html").read_text(encoding="utf-8")
        assert "Show code cell" not in text, f"{page}.html shows myst-nb's English toggle"
        if not page.startswith("labs/"):
            assert "student-notebook" not in text, f"{page}.html is not a lab but has the box"
            continue
        student = f"{Path(page).parent.as_posix()}/notebook_student.ipynb"
        assert (ROOT / student).is_file(), f"{student} is missing (run `make student`)"
        url = _colab_url(config, student)
        box = _STUDENT_BOX.search(text)
        assert box, f"{page}.html has no student-notebook box"
        assert f'href="{url}"' in box.group(1), f"the box of {page}.html does not open {url}"
        assert "notebook_solution.ipynb" in box.group(1) and student in box.group(1)
        assert box.start() < text.find('class="cell'), f"the box of {page}.html is not at the top"
        assert text.count(f'href="{url}"') == 2, f"{page}.html: the launch menu does not offer {url}"
