"""Reading the submissions folder without letting one file stop the grading of the others.

Every entry of the folder whose name ends in ``.ipynb`` is a submission, whatever bytes its
name holds:

- its **student id** (:func:`student_ids`) is made of letters, digits, ``.``, ``_`` and ``-``,
  at most ``MAX_ID`` characters, and unique also where file names ignore case (the feedback
  file ``<id>.md`` of one student never replaces another's);
- its **name as shown** (:func:`shown_name`) is the file name decoded as UTF-8 with replacement
  characters, control characters (newlines included) replaced, and bounded;
- its **bytes** are read only from a regular file, opened without following a symbolic link
  (:func:`read_submission`); a link, a folder, a FIFO, a device or a file over
  ``MAX_NOTEBOOK_BYTES`` is refused with the reason, and nothing is executed;
- its **code** is parsed once here (:func:`parse_problem`): a cell Python cannot parse within
  its recursion limit, or nested deeper than ``MAX_AST_DEPTH``, is refused before any process
  runs it, so no walk over the syntax tree in the grader (``rebuild``, ``score``) can blow up.
"""

from __future__ import annotations

import ast
import os
import re
import stat
import unicodedata
from dataclasses import dataclass
from pathlib import Path

MAX_ID = 64
MAX_SHOWN = 120
MAX_NOTEBOOK_BYTES = 64 * 2**20
# Nesting of a cell's syntax tree. Real code stays under ~30 levels; the grader's own walks
# (ast.unparse, NodeVisitor) use a few Python frames per level, so 200 keeps them well inside
# the default recursion limit (1000).
MAX_AST_DEPTH = 200


@dataclass
class Submission:
    student_id: str
    path: Path      # as the OS names it (undecodable bytes kept as surrogate escapes)
    shown: str      # the name as feedback and logs show it


class Refused(Exception):
    """A submission the grader does not run; the message (Spanish) is its reason."""


def shown_name(name: str | bytes) -> str:
    """A file name as text a report can show: UTF-8 with replacement characters for other
    bytes, every control or format character (newline, tab, bidi overrides...) as ``�``, at
    most ``MAX_SHOWN`` characters."""
    raw = name if isinstance(name, bytes) else os.fsencode(name)
    text = raw.decode("utf-8", errors="replace")
    text = "".join("\ufffd" if unicodedata.category(ch)[0] == "C" or
                   unicodedata.category(ch) in ("Zl", "Zp") else ch for ch in text)
    return text if len(text) <= MAX_SHOWN else text[: MAX_SHOWN - 1] + "…"


def _clean_id(name: str) -> str:
    stem = name[:-len(".ipynb")] if name.lower().endswith(".ipynb") else name
    stem = stem.encode("utf-8", errors="surrogateescape").decode("utf-8", errors="replace")
    base = re.sub(r"[^\w.-]+", "_", stem).strip("._-") or "entrega"
    return base[: MAX_ID - 5].rstrip("._-") or "entrega"  # room for "-9999"


def student_ids(paths: list[Path]) -> list[tuple[str, Path]]:
    """(student id, path) for each submission, in file-name order: the file name without
    extension, every run of characters other than letters, digits, ``.``, ``_`` and ``-``
    replaced by ``_``, cut to ``MAX_ID - 5`` characters; an id already taken (ignoring case)
    gets ``-2``, ``-3``..."""
    out, used = [], set()
    for path in sorted(paths, key=lambda p: os.fsencode(p.name)):
        base = _clean_id(path.name)
        sid, n = base, 1
        while sid.casefold() in used:
            n += 1
            sid = f"{base}-{n}"
        used.add(sid.casefold())
        out.append((sid, path))
    return out


def list_submissions(folder: Path) -> list[Submission]:
    """Every entry of ``folder`` named ``*.ipynb`` (not hidden), files or not: what is not a
    regular file is refused later, with its row in the gradebook."""
    names = [entry for entry in os.listdir(os.fsencode(folder))
             if entry.endswith(b".ipynb") and not entry.startswith(b".")]
    paths = [Path(folder) / os.fsdecode(name) for name in names]
    return [Submission(sid, path, shown_name(path.name)) for sid, path in student_ids(paths)]


def read_submission(path: Path) -> bytes:
    """The bytes of a regular file, opened without following a symbolic link and without
    blocking on a FIFO; :class:`Refused` otherwise."""
    try:
        st = os.lstat(path)
    except OSError as err:
        raise Refused(f"no se pudo leer el archivo ({err.strerror}).") from None
    if stat.S_ISLNK(st.st_mode):
        raise Refused("es un enlace simbólico; solo se corrigen archivos normales.")
    if not stat.S_ISREG(st.st_mode):
        kind = "una carpeta" if stat.S_ISDIR(st.st_mode) else \
            "una tubería (FIFO)" if stat.S_ISFIFO(st.st_mode) else \
            "un dispositivo o un socket"
        raise Refused(f"no es un archivo normal (es {kind}); solo se corrigen archivos normales.")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as err:
        raise Refused(f"no se pudo abrir el archivo ({err.strerror}).") from None
    try:
        st = os.fstat(fd)  # the file opened, not the name looked at before
        if not stat.S_ISREG(st.st_mode):
            raise Refused("no es un archivo normal; solo se corrigen archivos normales.")
        if st.st_size > MAX_NOTEBOOK_BYTES:
            raise Refused(f"ocupa {st.st_size / 2**20:.0f} MiB, más de los "
                          f"{MAX_NOTEBOOK_BYTES // 2**20} MiB que admite el corrector.")
        chunks, size = [], 0
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
            size += len(chunk)
            if size > MAX_NOTEBOOK_BYTES:
                raise Refused(f"ocupa más de los {MAX_NOTEBOOK_BYTES // 2**20} MiB que admite "
                              "el corrector.")
        return b"".join(chunks)
    finally:
        os.close(fd)


def tree_depth(tree: ast.AST) -> int:
    """The nesting depth of a syntax tree, walked without recursion."""
    deepest, stack = 0, [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))
    return deepest


def parse_problem(nb) -> str | None:
    """Why the grader must not analyse this notebook's code (Spanish), or None. A cell that is
    simply not valid Python is not a problem here: it fails in the kernel like any error."""
    from .rebuild import code_cells, python_source

    for n, cell in code_cells(nb):
        try:
            tree = ast.parse(python_source(str(cell.source)))
        except SyntaxError:
            continue
        except (RecursionError, MemoryError, ValueError, OverflowError) as err:
            return (f"la celda de código {n} no se puede analizar ({type(err).__name__}: "
                    "una expresión anidada demasiado profunda o demasiado larga); el corrector "
                    "no la ejecuta.")
        if (depth := tree_depth(tree)) > MAX_AST_DEPTH:
            return (f"la celda de código {n} anida {depth} niveles de sintaxis (el corrector "
                    f"admite {MAX_AST_DEPTH}); por ejemplo, una suma de cientos de términos en "
                    "una sola expresión. Escríbala con un bucle o sum().")
    return None
