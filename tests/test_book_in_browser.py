"""The built book, rendered in a real headless browser at a desktop and a phone width.

Every page of the table of contents is opened in Chromium (``tests/browser.py``) at 1400 px and at
390 px (phone emulation), once MathJax has typeset it, and must have

- no horizontal overflow: the page does not scroll sideways, nothing sticks out of the main
  column or is cut by it (wide code scrolls inside its own box), and at the desktop width no
  code cell and no display equation needs a scrollbar at all;
- nothing cut inside a box, at either width: no equation, table, figure or image is wider than
  a box around it that hides or scrolls what does not fit (issue 28: at 390 px the long
  equations scrolled inside their box, cut after a few symbols, and the first check passed);
- no missing image (an ``<img>`` whose ``naturalWidth`` is 0);
- no math left as raw TeX (``$…$``, ``\\(…\\)``, ``\\[…\\]``) and no MathJax error.

The same book, served over HTTP from a sub-path (``/curso/2027/``, as GitHub Pages serves a
project site), must work there: every page loads, every request it makes stays under the sub-path
and is answered, every link that stays on the site names one of its files, and no page holds an
absolute local path (``file://``, the build's folders).

The book is the one the suite builds once (``built_book``). Chromium comes from the system
(CI: ``.ci/run`` installs Debian's ``chromium``).
"""

from __future__ import annotations

import functools
import importlib.util
import http.server
import re
import shutil
import sys
import tempfile
import threading
import urllib.parse
from pathlib import Path

import pytest
import yaml

from browser import INSTALL_HINT, Chromium, find_chromium
from test_book import _toc_files

ROOT = Path(__file__).resolve().parents[1]
WIDTHS = {"escritorio": (1400, 900, False), "móvil": (390, 844, True)}

