"""Try to make the book lie: every lab page states conclusions about this machine while other
work shares the cores with it; check that every claim in each page's contract is still exactly
what its own numbers give (the page glues the same claim objects, see ``test_notebooks.py``).

The book build executes its pages two at a time, one torch thread each, on a 2-core machine
(`scripts/execute_book.py`; in `make test` the other worker's tests take turns with the second
page for the other core), so a lab page's timings are taken on a busy machine, and the build
records how busy (each page's ``others_cpu_seconds``). A busy core slows the timings and can flip
a comparison; what must never happen is a sentence that says one branch while the numbers it
carries support another, or a decisive verdict built from intervals that overlap or from a range
whose coverage is under `claims.DECISIVE`. These checks read the book's own execution (the `ci`
profile, seed 0): the labs do not run a second time for them.
"""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest

from ai_evolution import claims
from ai_evolution.labs import get_spec, list_labs
from test_notebooks import _printed_contract

ROOT = Path(__file__).resolve().parents[1]
BUSY_CORES = 0.25  # the least the rest of the machine computes, on average, beside a page


def busy_claim_problems(contract: dict) -> list[str]:
    """What is wrong with a contract's claims: a sentence its inputs do not give
    (``claims.recheck_contract``), a decisive comparison whose printed interval contains 1 (or an
    inconclusive one whose interval excludes it), or a claim whose volatility does not follow its
    source (measured on this machine ⇔ volatile), or a verdict that does not read as prose in the
    book (``claims.prose_problems``: a "(s)" plural, backticks, a capital after a colon...)."""
    problems = list(claims.recheck_contract(contract))
    for item in claims.claims_of(contract):
        claim = item["claim"]
        if claim["kind"] == "compare":
            inputs = claim["inputs"]
            est = claims.ratio_estimate(inputs["a"], inputs["b"], paired=inputs["paired"],
                                        level=inputs["level"], seed=inputs["seed"],
                                        q=inputs.get("q", 50.0))
            decisive = claim["outcome"] in (claims.HIGHER, claims.LOWER)
            if decisive != (est.decisive and not est.contains(1.0)):
                problems.append(f"decisive={decisive} with interval {est}: {item['statement']}")
        prose = claims.rebuild(claim).markdown
        problems += [f"{p}: {prose}" for p in claims.prose_problems(prose)]
        if item.get("volatile", False) != (item["source"] == "measured"):
            problems.append(f"volatile={item.get('volatile')} for a {item['source']} claim: "
                            f"{item['statement']}")
    return problems


@pytest.mark.parametrize("kind", list_labs())
def test_claims_match_their_numbers_on_a_busy_machine(built_book, kind):
    folder = Path(get_spec(kind).folder)
    executed = built_book["executed"] / folder / "notebook_solution.ipynb"
    assert executed.is_file(), (f"the book build left no executed page for {kind} (build exit "
                                f"{built_book['returncode']}):\n{built_book['log'][-3000:]}")
    times = json.loads((built_book["out"] / "_build" / "execution_times.json").read_text())
    page = times["pages"][str(folder / "notebook_solution.md")]
    # The page really shared the machine: the rest of it (another page, or in `make test` the
    # other worker's tests: with the CPU slots two pages run together only while no test holds a
    # core) kept on average at least a quarter of a core busy while the page ran (0.75-1.0 in
    # `make test` on 2026-12-06).
    assert times["jobs"] >= 2, times["jobs"]
    assert page["others_cpu_seconds"] >= BUSY_CORES * page["seconds"], page
    contract = _printed_contract(nbformat.read(executed, as_version=4))
    assert contract["kind"] == kind
    problems = busy_claim_problems(contract)
    assert problems == [], "\n".join(problems)


def test_the_busy_machine_checks_find_a_flipped_verdict_and_a_wrong_volatility():
    """The checks above can fail: an inconclusive comparison printed as decisive, and a measured
    claim that is not marked volatile, are both reported."""
    same = claims.compare([1.0, 1.2, 0.9, 1.1], [1.05, 1.0, 1.0, 1.15], what="a / b",
                          higher="a es más lento", lower="a es más rápido",
                          inconclusive="no se distinguen", seed=0)
    assert same.outcome == claims.INCONCLUSIVE
    item = same.evidence("x")
    assert busy_claim_problems({"evidence": [item]}) == []
    flipped = json.loads(json.dumps(item))
    flipped["claim"]["outcome"] = claims.HIGHER
    assert any("decisive=True" in p for p in busy_claim_problems({"evidence": [flipped]}))
    steady = json.loads(json.dumps(item))
    steady["volatile"] = False
    assert any("volatile=False" in p for p in busy_claim_problems({"evidence": [steady]}))


def test_the_busy_machine_checks_find_a_verdict_that_does_not_read_as_prose():
    bad = claims.compare([2.0, 2.1, 2.2, 2.0, 2.1], [1.0, 1.1, 1.0, 1.0, 1.05],
                         what="tokens/s con 1 hilo(s)", higher="gana `sdpa`", lower="pierde")
    assert any("plural" in p for p in busy_claim_problems({"evidence": [bad.evidence("x")]}))
    assert any("invertidas" in p for p in busy_claim_problems({"evidence": [bad.evidence("x")]}))


def test_the_machines_busy_seconds_grow_by_what_another_process_computes():
    """``others_cpu_seconds`` rests on the machine-wide CPU counter: a process that spins for a
    second of CPU moves it by about that much (more when something else runs too)."""
    import subprocess
    import sys
    sys.path.insert(0, str(ROOT / "scripts"))
    from execute_book import _machine_busy_s

    spin = ("import time\nend = time.process_time() + 1.0\n"
            "while time.process_time() < end:\n    pass\n")
    before = _machine_busy_s()
    subprocess.run([sys.executable, "-c", spin], check=True, timeout=60)
    assert _machine_busy_s() - before >= 0.8
