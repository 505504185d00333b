"""The PagedAttention lab: its contract, its determinism, its parameter errors, and conclusions
that take the branch their numbers support."""

import pytest

from ai_evolution import claims
from ai_evolution.checks import paged_attention as checks
from ai_evolution.engine import BlockPool, find_cached_prefix, hash_block
from ai_evolution.labs import LabParamError, assemble_contract, run_lab, without_volatile
from ai_evolution.labs.paged_attention import (Findings, block_size_sweep,
                                               datacenter_comparison, prefix_sentence, report,
                                               same_tokens_sentence, verdicts)
from checkutil import fails

FAST = dict(num_requests=10, prompt_len=16, mean_output=16, max_model_len=128, kv_rows=2,
            paged_max_num_seqs=8, block_size=8, block_sizes=[1, 8, 64], system_len=32, user_len=4,
            prefix_requests=4, prefix_output=4, chat_turns=3, dc_requests=160, dc_prompt_len=64,
            dc_mean_output=32, timing_repeats=3)  # 3 pairs: a range, cheap enough for a shape test


@pytest.fixture(scope="module")
def contract():
    return run_lab("paged_attention", seed=1, profile="ci", **FAST)


def test_contract_claims_are_what_their_numbers_give(contract):
    assert claims.recheck_contract(contract) == []
    kinds = {item["claim"]["inputs"]["what"] for item in claims.claims_of(contract)}
    assert len(kinds) == 3  # tokens/s, time per step, TTFT
    pairs = FAST["timing_repeats"]
    timing = contract["results"]["fragmentation_timing"]
    assert len(timing["paged_tok_s"]) == len(timing["contiguous_tok_s"]) == pairs
    assert len(contract["results"]["prefix_timing"]["ttft_mean_s_with"]) == pairs
    for item in contract["evidence"]:  # what the clock measured is volatile, nothing else is
        assert item.get("volatile", False) == (item["source"] == "measured"), item["statement"]


def test_paged_layout_uses_memory_better_and_admits_more(contract):
    f = contract["results"]["fragmentation"]
    assert f["outputs_identical"] and f["repeats_identical"]
    assert f["paged"]["mean_utilization"] > f["contiguous"]["mean_utilization"]
    assert f["contiguous"]["peak_batch"] == 2 < f["paged"]["peak_batch"]
    assert f["paged"]["steps"] < f["contiguous"]["steps"]
    assert f["paged"]["output_tokens"] == f["contiguous"]["output_tokens"]


