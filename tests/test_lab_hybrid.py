"""Lab 11 (hybrid): a real small run's contract rebuilds its claims from their numbers and its
memory arithmetic agrees with the models it builds, the same seed gives the same contract, the
student's step plugged into the model generates what the library's does, the verdicts take the
branch hand-made numbers call for, and bad parameters are refused in Spanish."""

from __future__ import annotations

import pytest
import torch

from ai_evolution import claims
from ai_evolution.generation import generate
from ai_evolution.labs import LabParamError, run_lab, without_volatile
from ai_evolution.labs import hybrid as lab
from ai_evolution.model.linear_attention import LinearAttentionState
from ai_evolution.reference.hybrid import (reference_delta_step, reference_reusable_tokens,
                                           reference_state_bytes)

# A real, small ``ci`` run (a few seconds): tiny models, two contexts, two batch sizes.
FAST = dict(hidden_size=128, num_layers=4, vocab_size=64, contexts=[8, 64], batch_sizes=[1, 3],
            batch_context=16, steps=2, rounds=3, probe_mib=16, probe_matmul=256,
            cache_block_size=4, checkpoint_intervals=[4, 16], prefix_lengths=[2, 4, 12, 20],
            prefix_requests=2, suffix_len=3, ttft_prefix=32, ttft_pairs=3)

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def contract():
    return run_lab("hybrid", seed=3, profile="ci", **FAST)


def test_a_real_run_rebuilds_its_claims_and_its_memory_is_the_models(contract):
    assert claims.recheck_contract(contract) == []
    r = contract["results"]
    configs = lab.lab_configs(contract["params"])
    hybrid = configs["hybrid"]
    # the arithmetic counts what the model really allocates for one sequence
    assert r["memory"]["state_bytes"] == LinearAttentionState(hybrid, 1).nbytes
    assert r["memory"]["state_bytes"] == reference_state_bytes(hybrid, 4.0)
    assert contract["environment"]["models"]["hybrid"]["attention_layers"] == 1
    assert contract["environment"]["models"]["transformer"]["linear_layers"] == 0
    per_token = r["memory"]["kv_bytes_per_token"]
    cross = r["memory"]["crossover"]
    assert per_token["hybrid"] * cross >= r["memory"]["state_bytes"] > per_token["hybrid"] * (cross - 1)
    even = r["memory"]["break_even"]
    hybrid_total = lambda n: per_token["hybrid"] * n + r["memory"]["state_bytes"]  # noqa: E731
    assert hybrid_total(even) < per_token["transformer"] * even
    assert hybrid_total(even - 1) >= per_token["transformer"] * (even - 1)
    # every timing sample exists, one per round, for every context / batch size and model
    for m in lab.MODELS:
        for c in FAST["contexts"]:
            assert len(r["context"][m][str(c)]["step_s"]) == FAST["rounds"]
        assert r["batching"][m]["batch_sizes"] == FAST["batch_sizes"]
        assert len(r["batching"][m]["round_ratios"][0]) == FAST["rounds"]
    assert len(r["context"]["hybrid"]["8"]["linear_s"]) == FAST["rounds"] * FAST["steps"]
    assert r["context"]["transformer"]["8"]["linear_s"] == []
    assert set(r["chapter_criteria"]) == {k for k, _ in lab.CRITERIA}


def test_the_gpu_table_matches_the_seed_articles_preset(contract):
    rows = {(f["model"], f["gpu_gb"], f["context"]): f for f in contract["results"]["fits"]}
    qwen = rows[("qwen3.5-9b", 80.0, 4096)]
    assert qwen["kv_bytes_per_token"] == 32 * 2**10          # 32 KiB per token (bf16)
    assert qwen["state_bytes"] > 48 * 2**20                  # 48 MiB of matrices + conv windows
    assert rows[("llama-3.1-8b", 80.0, 4096)]["state_bytes"] == 0
    # longer contexts: fewer sequences, and the hybrid holds more than the transformer at 32k
    for model in ("qwen3.5-9b", "llama-3.1-8b"):
        counts = [rows[(model, 80.0, c)]["sequences"] for c in (1024, 4096, 32768)]
        assert counts == sorted(counts, reverse=True)
    assert rows[("qwen3.5-9b", 80.0, 32768)]["sequences"] > rows[("llama-3.1-8b", 80.0, 32768)]["sequences"]


def test_the_same_seed_gives_the_same_contract(contract):
    again = run_lab("hybrid", seed=3, profile="ci", **FAST)
    assert without_volatile(again) == without_volatile(contract)


