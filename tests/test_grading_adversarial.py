"""The autograder against dishonest submissions (issues 21 and 26): each attack is a small
notebook built here from lab 2's solution, graded together with honest ones in one CLI run. None
scores above its honest content, no other student's grade or file changes, and the grader
always writes a gradebook. Issue 26's attacks aim at the process that decides the grade (its
frames, its __main__, the library it computes expected values with, the hidden checks' text):
none of them runs there any more, and the references are not in the worker's library. Cheap by design: no lab experiment runs; the contract is a
synthetic one that the notebook builds from its own ``seed`` and ``profile``."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import jupytext
import nbformat
import psutil
import pytest

from ai_evolution.grading import (find_assessment, grade_namespace, merge_outputs, parse_shard,
                                  shard_of, student_ids)
from ai_evolution.grading.delegation import delegation, forbidden_for
from ai_evolution.grading.rebuild import extract, parameter_rebinds
from ai_evolution.grading.assessment import resolve_reference
from ai_evolution.grading.sandbox import isolation
from ai_evolution import __version__
from ai_evolution.labs import get_spec

from test_grading import good_measurement, synthetic_contract

ROOT = Path(__file__).resolve().parents[1]
KV = ROOT / "labs" / "02-kv-cache"
HIDDEN_KV = ROOT / "assessments" / "02-kv-cache" / "hidden_checks.py"
ESCAPE_SECONDS = "4321.5"  # a sleep nobody else runs: the escaped process, if it survived


def solution_cells() -> tuple[str, list[str]]:
    """Lab 2's setup import lines and its four exercise cells (the reference solution)."""
    cells = [c for c in jupytext.read(KV / "notebook_solution.md").cells if c.cell_type == "code"]
    params = next(i for i, c in enumerate(cells) if "parameters" in c.metadata.get("tags", []))
    setup = cells[params + 1].source
    imports = "\n".join(line for line in setup.split("\n\n")[0:6] if "import" in line)
    exercises = [c.source for c in cells[params + 2:]
                 if "# BEGIN SOLUTION" in c.source and "student_extension" not in c.source]
    assert len(exercises) == 4
    return imports, exercises


CONTRACT = """import json as _json
contract = _json.loads({text!r})
contract["seed"], contract["profile"] = seed, profile
"""


def notebook(*cells: str | tuple[str, list[str]]) -> nbformat.NotebookNode:
    """A notebook: the parameters cell, then ``cells`` (a source, or (source, tags))."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    p = nbformat.v4.new_code_cell("seed = 0\nprofile = None")
    p.metadata["tags"] = ["parameters"]
    nb.cells = [p]
    for cell in cells:
        source, tags = (cell, []) if isinstance(cell, str) else cell
        c = nbformat.v4.new_code_cell(source)
        if tags:
            c.metadata["tags"] = tags
        nb.cells.append(c)
    return nb


def honest(*extra: str, exercises: list[str] | None = None, before: tuple = ()) -> nbformat.NotebookNode:
    imports, solved = solution_cells()
    contract = synthetic_contract("kv_cache", good_measurement("kv_cache"))
    setup = imports + "\nfrom ai_evolution.labs import resolve_profile\nprofile = resolve_profile(profile)"
    return notebook(*before, setup, *(exercises or solved), *extra,
                    CONTRACT.format(text=json.dumps(contract)))


WRONG_KV_BYTES = """def kv_bytes_per_token(config, dtype):
    return 8 * 2 * config.num_layers * config.num_kv_heads * config.head_dim * dtype_bytes(dtype)
"""

PATCH_IN_KERNEL = """import ai_evolution.checks as _c
import ai_evolution.checks.kv_cache as _kc
import ai_evolution.grading.namespace as _k
from ai_evolution.checks import CheckResult
_c.failed = lambda name, *a, **k: _c.passed(name, 1)
_kc.failed = _c.failed
_c.call_student = lambda name, fn, *a, **k: (None, None)
CheckResult.passed = property(lambda self: True)
_k.grade_function = lambda *a, **k: {"passed": True, "message": "ok", "stage": None, "cases": 1}
"""

PATCH_IN_EXERCISE = """def kv_bytes_per_token(config, dtype):
    import ai_evolution.checks.kv_cache as k
    k.failed = lambda name, *a, **kw: k.passed(name, 1)
    return 8 * 2 * config.num_layers * config.num_kv_heads * config.head_dim * dtype_bytes(dtype)
"""

FRAME_IN_EXERCISE = """def kv_bytes_per_token(config, dtype):
    try:
        raise ValueError
    except ValueError as err:
        caller = err.__traceback__.tb_frame.f_back
    return caller.f_locals.get("expected", 0)
"""

DELEGATES = ["from ai_evolution.model import kv_bytes_per_token",
             "from ai_evolution.model.attention import cached_attention as my_cached_attention",
             "import ai_evolution.timing as _t\ndef fit_growth(n, t):\n    return _t.fit_growth(n, t)",
             "from ai_evolution.checks.kv_cache import reference_sequences_that_fit as _r\n"
             "sequences_that_fit = _r"]

REWRITE_RESULTS = """import atexit, glob, os, threading, time
def _scribble():
    for pattern in ("/tmp/**/result.json", "/tmp/**/run.json", "/tmp/**/job.json",
                    "/tmp/**/gradebook.csv", "../**/*.json", os.path.expanduser("~/**/*.json")):
        for path in glob.glob(pattern, recursive=True):
            try:
                with open(path, "w") as fh:
                    fh.write('{"functions": {}, "passed": true}')
            except OSError:
                pass
threading.Thread(target=lambda: [(_scribble(), time.sleep(0.2)) for _ in range(50)],
                 daemon=True).start()
