"""Execute the book's notebook pages in parallel into the build's execution cache.

`jupyter-book build` (myst-nb, ``execute_notebooks: cache``) executes each notebook page when
Sphinx reads it, one page at a time, while the second core waits. This script fills the same
jupyter-cache first, ``--jobs`` pages at a time (one torch thread each, longest first), so the
build that follows finds every page cached and executes nothing twice: each page still runs
exactly once per build. A page that fails is not cached; the script says which and exits 1 (the
build would re-execute it and fail with myst-nb's message).

It writes ``<out>/_build/execution_times.json``: the wall time and the kernel's CPU time of every
page it executed, the CPU seconds the rest of the machine spent meanwhile, the lab kind of each
lab page, the total wall time and this machine's calibration (:func:`calibrate`: a fixed
workload's CPU seconds against the reference machine's).
`tests/test_book.py` holds each lab's CPU time to its ``ci`` budget scaled by that calibration:
wall time on a shared machine depends on what else runs, CPU time much less, and CPU time on a
slow core grows for the lab and the calibration alike.

Under `make test` (``AI_EVOLUTION_CPU_SLOTS`` set by tests/conftest.py) each page, and the
calibration, first takes a core from the suite's pool (`scripts/cpu_slots.py`), ahead of the
other worker's next test: two pages run at once only while nothing else holds a core.

    python scripts/execute_book.py [--path-output OUT] [--jobs 2]
    python scripts/execute_book.py --calibrate 5     # the calibration workload alone
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import yaml

from cpu_slots import hold_from_env  # beside this script (sys.path[0] when run as one)

ROOT = Path(__file__).resolve().parents[1]
TIMES_FILE = "execution_times.json"


def toc_files(node) -> list[str]:
    """Every ``root:`` and ``file:`` entry of a parsed ``_toc.yml``, in book order."""
    found: list[str] = []
    if isinstance(node, dict):
        for key in ("root", "file"):
            if isinstance(node.get(key), str):
                found.append(node[key])
        for value in node.values():
            if isinstance(value, (list, dict)):
                found.extend(toc_files(value))
    elif isinstance(node, list):
        for item in node:
            found.extend(toc_files(item))
    return found


def toc_documents(root: Path = ROOT) -> list[str]:
    """Every document of the book (``_toc.yml``), without extension, root first."""
    return toc_files(yaml.safe_load((root / "_toc.yml").read_text(encoding="utf-8")))


def _md_config(root: Path):
    from myst_parser.config.main import MdParserConfig

    config = yaml.safe_load((root / "_config.yml").read_text(encoding="utf-8"))
    extensions = config.get("parse", {}).get("myst_enable_extensions", [])
    return MdParserConfig(enable_extensions=set(extensions))


def notebook_pages(root: Path = ROOT) -> list[tuple[Path, object]]:
    """The pages myst-nb executes (MyST text notebooks with code cells), read the way the build
    reads them, so that their cache keys match."""
    from myst_nb.core.read import is_myst_markdown_notebook, read_myst_markdown_notebook

    md_config = _md_config(root)
    pages = []
    for doc in toc_documents(root):
        path = root / f"{doc}.md"
        if not path.is_file():
            continue
        text = path.read_text(encoding="utf-8")
        if not is_myst_markdown_notebook(text):
            continue
        nb = read_myst_markdown_notebook(text, config=md_config, add_source_map=True, path=str(path))
        if any(cell.cell_type == "code" for cell in nb.cells):
            pages.append((path, nb))
    return pages


def lab_kinds() -> dict[str, str]:
    """The lab kind of each lab page (``labs/NN-name/notebook_solution.md``), from the registry."""
    from ai_evolution.labs import get_spec, list_labs

    return {f"{get_spec(kind).folder}/notebook_solution.md": kind for kind in list_labs()}


def expected_seconds(kind: str | None) -> float:
    """The page's ``ci`` budget (longest first packs two workers best); 0 for a chapter."""
    if kind is None:
        return 0.0
    from ai_evolution.labs import get_spec

    return get_spec(kind).ci_budget_s


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _machine_busy_s() -> float:
    """CPU seconds the whole machine has spent computing since boot, all cores (not idle, not
    waiting for I/O, not stolen by the hypervisor)."""
    import psutil

    t = psutil.cpu_times()
    return sum(getattr(t, field, 0.0) for field in ("user", "nice", "system", "irq", "softirq"))