def test_a_students_step_plugged_into_the_model_generates_the_librarys_tokens():
    configs = lab.lab_configs(lab.SPEC.resolve_params("ci", FAST))
    model = lab.build_models({"hybrid": configs["hybrid"]}, 0, "cpu")["hybrid"]
    prompt = list(range(3, 15))
    calls = []

    def step(*args):
        calls.append(1)
        return reference_delta_step(*args)

    want, want_logits = lab.greedy_logits(model, prompt, 6)
    with lab.use_delta_step(step):
        got, got_logits = lab.greedy_logits(model, prompt, 6)
    assert got == want and len(calls) >= 5 * 3         # 5 decode steps x 3 linear layers
    assert torch.equal(got_logits, want_logits)         # the same operations: the same bits
    with lab.use_delta_step(lambda S, q, k, v, g, b: (torch.zeros_like(v), S)):
        _, broken = lab.greedy_logits(model, prompt, 6)
    assert torch.equal(broken[0], want_logits[0])       # the prompt runs the chunked form
    assert (broken[1:] - want_logits[1:]).abs().max() > 0   # a wrong step changes the logits
    assert torch.equal(lab.greedy_logits(model, prompt, 6)[1], want_logits)  # library's is back
    assert generate(model, prompt, 6)[0] == want


def _context(t_short, t_long, h_short, h_long, lin_short, lin_long):
    return {"transformer": {"8": {"step_s": t_short, "linear_s": []},
                            "64": {"step_s": t_long, "linear_s": []}},
            "hybrid": {"8": {"step_s": h_short, "linear_s": lin_short},
                       "64": {"step_s": h_long, "linear_s": lin_long}}}


def test_context_verdicts_take_the_branch_the_numbers_call_for():
    n = 6
    expected = _context([1.0] * n, [2.0, 2.1, 1.9, 2.0, 2.2, 2.05], [1.2] * n,
                        [1.4, 1.45, 1.35, 1.4, 1.5, 1.42], [0.5] * n,
                        [0.51, 0.5, 0.52, 0.49, 0.5, 0.5])
    found = lab.context_verdicts(expected, [8, 64], 0.25)
    assert found["context_transformer"].outcome == claims.HIGHER
    assert found["context_growth"].outcome == claims.HIGHER
    assert found["context_linear_flat"].outcome == claims.PASSED
    growing = _context([1.0] * n, [1.01, 0.99, 1.0, 1.02, 0.98, 1.0], [1.0] * n,
                       [2.0, 2.1, 1.9, 2.0, 2.2, 2.05], [0.5] * n, [1.0, 1.1, 0.9, 1.0, 1.2, 1.05])
    found = lab.context_verdicts(growing, [8, 64], 0.25)
    assert found["context_transformer"].outcome == claims.INCONCLUSIVE
    assert found["context_growth"].outcome == claims.LOWER
    assert found["context_linear_flat"].outcome == claims.FAILED
    few = lab.context_verdicts(_context([1.0] * 3, [2.0] * 3, [1.0] * 3, [1.1] * 3, [0.5] * 3,
                                        [0.5] * 3), [8, 64], 0.25)
    assert all(c.outcome == claims.INCONCLUSIVE for c in few.values())   # 3 pairs: no verdict
    assert "solo hay un rango" in few["context_transformer"].text


def test_batching_findings_find_the_departure_against_a_calibrated_roofline():
    params = lab.SPEC.resolve_params("ci", FAST)
    configs = lab.lab_configs(params)
    machine = {"bandwidth_bytes_per_s": 1e10, "peak_flops": 1e11}
    flat = {str(b): [1e-3] * 5 for b in (1, 3)}
    departs = {"1": [1e-3] * 5, "3": [3e-3, 3.1e-3, 2.9e-3, 3e-3, 3.2e-3]}
    found = lab.batching_findings(configs, {"transformer": flat, "hybrid": departs}, machine,
                                  params)
    assert found["transformer"]["departure_batch"] is None
    assert found["hybrid"]["departure_batch"] == 3
    assert found["hybrid"]["ms_per_extra_seq"] == pytest.approx(1.0)
    v = lab.batching_verdicts(found, params["tolerance"])
    assert v["batching_transformer"].outcome == claims.PASSED
    assert v["batching_hybrid"].outcome == claims.FAILED
    assert v["batching_growth"].outcome == claims.HIGHER
    assert "lote 3" in lab.batching_sentence("hybrid", found["hybrid"])
    # the calibration is on the smallest batch measured, whatever it is
    curve = lab.predicted_curve(configs["hybrid"], [2, 4], 16, 2e-3, machine)
    assert curve[0] == pytest.approx(2e-3) and curve[1] > curve[0]