atexit.register(_scribble)
1 / 0
"""

NEIGHBOUR = """import glob, os
found = glob.glob("/tmp/ai-evolution-*/**/*", recursive=True)
for path in glob.glob({folder!r} + "/*.ipynb") + [p for p in found if p.endswith(".ipynb")]:
    if "vecino" not in path:
        try:
            with open(path, "w") as fh:
                fh.write("{{}}")
        except OSError:
            pass
for path in glob.glob("/tmp/ai-evolution-*/work/numpy.py") + [os.path.join(p, "numpy.py")
        for p in glob.glob("/tmp/ai-evolution-*/work")]:
    try:
        with open(path, "w") as fh:
            fh.write("raise ImportError('saboteado')")
    except OSError:
        pass
hidden = glob.glob({assessments!r} + "/**/hidden_checks.py", recursive=True)
print("ocultas:", len(hidden))
"""

KILL_WORKER = """import os, signal
os.kill(os.getppid(), signal.SIGKILL)
"""

STOP_WORKER = """import os, signal
os.kill(os.getppid(), signal.SIGSTOP)
"""

ESCAPE = f"""import os
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execve("/bin/sleep", ["sleep", "{ESCAPE_SECONDS}"], {{}})
    os._exit(0)
"""

HIDE_ERRORS = """get_ipython().set_custom_exc((Exception,), lambda *a, **k: None)
1 / 0
"""

DISK_MB = 256  # the fixture's --disk-mb
FILL_SCRATCH = f"""import time
with open("relleno.bin", "wb") as fh:
    for _ in range({DISK_MB + 144}):
        fh.write(b"x" * 2**20)
time.sleep(20)
"""

FILL_TMP = """with open("/tmp/relleno.bin", "wb") as fh:
    for _ in range(512):
        fh.write(b"x" * 2**20)
"""

RECURSION_BOMB = "total = " + " + ".join(["1"] * 800)
FORGED = "ana\n- Puntuación automática: **13 de 13**"
NOT_UTF8 = b"no_utf8_\xff\xfe"


def pathological_files(folder: Path) -> dict[str, int]:
    """Files that once stopped grading for the whole class (issue 26): a symbolic link to the
    solution, a FIFO, a name that is not UTF-8, a name with a newline that forges a line of
    feedback, two 254-byte names that clean to one id, a recursion bomb, notebooks that fill
    their scratch folder and bubblewrap's /tmp. Return the most each may score, by id."""
    (folder / "enlace.ipynb").symlink_to(folder / "solucion.ipynb")
    os.mkfifo(folder / "tuberia.ipynb")
    with open(os.fsencode(folder) + b"/" + NOT_UTF8 + b".ipynb", "w", encoding="utf-8") as fh:
        nbformat.write(honest(), fh)
    (folder / f"{FORGED}.ipynb").write_text("{}", encoding="utf-8")
    for mark in "!?":
        (folder / ("a" * 240 + mark * 8 + ".ipynb")).write_text("{}", encoding="utf-8")
    nbformat.write(honest(RECURSION_BOMB), folder / "recursion.ipynb")
    nbformat.write(honest(FILL_SCRATCH), folder / "llena_disco.ipynb")
    most = {"enlace": 0, "tuberia": 0, "no_utf8": 13, "ana_-_Puntuación_automática_13_de_13": 0,
            "a" * 59: 0, "a" * 59 + "-2": 0, "recursion": 0, "llena_disco": 9}
    if isolation() == "bwrap":  # in a session of its own /tmp is the machine's
        nbformat.write(honest(FILL_TMP), folder / "llena_tmp.ipynb")
        most["llena_tmp"] = 12
    return most


def snapshot(folder: Path) -> dict[bytes, bytes]:
    """The bytes of every regular file (never through a link, never opening a FIFO)."""
    out = {}
    for name in os.listdir(os.fsencode(folder)):
        path = os.fsencode(folder) + b"/" + name
        if stat.S_ISREG(os.lstat(path).st_mode):
            with open(path, "rb") as fh:
                out[name] = fh.read()
    return out


# --- issue 26: attacks on the checker's process (none of them runs there any more) ----------------

STUBS = [f"def {name}(*args, **kwargs):\n    raise NotImplementedError('sin hacer')\n"
         for name in ("kv_bytes_per_token", "my_cached_attention", "fit_growth",
                      "sequences_that_fit")]

# A class body (run when the class is defined) takes over the process's __main__ module, and
# every exercise delegates to the library's reference by a route no static screen follows.
CLASS_BODY_AND_ROUTES = [
    """import functools, operator
import torch
import ai_evolution
import ai_evolution.timing
class _Toma:
    import torch as _t
    _m = _t.sys.modules["__main__"]
    _m.grade_function = lambda *a, **k: {"passed": True, "message": "ok", "stage": None, "cases": 1}
    _m.checker_main = _m.grade_function
""",
    """def kv_bytes_per_token(config, dtype):
    return torch.sys.modules["ai_evolution.model.memory"].kv_bytes_per_token(config, dtype)
""",
    """def my_cached_attention(q, k_new, v_new, k_cache, v_cache, positions):
    import ai_evolution.model.attention as _a
    return operator.attrgetter("cached_attention")(_a)(q, k_new, v_new, k_cache, v_cache, positions)
""",
    """def fit_growth(n, t):
    return functools.reduce(getattr, ["timing", "fit_growth"], ai_evolution)(n, t)
""",
    """def sequences_that_fit(*args):
    m = torch.sys.modules["importlib"].import_module("ai_evolution.checks.kv_cache")
    return getattr(m, "reference_sequences_that_fit")(*args)
"""]

