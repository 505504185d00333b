"""Fixtures shared by the tests: small models, one thread, and the book built once per session."""

import contextlib
import fcntl
import json
import os
import pickle
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from ai_evolution.model.checkpoint import load_pretrained, random_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from cpu_slots import ENV as CPU_SLOTS_ENV  # noqa: E402
from cpu_slots import CpuSlots  # noqa: E402

# `make test` runs two xdist workers on a 2-core machine: one torch thread per process (each
# worker, and the book build, kernels and graders it starts, which inherit the variable).
# Two processes of two threads each spin against each other: lab 7's notebook took 96 s under
# nbval beside another notebook, against 16 s alone.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread: these models are too small to gain from more, and on a shared 2-core
    machine a second thread that has to wait for a core makes every matmul many times slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny():
    """The shipped tiny-es model (read-only: tests must not modify it)."""
    return load_pretrained("tiny-es")


@pytest.fixture(scope="module")
def small():
    """A 2-layer random model with grouped-query attention (``engine_helpers.SMALL``): cheap
    references for the property tests."""
    from engine_helpers import SMALL
    return random_model(SMALL, seed=3, init_std=0.2)


ROOT = Path(__file__).resolve().parents[1]

# The grader draws its hidden cases from a secret and a nonce (issue 26): fixed for the suite
# (and for the graders it starts), so that grading a folder twice gives the same files.
os.environ.setdefault("AI_EVOLUTION_GRADING_SECRET", "secreto-de-las-pruebas")
os.environ.setdefault("AI_EVOLUTION_GRADING_NONCE", "pruebas")


def _jupyter_book() -> str:
    candidate = Path(sys.executable).with_name("jupyter-book")
    if candidate.exists():
        return str(candidate)
    found = shutil.which("jupyter-book")
    assert found, "jupyter-book is not installed in this environment"
    return found


# CPU slots (scripts/cpu_slots.py): with xdist, each test holds one of the run's
# ``os.cpu_count()`` slots for its setup, call and teardown, so that the two workers and what
# they start (the book's pages, two grading jobs) never put more CPU-bound processes than cores
# on the machine. ``_SLOT`` is this worker's pool and the token of the slots its test holds.
_SLOT: dict = {"slots": None, "token": None}


def _worker_slots(config):
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return None
    if _SLOT["slots"] is None:
        run = config._tmp_path_factory.getbasetemp().parent  # common to the run's workers
        _SLOT["slots"] = CpuSlots(run / "cpu-slots")
    return _SLOT["slots"]