def _execute(path: str, nb_json: str, timeout: int) -> tuple[str, str, dict, str | None]:
    """Worker: execute one notebook in its own folder; returns it as JSON, its times and its
    error, if any. Times: wall seconds, the CPU time of its kernel (a child of this process,
    reaped when the execution ends: its CPU seconds do not grow when another kernel shares the
    cores, its wall time does) and the CPU seconds the rest of the machine spent meanwhile
    (another page, the suite's tests, this executor)."""
    import nbformat
    from jupyter_cache.executors.utils import single_nb_execution

    nb = nbformat.reads(nb_json, as_version=4)
    with hold_from_env(priority=True):  # in `make test`: a core of its own (scripts/cpu_slots.py)
        cpu, busy = _children_cpu_s(), _machine_busy_s()
        result = single_nb_execution(nb, cwd=str(Path(path).parent), timeout=timeout,
                                     allow_errors=False, meta_override=True)
        kernel = _children_cpu_s() - cpu
        times = {"seconds": result.time, "cpu_seconds": kernel,
                 "others_cpu_seconds": max(0.0, _machine_busy_s() - busy - kernel)}
    return path, nbformat.writes(result.nb), times, result.exc_string


def execute_book(out: Path, jobs: int = 2, root: Path = ROOT, timeout: int = 600,
                 log=print) -> dict:
    """Execute every notebook page not already in ``out/_build/.jupyter_cache`` and cache it.
    Returns the report written to ``out/_build/execution_times.json``."""
    import nbformat
    from jupyter_cache import get_cache
    from jupyter_cache.base import CacheBundleIn

    build = out / "_build"
    build.mkdir(parents=True, exist_ok=True)
    cache = get_cache(str((build / ".jupyter_cache").resolve()))
    todo, labs = [], lab_kinds()
    kinds = {}
    for path, nb in notebook_pages(root):
        rel = str(path.relative_to(root))
        kinds[rel] = labs.get(rel)
        try:
            cache.match_cache_notebook(nb)
            log(f"en caché: {rel}")
        except KeyError:
            todo.append((path, nb))
    todo.sort(key=lambda item: -expected_seconds(kinds[str(item[0].relative_to(root))]))
    calibration = calibrate()
    log(f"calibración: {calibration['cpu_s']:.2f} s de CPU (referencia "
        f"{calibration['reference_cpu_s']:.2f} s): presupuestos `ci` × {calibration['factor']:.2f}")
    # One torch (OpenMP) thread per kernel: two kernels of two threads each on two cores spin
    # against each other (see tests/conftest.py).
    os.environ["OMP_NUM_THREADS"] = "1"
    start = time.perf_counter()
    pages, failed = {}, {}
    with ProcessPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = [pool.submit(_execute, str(path), nbformat.writes(nb), timeout)
                   for path, nb in todo]
        for future in as_completed(futures):
            path, nb_json, times, error = future.result()
            rel = str(Path(path).relative_to(root))
            seconds, cpu_s = times["seconds"], times["cpu_seconds"]
            pages[rel] = {**times, "kind": kinds[rel]}
            if error:
                failed[rel] = error
                log(f"FALLÓ {rel} ({seconds:.1f} s):\n{error[-3000:]}")
                continue
            cache.cache_notebook_bundle(
                CacheBundleIn(nbformat.reads(nb_json, as_version=4), path,
                              data={"execution_seconds": seconds, "cpu_seconds": cpu_s}),
                check_validity=False, overwrite=True)
            log(f"ejecutado {rel}: {seconds:.1f} s ({cpu_s:.1f} s de CPU)")
    for page in pages.values():
        for key in ("seconds", "cpu_seconds", "others_cpu_seconds"):
            page[key] = round(page[key], 2)
    report = {"jobs": jobs, "wall_s": round(time.perf_counter() - start, 2), "pages": pages,
              "failed": sorted(failed), "cpu": cpu_model(),
              "calibration": calibration}
    (build / TIMES_FILE).write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n",
                                    encoding="utf-8")
    return report


