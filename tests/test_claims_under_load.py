"""Try to make the book lie: run the labs that state conclusions about this machine while a
second process burns a core, and check that every claim in each contract is still exactly what
its own numbers give (the page glues the same claim objects, see ``test_notebooks.py``).

A busy core slows the timings and can flip a comparison; what must never happen is a sentence
that says one branch while the numbers it carries support another, or a decisive verdict built
from intervals that overlap.
"""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from ai_evolution import claims
from ai_evolution.labs import list_labs, run_lab

# The lab test modules keep each lab's small, fast parameters; reuse them so they stay in sync.
FAST_FROM = {
    "roofline": "test_lab_roofline",
    "kv_cache": "test_lab_kv_cache",
    "continuous_batching": "test_lab_continuous_batching",
    "paged_attention": "test_lab_paged_attention",
    "scheduler": "test_lab_scheduler",
    "observability": "test_lab_observability",
    "quantization": "test_lab_quantization",
    "flash_attention": "test_lab_flash_attention",
    "speculative": "test_lab_speculative",
}


def _fast_params(kind: str) -> dict:
    try:
        return dict(importlib.import_module(FAST_FROM[kind]).FAST)
    except (ImportError, AttributeError, KeyError):
        return {}


@pytest.fixture(scope="module")
def busy_core():
    """A second process spinning on one core for the whole module."""
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=10)


@pytest.mark.parametrize("kind", list_labs())
def test_claims_match_their_numbers_on_a_busy_machine(busy_core, kind):
    assert busy_core.poll() is None, "the burner process died"
    contract = run_lab(kind, seed=0, profile="ci", **_fast_params(kind))
    problems = claims.recheck_contract(contract)
    assert problems == [], "\n".join(problems)
    for item in claims.claims_of(contract):
        claim = item["claim"]
        if claim["kind"] == "compare":
            est = claims.ratio_estimate(claim["inputs"]["a"], claim["inputs"]["b"],
                                        paired=claim["inputs"]["paired"],
                                        level=claim["inputs"]["level"],
                                        seed=claim["inputs"]["seed"],
                                        q=claim["inputs"].get("q", 50.0))
            decisive = claim["outcome"] in (claims.HIGHER, claims.LOWER)
            # decisive only when the interval printed in the sentence excludes 1
            assert decisive == (est.n >= 2 and not est.contains(1.0)), item["statement"]
        assert item.get("volatile", False) == (item["source"] == "measured"), item["statement"]