def _cpu_s() -> float:
    """CPU seconds of this process and of the children it has reaped (and theirs)."""
    mine, children = (resource.getrusage(who) for who in (resource.RUSAGE_SELF,
                                                           resource.RUSAGE_CHILDREN))
    return mine.ru_utime + mine.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Each phase's report carries its CPU seconds (``cpu_s`` in ``user_properties``): this
    process's and its reaped children's, so that the closing lines tell a test that computes from
    one that waits (see :func:`schedule_lines`)."""
    outcome = yield
    now = _cpu_s()
    report = outcome.get_result()
    start = getattr(item, "_cpu_mark", now)
    report.user_properties = [*report.user_properties, ("cpu_s", round(now - start, 3))]
    item._cpu_mark = now


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    item._cpu_mark = _cpu_s()
    slots = _worker_slots(item.config)
    if slots is None:
        yield
        return
    _SLOT["token"] = slots.acquire(1)
    try:
        yield
    finally:
        if _SLOT["token"] is not None:
            slots.release(_SLOT["token"])
        _SLOT["token"] = None


@contextlib.contextmanager
def holding(cpus: int):
    """Within a test: hold ``cpus`` slots instead of the test's one (0 while it only waits, or
    while what it starts takes its own, as the book's pages do; 2 while it runs two CPU-bound
    processes at once), then the one again."""
    slots = _SLOT["slots"]
    if slots is None or _SLOT["token"] is None:
        yield
        return
    slots.release(_SLOT["token"])
    _SLOT["token"] = None
    token = slots.acquire(cpus) if cpus > 0 else None
    try:
        yield
    finally:
        if token is not None:
            slots.release(token)
        _SLOT["token"] = slots.acquire(1)


def once_per_run(tmp_path_factory, worker_id: str, name: str, produce, cpus: int = 1):
    """A session fixture's value computed once per pytest run, also with several xdist workers:
    the first worker that needs it runs ``produce(folder)`` under a file lock and pickles the
    result beside the workers' temporary folders; a worker that needs it later waits for the lock
    and loads it, holding no CPU slot while it waits. ``produce`` runs holding ``cpus`` slots
    (:func:`holding`). Without xdist (``worker_id == "master"``) it is simply computed."""
    if worker_id == "master":
        return produce(tmp_path_factory.mktemp(name))
    shared = tmp_path_factory.getbasetemp().parent  # one folder per run, common to its workers
    done = shared / f"{name}.pickle"
    with open(shared / f"{name}.lock", "w") as lock:
        with holding(0):
            fcntl.flock(lock, fcntl.LOCK_EX)
        if done.is_file():
            return pickle.loads(done.read_bytes())
        with holding(cpus):
            value = produce(tmp_path_factory.mktemp(name))
        done.write_bytes(pickle.dumps(value))
        return value


def build_book(out: Path) -> dict:
    """`make book` into ``out``: the notebook pages executed two at a time into the build's
    execution cache (`scripts/execute_book.py`; under xdist each page first takes a CPU slot, so
    two run at once only while no test holds a core), then `jupyter-book build`, which finds them
    cached. Each page executes once. The wall times go to ``out/_build/execution_times.json``."""
    env = dict(os.environ, AI_EVOLUTION_PROFILE="ci")
    if _SLOT["slots"] is not None:  # the pages take the run's CPU slots, ahead of the tests
        env[CPU_SLOTS_ENV] = str(_SLOT["slots"].folder)
    start = time.perf_counter()
    execute = subprocess.run([sys.executable, str(ROOT / "scripts" / "execute_book.py"),
                              "--path-output", str(out), "--jobs", "2"],
                             cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600)
    executed_s = time.perf_counter() - start
    cmd = [_jupyter_book(), "build", "--all", "-W", "-n", "--keep-going", "--path-output", str(out),
           str(ROOT)]
    slots = _SLOT["slots"]
    with slots.hold(priority=True) if slots is not None else contextlib.nullcontext():
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=3600)
    times = out / "_build" / "execution_times.json"
    report = json.loads(times.read_text(encoding="utf-8")) if times.is_file() else {}
    report.update(execute_s=round(executed_s, 1), build_s=round(time.perf_counter() - start, 1))
    times.write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    log = (execute.stdout[-4000:] + execute.stderr[-4000:] + "\n" + proc.stdout[-8000:] + "\n"
           + proc.stderr[-8000:])
    return {"out": out, "html": out / "_build" / "html", "executed": out / "_build" / "jupyter_execute",
            "returncode": proc.returncode or execute.returncode, "log": log}


@pytest.fixture(scope="session")
def built_book(tmp_path_factory, worker_id):
    """The book built exactly as `make book` builds it (pages executed two at a time, then
    `--all -W -n --keep-going`, labs in the `ci` profile), into an empty folder (so every page
    executes from scratch), once per run. The executed lab notebooks it leaves in
    `_build/jupyter_execute/` are the only execution of each lab in the suite: nbval compares them
    with the committed outputs without running them again (tests/nbval_replay.py), and lab 2's
    grading run compares the grader's execution with them. Returns the output folder and the
    build's exit code and log."""
    return once_per_run(tmp_path_factory, worker_id, "book", build_book, cpus=0)


