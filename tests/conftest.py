"""Fixtures shared by the tests: small models, one thread, and the book built once per session."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ai_evolution.model.checkpoint import load_pretrained, random_model


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


def _jupyter_book() -> str:
    candidate = Path(sys.executable).with_name("jupyter-book")
    if candidate.exists():
        return str(candidate)
    found = shutil.which("jupyter-book")
    assert found, "jupyter-book is not installed in this environment"
    return found


@pytest.fixture(scope="session")
def built_book(tmp_path_factory):
    """The book built exactly as `make book` builds it (`--all -W -n --keep-going`, labs in the
    `ci` profile), into an empty folder (so every page executes from scratch). The executed lab
    notebooks it leaves in `_build/jupyter_execute/` are the first execution the notebook tests
    check (nbval re-executes them once more): each lab runs twice in the whole suite, not three
    times. Returns the output folder and the build's exit code and log."""
    out = tmp_path_factory.mktemp("book")
    env = dict(os.environ, AI_EVOLUTION_PROFILE="ci")
    cmd = [_jupyter_book(), "build", "--all", "-W", "-n", "--keep-going", "--path-output", str(out),
           str(ROOT)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600)
    return {"out": out, "html": out / "_build" / "html", "executed": out / "_build" / "jupyter_execute",
            "returncode": proc.returncode, "log": proc.stdout[-8000:] + "\n" + proc.stderr[-8000:]}


@pytest.fixture(scope="session")
def graded_kv_cache(tmp_path_factory):
    """Lab 2's real solution, its untouched student copy, a broken solution and every attack of
    tests/test_grading_adversarial.py, graded in one CLI run. The solution's execution here is
    lab 2's second in the suite: its checked outputs are compared with the book's execution in
    place of an nbval run (tests/test_notebooks.py)."""
    from test_grading_adversarial import grade_attacks

    return grade_attacks(tmp_path_factory.mktemp("ataques"))


# `make check` (the everyday tier) runs `-m "not slow"`: no notebook execution, no book build, no
# real grading kernels. `make test` runs everything.
SLOW_MODULES = {"test_book.py", "test_grading.py", "test_grading_adversarial.py",
                "test_claims_under_load.py"}
SLOW_TESTS = {"test_student_notebook_stops_at_first_exercise_with_spanish_hint"}


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: executes notebooks, builds the book or grades real "
                                       "kernels (left out of `make check`)")


def pytest_collection_modifyitems(config, items):
    for item in items:
        name = getattr(item, "originalname", item.name)
        if (item.path.name in SLOW_MODULES or name in SLOW_TESTS
                or "built_book" in getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