# An exercise walks up its frames to whatever holds a channel, forges answers on it and exits.
FRAMES_TO_CHANNEL = """import torch
def kv_bytes_per_token(config, dtype):
    s = torch.sys
    f = s._getframe(0)
    while f is not None:
        for v in list(getattr(f, "f_locals").values()):
            if hasattr(v, "send"):
                for cid in ("kv_bytes_per_token", "cached_attention", "fit_growth",
                            "sequences_that_fit"):
                    v.send({"criterion": cid, "outcome": {"passed": True, "message": "ok"}})
                v.send({"result": 0, "updates": []})
        f = getattr(f, "f_back")
    s.exit(0)
"""

# The kernel swallows its own errors with a handler installed through names built from pieces.
HIDE_ERRORS_BY_PIECES = """_ip = globals()["get_" + "ipython"]()
getattr(_ip, "set_" + "custom_exc")((Exception,), lambda *a, **k: None)
1 / 0
"""

# An exercise returns the `expected` of the check that calls it; another reads the hidden checks
# and raises their text, hoping it reaches the feedback.
EXPECTED_FROM_CALLER = """import torch
def sequences_that_fit(*args):
    s = torch.sys
    f = s._getframe(1)
    while f is not None:
        seen = getattr(f, "f_locals")
        if "expected" in seen:
            return seen["expected"]
        f = getattr(f, "f_back")
    return {}
"""

READ_HIDDEN = """import torch
def fit_growth(n, t):
    b = torch.sys.modules["builtins"]
    with getattr(b, "open")({path!r}) as fh:
        raise ValueError(fh.read()[:1500])
"""

# A class body rewrites a library table in place (same objects: nothing changes identity) so
# that a wrong formula agrees with it; another exercise is a literal table of every case the
# grader used to run.
TABLE_IN_PLACE = """import torch
class _Ajusta:
    import torch as _t
    _d = _t.sys.modules["ai_evolution.model.memory"]._DTYPE_BYTES
    for _k in list(_d):
        _d[_k] = 4.0
def kv_bytes_per_token(config, dtype):
    return 2.0 * config.num_layers * config.num_kv_heads * config.head_dim * 4.0
"""


def literal_table() -> str:
    """``sequences_that_fit`` as a lookup of the public cases and of the edge cases the grader
    ran before they were drawn from the secret (the answers computed here, with the library)."""
    from ai_evolution.checks.kv_cache import budget_cases, reference_sequences_that_fit
    from ai_evolution.model import get_preset, kv_bytes_per_token, weight_bytes

    cfg = get_preset("llama-3.1-8b")
    w, block, act = weight_bytes(cfg, "bf16"), kv_bytes_per_token(cfg, "bf16") * 16, 2**30
    old_edges = [(cfg, w + act + 5 * 256 * block, 1.0, act, "bf16", "bf16", 16, 4096),
                 (cfg, w + act + 5 * 256 * block - 1, 1.0, act, "bf16", "bf16", 16, 4096),
                 (cfg, w + act, 1.0, act, "bf16", "bf16", 16, 4096),
                 (cfg, w + act + 5 * 256 * block, 1.0, act, "bf16", "bf16", 16, 4097),
                 (cfg, w + 3 * 4096 * block / 16, 1.0, 0.0, "bf16", "bf16", 1, 4096),
                 (get_preset("qwen3-0.6b"), 12e9, 0.95, 0.0, "bf16", "int4", 16, 131072)]
    table = {repr((c.name, *rest)): reference_sequences_that_fit(c, *rest)
             for c, *rest in budget_cases() + old_edges}
    return (f"_TABLE = {table!r}\n"
            "def sequences_that_fit(config, *rest):\n"
            "    return _TABLE.get(repr((config.name, *rest)), {'kv_budget_bytes': 0.0, "
            "'num_blocks': 0, 'max_tokens': 0, 'sequences': 0})\n")


def attack_folder(folder: Path) -> dict[str, int]:
    """Write the submissions; return the most each may score (its honest content)."""
    folder.mkdir()
    imports, solved = solution_cells()
    subs = {
        "honesto": (honest(), 13),
        "importa_referencias": (honest(exercises=DELEGATES), 13 - 9),
        "parchea_kernel": (honest(PATCH_IN_KERNEL, exercises=[WRONG_KV_BYTES] + solved[1:]), 11),
        "parchea_ejercicio": (honest(exercises=[PATCH_IN_EXERCISE] + solved[1:]), 11),
        "marcos": (honest(exercises=[FRAME_IN_EXERCISE] + solved[1:]), 11),
        # A dummy injected-parameters cell first, then its own parameters: the grader drops
        # the dummy, papermill injects after the parameters cell: seed stays 0.
        "celda_inyectada": (honest(before=(("seed = 123\nprofile = 'full'",
                                            ["injected-parameters"]),)), 13),
        "reasigna_semilla": (honest("seed = 5"), 13 - 1 - 2),
        "reescribe": (honest(REWRITE_RESULTS), 13 - 1),
        "mata_worker": (honest("1 / 0", KILL_WORKER), 9),
        "para_worker": (honest(STOP_WORKER), 9),
        "escapa": (honest(ESCAPE), 13),
        "oculta_errores": (honest(HIDE_ERRORS), 13 - 1),
        # issue 26: the checker runs none of the submitted code.
        "clase_y_rutas": (honest(exercises=CLASS_BODY_AND_ROUTES), 13 - 9),
        "marcos_y_kernel": (honest(HIDE_ERRORS_BY_PIECES,
                                   exercises=[FRAMES_TO_CHANNEL] + solved[1:]), 13 - 1 - 2),
        "espia": (honest(exercises=solved[:2] + [READ_HIDDEN.format(path=str(HIDDEN_KV)),
                                                 EXPECTED_FROM_CALLER]), 13 - 2 - 2),
        "tabla": (honest(exercises=[TABLE_IN_PLACE] + solved[1:3] + [literal_table()]),
                  13 - 2 - 2),
    }
    if isolation() == "bwrap":  # in a session of its own a notebook can write the user's files
        subs["vecino"] = (honest(NEIGHBOUR.format(folder=str(folder),
                                                  assessments=str(ROOT / "assessments"))), 13)
    for sid, (nb, _) in subs.items():
        nbformat.write(nb, folder / f"{sid}.ipynb")
    return {sid: most for sid, (_, most) in subs.items()}