def test_the_real_engine_shows_the_cliff_below_the_checkpoint_interval(contract):
    cache = contract["results"]["prefix_cache"]
    assert set(cache) == {"transformer", "hybrid-4", "hybrid-16"}
    hits = {label: {r["prefix_len"]: r["hit_tokens"] for r in s["rows"]}
            for label, s in cache.items()}
    # 2 repeats of each prefix; a hit is the prefix cut to a multiple of the interval
    assert hits["transformer"] == {2: 0, 4: 8, 12: 24, 20: 40}
    assert hits["hybrid-4"] == hits["transformer"]
    assert hits["hybrid-16"] == {2: 0, 4: 0, 12: 0, 20: 32}
    # finer checkpoints: more state copies for the same workload
    saves = {label: sum(r["checkpoint_saves"] for r in s["rows"]) for label, s in cache.items()}
    assert saves["transformer"] == 0 and saves["hybrid-4"] > saves["hybrid-16"] > 0
    ttft = contract["results"]["prefix_ttft"]
    assert ttft["hit_tokens"] == [32] * 3 and len(ttft["cold_s"]) == 3
    assert contract["results"]["chapter_criteria"]["prefix_cliff"] is True
    assert contract["results"]["chapter_criteria"]["prefix_rule"] is True


def test_prefix_verdicts_take_the_branch_the_counts_call_for():
    params = {"checkpoint_intervals": [4, 16], "prefix_lengths": [4, 20]}

    def setup(model, interval, hits):
        return {"model": model, "interval": interval, "checkpoint_bytes": 1.0,
                "rows": [{"prefix_len": L, "prompt_len": L + 3, "requests": 1, "hit_tokens": h,
                          "queried_tokens": L + 3, "truncated_tokens": 0, "checkpoint_saves": 1,
                          "expected_hit_tokens": reference_reusable_tokens(L, L + 3, interval)}
                         for L, h in zip((4, 20), hits)]}
    ttft = {"prefix_len": 32, "cold_s": [2.0, 2.1, 1.9, 2.0, 2.2],
            "hit_s": [1.0, 1.1, 0.9, 1.0, 1.0], "hit_tokens": [32] * 5}
    good = {"transformer": setup("transformer", 4, (4, 20)), "hybrid-4": setup("hybrid", 4, (4, 20)),
            "hybrid-16": setup("hybrid", 16, (0, 16))}
    v = lab.prefix_verdicts(good, ttft, params)
    assert v["prefix_cliff"].outcome == claims.PASSED
    assert v["prefix_transformer"].outcome == claims.PASSED
    assert v["prefix_rule"].outcome == claims.PASSED
    assert v["prefix_ttft"].outcome == claims.HIGHER
    leaky = dict(good, **{"hybrid-16": setup("hybrid", 16, (4, 16))})  # a hit below the interval
    v = lab.prefix_verdicts(leaky, dict(ttft, hit_s=ttft["cold_s"]), params)
    assert v["prefix_cliff"].outcome == claims.FAILED
    assert v["prefix_rule"].outcome == claims.FAILED
    assert "intervalo 16 con 4 tokens" in v["prefix_rule"].text
    assert v["prefix_ttft"].outcome == claims.INCONCLUSIVE
    assert reference_reusable_tokens(16, 16, 16) == 0  # one prompt token always left to compute


def test_bad_parameters_are_refused_in_spanish():
    with pytest.raises(LabParamError, match="múltiplo de full_every"):
        run_lab("hybrid", profile="ci", num_layers=6, full_every=4)
    with pytest.raises(LabParamError, match="de menor a mayor"):
        run_lab("hybrid", profile="ci", contexts=[64, 8])
    with pytest.raises(LabParamError, match="al menos dos contextos"):
        run_lab("hybrid", profile="ci", contexts=[64])
    with pytest.raises(LabParamError, match="múltiplo de 128"):
        run_lab("hybrid", profile="ci", hidden_size=200)
    with pytest.raises(LabParamError, match="valores aceptados"):
        run_lab("hybrid", profile="ci", kv_dtype="int3")
    with pytest.raises(LabParamError, match="múltiplos de cache_block_size"):
        run_lab("hybrid", profile="ci", checkpoint_intervals=[16, 40])
    with pytest.raises(LabParamError, match="más corto que el mayor"):
        run_lab("hybrid", profile="ci", checkpoint_intervals=[16], prefix_lengths=[16, 32])
