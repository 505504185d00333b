"""The grader with and without its checker zygote, side by side: CPU seconds of the whole machine
and wall seconds to grade the same folder.

    python benchmarks/grading_zygote.py [--submissions 4] [--pairs 2]

The folder holds ``--submissions`` copies of the honest lab-2 notebook the grading tests build
(its solved exercises and a synthetic contract: no lab experiment, so the cost is the grader's
own: kernel, checker, function worker). Each pair grades it once with the zygote
(``ai_evolution/grading/zygote.py``) and once with fresh checker processes, in an order that
alternates from pair to pair, each run in a process of its own with ``--jobs 1``. CPU is read
from ``/proc/stat`` (the machine's busy time, so the jailed processes count too): run it on an
otherwise idle machine. Prints each run and the ratio (without / with) of each pair.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the honest notebook of the grading tests

GRADE = """
import contextlib, sys
import ai_evolution.grading.zygote as zygote
if sys.argv[1] == "fresh":
    zygote.checker_zygote = contextlib.nullcontext
from ai_evolution.grading import grade_folder
grades = grade_folder("kv_cache", sys.argv[2], sys.argv[3], jobs=1)
assert all(g.status == "ok" and g.total == g.max_total for g in grades), grades
"""


def busy_s() -> float:
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / 100  # all but idle and iowait, in USER_HZ


def run(mode: str, folder: Path, out: Path) -> tuple[float, float]:
    cpu, wall = busy_s(), time.monotonic()
    subprocess.run([sys.executable, "-c", GRADE, mode, str(folder), str(out)], check=True,
                   cwd=ROOT)
    return busy_s() - cpu, time.monotonic() - wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--submissions", type=int, default=4)
    parser.add_argument("--pairs", type=int, default=2)
    args = parser.parse_args()
    import nbformat
    from test_grading_adversarial import honest

    base = Path(tempfile.mkdtemp(prefix="zygote-bench-"))
    folder = base / "entregas"
    folder.mkdir()
    for i in range(args.submissions):
        nbformat.write(honest(), folder / f"honesta_{i}.ipynb")
    for pair in range(args.pairs):
        order = ("zygote", "fresh") if pair % 2 == 0 else ("fresh", "zygote")
        got = {mode: run(mode, folder, base / f"{mode}{pair}") for mode in order}
        for mode in order:
            cpu, wall = got[mode]
            print(f"pair {pair + 1} {mode:>6}: {cpu:6.1f} s CPU, {wall:6.1f} s wall "
                  f"({args.submissions} submissions)")
        print(f"pair {pair + 1}: fresh / zygote = {got['fresh'][0] / got['zygote'][0]:.2f} CPU, "
              f"{got['fresh'][1] / got['zygote'][1]:.2f} wall")


if __name__ == "__main__":
    main()