def rows(gradebook: Path) -> dict[str, dict]:
    with open(gradebook, newline="", encoding="utf-8") as fh:
        return {r["student_id"]: r for r in csv.DictReader(fh)}


def submission_seconds(log: str) -> dict[str, int]:
    """Each submission's wall seconds, from the grader's progress lines (``[k/n] id: …(N s)``)."""
    return {m[1]: int(m[2]) for m in re.finditer(r"^\[\d+/\d+\] (\S+): .*\((\d+) s\)$", log,
                                                 re.M)}


def grade_attacks(base: Path) -> dict:
    """Every attack, the honest notebook and the realistic submissions of test_grading (lab 2's
    real solution, its untouched student copy, a broken solution) graded in one CLI run
    (--jobs 2): the suite's only grading of real lab kernels. Run once per session by the
    ``graded_kv_cache`` fixture (tests/conftest.py)."""
    from test_grading import realistic_folder

    folder = base / "entregas"
    most = attack_folder(folder) | realistic_folder(folder)
    most |= pathological_files(folder)
    before = snapshot(folder)
    out = base / "notas"
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "ai_evolution.grading", "--lab", "kv_cache",
                           str(folder), "--out", str(out), "--timeout", "300", "--cell-timeout",
                           "120", "--memory-mb", "4096", "--disk-mb", str(DISK_MB), "--jobs", "2"],
                          capture_output=True, text=True, timeout=1500)
    elapsed = time.monotonic() - start
    time.sleep(1)
    survivors = [p.info["cmdline"] for p in psutil.process_iter(["cmdline"])
                 if ESCAPE_SECONDS in " ".join(p.info["cmdline"] or [])]
    return {"done": done, "out": out, "folder": folder, "most": most, "before": before,
            "elapsed": elapsed, "survivors": survivors}


@pytest.fixture(scope="module")
def attacked(graded_kv_cache):
    return graded_kv_cache


def test_the_grader_writes_a_gradebook_and_survives_every_attack(attacked):
    done = attacked["done"]
    assert done.returncode == 0, done.stderr[-3000:]
    book = rows(attacked["out"] / "gradebook.csv")
    assert sorted(book) == sorted(attacked["most"])
    assert not attacked["survivors"], attacked["survivors"]  # the escaped process was killed
    assert {r["isolation"] for r in book.values()} == {isolation()}
    # The stopped (SIGSTOP) and the killed worker end their run when they stop, not at the run's
    # 300 s limit: each submission's seconds, from the grader's log (the files carry no timings).
    # A cheap attack takes ~10-60 s with its checker, by the machine and what runs beside it.
    seconds = submission_seconds(done.stderr)
    assert sorted(seconds) == sorted(attacked["most"]), done.stderr[-3000:]
    for sid in ("para_worker", "mata_worker"):
        assert seconds[sid] < 150, (sid, seconds[sid])


def test_no_attack_scores_above_its_honest_content(attacked):
    book = rows(attacked["out"] / "gradebook.csv")
    for sid, most in attacked["most"].items():
        assert float(book[sid]["total"]) <= most, (sid, book[sid])
    # ...and the honest parts of each attack still count (one mistake costs one criterion).
    assert book["honesto"]["total"] == "13" and book["honesto"]["status"] == "ok"
    for sid in ("parchea_kernel", "parchea_ejercicio", "marcos", "reasigna_semilla", "reescribe",
                "mata_worker", "para_worker", "oculta_errores", "importa_referencias",
                "clase_y_rutas", "espia"):
        assert float(book[sid]["total"]) == attacked["most"][sid], (sid, book[sid])


def test_each_attack_loses_the_right_criteria_with_a_reason(attacked):
    out = attacked["out"]
    book = rows(out / "gradebook.csv")
    feedback = {sid: (out / "feedback" / f"{sid}.md").read_text(encoding="utf-8") for sid in book}
    refs = book["importa_referencias"]
    assert [refs[c] for c in ("kv_bytes_per_token", "cached_attention", "fit_growth",
                              "sequences_that_fit")] == ["0"] * 4
    # The references are not in the worker's library: the three imports reach a stub (and the
    # delegation walk flags them for a human); the fourth imports from ai_evolution.checks,
    # which the screen keeps out of exercise code.
    assert feedback["importa_referencias"].count("no está disponible en el corrector") >= 3
    assert feedback["importa_referencias"].count("parece delegar en la biblioteca") == 3
    assert "no se encontró `sequences_that_fit`" in feedback["importa_referencias"]
    assert book["parchea_kernel"]["kv_bytes_per_token"] == "0"
    assert "ai_evolution.grading" in feedback["parchea_kernel"]  # flagged for a human
    assert book["parchea_ejercicio"]["kv_bytes_per_token"] == "0"
    assert "parte del corrector" in feedback["parchea_ejercicio"]
    assert book["marcos"]["kv_bytes_per_token"] == "0" and "__traceback__" in feedback["marcos"]
    assert book["celda_inyectada"]["contract"] == "1"  # the injected seed 0 won
    assert "injected-parameters" in feedback["celda_inyectada"]
    seed = book["reasigna_semilla"]
    assert (seed["contract"], seed["extension"]) == ("0", "0") and "`seed`" in feedback["reasigna_semilla"]
    assert book["reescribe"]["runs"] == "0" and book["reescribe"]["status"] == "error"
    killed = book["mata_worker"]
    assert killed["status"] == "crashed" and killed["runs"] == "0" and killed["contract"] == "0"
    stopped = book["para_worker"]
    assert stopped["status"] == "crashed" and "SIGSTOP" in stopped["reason"]
    hidden = book["oculta_errores"]
    assert hidden["runs"] == "0" and "set_custom_exc" in feedback["oculta_errores"]


