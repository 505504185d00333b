"""Generate each lab's student notebook from its solution, and keep the Colab install cell in sync.

The solution (``labs/NN-name/notebook_solution.md``, a MyST text notebook paired with
``notebook_solution.ipynb``) is the single source. In it, the code between the markers

    # BEGIN SOLUTION
    # PISTA: one line of Spanish hint
    ...reference code...
    # END SOLUTION

is replaced in the student notebook by ``raise NotImplementedError("<hint>")`` at the same
indentation; cells holding such a region are tagged ``exercise``. Outputs are cleared and the
jupytext pairing is dropped, so the student notebook is a plain .ipynb.

The Colab install cell (the line holding ``INSTALL_MARKER``) gets ``git+URL@VERSION`` from
``_config.yml`` (``repository.url`` and ``repository.version``, read and checked by
``_ext/course.py``), in the solution source and in the student notebook alike; a bad value stops
the script with a Spanish message. The paired ``notebook_solution.ipynb`` follows the source
(``make sync``, which ``make student`` runs after this script).

    python scripts/make_student.py            # write every lab's student notebook
    python scripts/make_student.py --check    # exit 1 if a committed notebook is out of date
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import jupytext
import nbformat

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "_ext"))
from course import CourseSettingError, read_course  # noqa: E402

BEGIN, END, HINT = "# BEGIN SOLUTION", "# END SOLUTION", "# PISTA:"
INSTALL_MARKER = "# colab-install"
# How the book shows a cell (myst-nb); the student notebook shows every cell whole.
BOOK_ONLY_TAGS = ("remove-cell", "remove-input", "hide-input")
_INSTALL_LINE = re.compile(r'^(\s*%pip install -q ")git\+[^"]*(" *' + re.escape(INSTALL_MARKER) + r")\s*$",
                           re.M)


class SolutionMarkupError(ValueError):
    pass


def repository_url(root: Path = ROOT) -> str:
    return read_course(root).repository_url


def install_requirement(root: Path = ROOT) -> str:
    """``URL@VERSION`` of ``_config.yml``: what the install line installs (after ``git+``)."""
    course = read_course(root)
    return f"{course.repository_url}@{course.version}"


def install_source(source: str, url: str) -> str:
    """Point the Colab install line at ``url`` (a repository URL, ``@VERSION`` included)."""
    return _INSTALL_LINE.sub(lambda m: f"{m.group(1)}git+{url}{m.group(2)}", source)


def strip_solution(source: str, where: str) -> tuple[str, bool]:
    """Replace every solution region of one cell's source by a NotImplementedError stub."""
    out, lines, i, found = [], source.split("\n"), 0, False
    while i < len(lines):
        line = lines[i]
        if line.strip() != BEGIN:
            if line.strip() == END:
                raise SolutionMarkupError(f"{where}: '{END}' without '{BEGIN}'")
            out.append(line)
            i += 1
            continue
        indent = line[: len(line) - len(line.lstrip())]
        try:
            end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == END)
        except StopIteration:
            raise SolutionMarkupError(f"{where}: '{BEGIN}' without '{END}'") from None
        hints = [ln.strip()[len(HINT):].strip() for ln in lines[i + 1 : end]
                 if ln.strip().startswith(HINT)]
        if not hints:
            raise SolutionMarkupError(f"{where}: solution region without a '{HINT}' line")
        message = " ".join(hints).replace('"', '\\"')
        out.append(f'{indent}raise NotImplementedError("Ejercicio sin resolver. {message}")')
        found, i = True, end + 1
    return "\n".join(out), found


def show_solution(source: str, where: str) -> str:
    """One cell's source as the solved page shows it: the solution code without its markup
    (the ``BEGIN``/``END`` marker lines and the ``PISTA`` hint lines, which are for the student
    notebook). Malformed markup raises as in :func:`strip_solution`."""
    strip_solution(source, where)  # the same checks
    out, inside = [], False
    for line in source.split("\n"):
        text = line.strip()
        if text in (BEGIN, END):
            inside = text == BEGIN
            continue
        if inside and text.startswith(HINT):
            continue
        out.append(line)
    return "\n".join(out)


def make_student(solution_md: Path, url: str) -> nbformat.NotebookNode:
    nb = jupytext.read(solution_md)
    nb.nbformat, nb.nbformat_minor = 4, 5
    for n, cell in enumerate(nb.cells):
        cell["id"] = f"cell-{n:03d}"  # stable ids: the committed file must be reproducible
        if cell.cell_type != "code":
            continue
        cell.source = install_source(cell.source, url)
        cell.source, found = strip_solution(cell.source, f"{solution_md}, cell {n + 1}")
        tags = [t for t in cell.metadata.get("tags", []) if t not in BOOK_ONLY_TAGS]
        if found and "exercise" not in tags:
            tags.append("exercise")
        if tags:
            cell.metadata["tags"] = tags
        else:
            cell.metadata.pop("tags", None)
        cell.outputs, cell.execution_count = [], None
    nb.metadata.pop("jupytext", None)
    nbformat.validate(nb)
    return nb


def sync_solution_install(solution_md: Path, url: str) -> bool:
    """Rewrite the install line of the solution source itself; True if it changed."""
    text = solution_md.read_text(encoding="utf-8")
    new = install_source(text, url)
    if new != text:
        solution_md.write_text(new, encoding="utf-8")
    return new != text


def sync_pairs(solutions: list[Path]) -> None:
    """Carry the sources' changes into their paired .ipynb (what Colab opens as the solved
    notebook), as `make sync` does: jupytext keeps the pair's cell ids and outputs."""
    paired = [str(md) for md in solutions if md.with_suffix(".ipynb").exists()]
    if paired:
        subprocess.run([sys.executable, "-m", "jupytext", "--quiet", "--to", "ipynb", "--update",
                        *paired], check=True)


def student_path(solution_md: Path) -> Path:
    return solution_md.with_name("notebook_student.ipynb")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="do not write; exit 1 if a student notebook or install URL is stale")
    parser.add_argument("labs", nargs="*", type=Path, help="solution .md files (default: all labs)")
    parser.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    root = args.root.resolve()
    try:
        url = install_requirement(root)
    except CourseSettingError as err:
        print(f"make student: {err}", file=sys.stderr)
        return 2
    sources = [p.resolve() for p in args.labs] or sorted((root / "labs").glob("*/notebook_solution.md"))
    stale, changed = [], []
    for md in sources:
        if args.check:
            if install_source(md.read_text(encoding="utf-8"), url) != md.read_text(encoding="utf-8"):
                stale.append(f"{md}: the Colab install line is not git+{url} (_config.yml)")
        elif sync_solution_install(md, url):
            changed.append(md)
        expected = nbformat.writes(make_student(md, url)) + "\n"
        target = student_path(md)
        current = target.read_text(encoding="utf-8") if target.exists() else None
        if current != expected:
            if args.check:
                stale.append(f"{target} is out of date: run `make student`")
            else:
                target.write_text(expected, encoding="utf-8")
                print(f"wrote {target.relative_to(root)}")
    sync_pairs(changed)
    for line in stale:
        print(line, file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