def build_lab_page(out: Path, edition: str, lab: str = "02-kv-cache") -> Path:
    """One lab page built alone, without executing it, in the given edition (``full`` or
    ``student``, ``_ext/lab_pages.py``): the book's own configuration with execution off and a
    table of contents of that page only. Returns the HTML folder."""
    import yaml

    config = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))
    config["execute"]["execute_notebooks"] = "off"
    sphinx = config["sphinx"]  # paths in a --config file are read from its own folder
    sphinx["local_extensions"] = {k: str(ROOT / v) for k, v in sphinx["local_extensions"].items()}
    sphinx["config"]["html_static_path"] = [str(ROOT / p) for p in sphinx["config"]["html_static_path"]]
    config["bibtex_bibfiles"] = [str(ROOT / p) for p in config["bibtex_bibfiles"]]
    out.mkdir(parents=True, exist_ok=True)
    (out / "_config.yml").write_text(yaml.safe_dump(config, allow_unicode=True), encoding="utf-8")
    (out / "_toc.yml").write_text(f"format: jb-book\nroot: labs/{lab}/notebook_solution\n",
                                  encoding="utf-8")
    env = dict(os.environ, AI_EVOLUTION_PROFILE="ci", AI_EVOLUTION_EDITION=edition)
    proc = subprocess.run([_jupyter_book(), "build", "--all", "--path-output", str(out),
                           "--config", str(out / "_config.yml"), "--toc", str(out / "_toc.yml"),
                           str(ROOT)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return out / "_build" / "html"


@pytest.fixture(scope="session")
def lab_page_editions(tmp_path_factory, worker_id):
    """Lab 2's page built alone in both editions (about 20 s each), once per run."""
    return once_per_run(tmp_path_factory, worker_id, "ediciones", lambda base: {
        edition: build_lab_page(base / edition, edition) for edition in ("full", "student")})


def _grade_attacks(base: Path) -> dict:
    from test_grading_adversarial import grade_attacks

    return grade_attacks(base)


@pytest.fixture(scope="session")
def graded_kv_cache(tmp_path_factory, worker_id):
    """Lab 2's real solution, its untouched student copy, a broken solution and every attack of
    tests/test_grading_adversarial.py, graded in one CLI run (two jobs: it holds two CPU
    slots), once per run. The solution's
    execution here is lab 2's second in the suite: its checked outputs are compared with the
    book's execution in place of an nbval run (tests/test_notebooks.py)."""
    return once_per_run(tmp_path_factory, worker_id, "ataques", _grade_attacks, cpus=2)


# `make check` (the everyday tier) runs `-m "not slow"`: no notebook execution, no book build, no
# real grading kernels or checkers, no process groups (tensor-parallel ranks, replicas behind the
# router) (the modules below), and none of the tests marked `slow` where they are defined: Chromium, a
# second run of a whole lab (its same-seed reproduction, its run in fp16), a long soak, a
# sampling statistic over thousands of draws. `make test` runs everything.
SLOW_MODULES = {"test_book.py", "test_grading.py", "test_grading_adversarial.py",
                "test_install.py", "test_book_editions.py", "test_tensor_parallel.py",
                "test_router.py", "test_lab_distributed.py", "test_grading_zygote.py"}

# `make test` runs on two workers (pytest-xdist, `--dist loadscope --no-loadscope-reorder`): a
# module's tests go to one worker (its module fixtures are built once), in the order below.
# - First the modules that start the two long session fixtures, one per worker: the book build
#   (test_book.py) and lab 2's grading run (test_grading_adversarial.py).
# - Then every other module.
# - Last, the tests that read the book from other modules (``BOOK_READERS``), each on its own:
#   by then the book is built, and either worker takes them.
# xdist's scheduler sees node ids only, so the readers are named here; collection fails when a
# test that uses ``built_book`` outside test_book.py is not named (it would hold its worker
# waiting for the build).
FIRST_MODULES = ("test_book.py", "test_grading_adversarial.py")
BOOK_READERS = {"test_solution_runs_under_ci_and_its_checked_outputs_are_reproducible",
                "test_every_page_renders_without_overflow_missing_images_or_raw_math",
                "test_every_built_page_shows_version_build_date_and_licences",
                "test_the_book_works_served_from_a_sub_path",
                "test_every_interactive_figure_works_offline",
                "test_claims_match_their_numbers_on_a_busy_machine"}


def _parts(nodeid: str) -> tuple[str, str]:
    module, _, rest = nodeid.partition("::")
    return module, rest.split("[")[0]


def scope_of(nodeid: str) -> str:
    """The xdist scope of a test: itself for a book reader, else its module."""
    module, name = _parts(nodeid)
    return nodeid if name in BOOK_READERS else module


def run_order(nodeid: str) -> int:
    module, name = _parts(nodeid)
    if name in BOOK_READERS:
        return len(FIRST_MODULES) + 1
    name = Path(module).name
    return FIRST_MODULES.index(name) if name in FIRST_MODULES else len(FIRST_MODULES)


def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ScopeScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

    return ScopeScheduling(config, log)


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: executes notebooks, builds the book, grades real "
                                       "kernels or starts process groups (left out of `make check`)")


def pytest_collection_modifyitems(config, items):
    unnamed = []
    for item in items:
        name = getattr(item, "originalname", item.name)
        fixtures = set(getattr(item, "fixturenames", ()))
        if item.path.name in SLOW_MODULES or "built_book" in fixtures:
            item.add_marker(pytest.mark.slow)
        if ("built_book" in fixtures and item.path.name != FIRST_MODULES[0]
                and name not in BOOK_READERS):
            unnamed.append(item.nodeid)
    if unnamed:
        raise pytest.UsageError("these tests read the book build but are not named in "
                                "BOOK_READERS of tests/conftest.py: " + ", ".join(unnamed))
    items.sort(key=lambda item: run_order(item.nodeid))  # stable within each rank


# Where the two workers spent the run: each test report that reaches the controller (xdist)
# with the worker that ran it, its module, its seconds (setup + call + teardown), when it arrived
# and its CPU seconds (the worker's and its reaped children's). The closing lines then say how busy
# each worker was and which modules cost most, in wall and CPU seconds (a module whose CPU is far
# below its wall time mostly waits), so that the suite's schedule can be balanced from a measured
# run (see FIRST_MODULES).
_REPORTS: list[tuple[str, str, float, float, float]] = []
_START = time.monotonic()


def pytest_runtest_logreport(report):
    node = getattr(report, "node", None)  # set by xdist on the controller only
    if node is not None:
        worker = getattr(getattr(node, "gateway", None), "id", "?")
        cpu = dict(report.user_properties).get("cpu_s", 0.0)
        _REPORTS.append((worker, report.nodeid.split("::")[0], float(report.duration),
                         time.monotonic() - _START, float(cpu)))


def schedule_lines(reports: list[tuple[str, str, float, float, float]], top: int = 8) -> list[str]:
    """Per worker: seconds inside its tests, their CPU seconds and when its last report arrived
    (seconds from the session's start); then the ``top`` modules by seconds, with their CPU
    seconds and their worker."""
    lines = []
    for worker in sorted({r[0] for r in reports}):
        mine = [r for r in reports if r[0] == worker]
        lines.append(f"worker {worker}: {sum(r[2] for r in mine):.0f} s "
                     f"({sum(r[4] for r in mine):.0f} s CPU) in {len(mine)} test phases, "
                     f"last at {max(r[3] for r in mine):.0f} s")
    modules: dict[tuple[str, str], list[float]] = {}
    for worker, module, seconds, _, cpu in reports:
        total = modules.setdefault((module, worker), [0.0, 0.0])
        total[0] += seconds
        total[1] += cpu
    for (module, worker), (seconds, cpu) in sorted(modules.items(), key=lambda kv: -kv[1][0])[:top]:
        lines.append(f"  {seconds:7.1f} s ({cpu:6.1f} s CPU)  {module} ({worker})")
    return lines


def pytest_terminal_summary(terminalreporter, config):
    """The suite's closing lines: the book build's wall time and each page's execution, on this
    machine (the budgets are held by tests/test_book.py)."""
    try:  # a diagnostic: it never fails the run
        for line in schedule_lines(_REPORTS):
            terminalreporter.write_line(line)
    except Exception as err:  # noqa: BLE001
        terminalreporter.write_line(f"(no schedule summary: {err})")
    factory = getattr(config, "_tmp_path_factory", None)
    if factory is None:
        return
    try:
        base = factory.getbasetemp()
    except (OSError, ValueError):
        return
    found = {p.resolve() for pattern in ("book*/_build/execution_times.json",
                                         "popen-gw*/book*/_build/execution_times.json")
             for p in base.glob(pattern)}
    for times in sorted(found):
        report = json.loads(times.read_text(encoding="utf-8"))
        write = terminalreporter.write_line
        write(f"book build: {report.get('build_s', '?')} s in all, pages executed in "
              f"{report.get('wall_s', '?')} s with {report.get('jobs', '?')} processes "
              f"(CPU: {report.get('cpu', '?')}, {os.cpu_count()} cores)")
        calibration = report.get("calibration") or {}
        write(f"calibration: {calibration.get('cpu_s', '?')} s of CPU against the reference's "
              f"{calibration.get('reference_cpu_s', '?')} s ({calibration.get('reference', '?')}): "
              f"`ci` budgets × {calibration.get('factor', '?')}")
        for page, item in sorted(report.get("pages", {}).items(), key=lambda kv: -kv[1]["seconds"]):
            write(f"  {item['seconds']:7.1f} s ({item.get('cpu_seconds', 0):6.1f} s CPU, "
                  f"the rest of the machine {item.get('others_cpu_seconds', 0):5.1f} s)  {page}")