FUNCTIONS = ("kv_bytes_per_token", "cached_attention", "fit_growth", "sequences_that_fit")


def test_attacks_on_the_checkers_process_find_nothing_to_attack(attacked):
    """Issue 26: the exercise code runs in a jailed worker with a library without the
    references; the checks, the expected values and the channel to the grader are elsewhere."""
    out = attacked["out"]
    book = rows(out / "gradebook.csv")
    feedback = {sid: (out / "feedback" / f"{sid}.md").read_text(encoding="utf-8") for sid in book}
    # A class body replacing __main__'s functions, and delegation by torch.sys.modules,
    # operator.attrgetter, functools.reduce(getattr, ...) and getattr(module, "name").
    routes = book["clase_y_rutas"]
    assert [routes[c] for c in FUNCTIONS] == ["0"] * 4, routes
    assert feedback["clase_y_rutas"].count("no está disponible en el corrector") == 4
    # Frames walked up to a channel, forged answers, exit; the kernel hiding its own error.
    frames = book["marcos_y_kernel"]
    assert frames["kv_bytes_per_token"] == "0" and frames["runs"] == "0", frames
    assert "el kernel no mostró este error" in feedback["marcos_y_kernel"]
    # f_locals["expected"] of the caller; the hidden checks opened and raised.
    spy = book["espia"]
    assert (spy["fit_growth"], spy["sequences_that_fit"]) == ("0", "0"), spy
    private = [ln.strip() for ln in HIDDEN_KV.read_text(encoding="utf-8").splitlines()
               if ln.startswith("def _")]  # the hidden checks' own helpers: nowhere public
    assert len(private) >= 4
    for sid, text in feedback.items():
        assert not [ln for ln in private if ln[:20] in text], sid
        assert "assessments/" not in text and "hidden_checks" not in text, sid
    # A library table rewritten in place for a wrong formula; a literal table of old cases.
    table = book["tabla"]
    assert (table["kv_bytes_per_token"], table["sequences_that_fit"]) == ("0", "0"), table
    # Hidden cases come from the run's secret: the nonce is recorded, the secret is not.
    text = (out / "run.json").read_text(encoding="utf-8")
    run = json.loads(text)
    assert (run["lab"], run["nonce"], run["secret_source"]) == ("kv_cache", "pruebas", "entorno")
    assert len(run["secret_fingerprint"]) == 16
    assert os.environ["AI_EVOLUTION_GRADING_SECRET"] not in text


def test_no_other_students_file_or_grade_changes(attacked):
    folder, out = attacked["folder"], attacked["out"]
    book = rows(out / "gradebook.csv")
    assert book["honesto"]["total"] == "13"
    if isolation() == "bwrap":  # in a session of its own a notebook can write the user's files
        assert book["vecino"]["total"] == "13"
        after = snapshot(folder)
        assert after == attacked["before"]
        executed = (out / "executed" / "vecino.ipynb").read_text(encoding="utf-8")
        assert "ocultas: 0" in executed


def test_pathological_files_cost_only_their_own_row(attacked):
    out = attacked["out"]
    book = rows(out / "gradebook.csv")
    feedback = {sid: (out / "feedback" / f"{sid}.md").read_text(encoding="utf-8") for sid in book}
    for sid in ("enlace", "tuberia", "recursion"):
        assert book[sid]["status"] == "refused" and book[sid]["total"] == "0", book[sid]
    assert "enlace simbólico" in book["enlace"]["reason"] and "FIFO" in book["tuberia"]["reason"]
    assert "anida" in book["recursion"]["reason"]
    # A name in any bytes: graded like any other, shown with replacement characters.
    assert book["no_utf8"]["total"] == "13", book["no_utf8"]
    assert "no_utf8_\ufffd\ufffd.ipynb" in feedback["no_utf8"]
    # A newline in a name forges no line; the long names got two short, distinct ids.
    forged = "ana_-_Puntuación_automática_13_de_13"
    assert [ln for ln in feedback[forged].splitlines() if "13 de 13" in ln] == \
        [ln for ln in feedback[forged].splitlines() if ln.startswith("- Archivo entregado:")]
    assert {"a" * 59, "a" * 59 + "-2"} <= set(book)
    full = book["llena_disco"]
    assert full["status"] == "disk" and f"{DISK_MB} MiB" in full["reason"], full
    if isolation() == "bwrap":
        tmp = book["llena_tmp"]
        assert tmp["status"] == "error" and "No space left" in tmp["reason"], tmp
    record = json.loads((out / "grading.json").read_text(encoding="utf-8"))
    assert record["ai_evolution"] == __version__ and record["students"] == len(book)
    # The honest copies of the published solution are flagged for a person, with no points off.
    assert book["solucion"]["similarity"] == "la solución publicada: 100 %"
    assert book["solucion"]["total"] == "13" and book["sin_tocar"]["similarity"] == ""


# --- fast, in-process: the static parts ------------------------------------------------------------

