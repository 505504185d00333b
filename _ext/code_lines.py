"""Each line of highlighted code in its own box, so a wrapped line keeps its indentation.

From tablet width up the book wraps long lines of code and printed output inside the column
(``book.css``). Wrapped as one block of text, the continuation of an indented line starts at the
left margin and the reader loses the structure of the code. This extension splits the HTML that
Pygments returns into one ``span.code-line`` per source line, with the line's indentation plus a
hanging indent in a CSS variable (``--hang``), so a continuation starts under the line's own text,
four columns in. The line feeds stay in the document, each in a ``span.code-nl`` that is not
displayed: copying a cell (sphinx-copybutton reads the text of a detached clone) gives exactly the
source. Spans that Pygments opens on one line and closes on another (docstrings, multi-line
strings) are closed at the end of each line and reopened on the next.
"""

from __future__ import annotations

import html
import re

_PRE = re.compile(r"(<pre[^>]*>)(.*?)(</pre>)", re.S)
_TOKEN = re.compile(r"(<[^>]+>)|([^<]+)")
HANG_COLUMNS = 4  # how far a wrapped continuation is indented past the line's own indentation


def _name(tag: str) -> str:
    return re.match(r"<\s*([A-Za-z0-9]+)", tag).group(1)


def _line(parts: list[str]) -> str:
    text = html.unescape(re.sub(r"<[^>]+>", "", "".join(parts)))
    indent = len(text) - len(text.lstrip(" "))
    return f'<span class="code-line" style="--hang:{indent + HANG_COLUMNS}ch">{"".join(parts)}</span>'


def split_lines(pre_body: str) -> str:
    """The inside of a ``<pre>`` with every line wrapped in its own ``span.code-line``."""
    lines: list[str] = []
    current: list[str] = []
    open_tags: list[str] = []
    for tag, text in _TOKEN.findall(pre_body):
        if tag:
            current.append(tag)
            if tag.startswith("</"):
                if open_tags:
                    open_tags.pop()
            elif not tag.endswith("/>"):
                open_tags.append(tag)
            continue
        pieces = text.split("\n")
        for k, piece in enumerate(pieces):
            if k:  # a line feed: close what is open, end the line, reopen on the next one
                current.extend(f"</{_name(t)}>" for t in reversed(open_tags))
                lines.append(_line(current))
                current = list(open_tags)
            if piece:
                current.append(piece)
    newline = '<span class="code-nl">\n</span>'
    body = "".join(line + newline for line in lines)
    if any(not p.startswith("<") for p in current):  # text after the last line feed
        return body + _line(current)
    return body + "".join(current)


def split_code_lines(highlighted: str) -> str:
    """Pygments' HTML for a block, each ``<pre>`` split into line boxes."""
    return _PRE.sub(lambda m: m.group(1) + split_lines(m.group(2)) + m.group(3), highlighted)


def _wrap_highlighter(app) -> None:
    highlighter = getattr(app.builder, "highlighter", None)
    if highlighter is None or getattr(highlighter, "_code_lines", False):
        return
    original = highlighter.highlight_block

    def highlight_block(*args, **kwargs):
        return split_code_lines(original(*args, **kwargs))

    highlighter.highlight_block = highlight_block
    highlighter._code_lines = True


def setup(app):
    app.connect("builder-inited", _wrap_highlighter)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