def test_prefix_cache_saves_prefill_and_chat_turns_hit(contract):
    p = contract["results"]["prefix"]
    assert p["repeats_identical"]
    assert p["without_cache"]["hit_tokens"] == 0
    assert p["with_cache"]["hit_tokens"] == 3 * 32  # 3 later requests x the 32-token system prompt
    assert p["with_cache"]["prefill_tokens"] + p["with_cache"]["hit_tokens"] == p["without_cache"]["prefill_tokens"]
    chat = contract["results"]["chat"]
    assert chat[0]["hit_tokens"] == 0
    assert all(t["hit_tokens"] >= chat[i]["prompt_tokens"] // 8 * 8 - 8 for i, t in enumerate(chat[1:]))


def test_eviction_study_loses_the_prefix_only_in_small_pools(contract):
    ev = contract["results"]["eviction"]
    assert ev[0]["hit_tokens"] == 0 and ev[-1]["hit_tokens"] == 32
    assert [r["num_blocks"] for r in ev] == sorted(r["num_blocks"] for r in ev)


def test_datacenter_paged_admits_more(contract):
    dc = contract["results"]["datacenter"]
    assert dc["paged"]["peak_batch"] > dc["contiguous"]["peak_batch"]


@pytest.mark.slow  # a whole lab, a long soak or a sampling statistic: `make test` only
def test_same_seed_gives_the_same_contract_except_volatile_fields(contract):
    again = run_lab("paged_attention", seed=1, profile="ci", **FAST)
    assert without_volatile(again) == without_volatile(contract)


@pytest.mark.parametrize("lens,bs,waste,entries", [([16, 16], 16, 0.0, 1.0), ([17], 16, 15 / 32, 2.0),
                                                   ([1, 3], 4, 4 / 8, 1.0)])
def test_block_size_sweep_arithmetic(lens, bs, waste, entries):
    (row,) = block_size_sweep(lens, [bs])
    assert row["internal_waste"] == pytest.approx(waste) and row["mean_table_entries"] == entries


def test_bad_parameters_are_rejected_in_spanish():
    with pytest.raises(LabParamError, match="supera las 512 posiciones"):
        run_lab("paged_attention", profile="ci", max_model_len=1024)
    with pytest.raises(LabParamError, match="debe ser menor que max_model_len"):
        run_lab("paged_attention", profile="ci", prompt_len=200, max_model_len=128)
    with pytest.raises(LabParamError, match="block_size"):
        run_lab("paged_attention", profile="ci", block_size=0)


# --- report(): every conclusion follows the numbers it is given -----------------------------------
PARAMS = {"max_model_len": 128, "kv_rows": 2, "block_size": 8}
LAYOUT = {"steps": 90, "mean_utilization": 0.3, "peak_batch": 2, "mean_batch": 1.9,
          "num_preemptions": 0, "output_tokens": 160}


def measurements(paged_tok_s, contiguous_tok_s, ttft_with, ttft_without, dc_ratio=1.2):
    """Hand-made lab measurements in the shapes the lab's studies return."""
    paged = dict(LAYOUT, steps=60, mean_utilization=0.92, peak_batch=8, mean_batch=3.1)
    frag = {"contiguous": LAYOUT, "paged": paged, "outputs_identical": True,
            "repeats_identical": True, "final_lengths": [20, 40, 60],
            "timing": {"paged_tok_s": paged_tok_s, "contiguous_tok_s": contiguous_tok_s,
                       "paged_step_ms": [1e3 * 160 / t / 60 for t in paged_tok_s],
                       "contiguous_step_ms": [1e3 * 160 / t / 90 for t in contiguous_tok_s]}}
    prefix = {"with_cache": {"hit_tokens": 96, "prefill_tokens": 12, "prompt_tokens": 108,
                             "hit_rate": 96 / 108},
              "without_cache": {"hit_tokens": 0, "prefill_tokens": 108, "prompt_tokens": 108,
                                "hit_rate": 0.0},
              "repeats_identical": True,
              "timing": {"ttft_mean_s_with": ttft_with, "ttft_mean_s_without": ttft_without}}
    dc = {"kv_tokens": 10_000, "max_model_len": 4096, "throughput_ratio": dc_ratio,
          "contiguous": {"max_num_seqs": 2, "peak_batch": 2, "throughput_tok_s": 100.0,
                         "num_preemptions": 0},
          "paged": {"max_num_seqs": 256, "peak_batch": 4, "throughput_tok_s": 100.0 * dc_ratio,
                    "num_preemptions": 0}}
    return frag, block_size_sweep(frag["final_lengths"], [8, 16]), prefix, [], [], dc


def body_of(*args):
    frag, sweep, prefix, chat, eviction, dc = measurements(*args)
    v = verdicts(frag, prefix)
    body = report(Findings.from_measurements("tiny-es", PARAMS, frag, sweep, prefix, chat,
                                             eviction, dc, v))
    return v, body


FAST_SIDE, SLOW_SIDE = [300.0, 310.0, 305.0, 302.0, 308.0], [100.0, 104.0, 98.0, 101.0, 99.0]
NOISY_A, NOISY_B = [100.0, 300.0, 150.0, 250.0, 120.0], [200.0, 120.0, 180.0, 150.0, 240.0]
QUICK, SLOW = [0.010, 0.011, 0.0105, 0.0102, 0.0108], [0.030, 0.032, 0.029, 0.031, 0.030]

MORE, LESS = "los bloques generan más tokens", "los bloques generan menos tokens"
UNSURE = "no es concluyente"


@pytest.mark.parametrize("paged,contiguous,outcome,says", [
    (FAST_SIDE, SLOW_SIDE, claims.HIGHER, MORE),
    (SLOW_SIDE, FAST_SIDE, claims.LOWER, LESS),  # the "slow" side wins: the sentence follows
    ([10 * x for x in SLOW_SIDE], [10 * x for x in FAST_SIDE], claims.LOWER, LESS),  # a 10x slower machine
    (NOISY_A, NOISY_B, claims.INCONCLUSIVE, UNSURE),  # overlapping noise
    ([300.0], [100.0], claims.INCONCLUSIVE, "una sola medición"),  # one pair never decides
])
def test_throughput_claim_follows_its_samples(paged, contiguous, outcome, says):
    v, body = body_of(paged, contiguous, QUICK, SLOW)
    claim = v["throughput"]
    assert claim.outcome == outcome and says in claim.text
    for other in {MORE, LESS, UNSURE} - {says}:
        assert other not in claim.text
    statements = [e["statement"] for e in body["evidence"]]
    assert claim.text in statements  # the page's object is the contract's
    assert claims.recheck_contract(body) == []


@pytest.mark.parametrize("with_,without,outcome,says,never", [
    (QUICK, SLOW, claims.LOWER, "acorta el TTFT", ["es mayor", "no es concluyente"]),
    (SLOW, QUICK, claims.HIGHER, "el TTFT medio es mayor", ["acorta", "no es concluyente"]),
    ([0.01, 0.03, 0.02, 0.028, 0.011], [0.025, 0.012, 0.02, 0.011, 0.027], claims.INCONCLUSIVE, "no es concluyente",
     ["acorta", "es mayor"]),
])
def test_ttft_claim_follows_its_samples(with_, without, outcome, says, never):
    v, body = body_of(FAST_SIDE, SLOW_SIDE, with_, without)
    assert v["ttft"].outcome == outcome and says in v["ttft"].text
    assert not any(w in v["ttft"].text for w in never)
    assert v["ttft"].text in [e["statement"] for e in body["evidence"]]


def test_step_time_claim_reads_the_per_step_times():
    # paged: 3x the tokens/s in 2/3 of the steps -> each step takes half as long
    v, _ = body_of(FAST_SIDE, SLOW_SIDE, QUICK, SLOW)
    assert v["step_time"].outcome == claims.LOWER and "cuesta menos" in v["step_time"].text
    # paged: same tokens/s in 2/3 of the steps -> each step takes 1,5 times as long
    v, _ = body_of(SLOW_SIDE, SLOW_SIDE, QUICK, SLOW)
    assert v["step_time"].outcome == claims.HIGHER and "cuesta más" in v["step_time"].text
    assert "1,50 veces" in v["step_time"].text


def test_report_computes_its_claims_when_not_given_and_assembles():
    frag, sweep, prefix, chat, eviction, dc = measurements(FAST_SIDE, SLOW_SIDE, QUICK, SLOW)
    body = report(Findings.from_measurements("tiny-es", PARAMS, frag, sweep, prefix, chat,
                                             eviction, dc))
    v = verdicts(frag, prefix)
    assert [e["statement"] for e in claims.claims_of(body)] == [v[k].text for k in
                                                               ("throughput", "step_time", "ttft")]
    contract = assemble_contract("paged_attention", 0, "ci", dict(FAST, **PARAMS), body, "cpu")
    assert claims.recheck_contract(contract) == []
    assert "la mediana de 5 repeticiones" in " ".join(contract["limitations"])


@pytest.mark.parametrize("ratio,says,never", [
    (0.9, "el rendimiento simulado baja", ["menor que en concurrencia", "alcanza"]),
    (1.5, "menor que en concurrencia", ["baja", "alcanza"]),  # concurrency: 2 times
    (2.5, "alcanza la de concurrencia", ["baja", "menor que en concurrencia"]),
])
def test_datacenter_sentence_takes_the_branch_of_its_numbers(ratio, says, never):
    *_, dc = measurements(FAST_SIDE, SLOW_SIDE, QUICK, SLOW, dc_ratio=ratio)
    text = datacenter_comparison(dc)
    assert says in text and not any(w in text for w in never)
    _, body = body_of(FAST_SIDE, SLOW_SIDE, QUICK, SLOW, ratio)
    assert any(text in e["statement"] for e in body["evidence"])


def test_count_sentences_read_right_for_any_value():
    saving = prefix_sentence({"prefill_tokens": 12, "hit_rate": 0.89}, {"prefill_tokens": 108})
    assert "un 89 % menos de tokens (12 frente a 108)" in saving
    none = prefix_sentence({"prefill_tokens": 108, "hit_rate": 0.0}, {"prefill_tokens": 108})
    assert "no calcula menos tokens" in none and "% menos" not in none
    assert "exactamente los mismos" in same_tokens_sentence(True)
    assert "NO generan" in same_tokens_sentence(False)


# --- the exercises' checks: each plausible mistake is named with its own hint --------------------
class FreeWithoutCount(BlockPool):
    def free(self, blocks):
        for block in blocks:
            self._free[block.block_id] = None


class ReuseKeepsPrefix(BlockPool):
    def allocate(self, n):
        if n > len(self._free):
            return None
        out = [self.blocks[self._free.popitem(last=False)[0]] for _ in range(n)]
        for block in out:
            block.ref_cnt = 1
        return out


class FreesInReverse(BlockPool):
    def free(self, blocks):
        super().free(list(reversed(blocks)))


class AllocatesWhatIsLeft(BlockPool):
    def allocate(self, n):
        return super().allocate(min(n, len(self._free))) if self._free else None


@pytest.mark.parametrize("cls,match", [
    (FreeWithoutCount, ["= free", "quita un solo dueño"]),
    (ReuseKeepsPrefix, ["= allocate", "pierde el prefijo que guardaba"]),
    (FreesInReverse, ["= free", "en el orden en que free los recibe"]),
    (AllocatesWhatIsLeft, ["allocate debía devolver None y devolvió los bloques", "no asigna ninguno"]),
])
def test_each_pool_mistake_is_named_with_its_own_hint(cls, match):
    fails(checks.check_block_pool, cls, *match)
    assert checks.check_block_pool(BlockPool, seed=3, raise_on_fail=False).passed


def test_prefix_mistakes_are_named_without_code():
    def whole_prompt(token_ids, block_size, pool):
        return find_cached_prefix(list(token_ids) + [0], block_size, pool)

    def unchained(token_ids, block_size, pool):
        hits = []
        for i in range((len(token_ids) - 1) // block_size):
            block = pool.lookup(hash_block(None, token_ids[i * block_size:(i + 1) * block_size]))
            if block is None:
                break
            hits.append(block)
        return hits
    fails(checks.check_prefix_lookup, whole_prompt, "el último token del prompt nunca sale de la caché")
    result = fails(checks.check_prefix_lookup, unchained, "encadena el del bloque anterior")
    assert "parent =" not in result.message and "hash_block(" not in result.message