def test_delegation_is_found_by_identity_alias_wrapper_and_partial():
    a = find_assessment("kv_cache")
    crit = next(c for c in a.functions if c.id == "fit_growth")
    forbidden = forbidden_for(crit, resolve_reference)
    ref = resolve_reference(crit.reference)
    import functools

    def built(source):
        nb = notebook(source)
        ns = {"__name__": "entrega", "np": __import__("numpy")}
        for stmt in extract(nb, {"np"}).statements:
            exec(compile(stmt.source, f"<celda {stmt.cell}>", "exec"), ns)  # noqa: S102
        return ns["fit_growth"]

    assert delegation(ref, forbidden) and delegation(functools.partial(ref), forbidden)
    assert delegation(built("from ai_evolution.claims import fit_growth"), forbidden)
    assert delegation(built("from ai_evolution import timing\ndef fit_growth(n, t):\n"
                            "    return timing.fit_growth(n, t)"), forbidden)
    assert delegation(built("from ai_evolution.timing import fit_growth as f\n_g = f\n"
                            "def _h(n, t):\n    return _g(n, t)\n"
                            "def fit_growth(n, t):\n    return _h(n, t)"), forbidden)
    # A call the checker does not run (not a definition): the plain def is what gets graded...
    plain = built("def fit_growth(n, t, _f=None):\n    return _f(n, t)\n"
                  "import functools as _ft\nfrom ai_evolution.timing import fit_growth as _r\n"
                  "fit_growth = _ft.partial(fit_growth, _f=_r)")
    assert not isinstance(plain, functools.partial) and delegation(plain, forbidden) is None
    # ...and a partial that carries the reference as an argument delegates.
    assert delegation(functools.partial(plain, _f=ref), forbidden)
    _, solved = solution_cells()
    assert delegation(built(solved[2]), forbidden) is None  # the real solution is its own code


def test_a_class_exercise_may_subclass_the_library_but_must_write_its_methods():
    a = find_assessment("paged_attention")
    crit = next(c for c in a.functions if c.id == "block_pool")
    forbidden = forbidden_for(crit, resolve_reference)
    from ai_evolution.engine import BlockPool

    def cls(body):
        ns = {"__name__": "entrega", "BlockPool": BlockPool}
        name = crit.name  # the notebook's class name, RefCountedBlockPool
        exec(compile(f"class {name}(BlockPool):\n{body}", "<celda 1>", "exec"), ns)  # noqa: S102
        return ns[name]

    mine = cls("    def allocate(self, n):\n        return None\n"
               "    def free(self, blocks):\n        pass\n")
    assert delegation(mine, forbidden, crit.methods) is None
    assert "no define `free`" in delegation(cls("    def allocate(self, n):\n        return None\n"),
                                            forbidden, crit.methods)
    lazy = cls("    def allocate(self, n):\n        return super().allocate(n)\n"
               "    def free(self, blocks):\n        pass\n")
    assert "super" in delegation(lazy, forbidden, crit.methods)
    named = cls("    def allocate(self, n):\n        return BlockPool.allocate(self, n)\n"
                "    def free(self, blocks):\n        pass\n")
    assert "BlockPool.allocate" in delegation(named, forbidden, crit.methods)
    assert delegation(BlockPool, forbidden, crit.methods)


def test_the_screen_keeps_definitions_and_refuses_what_could_reach_the_grader():
    nb = notebook("import numpy as np\nx = np.zeros(3)\nprint(x)\nLIMIT = 2 ** 10\n"
                  "def f(a):\n    return np.sum(a) * LIMIT",
                  "import os\ndef g():\n    return os.getpid()",  # g runs, without os
                  "def h(fn):\n    return fn.__globals__",
                  "def k(path):\n    return open(path).read()",
                  "import numpy as np\ndef m(a):\n    np.allclose = lambda *x, **y: True\n    return a",
                  "def n(block):\n    block.ref_cnt -= 1\n    return block._free",
                  "%matplotlib inline\nimport math")
    found = extract(nb, set())
    kept = {n for s in found.statements for n in s.defines}
    refused = {n: r.reason for r in found.rejected for n in r.defines}
    assert {"np", "LIMIT", "f", "g", "n", "math"} <= kept and "x" not in kept
    assert set(refused) == {"os", "h", "k", "m"}
    assert "__globals__" in refused["h"] and "open" in refused["k"]
    assert "np.allclose" in refused["m"]


def test_rebinding_the_injected_parameters_is_found():
    assert parameter_rebinds(notebook("from ai_evolution.labs import resolve_profile\n"
                                      "profile = resolve_profile(profile)",
                                      "for k in range(3):\n    print(seed + k)",
                                      "def f(seed):\n    return seed")) == []
    found = parameter_rebinds(notebook("x = 1", "seed = 7", "def f():\n    global profile\n"
                                       "    profile = 'full'", "globals()['seed'] = 3",
                                       "for seed in range(2):\n    pass"))
    assert [f.split(":")[0] for f in found] == ["celda de código 3", "celda de código 4",
                                                "celda de código 5", "celda de código 6"]


def test_the_checks_logic_is_unchanged_for_the_graded_names(one_thread):
    # grade_namespace (what the checker runs) still gives the solution full marks.
    a = find_assessment("kv_cache")
    imports, solved = solution_cells()
    ns: dict = {"seed": 0, "profile": "ci", "__name__": "entrega"}
    with contextlib.redirect_stdout(io.StringIO()):
        exec(imports, ns)  # noqa: S102
        for source in solved:
            exec(source, ns)  # noqa: S102
        result = grade_namespace(ns, a, 0)
    assert all(r["passed"] for r in result["functions"].values()), result


# --- scale-out ------------------------------------------------------------------------------------