# Runs in the page once it has loaded; returns the list of problems found (strings).
CHECK_PAGE = r"""
(async (desktop) => {
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
    await MathJax.startup.promise;
  }
  await Promise.all([...document.images].map(img => {
    if (img.complete) return null;
    img.loading = "eager";
    return new Promise(done => {
      img.addEventListener("load", done); img.addEventListener("error", done);
      setTimeout(done, 5000);
    });
  }));
  const problems = [];
  const describe = el => {
    let s = el.tagName.toLowerCase();
    if (el.id) s += "#" + el.id;
    if (typeof el.className === "string" && el.className.trim())
      s += "." + el.className.trim().split(/\s+/).slice(0, 2).join(".");
    const text = (el.textContent || "").replace(/\s+/g, " ").trim().slice(0, 70);
    return text ? `${s} «${text}»` : s;
  };

  const doc = document.documentElement;
  if (doc.scrollWidth > doc.clientWidth + 1)
    problems.push(`the page scrolls sideways: ${doc.scrollWidth} px of content in a ` +
                  `${doc.clientWidth} px window`);

  const column = document.querySelector("article.bd-article") || document.querySelector("main");
  const edge = column.getBoundingClientRect();
  const scrolls = el => ["auto", "scroll"].includes(getComputedStyle(el).overflowX);
  const reported = new Set();
  for (const el of column.querySelectorAll("*")) {
    if (el.closest("mjx-assistive-mml")) continue;  // MathJax's copy for screen readers: never shown
    const r = el.getBoundingClientRect();
    if (r.width === 0 || r.height === 0) continue;
    if (r.left >= edge.left - 1 && r.right <= edge.right + 1) continue;
    let up = el.parentElement, inBox = false, clipped = null;
    while (up && up !== column) {
      if (reported.has(up)) { inBox = true; break; }
      const ox = getComputedStyle(up).overflowX;
      if (ox === "auto" || ox === "scroll") { inBox = true; break; }
      if (ox === "hidden" || ox === "clip") { clipped = up; break; }
      up = up.parentElement;
    }
    if (inBox) continue;
    reported.add(el);
    const by = Math.round(Math.max(edge.left - r.left, r.right - edge.right));
    problems.push(clipped
      ? `${describe(el)} is cut by ${describe(clipped).split(" ")[0]}: ${by} px outside the column`
      : `${describe(el)} sticks out of the column by ${by} px`);
  }

  if (desktop) {
    for (const pre of column.querySelectorAll("div.cell_input pre, div.highlight pre")) {
      if (pre.scrollWidth > pre.clientWidth + 1) {
        const longest = pre.textContent.split("\n").reduce((a, b) => b.length > a.length ? b : a, "");
        problems.push(`code wider than the column (${pre.scrollWidth} px in ${pre.clientWidth} px): ` +
                      `«${longest.trim().slice(0, 80)}» (${longest.length} characters)`);
      }
    }
    // Each line of code is its own box (_ext/code_lines.py); a wrapped line continues under its
    // own text, past its indentation, never at the left margin.
    for (const pre of column.querySelectorAll("div.highlight pre")) {
      const lines = pre.querySelectorAll(".code-line");
      if (!lines.length && pre.textContent.trim()) {
        problems.push(`code not split into lines: «${pre.textContent.trim().slice(0, 60)}»`);
        continue;
      }
      for (const line of lines) {
        const range = document.createRange();
        range.selectNodeContents(line);
        const rects = [...range.getClientRects()].filter(r => r.width > 0);
        if (!rects.length) continue;
        const top = Math.min(...rects.map(r => r.top));
        const next = rects.filter(r => r.top > top + 2);
        if (!next.length) continue;
        const start = line.getBoundingClientRect().left + parseFloat(getComputedStyle(line).paddingLeft);
        const indent = line.textContent.length - line.textContent.trimStart().length;
        const probe = document.createElement("span");
        probe.textContent = "0".repeat(10);
        pre.appendChild(probe);
        const ch = probe.getBoundingClientRect().width / 10;
        probe.remove();
        const left = Math.min(...next.map(r => r.left));
        if (left < start - 1 || left < line.getBoundingClientRect().left + (indent + 1) * ch - 1)
          problems.push(`a wrapped line of code loses its indentation: «${line.textContent.trim().slice(0, 60)}»`);
      }
    }
    for (const eq of column.querySelectorAll('mjx-container[display="true"]')) {
      const inner = eq.firstElementChild;
      const width = inner ? inner.getBoundingClientRect().width : eq.scrollWidth;
      if (width > eq.getBoundingClientRect().width + 1) {
        const tex = (eq.closest(".math") || eq).getAttribute("id") || "";
        problems.push(`display equation wider than the column (${Math.round(width)} px in ` +
                      `${Math.round(eq.getBoundingClientRect().width)} px) ${tex}`);
      }
    }
  }

  // At every width, an equation, a table or a figure must be seen whole: none may be wider than
  // a box around it (itself included) that hides or scrolls what does not fit. Code may scroll.
  const shown = ox => ox === "visible";
  const seen = new Set();
  for (const el of column.querySelectorAll(
      'mjx-container[display="true"], div.math, table, figure, img, svg:not(mjx-container svg)')) {
    if (el.closest("pre, mjx-assistive-mml") || el.getBoundingClientRect().width === 0) continue;
    for (let box = el; box && box !== column; box = box.parentElement) {
      if (shown(getComputedStyle(box).overflowX) || box.scrollWidth <= box.clientWidth + 1) continue;
      if (seen.has(box)) break;
      seen.add(box);
      problems.push(`${describe(el)} does not fit: ${box.scrollWidth - box.clientWidth} px of ` +
                    `${box.scrollWidth} px hidden in ${describe(box).split(" ")[0]}`);
      break;
    }
  }

  for (const img of document.images)
    if (img.naturalWidth === 0) problems.push(`missing image: ${img.getAttribute("src")}`);

  for (const err of column.querySelectorAll("mjx-merror"))
    problems.push(`MathJax error: ${err.getAttribute("data-mjx-error") || err.textContent}`);
  const walker = document.createTreeWalker(column, NodeFilter.SHOW_TEXT, {
    acceptNode: node => node.parentElement.closest("pre, code, script, style, mjx-container, .MathJax")
      ? NodeFilter.FILTER_REJECT : NodeFilter.FILTER_ACCEPT});
  const raw = /\$[^$\s][^$]*\$|\\\(|\\\[|\\(frac|mathrm|text|cdot|times|le|ge)\b/;
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    const hit = node.textContent.match(raw);
    if (hit) problems.push(`math left as raw TeX: «${node.textContent.trim().slice(0, 80)}»`);
  }
  return problems;
})
"""


