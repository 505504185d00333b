"""Claims: the branch a sentence takes is the one its numbers support, and it can be rebuilt."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ai_evolution import claims
from ai_evolution.labs import validate_contract
from ai_evolution.labs.contract import evidence

PHRASES = {"what": "A / B", "higher": "A gana", "lower": "B gana"}


def test_compare_separated_samples_pick_the_side_they_lie_on():
    fast, slow = [10.0, 10.2, 9.9, 10.1, 10.0], [5.0, 5.1, 4.9, 5.0, 5.2]
    c = claims.compare(fast, slow, **PHRASES)
    assert c.outcome == claims.HIGHER and "A gana" in c.text and c.value == pytest.approx(2.0)
    c = claims.compare(slow, fast, **PHRASES)
    assert c.outcome == claims.LOWER and "B gana" in c.text and c.value == pytest.approx(0.5)


def test_compare_overlapping_samples_are_inconclusive_and_say_so():
    a, b = [10.0, 6.0, 12.0, 7.0, 9.0, 8.0], [9.0, 11.0, 6.5, 8.0, 9.5, 7.5]
    c = claims.compare(a, b, **PHRASES)
    assert c.outcome == claims.INCONCLUSIVE
    assert "A gana" not in c.text and "B gana" not in c.text and "no es concluyente" in c.text


def test_one_measurement_never_decides():
    c = claims.compare([100.0], [1.0], **PHRASES)
    assert c.outcome == claims.INCONCLUSIVE and "una sola medición" in c.text


def test_paired_comparison_cancels_drift_that_unpaired_cannot():
    # The machine slows down over the run; A is always 10 % faster than B measured beside it.
    drift = np.linspace(1.0, 3.0, 8)
    a, b = 1.1 * drift, drift
    assert claims.compare(a, b, **PHRASES).outcome == claims.HIGHER
    assert claims.compare(a, b, paired=False, **PHRASES).outcome == claims.INCONCLUSIVE


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.1, 100), min_size=1, max_size=12),
       st.lists(st.floats(0.1, 100), min_size=1, max_size=12), st.booleans())
def test_compare_outcome_agrees_with_its_printed_interval(a, b, paired):
    if paired:
        b = (b * len(a))[: len(a)]
    c = claims.compare(a, b, paired=paired, **PHRASES)
    est = claims.ratio_estimate(a, b, paired=paired)
    assert c.value == pytest.approx(est.median)
    if c.outcome == claims.HIGHER:
        assert est.low > 1 and est.decisive
    elif c.outcome == claims.LOWER:
        assert est.high < 1 and est.decisive
    else:
        assert not est.decisive or est.low <= 1 <= est.high
    assert est.decisive == (est.coverage >= claims.DECISIVE) and est.low <= est.median <= est.high
    assert claims.recheck(c.evidence("x")) == []


def test_threshold_passes_fails_and_straddles():
    ok = claims.threshold(0.06, 0.15, what="error", passed="validado", failed="no validado")
    bad = claims.threshold(0.169, 0.15, what="error", passed="validado", failed="no validado")
    mid = claims.threshold(0.14, 0.15, what="error", passed="validado", failed="no validado",
                           interval=(0.10, 0.20))
    assert (ok.outcome, bad.outcome, mid.outcome) == (claims.PASSED, claims.FAILED, claims.INCONCLUSIVE)
    assert "16,9" in bad.text and "no validado" in bad.text.lower() and "15,0" in bad.text
    assert "validado" in ok.text.lower() and "no validado" not in ok.text.lower()
    assert "validado" not in mid.text.lower() and "no es concluyente" in mid.text
    above = claims.threshold(2.0, 1.5, what="ganancia", passed="sí", failed="no", below=False,
                             scale=1, unit="veces", decimals=2)
    assert above.outcome == claims.PASSED and "2,00 veces" in above.text


def test_growth_fit_is_non_negative_and_bounded():
    n = np.arange(1, 65)
    quad = 0.001 + 0.0002 * n + 0.00005 * n**2
    lin = 0.002 + 0.003 * n
    assert claims.fit_growth(n, quad)["exponent"] > 1.5
    assert claims.growth(n, quad, what="t").outcome == claims.SUPERLINEAR
    fit = claims.fit_growth(n, lin)
    assert fit["quadratic_share"] == pytest.approx(0, abs=1e-9) and fit["exponent"] < 1.01
    assert claims.growth(n, lin, what="t").outcome == claims.LINEAR
    # Concave data: plain least squares would give c2 < 0 and a share below 0.
    concave = 5 * np.sqrt(n)
    fit = claims.fit_growth(n, concave)
    assert min(fit["c0"], fit["c1"], fit["c2"]) >= 0
    assert 0 <= fit["quadratic_share"] <= 1 and 0 <= fit["exponent"] <= 2


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0, 1e3), min_size=3, max_size=30), st.integers(0, 2**31 - 1))
def test_growth_metrics_stay_in_range_for_any_data(t, seed):
    n = np.random.default_rng(seed).permutation(len(t)) + 1
    fit = claims.fit_growth(n, t)
    assert min(fit["c0"], fit["c1"], fit["c2"]) >= 0
    assert 0 <= fit["quadratic_share"] <= 1 and 0 <= fit["exponent"] <= 2


def test_nonneg_lstsq_matches_unconstrained_when_that_is_feasible():
    rng = np.random.default_rng(0)
    x = rng.random((20, 3))
    y = x @ np.array([1.0, 2.0, 0.5])
    assert np.allclose(claims.nonneg_lstsq(x, y), [1.0, 2.0, 0.5])


def test_claims_survive_json_and_the_contract_schema():
    items = [claims.compare([2, 2.1, 2.2], [1, 1.1, 1.0], **PHRASES).evidence("x"),
             claims.threshold(0.2, 0.15, what="e", passed="p", failed="f").evidence("fracción"),
             claims.growth([1, 2, 3, 4], [1, 4, 9, 16], what="t").evidence("exponente", "measured"),
             evidence("Sin afirmación que recomprobar.", 1, "x")]
    contract = {"schema_version": 1, "kind": "k", "seed": 0, "profile": "ci", "params": {},
                "environment": {"device": "cpu", "device_name": "cpu",
                                "versions": {"torch": "x", "ai_evolution": "y"}},
                "results": {}, "evidence": items, "limitations": ["Una limitación cualquiera."],
                "volatile_fields": []}
    validate_contract(contract)
    again = json.loads(json.dumps(contract))
    assert claims.recheck_contract(again) == []
    assert len(claims.claims_of(again)) == 3


def test_recheck_catches_a_statement_its_numbers_contradict():
    item = claims.compare([1, 1.1, 1.05, 1.0, 1.02, 1.08], [2, 2.1, 2.05, 2.0, 2.02, 2.1],
                          **PHRASES).evidence("x")
    assert item["claim"]["outcome"] == claims.LOWER
    lying = dict(item, statement=item["statement"].replace("B gana", "A gana"))
    assert any("statement" in p for p in claims.recheck(lying))
    tampered = json.loads(json.dumps(item))
    tampered["claim"]["inputs"]["a"] = [3, 3.1, 3.05, 3.0, 3.02, 3.08]
    problems = claims.recheck(tampered)
    assert any("outcome" in p for p in problems) and any("value" in p for p in problems)


def test_compare_a_tail_percentile():
    rng = np.random.default_rng(1)
    body = rng.exponential(1.0, 2000)
    tail = np.concatenate([body[:1900], 50 + rng.random(100)])  # same median, a far heavier tail
    assert claims.compare(tail, body, paired=False, q=99, **PHRASES).outcome == claims.HIGHER
    assert claims.compare(tail, body, paired=False, **PHRASES).outcome == claims.INCONCLUSIVE
    assert claims.recheck(claims.compare(tail, body, paired=False, q=99, **PHRASES).evidence("x")) == []



def test_compare_names_what_a_pair_is_and_rebuilds_with_it():
    a, b = [2, 2.1, 2.2, 2.05, 2.15], [1, 1.1, 1.0, 1.05, 1.02]
    usual = claims.compare(a, b, **PHRASES)
    assert "5 pares intercalados" in usual.text and "pairs" not in usual.inputs
    seeded = claims.compare(a, b, pairs="pares de cargas con la misma semilla", **PHRASES)
    assert "5 pares de cargas con la misma semilla" in seeded.text
    assert "intercalados" not in seeded.text and seeded.outcome == usual.outcome
    item = json.loads(json.dumps(seeded.evidence("x")))
    assert claims.recheck(item) == [] and claims.rebuild(item["claim"]).text == seeded.text

# --- intervals print the coverage they have ----------------------------------------------------
def test_order_interval_coverage_is_the_binomial_sum():
    # Three values: the widest interval is min-max, which covers the median 75 % of the time.
    assert claims.order_interval(3) == (1, 3, pytest.approx(0.75))
    assert claims.order_interval(5)[2] == pytest.approx(1 - 2 / 32)
    assert claims.order_interval(6)[2] == pytest.approx(1 - 2 / 64)
    for n in (9, 20, 101):
        l, u, cov = claims.order_interval(n)
        assert cov >= 0.95 and l + u == n + 1          # symmetric around the median
        pmf = claims.binomial_pmf(n, 0.5)
        assert cov == pytest.approx(pmf[l:u].sum())
    l, u, cov = claims.order_interval(2000, 0.99)
    assert 1950 < l < 1980 < u <= 2000 and cov >= 0.95


@pytest.mark.parametrize("n", [3, 5, 6, 9, 20])
def test_printed_coverage_holds_by_simulation(n):
    """Seeded and cheap: 4000 samples of n skewed values; the share of intervals that contain the
    true median matches the coverage the estimate prints (within 4 standard errors)."""
    rng = np.random.default_rng(n)
    trials, true_median = 4000, 1.0                      # lognormal(0, 1): median e^0 = 1
    data = rng.lognormal(0.0, 1.0, size=(trials, n))
    ests = [claims.estimate(row) for row in data]
    printed = ests[0].coverage
    assert all(e.coverage == printed for e in ests)
    hit = np.mean([e.contains(true_median) for e in ests])
    se = math.sqrt(printed * (1 - printed) / trials)
    assert abs(hit - printed) < 4 * se + 1e-9, (n, hit, printed)
    assert ests[0].decisive == (printed >= 0.90)
    # The bootstrap this replaced printed 95 % at any n: three values cover about 75 %.
    if n == 3:
        assert hit < 0.80


def test_paired_and_unpaired_coverage_by_simulation():
    rng = np.random.default_rng(7)
    trials, n = 3000, 7
    drift = rng.uniform(1, 3, size=(trials, n))          # shared by both members of a pair
    a = 1.2 * drift * rng.lognormal(0, 0.1, size=(trials, n))
    b = drift * rng.lognormal(0, 0.1, size=(trials, n))
    paired = [claims.ratio_estimate(x, y) for x, y in zip(a, b)]
    assert np.mean([e.contains(1.2) for e in paired]) >= paired[0].coverage - 4 * math.sqrt(
        paired[0].coverage * (1 - paired[0].coverage) / trials)
    x = rng.lognormal(0.2, 0.5, size=(trials, 12))
    y = rng.lognormal(0.0, 0.5, size=(trials, 12))
    unpaired = [claims.ratio_estimate(p, r, paired=False) for p, r in zip(x, y)]
    assert unpaired[0].method == claims.ORDER2
    # ORDER2 states a lower bound: the simulated coverage is at least that.
    assert np.mean([e.contains(math.exp(0.2)) for e in unpaired]) >= unpaired[0].coverage


def test_three_pairs_never_decide_six_can():
    fast, slow = [2.0, 2.1, 2.2], [1.0, 1.1, 1.0]
    c = claims.compare(fast, slow, **PHRASES)
    assert c.outcome == claims.INCONCLUSIVE and "A gana" not in c.text
    assert "rango" in c.text and "75" in c.text and "95" not in c.text
    c = claims.compare(fast * 2, slow * 2, **PHRASES)
    assert c.outcome == claims.HIGHER and "intervalo del 96" in c.text
    t = claims.threshold(0.05, 0.15, what="error", passed="validado", failed="no",
                         interval=claims.estimate([0.04, 0.05, 0.06]))
    assert t.outcome == claims.INCONCLUSIVE and "validado" not in t.text
    assert claims.recheck(t.evidence("x")) == []


# --- the book's formatter ----------------------------------------------------------------------
def test_markdown_is_one_sentence_with_its_number_in_bold():
    c = claims.compare([2.0, 2.1, 2.2, 2.0, 2.1, 2.2], [1.0, 1.1, 1.0, 1.0, 1.1, 1.0],
                       what="tokens/s de A / B", higher="A genera más tokens por segundo",
                       lower="B genera más")
    assert c.markdown == "Tokens/s de A / B: **2,10 veces**; A genera más tokens por segundo."
    table = claims.table({"x": c, "g": claims.growth([1, 2, 3, 4], [1, 2, 3, 4], what="tiempo")})
    lines = table.strip().splitlines()
    assert lines[0].startswith("| Medición | Valor |") and len(lines) == 4
    assert "intervalo del 96" in lines[2] and "6 pares" in lines[2] and "mayor que 1" in lines[2]
    for text in (c.markdown, table, c.text):
        assert claims.prose_problems(text) == []


@pytest.mark.parametrize("bad", ["con 1 hilo(s)", "la función `sdpa` gana", "en esta máquina: Tokens/s",
                                 "con H_B = 4", "**1,2 veces"])
def test_prose_problems_catch_each_defect(bad):
    assert claims.prose_problems(bad)


def test_prose_problems_accept_acronyms_after_a_colon():
    assert claims.prose_problems("en esta máquina: TTFT de 3 ms; criterio: H100") == []


def test_pasted_values_show_html_in_the_book_and_the_statement_to_the_contract_check():
    c = claims.compare([2.0, 2.1, 2.2, 2.0, 2.1, 2.2], [1.0, 1.1, 1.0, 1.0, 1.1, 1.0],
                       what="a < b", higher="A gana", lower="B gana")
    p = c.pasted()
    assert eval(repr(p)) == c.text                     # what myst-nb stores as text/plain
    assert p._repr_html_() == '<span class="verdict">A &lt; b: <strong>2,10 veces</strong>; A gana.</span>'
    assert claims.paste("Sin **nada** que decidir.").html == "Sin <strong>nada</strong> que decidir."
    t = claims.paste_table([c])
    assert t.text == claims.table([c]) and t.html.count("<tr>") == 2 and "a &lt; b" not in t.html
    assert "A &lt; b" in t.html and "<caption>Cómo se decidió</caption>" in t.html
    with pytest.raises(ValueError, match="al menos una"):
        claims.table([])


def test_a_range_whose_coverage_bound_is_zero_does_not_print_a_coverage():
    # Two tails of 30 and 32 values: each side's p99 interval covers little, so the bound on
    # the ratio's coverage (c_a + c_b - 1) is 0; "covers at least 0 %" would say nothing.
    rng = np.random.default_rng(3)
    c = claims.compare(rng.uniform(1, 2, 30), rng.uniform(1, 2, 32), paired=False, q=99,
                       **PHRASES)
    assert c.outcome == claims.INCONCLUSIVE
    assert "sin una cobertura que se pueda garantizar" in c.text and "0\u00a0%" not in c.text
    assert claims.recheck(c.evidence("x")) == []
