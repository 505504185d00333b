"""Lab 10 (determinism): a real small run's contract rebuilds its claims from their numbers, the
mode's logits are bit-equal at every batch size and dtype, its identical copies give one answer,
the same seed gives the same contract, and the verdicts take the branch hand-made numbers call
for."""

from __future__ import annotations

import pytest

from ai_evolution import claims
from ai_evolution.labs import LabParamError, run_lab, without_volatile
from ai_evolution.labs import determinism as lab

# A real, small ``ci`` run (seconds).
FAST = dict(dtypes=["fp32", "bf16"], batch_sizes=[2, 8], prompts=8, prompt_len=8, new_tokens=6,
            copies=4, composition_batch=6, composition_tokens=8, cost_batches=[1, 2], cost_tokens=3,
            cost_reps=2,
            identical=6, rate=200.0, max_num_seqs=8)

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def contract():
    return run_lab("determinism", seed=3, profile="ci", **FAST)


def test_a_real_run_gives_bit_equal_logits_with_the_mode_and_rebuilds_its_claims(contract):
    assert claims.recheck_contract(contract) == []
    r = contract["results"]
    assert r["chapter_criteria"] == {"invariant_logits": True, "invariant_composed": True,
                                   "invariant_identical": True}
    for dtype in ("fp32", "bf16"):
        rows = r["divergence"][dtype]["invariant"]
        assert [row["batch_size"] for row in rows] == [2, 8]
        assert all(row["bit_equal"] and row["max_abs_diff"] == 0.0 for row in rows)
    for case in r["identical"].values():
        assert case["invariant"]["distinct"] == 1 and case["invariant"]["copies"] == 6
    (composed,) = r["composed"].values()
    assert composed["invariant"]["copies"] == 4 and composed["invariant"]["distinct"] == 1
    assert composed["invariant"]["differing_from_solo"] == 0
    assert composed["invariant"]["first_logit_steps"] == [None] * 4
    assert composed["usual"]["batch_sizes"][0] == 1  # the first copy is served alone
    # fp32 on this CPU: the usual kernels change the bits with the batch (the GEMV/GEMM switch)
    assert max(row["max_abs_diff"] for row in r["divergence"]["fp32"]["usual"]) > 0


@pytest.mark.slow  # a whole lab, a long soak or a sampling statistic: `make test` only
def test_the_same_seed_gives_the_same_contract(contract):
    again = run_lab("determinism", seed=3, profile="ci", **FAST)
    assert without_volatile(again) == without_volatile(contract)


def _rows(diffs, steps=None):
    steps = steps or [None] * len(diffs)
    return [{"batch_size": b, "max_abs_diff": d, "bit_equal": d == 0.0, "first_divergent_step": s}
            for b, d, s in zip((2, 8), diffs, steps)]


def _identical(usual_distinct, invariant_distinct, copies=10):
    return {m: {"distinct": n, "differing": n - 1, "copies": copies, "largest_batch": 8,
                "mean_batch": 4.0} for m, n in (("usual", usual_distinct), ("invariant", invariant_distinct))}


def test_verdicts_take_the_branch_the_numbers_call_for():
    divergence = {"bf16": {"usual": _rows([0.0625, 0.125], [None, 3]), "invariant": _rows([0.0, 0.0])}}
    found = lab.verdicts(divergence, {"voraz bf16": _identical(3, 1)})
    assert found["usual_bf16"].outcome == claims.FAILED          # the bits change with the batch
    assert found["invariant_bf16"].outcome == claims.PASSED
    assert found["identical_voraz bf16_usual"].outcome == claims.FAILED
    assert found["identical_voraz bf16_invariant"].outcome == claims.PASSED
    assert "paso 3 (lote 8)" in lab.divergence_sentence("bf16", divergence["bf16"]["usual"])
    broken = {"bf16": {"usual": _rows([0.0, 0.0]), "invariant": _rows([0.0, 1e-3])}}
    f = lab.Findings.from_measurements({}, broken, {"voraz bf16": _identical(1, 2)})
    assert f.found["usual_bf16"].outcome == claims.PASSED        # nothing to remove here
    assert f.criteria_met == {"invariant_logits": False, "invariant_composed": False,
                             "invariant_identical": False}
    assert "ni sus logits" in lab.divergence_sentence("bf16", broken["bf16"]["usual"])


def test_composed_verdicts_and_sentence_take_the_branch_the_numbers_call_for():
    def modes(usual_steps, invariant_steps):
        def one(steps):
            differ = sum(x is not None for x in steps)
            return {"copies": len(steps), "distinct": 1 + bool(differ), "differing_from_solo": differ,
                    "batch_sizes": [1, 4, 9], "first_token_steps": steps,
                    "first_logit_steps": [None if x is None else 1 for x in steps],
                    "max_abs_diff": 0.0625 if differ else 0.0}
        return {"usual": one(usual_steps), "invariant": one(invariant_steps)}

    diverged = {"voraz bf16": modes([None, 8, 8], [None, None, None])}
    found = lab.verdicts({}, {}, diverged)
    assert found["composed_usual"].outcome == claims.FAILED
    assert found["composed_invariant"].outcome == claims.PASSED
    assert "2 de 2 copias" in lab.composed_sentence("voraz bf16", diverged["voraz bf16"]["usual"])
    calm = {"voraz bf16": modes([None, None, None], [None, 3, None])}
    f = lab.Findings.from_measurements({}, {}, {}, composed=calm)
    assert f.found["composed_usual"].outcome == claims.PASSED    # no divergence here: said so
    assert "no divergió" in f.found["composed_usual"].text
    assert f.criteria_met["invariant_composed"] is False
    assert "ninguna de las 3 copias" in lab.composed_sentence("voraz bf16", calm["voraz bf16"]["usual"])


def test_compositions_are_seeded_and_the_first_copy_is_alone():
    pool = [[i] * 10 for i in range(3, 20)]
    a, b = lab.compositions(6, pool, 8, seed=1), lab.compositions(6, pool, 8, seed=1)
    assert a == b and a[0] == {"others": [], "place": 0}
    assert all(2 <= len(c["others"]) + 1 <= 8 for c in a[1:])
    assert a != lab.compositions(6, pool, 8, seed=2)


def test_first_divergence():
    assert lab.first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert lab.first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert lab.first_divergence([1, 2], [1, 2, 3]) == 2


def test_bad_parameters_are_refused_in_spanish():
    with pytest.raises(LabParamError, match="no puede pasar del número de prompts"):
        run_lab("determinism", profile="ci", batch_sizes=[2, 64], prompts=8)
    with pytest.raises(LabParamError, match="valores aceptados"):
        run_lab("determinism", profile="ci", dtypes=["fp8"])