def test_shards_partition_the_students_deterministically():
    ids = [f"estudiante_{i:03d}" for i in range(200)]
    parts = [{sid for sid in ids if shard_of(sid, 4) == i} for i in range(1, 5)]
    assert set().union(*parts) == set(ids) and sum(map(len, parts)) == len(ids)
    assert all(30 <= len(p) <= 70 for p in parts)
    assert [shard_of(sid, 4) for sid in ids] == [shard_of(sid, 4) for sid in ids]
    assert parse_shard("2/8") == (2, 8)
    for bad in ("0/3", "4/3", "a/b", "3"):
        with pytest.raises(ValueError):
            parse_shard(bad)


def test_merge_joins_shards_into_the_gradebook_of_one_run(tmp_path):
    header = "student_id,runs,total,max_total,status,reason,isolation\n"
    one, two = tmp_path / "uno", tmp_path / "dos"
    for folder, lines in ((one, ["b,1,1,1,ok,,bwrap\n"]), (two, ["a,0,0,1,error,\"x, y\",bwrap\n",
                                                                  "c,1,1,1,ok,,bwrap\n"])):
        (folder / "feedback").mkdir(parents=True)
        (folder / "gradebook.csv").write_text(header + "".join(lines), encoding="utf-8")
        for line in lines:
            (folder / "feedback" / f"{line[0]}.md").write_text(line, encoding="utf-8")
    merged = tmp_path / "todo"
    done = subprocess.run([sys.executable, "-m", "ai_evolution.grading", "merge", str(merged),
                           str(one), str(two)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (merged / "gradebook.csv").read_text(encoding="utf-8") == \
        header + "a,0,0,1,error,\"x, y\",bwrap\nb,1,1,1,ok,,bwrap\nc,1,1,1,ok,,bwrap\n"
    assert sorted(p.name for p in (merged / "feedback").iterdir()) == ["a.md", "b.md", "c.md"]
    # The shards of one run share its nonce; shards graded with other nonces do not merge.
    for folder in (one, two):
        (folder / "run.json").write_text('{"nonce": "n1"}\n', encoding="utf-8")
    merge_outputs([one, two], tmp_path / "con_nonce")
    assert (tmp_path / "con_nonce" / "run.json").read_text(encoding="utf-8") == '{"nonce": "n1"}\n'
    (two / "run.json").write_text('{"nonce": "n2"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match="nonces distintos"):
        merge_outputs([one, two], tmp_path / "mezcla")
    (two / "run.json").unlink()
    (one / "run.json").unlink()
    with pytest.raises(ValueError, match="dos libros"):
        merge_outputs([one, one], tmp_path / "doble")
    (two / "gradebook.csv").write_text("student_id,otra\n", encoding="utf-8")
    bad = subprocess.run([sys.executable, "-m", "ai_evolution.grading", "merge",
                          str(tmp_path / "mal"), str(one), str(two)], capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 2 and "columnas" in bad.stderr


def test_a_shard_grades_only_its_students(tmp_path):
    folder = tmp_path / "entregas"
    folder.mkdir()
    names = [f"e{i}" for i in range(6)]
    for name in names:
        (folder / f"{name}.ipynb").write_text("no es un cuaderno", encoding="utf-8")  # cheap
    mine = sorted(sid for sid, _ in student_ids(list(folder.glob("*.ipynb")))
                  if shard_of(sid, 3) == 2)
    done = subprocess.run([sys.executable, "-m", "ai_evolution.grading", "--lab", "kv_cache",
                           str(folder), "--out", str(tmp_path / "notas"), "--shard", "2/3"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert sorted(rows(tmp_path / "notas" / "gradebook.csv")) == mine
    assert subprocess.run([sys.executable, "-m", "ai_evolution.grading", "--lab", "kv_cache",
                           str(folder), "--shard", "4/3"], capture_output=True,
                          timeout=120).returncode == 2


# --- every lab's solution, rebuilt from its notebook, passes in the checker -----------------------

@pytest.fixture(scope="module")
def zygote():
    """One checker zygote for the module's direct ``check_functions`` calls, as one grading run
    has (ai_evolution/grading/zygote.py)."""
    from ai_evolution.grading.zygote import checker_zygote

    with checker_zygote() as z:
        yield z


@pytest.mark.parametrize("kind", ["roofline", "kv_cache", "continuous_batching",
                                  "paged_attention", "scheduler", "observability",
                                  "quantization", "flash_attention", "speculative",
                                  "determinism", "hybrid", "operations",
                                  "distributed"])
def test_each_lab_solution_rebuilt_in_the_checker_gets_every_function_point(kind, tmp_path,
                                                                          zygote):
    """The screen accepts the solutions' exercise cells, the lab's setup imports are enough to
    rebuild them in the function worker (on the library without the lab's references), no
    delegation is seen, and every check passes through the plain-data proxy (~20-60 s a lab)."""
    import ast

    from ai_evolution.grading import setup_lines
    from ai_evolution.grading.checker import check_functions

    a = find_assessment(kind)
    setup = list(setup_lines(a.lab_folder))
    names = {n for line in setup for stmt in ast.parse(line).body
             for n in [x.asname or x.name.split(".")[0] for x in stmt.names]}
    nb = nbformat.read(a.lab_folder / "notebook_solution.ipynb", as_version=4)
    results, flags = check_functions(a, 0, extract(nb, names), 120, 4096, tmp_path, setup)
    assert {cid: r["passed"] for cid, r in results.items()} == \
        {c.id: True for c in a.functions}, results
    assert flags == []


@pytest.mark.skipif(isolation() != "bwrap", reason="bubblewrap (bwrap) no está disponible")
def test_the_bwrap_sandbox_sees_only_the_library_and_its_own_scratch():
    from ai_evolution.grading.sandbox import _base_env, command, new_scratch

    script = f"""import json, os, socket, ai_evolution
def writable(path):
    try:
        with open(os.path.join(path, "x.txt"), "w") as fh:
            fh.write("x")
        return True
    except OSError:
        return False
print(json.dumps({{
    "assessments": os.path.exists({str(ROOT / "assessments")!r}),
    "tests": os.path.exists({str(ROOT / "tests")!r}),
    "library": os.path.exists(os.path.dirname(ai_evolution.__file__)),
    "library_writable": writable(os.path.dirname(ai_evolution.__file__)),
    "scratch_writable": writable("."),
    "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
    "interfaces": sorted(name for _, name in socket.if_nameindex()),
}}))
"""
    scratch = new_scratch()
    try:
        cmd = command("ai_evolution.grading.worker", scratch, "bwrap")
        cmd = cmd[:cmd.index("--") + 1] + [sys.executable, "-c", script]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                              env=_base_env(scratch, "prueba"))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["library"] and seen["scratch_writable"]
    assert not (seen["assessments"] or seen["tests"] or seen["library_writable"])
    assert len(seen["pids"]) <= 3 and seen["interfaces"] == ["lo"]


# --- the function worker, driven directly (one worker start, a few seconds) -----------------------

WORKER_CODE = {
    "subclass": "def subclass():\n    class D(dict):\n        pass\n    return D(a=1)\n",
    "custom": "def custom():\n    class C:\n        pass\n    return [C()]\n",
    "huge": "def huge():\n    return 'x' * (70 * 2 ** 20)\n",
    "hang": "def hang():\n    while True:\n        pass\n",
    "flood": "def flood():\n    for _ in range(200):\n        print('x' * 100000)\n    return 1\n",
    "leave": "def leave():\n    s = torch.sys\n    s.modules['os']._exit(3)\n",
    "routes": ("def routes(config):\n"
               "    m = torch.sys.modules['importlib'].import_module('ai_evolution.model.memory')\n"
               "    return functools.reduce(getattr, ['kv_bytes_per_token'], m)(config, 'fp16')\n"),
    "peek": ("def peek():\n    b = torch.sys.modules['builtins']\n"
             "    with getattr(b, 'open')({path!r}) as fh:\n        raise ValueError(fh.read())\n"),
    "write": "def write(cache):\n    cache[0, 1] = 5.0\n    return cache.sum()\n",
    "frames": ("def frames():\n    s = torch.sys\n    f, names = s._getframe(0), []\n"
               "    while f is not None:\n        names += list(getattr(f, 'f_locals'))\n"
               "        f = getattr(f, 'f_back')\n    return sorted(set(names))\n"),
}


def test_the_worker_answers_plain_data_only_and_survives_what_its_code_does(tmp_path):
    """A returned subclass or custom object fails the call with a Spanish reason; a huge answer
    is refused; a hang or an exit costs that call and the worker restarts; printing floods
    nothing; the references are not in its library; the hidden checks are not readable (with
    bubblewrap) and never reach a message; in-place writes come back; its frames hold nothing
    of the checker's."""
    import torch

    from ai_evolution.grading import stripped
    from ai_evolution.grading.proxy import FunctionWorker, StudentError, WorkerLost, redactor

    a = find_assessment("kv_cache")
    library = stripped.build(a, tmp_path / "lib")
    code = {k: v.format(path=str(HIDDEN_KV)) for k, v in WORKER_CODE.items()}
    statements = [{"cell": 1, "source": "import functools\nimport torch", "defines": ["torch"]}] + \
        [{"cell": i + 2, "source": src, "defines": [name]} for i, (name, src) in enumerate(code.items())]
    job = {"setup": [], "statements": statements, "seed": 0, "params": {}, "memory_mb": 4096,
           "graded": [{"name": n, "reference": "ai_evolution.model:kv_bytes_per_token",
                       "delegates": [], "methods": []} for n in code]}
    worker = FunctionWorker(job, library, isolation(), 4096, tmp_path / "w.log", {},
                            redact=redactor(HIDDEN_KV.parent), call_limit_s=8)
    try:
        ready = worker.start()
        assert set(ready["kinds"]) == set(code), ready
        for name in ("subclass", "custom", "huge"):
            with pytest.raises(StudentError) as err:
                worker.call(name, (), {})
            assert "no puede cruzar" in err.value.feedback or "MiB" in err.value.feedback
        with pytest.raises(WorkerLost, match="superó 8 s"):
            worker.call("hang", (), {})
        assert worker.call("flood", (), {}) == 1  # restarted, and prints go nowhere
        with pytest.raises(WorkerLost, match="terminó"):
            worker.call("leave", (), {})
        with pytest.raises(NotImplementedError, match="no está disponible en el corrector"):
            worker.call("routes", (get_preset_config(),), {})
        with pytest.raises(StudentError) as err:
            worker.call("peek", (), {})
        text = HIDDEN_KV.read_text(encoding="utf-8")
        assert "def _kv_bytes_edges" in text and "_kv_bytes_edges" not in err.value.feedback
        assert "assessments" not in err.value.feedback
        if isolation() == "bwrap":
            assert "FileNotFoundError" in err.value.feedback
        cache = torch.zeros(2, 3)
        assert worker.call("write", (cache,), {}).item() == 5.0 and cache[0, 1].item() == 5.0
        seen = worker.call("frames", (), {})
        assert not {"expected", "key", "channel", "ctx", "assessment"} & set(seen), seen
    finally:
        worker.stop()


def get_preset_config():
    from ai_evolution.model import get_preset

    return get_preset("llama-3.1-8b")