# The machine the labs' `ci` budgets (``LabSpec.ci_budget_s``) are stated for, and the CPU
# seconds its core takes for the calibration workload (the smallest of its repetitions), measured
# there with nothing else running. A build on another machine scales the budgets by its own
# calibration over this one (`tests/test_book.py`), so that "twice the budget" means the same
# amount of work on a fast core and on a slow one.
REFERENCE_MACHINE = "AMD EPYC, family 25 (Zen 3, AVX2), 2-core VM; 2026-12-02, idle"
REFERENCE_CALIBRATION_CPU_S = 0.68


def calibration_workload(repeats: int = 5) -> list[float]:
    """CPU seconds of each repetition of a fixed piece of lab-like work on one torch thread:
    greedy decoding of 48 tokens for 4 prompts of 48 tokens on the shipped tiny-es model (Python
    overhead and small matmuls, as in the labs), after a warm-up."""
    import torch

    from ai_evolution.generation import generate
    from ai_evolution.model.checkpoint import load_pretrained

    torch.set_num_threads(1)
    model = load_pretrained("tiny-es")
    prompts = torch.randint(3, model.config.vocab_size, (4, 48),
                            generator=torch.Generator().manual_seed(0)).tolist()
    generate(model, prompts, 4)
    seconds = []
    for _ in range(repeats):
        began = time.process_time()
        generate(model, prompts, 48)
        seconds.append(time.process_time() - began)
    return seconds


def calibrate(repeats: int = 5) -> dict:
    """The calibration workload in a fresh process with one OpenMP thread (as every kernel of
    the build): its CPU seconds (the smallest repetition: the others met more interference),
    the reference's, and their ratio, by which the `ci` budgets are scaled on this machine."""
    import subprocess

    env = dict(os.environ, OMP_NUM_THREADS="1")
    with hold_from_env(priority=True):
        done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--calibrate",
                               str(repeats)], env=env, capture_output=True, text=True,
                              timeout=600, check=True)
    seconds = json.loads(done.stdout.strip().splitlines()[-1])
    best = round(min(seconds), 3)
    return {"cpu_s": best, "samples": [round(s, 3) for s in seconds],
            "reference_cpu_s": REFERENCE_CALIBRATION_CPU_S, "reference": REFERENCE_MACHINE,
            "factor": round(best / REFERENCE_CALIBRATION_CPU_S, 3)}


def over_budget(cpu_seconds: dict[str, float], budgets: dict[str, float],
                factor: float) -> dict[str, str]:
    """The labs whose kernel took more than twice their `ci` budget (reference-machine seconds)
    scaled by this machine's calibration ``factor``, each with its numbers."""
    return {lab: f"{s:.0f} s > 2 × {budgets[lab]:.0f} s × {factor:.2f}"
            for lab, s in cpu_seconds.items() if s > 2 * budgets[lab] * factor}


def cpu_model() -> str:
    """The processor's model name (Linux), for the timing report."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--path-output", type=Path, default=ROOT,
                        help="folder holding _build (as jupyter-book's --path-output)")
    parser.add_argument("--jobs", type=int, default=2, help="pages executed at once")
    parser.add_argument("--calibrate", type=int, metavar="REPEATS",
                        help="only run the calibration workload and print its CPU seconds")
    args = parser.parse_args(argv)
    if args.calibrate:
        print(json.dumps(calibration_workload(args.calibrate)))
        return 0
    report = execute_book(args.path_output, args.jobs)
    print(f"{len(report['pages'])} páginas ejecutadas en {report['wall_s']:.0f} s "
          f"con {report['jobs']} procesos")
    return 1 if report["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
