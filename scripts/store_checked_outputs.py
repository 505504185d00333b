"""Store the outputs nbval checks in each lab's committed paired notebook.

The cells of ``labs/NN-name/notebook_solution.md`` tagged ``nbval-check-output`` print what a
run of the lab must reproduce exactly (self-check verdicts, arithmetic on datasheet figures).
``make test`` compares the book build's execution of each lab with the outputs stored in the
committed ``notebook_solution.ipynb`` (nbval's comparison, ``tests/nbval_replay.py``), so the
lab runs once. After an intended change of a checked output, refresh the stored ones from a
fresh build:

    make book && make outputs        # = python scripts/store_checked_outputs.py [--build _build]

Only the checked cells get outputs (and an execution count, which nbval needs to compare a
cell); every other cell of the paired notebook stays empty.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
CHECK_TAG = "nbval-check-output"


def checked(cell) -> bool:
    return cell.cell_type == "code" and CHECK_TAG in cell.metadata.get("tags", [])


def store(paired: nbformat.NotebookNode, executed: nbformat.NotebookNode) -> list[str]:
    """Copy the executed outputs of ``paired``'s checked cells into it (in place); clear every
    other cell. Returns the sources of checked cells the execution does not have."""
    pool = [c for c in executed.cells if c.cell_type == "code"]
    missing = []
    for cell in paired.cells:
        if cell.cell_type != "code":
            continue
        cell.outputs, cell.execution_count = [], None
        if not checked(cell):
            continue
        match = next((c for c in pool if c.source == cell.source), None)
        if match is None:
            missing.append(cell.source)
            continue
        pool.remove(match)
        cell.outputs = [out for out in match.outputs if out.get("output_type") != "error"]
        cell.execution_count = match.execution_count or 1
    return missing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build", type=Path, default=ROOT / "_build",
                        help="the book build folder (holding jupyter_execute/)")
    args = parser.parse_args(argv)
    problems = []
    for paired_path in sorted((ROOT / "labs").glob("*/notebook_solution.ipynb")):
        rel = paired_path.relative_to(ROOT)
        executed_path = args.build / "jupyter_execute" / rel
        if not executed_path.is_file():
            problems.append(f"{rel}: the build has no execution of it ({executed_path}); "
                            f"run `make book` first")
            continue
        paired = nbformat.read(paired_path, as_version=4)
        missing = store(paired, nbformat.read(executed_path, as_version=4))
        problems += [f"{rel}: the build did not execute the checked cell {src[:60]!r}"
                     for src in missing]
        nbformat.write(paired, paired_path)
        print(f"stored {sum(map(checked, paired.cells))} checked outputs in {rel}")
    for line in problems:
        print(line, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
