"""Lab 7 (quantization): every conclusion in its contract is a claim its own numbers rebuild, each
claim takes the branch that hand-made measurements support, the held-out text is the training's
validation split, and the self-checks catch the plausible mistakes with the right hint."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from ai_evolution import claims
from ai_evolution.checks import quantization as checks
from ai_evolution.labs import (LabParamError, assemble_contract, get_spec, run_lab,
                               without_volatile)
from ai_evolution.labs.quantization import (CHALLENGE_TOLERANCE, CRITERIA, Findings, analyse_kv,
                                            analyse_quality, analyse_speed, cheapest_within,
                                            criteria_sentence, increase_estimate, kv_budgets,
                                            pareto_front, reference_predict_step_s, report,
                                            weights_vs_kv)
from ai_evolution.model import get_preset
from ai_evolution.model.memory import linear_shapes, quantized_weight_bytes
from ai_evolution.model.shipped_models import held_out_tokens
from ai_evolution.sim import decode_step_cost

ROOT = Path(__file__).resolve().parents[1]
PARAMS = get_spec("quantization").resolve_params("ci", {})
# A real, small run (seconds): tiny-es for speed too, two rounds so comparisons have an interval
# (test_fp16_cpu reuses those of the engine labs).
FAST = dict(speed_model="tiny-es", group_size=64, decode_tokens=4, repeats=2, probe_mib=64,
            quality_formats=["int8", "int4-g64"], agreement_prompts=2, agreement_tokens=4)


@pytest.fixture(scope="module")
def contract():
    return run_lab("quantization", seed=3, profile="ci", **FAST)


def test_every_claim_of_a_real_contract_rebuilds_from_its_inputs(contract):
    assert claims.recheck_contract(contract) == []
    kinds = sorted(item["claim"]["kind"] for item in claims.claims_of(contract))
    # faster x2, prediction x2 (compare); halving x3, quality x2, the int8 cache (threshold)
    assert kinds == ["compare"] * 4 + ["threshold"] * 6
    speed = contract["results"]["speed"]
    assert [f["label"] for f in speed["formats"]] == ["fp32", "bf16", "int8", "int4-g64"]
    assert speed["torch_threads"] == 1 and all(len(f["step_samples_ms"]) == 2
                                               for f in speed["formats"])
    assert speed["formats"][2]["kernels"] and speed["formats"][0]["kernels"] == {"F.linear": 43}
    quality = contract["results"]["quality"]
    assert [r["label"] for r in quality["formats"]] == ["fp32", "bf16", "int8", "int4-g64"]
    assert quality["held_out_tokens"] == 1983
    kv = contract["results"]["kv"]
    assert kv["measured"]["kv_bytes_per_token"]["int8"] == 2 * 6 * 2 * (64 + 4)  # + fp32 scales
    assert kv["measured"]["cache_nbytes_100_tokens"]["int8"] == 100 * 2 * 6 * 2 * (64 + 4)
    assert kv["budgets"]["h100_llama31_8b"]["static_slots"] == {"bf16": 116, "int8": 229}
    b = contract["results"]["bytes"]
    assert b["quality_model_bytes"] == b["quality_model_bytes_predicted"]  # measured = formula
    assert b["per_step"]["fp32"] == pytest.approx(2 * b["per_step"]["bf16"], rel=1e-3)


@pytest.mark.slow  # a whole lab, a long soak or a sampling statistic: `make test` only
def test_two_runs_with_one_seed_agree_outside_the_volatile_fields(contract):
    again = run_lab("quantization", seed=3, profile="ci", **FAST)
    assert without_volatile(again) == without_volatile(contract)
    assert "speed" not in without_volatile(contract)["results"]
    assert "measured" not in without_volatile(contract)["results"]["kv"]
    assert "bytes" in without_volatile(contract)["results"]


def test_bad_parameters_are_refused_in_spanish():
    with pytest.raises(LabParamError, match="group_size=128 no sirve para tiny-es"):
        run_lab("quantization", profile="ci", **(FAST | {"group_size": 128}))
    with pytest.raises(LabParamError, match="posiciones"):
        run_lab("quantization", profile="ci", **(FAST | {"prompt_len": 600}))
    with pytest.raises(LabParamError, match="quality_formats"):
        run_lab("quantization", profile="ci", quality_formats=["int4-g128"])


# --- hand-made speed measurements ------------------------------------------------------------

CFG = get_preset("cpu-200m")
LADDER = [("fp32", "fp32", None), ("bf16", "bf16", None), ("int8", "bf16", "int8"),
          ("int4-g128", "bf16", "int4-g128")]
CTX = 35


def speed(step, rounds=5, noise=0.01, bw_gbps=10.0, seed=0) -> dict:
    """``step(bytes) -> seconds`` per format, with multiplicative noise per round."""
    rng = np.random.default_rng(seed)
    rows = []
    for label, dtype, fmt in LADDER:
        n_bytes = decode_step_cost(CFG, 1, CTX, dtype, weight_format=fmt).bytes
        rows.append({"label": label, "dtype": dtype, "weight_format": fmt, "kernels": {},
                     "bytes_per_step": n_bytes, "model_bytes": 0,
                     "step_s": [step(label, n_bytes) * (1 + noise * rng.standard_normal())
                                for _ in range(rounds)]})
    return {"model": CFG.name, "parameters": 0, "device": "cpu", "prompt_len": 32,
            "decode_tokens": 6, "context_len": CTX, "repeats": rounds, "torch_threads": 1,
            "read_bytes": 2**28, "bandwidth_read_gbps": [bw_gbps] * rounds, "formats": rows}


def bound(label, n_bytes):  # every format reads at half the probe's rate, nothing else
    return 2 * n_bytes / 10e9


def slow_int4(label, n_bytes):  # int4 unpacks: its step barely drops below int8's
    return bound(label, n_bytes) if label != "int4-g128" else 0.95 * bound("int8", 168.8e6)


def slower_quantized(label, n_bytes):  # a device without fast integer kernels
    return bound("bf16", 336.6e6) * (1.5 if label.startswith("int") else 1) \
        if label != "fp32" else bound(label, n_bytes)


def fixed_overhead(label, n_bytes):  # the roofline plus a fixed cost
    return n_bytes / 10e9 + 0.05


def outcomes(found: dict) -> dict[str, str]:
    return {k: c.outcome for k, c in found.verdicts.items()}


def test_steps_that_follow_the_bytes_take_the_expected_branches():
    found = analyse_speed(speed(bound), CFG)
    got = outcomes(found)
    assert got["faster_int8"] == got["faster_int4-g128"] == claims.HIGHER
    assert got["halving_bf16"] == got["halving_int8"] == got["halving_int4-g128"] == claims.PASSED
    assert "int8 decodifica más deprisa que bf16" in found.verdicts["faster_int8"].text
    assert "bastante menos" not in found.verdicts["halving_int8"].text
    # bf16 calibrates an overhead that is really per byte: the quantized steps beat the prediction
    assert got["prediction_int8"] == got["prediction_int4-g128"] == claims.LOWER
    assert "no es fija" in found.verdicts["prediction_int8"].text
    assert [r["efficiency"] for r in found.rows] == pytest.approx([0.5] * 4, rel=0.05)


def test_a_fixed_overhead_is_predicted_and_an_unpacking_cost_is_named():
    found = analyse_speed(speed(fixed_overhead, noise=0.0, rounds=3), CFG)
    for r in found.rows:
        assert r["predicted_s"] == pytest.approx(r["step_s"], rel=1e-9)
    slow = analyse_speed(speed(slow_int4), CFG)
    assert outcomes(slow)["halving_int4-g128"] == claims.FAILED
    assert "bastante menos que los bytes" in slow.verdicts["halving_int4-g128"].text
    assert outcomes(slow)["halving_int8"] == claims.PASSED


def test_quantized_formats_slower_than_16_bits_are_stated_as_slower():
    sp = speed(slower_quantized)
    found = analyse_speed(sp, CFG)
    assert outcomes(found)["faster_int8"] == claims.LOWER
    assert "más despacio que bf16" in found.verdicts["faster_int8"].text
    assert "más deprisa" not in found.verdicts["faster_int8"].text
    findings = Findings(PARAMS, sp, found, quality(STEPPED, noise=0.5), QUALITY_FOUND, kv(0.0),
                        analyse_kv(kv(0.0)))
    assert not findings.criteria_met["faster_int8"]


def test_noise_and_a_single_round_are_inconclusive():
    noisy = analyse_speed(speed(lambda label, n: 0.1, noise=0.3, seed=1), CFG)
    assert outcomes(noisy)["faster_int8"] == claims.INCONCLUSIVE
    one = analyse_speed(speed(bound, rounds=1), CFG)
    assert outcomes(one)["faster_int8"] == claims.INCONCLUSIVE
    assert "una sola medición" in one.verdicts["faster_int8"].text


# --- hand-made quality measurements ----------------------------------------------------------

COUNTS = [80.0] * 20


def quality(increases: dict[str, float], noise: float = 0.0, seed: int = 0) -> dict:
    """Per-chunk NLL around log(500) per token, each format shifted by ``log(1 + increase)``."""
    rng = np.random.default_rng(seed)
    base = np.log(500) * np.asarray(COUNTS)
    cfg = get_preset("tiny-es")
    n = sum(o * k for _, o, k in linear_shapes(cfg))
    rows = []
    for label, inc in increases.items():
        fmt = None if label in ("fp32", "bf16") else label
        nll = base + np.log1p(inc) * np.asarray(COUNTS) + noise * rng.standard_normal(len(COUNTS))
        rows.append({"label": label, "weight_format": fmt,
                     "dtype": "fp32" if label == "fp32" else "bf16",
                     "bytes_per_weight": 4.0 if label == "fp32" else 2.0 if label == "bf16"
                     else quantized_weight_bytes(cfg, label, "bf16") / n,
                     "model_bytes": 1, "model_bytes_predicted": 1,
                     "chunk_nll": nll.tolist(),
                     "perplexity": float(np.exp(nll.sum() / sum(COUNTS))),
                     "top1_agreement": 1.0 - inc, "identical_continuations": 2,
                     "tokens_before_divergence": [4, 4], "layer_errors": {"a": inc, "b": 2 * inc}})
    return {"model": "tiny-es", "parameters": 5_464_832, "linear_weights": n, "chunks": 20,
            "chunk_tokens": COUNTS, "held_out_tokens": 1620, "agreement_prompts": 2,
            "agreement_prompt_tokens": 16, "agreement_tokens": 4, "formats": rows}


STEPPED = {"fp32": 0.0, "bf16": 0.0, "int8": 0.001, "int4-g64": 0.03, "int4-asym-g32": 0.015}
QUALITY_FOUND = analyse_quality(quality(STEPPED, noise=0.5))


def test_increases_are_read_against_bf16_with_their_interval():
    found = QUALITY_FOUND
    by = {r["label"]: r for r in found.rows}
    assert by["int4-g64"]["increase_vs_bf16"] == pytest.approx(0.03, abs=2e-3)
    assert found.verdicts["quality_int4-g64"].outcome == claims.FAILED
    assert "sube frente a bf16" in found.verdicts["quality_int4-g64"].text
    exact = analyse_quality(quality({"fp32": 0, "bf16": 0, "int8": 0.0}))
    assert exact.verdicts["quality_int8"].outcome == claims.PASSED
    noisy = analyse_quality(quality({"fp32": 0, "bf16": 0, "int8": 0.002}, noise=60.0))
    assert noisy.verdicts["quality_int8"].outcome == claims.INCONCLUSIVE
    assert "no se distingue" in noisy.verdicts["quality_int8"].text


def test_increase_estimate_is_the_perplexity_ratio_and_its_interval_holds_it():
    rng = np.random.default_rng(4)
    a, b = rng.uniform(300, 400, 12), rng.uniform(300, 400, 12)
    n = rng.integers(60, 90, 12).astype(float)
    est = increase_estimate(a.tolist(), b.tolist(), n.tolist())
    assert est.median == pytest.approx(np.exp(a.sum() / n.sum()) / np.exp(b.sum() / n.sum()) - 1)
    assert est.low <= est.median <= est.high and est.n == 12


def test_the_challenge_rule_uses_the_top_of_the_interval_and_the_front_is_pareto():
    rows = QUALITY_FOUND.rows
    chosen = cheapest_within(rows)
    assert all(r["increase_interval"][1] > CHALLENGE_TOLERANCE for r in rows
               if r["bytes_per_weight"] < chosen["bytes_per_weight"] and r["label"] != "fp32")
    assert chosen["increase_interval"][1] <= CHALLENGE_TOLERANCE
    assert cheapest_within(rows, tolerance=1.0)["label"] == "int4-g64"  # cheapest of all
    pts = [{"label": k, "bytes_per_weight": b, "perplexity": p}
           for k, b, p in (("a", 4, 10), ("b", 2, 10), ("c", 1, 12), ("d", 1.5, 13))]
    assert pareto_front(pts) == ["c", "b"]


def kv(increase: float, noise: float = 0.0) -> dict:
    rng = np.random.default_rng(1)
    base = np.log(500) * np.asarray(COUNTS)
    return {"model": "tiny-es", "dtype": "fp32", "chunk_tokens": COUNTS, "held_out_tokens": 1620,
            "kv_bytes_per_token": {"fp32": 6144.0, "int8": 1632.0},
            "cache_nbytes": {"fp32": 614400, "int8": 163200},
            "chunk_nll": {"float": base.tolist(),
                          "int8": (base + np.log1p(increase) * np.asarray(COUNTS)
                                   + noise * rng.standard_normal(len(COUNTS))).tolist()},
            "max_abs_logit_diff": 0.2, "max_abs_logit": 20.0, "top1_agreement": 0.99,
            "identical_continuations": 2, "agreement_prompts": 2}


def test_the_int8_cache_claim_reads_the_perplexity_increase():
    assert analyse_kv(kv(0.02)).kv_quality.outcome == claims.FAILED
    assert analyse_kv(kv(0.0)).kv_quality.outcome == claims.PASSED
    assert analyse_kv(kv(0.001, noise=40.0)).kv_quality.outcome == \
        claims.INCONCLUSIVE


def test_budgets_and_the_weights_kv_crossing_follow_the_bytes():
    b = kv_budgets()["gpu24_7b"]
    assert b["kv_bytes_per_token"] == {"fp16": 524288.0, "int8": 2 * 32 * 32 * (128 + 2)}
    assert b["on_demand_sequences"]["int8"] > 1.9 * b["on_demand_sequences"]["fp16"]
    roof = weights_vs_kv()
    w, k = roof["weight_bytes"], roof["kv_bytes_per_sequence"]
    for label, cross in roof["crossing_batch"].items():
        _, wf, _, kf = label.replace(",", "").split()
        assert cross * k[kf] == pytest.approx(w[wf])
    ladder = roof["crossing_batch"]
    assert ladder["pesos int4-g128, caché bf16"] < ladder["pesos bf16, caché bf16"] \
        < ladder["pesos bf16, caché int8"]


def test_the_contract_carries_the_page_claims_and_a_tampered_one_is_caught():
    sp = speed(slow_int4)
    sf = analyse_speed(sp, CFG)
    q = quality(STEPPED, noise=0.5)
    kvm = kv(0.001)
    kf = analyse_kv(kvm)
    body = report(Findings(PARAMS, sp, sf, q, QUALITY_FOUND, kvm, kf))
    statements = {i["statement"] for i in claims.claims_of(body)}
    assert statements == {c.text for c in (sf.verdicts | QUALITY_FOUND.verdicts
                                           | kf.verdicts).values()}
    contract = assemble_contract("quantization", 0, "ci", PARAMS, body, "cpu")
    assert claims.recheck_contract(contract) == []
    item = next(i for i in contract["evidence"] if "bastante menos" in i["statement"])
    item["statement"] = item["statement"].replace("bastante menos", "casi tanto")
    assert claims.recheck_contract(contract)
    met = contract["results"]["speed"]["expectations"]
    assert met == {key: True for key, _ in CRITERIA}
    assert criteria_sentence(met).startswith("Esta ejecución cumple las 3")
    assert "no cumple 1 de las 3" in criteria_sentence(met | {"faster_int8": False})


# --- the held-out text and the reference prediction -------------------------------------------

def test_held_out_tokens_are_the_training_validation_split():
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "export_held_out.py"),
                           "--check"], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    chunks = held_out_tokens("tiny-es")
    assert len(chunks) == 24 and sum(map(len, chunks)) == 1983  # training.json: tokens_val
    assert chunks[-1][-1] == 1  # each file's split ends with </s>


def test_reference_prediction_is_bytes_over_bandwidth_plus_overhead():
    cfg = get_preset("llama-3.1-8b")
    bf16 = reference_predict_step_s(cfg, None, "bf16", 0, 1e12, 0.0)
    int4 = reference_predict_step_s(cfg, "int4-g128", "bf16", 0, 1e12, 0.0)
    assert bf16 == pytest.approx(decode_step_cost(cfg, 1, 0, "bf16").bytes / 1e12)
    assert 3 < bf16 / int4 < 4  # scales, norms, an embedding row and the KV cache stay
    assert reference_predict_step_s(cfg, "int8", "bf16", 10, 1e12, 0.25) == pytest.approx(
        decode_step_cost(cfg, 1, 10, "bf16", weight_format="int8").bytes / 1e12 + 0.25)


# --- the self-checks name the mistake -----------------------------------------------------------

def _message(check, fn, **kwargs) -> str:
    result = check(fn, raise_on_fail=False, **kwargs)
    assert not result.passed
    return result.message


def test_self_checks_catch_plausible_mistakes_with_their_hint():
    def scale_128(w):
        s = w.abs().amax(dim=1) / 128
        return torch.round(w / torch.where(s == 0, 1, s)[:, None]).to(torch.int8), s

    assert "no a 128" in _message(checks.check_quantize_int8, scale_128)

    def per_column(w):
        s = w.abs().amax(dim=0) / 127
        return torch.round(w / torch.where(s == 0, 1, s)[None, :]).to(torch.int8), s

    assert "no por columna" in _message(checks.check_quantize_int8, per_column)

    def swapped(w, g):
        p, s = checks.reference_quantize_int4_groups(w, g)
        return ((p & 15) << 4) | (p >> 4), s

    assert "intercambiados" in _message(checks.check_quantize_int4_groups, swapped)

    def silent(w, g):
        K = w.shape[1] - w.shape[1] % g
        return checks.reference_quantize_int4_groups(w[:, :K], g)

    assert "ValueError" in _message(checks.check_quantize_int4_groups, silent)

    def no_scales(config, fmt, dtype, ctx, bw, overhead):
        from ai_evolution.model.memory import parse_weight_format
        full = reference_predict_step_s(config, fmt, dtype, ctx, bw, 0.0) * bw
        if fmt is not None:
            f = parse_weight_format(fmt)
            full -= sum(f.linear_bytes(o, k, dtype) - o * k * f.bytes_per_weight
                        for _, o, k in linear_shapes(config))
        return full / bw + overhead

    assert "Faltan las escalas" in _message(checks.check_predict_step_s, no_scales)

    def in_ms(*args):
        return 1e3 * reference_predict_step_s(*args)

    assert "milisegundos" in _message(checks.check_predict_step_s, in_ms)


@pytest.mark.parametrize("g32,g64,outcome,says", [
    (0.01, 0.03, claims.PASSED, "siguen mejor"),
    (0.03, 0.01, claims.FAILED, "contra lo que se espera"),
    (0.0201, 0.02, claims.INCONCLUSIVE, "no se distingue"),
])
def test_group_claim_takes_the_branch_of_the_numbers(g32, g64, outcome, says):
    """int4-g32 against int4-g64 on the same chunks: better, worse (the chapter explains it
    instead of repeating the theory) or indistinguishable."""
    found = analyse_quality(quality({"fp32": 0, "bf16": 0, "int4-g64": g64, "int4-g32": g32},
                                     noise=0.5))
    c = found.verdicts["group_int4-g32"]
    assert c.outcome == outcome and says in c.text
    assert "int4-g64" not in {k.split("_", 1)[1] for k in found.verdicts if k.startswith("group_")}
    assert "aproximado" in c.text or outcome == claims.INCONCLUSIVE
    assert claims.recheck(c.evidence("fracción")) == []


def test_a_bootstrap_over_few_chunks_decides_nothing():
    few = increase_estimate([1.0, 2.0, 1.5], [0.5, 1.0, 0.7], [10.0, 10.0, 10.0])
    assert few.method == claims.BOOTSTRAP and not few.decisive
    many = increase_estimate([1.0] * 20, [0.5] * 20, [10.0] * 20)
    assert many.decisive and many.coverage == claims.LEVEL