def rendering_problems(html: Path, pages: list[str], executable: str) -> dict[str, list[str]]:
    """Problems per "page @ width" (only pages with problems), all pages in one browser."""
    found: dict[str, list[str]] = {}
    with Chromium(executable) as browser:
        for label, (width, height, mobile) in WIDTHS.items():
            browser.set_viewport(width, height, mobile)
            for page in pages:
                browser.open((html / f"{page}.html").as_uri())
                problems = browser.evaluate(f"{CHECK_PAGE}({'true' if not mobile else 'false'})")
                if problems:
                    found[f"{page} @ {label} ({width} px)"] = problems
    return found


def _chromium() -> str:
    executable = find_chromium()
    if executable is None:
        pytest.fail(f"Chromium is not installed: this test renders the book in it. Install it with "
                    f"`{INSTALL_HINT}` (Debian/Ubuntu; .ci/run does it on CI).")
    return executable


def test_every_page_renders_without_overflow_missing_images_or_raw_math(built_book):
    executable = _chromium()
    assert built_book["returncode"] == 0, built_book["log"]
    pages = _toc_files(yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8")))
    found = rendering_problems(built_book["html"], pages, executable)
    report = "\n".join(f"{where}:\n  " + "\n  ".join(problems) for where, problems in found.items())
    assert not found, f"rendering problems in the built book:\n{report}"


# One page with one case of each problem, and one wide box that scrolls inside itself (allowed).
_BAD_PAGE = """<html><head><meta name="viewport" content="width=device-width"></head><body>
<article class="bd-article" style="max-width: 600px">
<p>Sin procesar: $x^2 + y$.</p>
<img src="no-existe.png">
<div id="ancho" style="width: 900px">ancho</div>
<div id="recorte" style="overflow: hidden"><div style="width: 900px">cortado</div></div>
<div style="overflow-x: auto"><div style="width: 900px">con su propia barra</div></div>
<div class="highlight"><pre style="overflow-x: auto">x = "{long}"</pre></div>
<div style="overflow-x: auto"><table id="tabla"><tr><td style="min-width: 900px">tabla ancha</td></tr></table></div>
</article></body></html>"""


@pytest.mark.slow
def test_the_checker_sees_each_kind_of_problem(tmp_path):
    (tmp_path / "mala.html").write_text(_BAD_PAGE.replace("{long}", "x" * 150), encoding="utf-8")
    found = rendering_problems(tmp_path, ["mala"], _chromium())
    desktop, phone = found["mala @ escritorio (1400 px)"], found["mala @ móvil (390 px)"]
    for problems in (desktop, phone):
        text = "\n".join(problems)
        assert "missing image: no-existe.png" in text
        assert "math left as raw TeX" in text and "$x^2 + y$" in text
        assert "div#ancho «ancho» sticks out of the column" in text
        assert "«cortado» is cut by div#recorte" in text
        assert "con su propia barra" not in text
        assert "table#tabla «tabla ancha» does not fit" in text
    assert any(p.startswith("code wider than the column") for p in desktop)
    assert not any(p.startswith("code wider than the column") for p in phone)
    assert any(p.startswith("code not split into lines") for p in desktop)


def test_a_wrapped_line_of_code_keeps_its_indentation(tmp_path):
    """The book's highlighter output, split by ``_ext/code_lines.py``, with the book's stylesheet:
    at 1400 px a long indented line wraps and continues four columns past its indentation, the
    checker finds nothing; the same code unsplit is reported; copying gives the source back."""
    spec = importlib.util.spec_from_file_location("code_lines", ROOT / "_ext" / "code_lines.py")
    code_lines = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(code_lines)
    from pygments import highlight
    from pygments.formatters import HtmlFormatter
    from pygments.lexers import PythonLexer

    source = ('def f(x):\n    """Una docstring\n    en dos líneas."""\n\n    if x:\n'
              '        return una_funcion(' + ", ".join(f"argumento_{i}" for i in range(14)) + ')\n'
              '    return 1\n')
    plain = highlight(source, PythonLexer(), HtmlFormatter())
    split = code_lines.split_code_lines(plain)
    css = (ROOT / "_ext" / "static" / "book.css").as_uri()
    no_hang = ".code-line { padding-left: 0 !important; text-indent: 0 !important }"
    for name, block, extra in (("partido", split, ""), ("entero", plain, ""),
                               ("sin-sangria", split, no_hang)):
        (tmp_path / f"{name}.html").write_text(
            f'<html><head><meta name="viewport" content="width=device-width">'
            f'<link rel="stylesheet" href="{css}"><style>pre {{ overflow-x: auto }} {extra}</style>'
            f'</head><body><article class="bd-article" style="max-width: 700px">{block}</article>'
            f'</body></html>',  # the theme's pre scrolls inside its box
            encoding="utf-8")
    found = rendering_problems(tmp_path, ["partido", "entero", "sin-sangria"], _chromium())
    assert "partido @ escritorio (1400 px)" not in found and "partido @ móvil (390 px)" not in found
    assert any(p.startswith("code not split into lines") for p in found["entero @ escritorio (1400 px)"])
    assert any(p.startswith("a wrapped line of code loses its indentation")
               for p in found["sin-sangria @ escritorio (1400 px)"])
    with Chromium(_chromium()) as browser:
        browser.set_viewport(1400, 900, False)
        browser.open((tmp_path / "partido.html").as_uri())
        copied, starts = browser.evaluate("""(() => {
          const pre = document.querySelector("pre");
          const line = [...pre.querySelectorAll(".code-line")].find(l => l.textContent.includes("una_funcion"));
          const range = document.createRange(); range.selectNodeContents(line);
          const lefts = [...range.getClientRects()].filter(r => r.width > 0).map(r => [r.top, r.left]);
          const first = Math.min(...lefts.map(x => x[0]));
          const ch = parseFloat(getComputedStyle(line).paddingLeft) / 12;
          return [pre.cloneNode(true).innerText,
                  [lefts.filter(x => x[0] > first + 2).map(x => x[1]), line.getBoundingClientRect().left, ch]];
        })()""")
    assert copied == source
    wrapped, left, ch = starts
    assert wrapped, "the long line should wrap at 700 px"
    assert min(wrapped) == pytest.approx(left + 12 * ch, abs=1)  # 8 spaces of indentation + 4


# --- the book served from a sub-path, as GitHub Pages serves it (https://OWNER.github.io/REPO/) ---
SUB_PATH = "/curso/2027/"

# Runs in a loaded page: waits for MathJax and the images, then lists every URL the page links
# or loads from (links, stylesheets, scripts, images, frames).
PAGE_URLS = r"""
(async () => {
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) await MathJax.startup.promise;
  await Promise.all([...document.images].map(img => img.complete ? null : new Promise(done => {
    img.addEventListener("load", done); img.addEventListener("error", done);
    setTimeout(done, 5000);
  })));
  return [...document.querySelectorAll("a[href], link[href], script[src], img[src], iframe[src], source[src]")]
    .map(el => el.href || el.src).filter(Boolean);
})()
"""


_REFRESH = re.compile(r'<meta http-equiv="Refresh" content="0; url=([^"]+)"', re.IGNORECASE)


class _Recorder(http.server.SimpleHTTPRequestHandler):
    """Serves the site folder; records (path, status) of every request it answers."""

    requests: list[tuple[str, int]] = []

    def log_request(self, code="-", size="-") -> None:
        self.requests.append((self.path, int(code) if str(code).isdigit() else 0))

    def log_message(self, *args) -> None:  # quiet
        pass


def local_paths(html: Path, also: tuple[str, ...]) -> dict[str, list[str]]:
    """Per page, the absolute local paths its HTML holds (``file://``, ``/work/`` and ``also``)."""
    needles = ("file://", "/work/") + also
    found = {}
    for page in sorted(html.rglob("*.html")):
        text = page.read_text(encoding="utf-8", errors="replace")
        hits = sorted({n for n in needles if n in text})
        if hits:
            found[page.relative_to(html).as_posix()] = hits
    return found


def sub_path_problems(html: Path, executable: str) -> list[str]:
    """Serve ``html`` at ``http://127.0.0.1:PORT/curso/2027/`` and open every page in Chromium:
    every request the pages make must stay under the sub-path and be answered, and every link
    that stays on the site must name a file of the site."""
    site = Path(tempfile.mkdtemp(prefix="sitio-"))
    (site / SUB_PATH.strip("/")).parent.mkdir(parents=True)
    (site / SUB_PATH.strip("/")).symlink_to(html.resolve(), target_is_directory=True)
    handler = functools.partial(_Recorder, directory=str(site))
    _Recorder.requests = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{server.server_address[1]}{SUB_PATH}"
    pages = [p.relative_to(html).as_posix() for p in sorted(html.rglob("*.html"))
             if not p.relative_to(html).parts[0].startswith("_")]
    problems = []

    def check_url(page: str, url: str) -> None:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme == "file":
            problems.append(f"{page}: enlace a un archivo local: {url}")
        if parsed.netloc != urllib.parse.urlsplit(base).netloc:
            return
        if not parsed.path.startswith(SUB_PATH):
            problems.append(f"{page}: enlace fuera de {SUB_PATH}: {parsed.path}")
            return
        target = html / urllib.parse.unquote(parsed.path[len(SUB_PATH):])
        if target.is_dir():
            target = target / "index.html"
        if not target.is_file():
            problems.append(f"{page}: enlace a un archivo que no existe: {parsed.path}")

    try:
        with Chromium(executable) as browser:
            for page in pages:
                redirect = _REFRESH.search((html / page).read_text(encoding="utf-8"))
                if redirect:  # a bare redirect (Jupyter Book's index.html): its target is a page
                    check_url(page, urllib.parse.urljoin(base + page, redirect[1]))
                    continue
                browser.open(base + page)
                for url in browser.evaluate(PAGE_URLS):
                    check_url(page, url)
    finally:
        server.shutdown()
        server.server_close()
        shutil.rmtree(site)
    for path, status in _Recorder.requests:
        if not path.startswith(SUB_PATH):
            problems.append(f"petición fuera de {SUB_PATH}: {path} ({status})")
        elif status >= 400:
            problems.append(f"petición sin respuesta: {path} ({status})")
    assert len({p for p, _ in _Recorder.requests}) > len(pages), "the pages loaded nothing"
    return problems


def test_the_book_works_served_from_a_sub_path(built_book):
    executable = _chromium()
    assert built_book["returncode"] == 0, built_book["log"]
    html = built_book["html"]
    leaks = local_paths(html, (str(ROOT), str(built_book["out"]), sys.prefix))
    assert not leaks, f"absolute local paths in the built HTML: {leaks}"
    problems = sub_path_problems(html, executable)
    assert not problems, "the book served from a sub-path:\n" + "\n".join(problems[:40])


_SITE_PAGE = """<html><head><link rel="stylesheet" href="file:///work/estilo.css">
<link rel="icon" href="data:,"></head><body>
<a href="otra.html">bien</a> <a href="/raiz.html">fuera</a> <a href="no-existe.html">roto</a>
<img src="falta.png"> <img src="/imagen.png"></body></html>"""


@pytest.mark.slow
def test_the_sub_path_checker_sees_each_kind_of_problem(tmp_path):
    html = tmp_path / "html"
    html.mkdir()
    (html / "index.html").write_text(_SITE_PAGE, encoding="utf-8")
    (html / "otra.html").write_text('<html><head><link rel="icon" href="data:,"></head><body>otra'
                                    "</body></html>", encoding="utf-8")
    (html / "salto.html").write_text('<meta http-equiv="Refresh" content="0; url=/fuera.html" />',
                                     encoding="utf-8")
    assert local_paths(html, ()) == {"index.html": ["/work/", "file://"]}
    text = "\n".join(sub_path_problems(html, _chromium()))
    assert "index.html: enlace a un archivo local: file:///work/estilo.css" in text
    assert "index.html: enlace fuera de /curso/2027/: /raiz.html" in text
    assert "enlace a un archivo que no existe: /curso/2027/no-existe.html" in text
    assert "petición sin respuesta: /curso/2027/falta.png (404)" in text
    assert "petición fuera de /curso/2027/: /imagen.png (404)" in text
    assert "salto.html: enlace fuera de /curso/2027/: /fuera.html" in text
    assert "otra.html" not in text.replace("index.html", "")


@pytest.mark.slow
def test_a_verdict_and_its_decision_table_fit_a_phone(tmp_path):
    """The formatter's output (``claims``: a sentence with its number in bold, the quiet
    "Cómo se decidió" table) with the book's stylesheet: nothing overflows, is cut or scrolls,
    at 1400 px or at 390 px (on a phone the table's rows become blocks)."""
    from ai_evolution import claims

    c = claims.compare([2.0, 2.1, 2.2, 2.0, 2.1], [1.0, 1.1, 1.0, 1.0, 1.05],
                       what="TTFT medio del prompt largo con 16 tokens por paso / con 512 tokens por paso",
                       higher="con pasos pequeños el prompt largo tarda más en dar su primer token",
                       lower="con pasos pequeños el prompt largo da antes su primer token")
    g = claims.growth([1, 2, 3, 4], [1, 4, 9, 16], what="memoria pico de la atención ingenua frente a N")
    css = (ROOT / "_ext" / "static" / "book.css").as_uri()
    page = (f'<html><head><meta name="viewport" content="width=device-width">'
            f'<link rel="stylesheet" href="{css}"></head><body>'
            f'<article class="bd-article" style="max-width: 700px"><p>Texto. {c.pasted().html}</p>'
            f'{claims.paste_table([c, g]).html}</article></body></html>')
    (tmp_path / "veredicto.html").write_text(page, encoding="utf-8")
    assert rendering_problems(tmp_path, ["veredicto"], _chromium()) == {}


# --- interactive figures (ai_evolution.plots.interactive) -------------------------------------

# Drives every explorer of the open page: for a sample of its states (every one up to 60), sets
# its controls as a reader does and reads back the readouts; returns the problems found.
DRIVE_EXPLORERS = r"""
(async () => {
  const problems = [];
  const roots = [...document.querySelectorAll(".ae-explorer")];
  for (const root of roots) {
    const spec = JSON.parse(root.querySelector("script.ae-data").textContent);
    const controls = [...root.querySelectorAll("[data-ae-control]")];
    if (!root.querySelector(".ae-plot svg.main-svg"))
      problems.push(`${root.id}: no plot drawn (is plotly.min.js loaded?)`);
    const keys = Object.keys(spec.states);
    const step = Math.max(1, Math.floor(keys.length / 60));
    for (let k = 0; k < keys.length; k += step) {
      const key = keys[k], values = key.split(",");
      values.forEach((v, i) => {
        controls[i].value = v;
        controls[i].dispatchEvent(new Event("input", {bubbles: true}));
      });
      const shown = [...root.querySelectorAll("table.ae-readouts td")].map(td => td.textContent);
      if (JSON.stringify(shown) !== JSON.stringify(spec.states[key].readouts))
        problems.push(`${root.id} at ${key}: readouts ${JSON.stringify(shown)}, data ` +
                      JSON.stringify(spec.states[key].readouts));
    }
  }
  return {count: roots.length, problems};
})()
"""


def explorer_problems(html: Path, executable: str) -> tuple[int, list[str]]:
    """Every page with an interactive figure, opened from ``file://`` at both widths: the page
    loads plotly.min.js from the book itself, each figure is drawn, its controls move its
    readouts to the values its executed data hold, and no request leaves the build folder.
    Returns (figures driven, problems)."""
    pages = [p for p in sorted(html.rglob("*.html")) if 'class="ae-explorer"' in
             p.read_text(encoding="utf-8", errors="replace")]
    count, problems = 0, []
    root = html.resolve().as_uri() + "/"
    with Chromium(executable) as browser:
        browser.watch_network()
        for label, (width, height, mobile) in WIDTHS.items():
            browser.set_viewport(width, height, mobile)
            for page in pages:
                browser.open(page.resolve().as_uri())
                seen = browser.evaluate(DRIVE_EXPLORERS)
                count += seen["count"]
                where = f"{page.relative_to(html).as_posix()} @ {label}"
                problems += [f"{where}: {p}" for p in seen["problems"]]
                problems += [f"{where}: request outside the book: {u}"
                             for u in browser.requested_urls()
                             if not u.startswith((root, "data:", "about:"))]
    return count, problems


def test_every_interactive_figure_works_offline(built_book):
    html = built_book["html"]
    count, problems = explorer_problems(html, _chromium())
    assert count >= 2 * 4, f"expected the interactive figures of chapters 1, 2 and 6 ({count} seen)"
    assert problems == [], "\n".join(problems)
