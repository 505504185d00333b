"""The roofline lab: its contract, its claims (each takes the branch its numbers support), the
departure point, the interleaved stream probes and its parameter errors."""

import pytest

from ai_evolution import claims
from ai_evolution.hardware import measure_stream_bandwidths
from ai_evolution.labs import LabParamError, assemble_contract, get_spec, run_lab, without_volatile
from ai_evolution.labs.roofline import (Findings, analyse_batching, analyse_step, control_lesson,
                                        mid_context, report, supports_chapter, with_departure)
from ai_evolution.model import get_preset
from ai_evolution.sim import decode_step_cost, departure_batch

FAST = dict(model="tiny-es", prompt_len=32, context_len=16, decode_tokens=4, batch_sizes=[1, 2],
            repeats=3, torch_threads=1)


@pytest.fixture(scope="module")
def contract():
    return run_lab("roofline", seed=1, profile="ci", **FAST)


def test_contract_reports_machine_floor_and_batching_curve(contract):
    r = contract["results"]
    assert r["machine"]["bandwidth_read_gbps"] > 0 and r["machine"]["matmul_gflops"] > 0
    assert r["machine"]["gemv_gbps"] > 0 and len(r["machine"]["gemv_samples_gbps"]) == 3
    assert r["machine"]["probes"]["gemv_working_set_bytes"] >= 2**30  # beyond the LLC
    assert r["floor"]["floor_b1_ms"] > 0 and r["floor"]["efficiency"] > 0
    assert r["floor"]["gemv_floor_b1_ms"] > 0 and r["floor"]["gemv_efficiency"] > 0
    assert len(r["batching"]["measured_ms"]) == len(r["batching"]["predicted_ms"]) == 2
    assert [len(s) for s in r["batching"]["measured_samples_ms"]] == [3, 3]
    # the prediction is calibrated on the batch-1 step
    assert r["batching"]["predicted_ms"][0] == pytest.approx(r["batching"]["measured_ms"][0])
    assert r["datasheet"]["h100_llama31_8b_bf16_floor_ms"] == pytest.approx(4.5, abs=0.05)


def test_every_claim_of_a_real_contract_is_what_its_numbers_give(contract):
    assert claims.recheck_contract(contract) == []
    made = claims.claims_of(contract)
    assert len(made) == 7  # floors, share, phases, two regimes, gain, departure
    assert all(item["volatile"] and item["source"] == "measured" for item in made)
    assert {item["claim"]["outcome"] for item in made} <= {
        claims.HIGHER, claims.LOWER, claims.INCONCLUSIVE, claims.PASSED, claims.FAILED}
    verdicts = contract["results"]["verdicts"]
    assert sorted(verdicts) == sorted(["floors", "share", "phases", "decode_regime",
                                       "prefill_regime", "gain", "departure"])


@pytest.mark.slow  # a whole lab, a long soak or a sampling statistic: `make test` only
def test_same_seed_gives_the_same_contract_except_volatile_fields(contract):
    again = run_lab("roofline", seed=1, profile="ci", **FAST)
    assert without_volatile(again) == without_volatile(contract)
    assert "machine" not in without_volatile(contract)["results"]
    assert "verdicts" not in without_volatile(contract)["results"]


# --- report() on hand-made measurements --------------------------------------------------------
CFG = get_preset("cpu-200m")
PARAMS = get_spec("roofline").resolve_params("ci", {})
BYTES = decode_step_cost(CFG, 1, 64 + 8 // 2, "float32").bytes


def synthetic(read=(78.0, 77.0, 79.0, 78.5, 77.5), gemv=(23.6, 23.0, 24.1, 23.8, 23.3),
              step_b1=None, prefill=(2.0, 2.1, 1.9, 2.0, 2.05), steps=None,
              matmul=(100.0, 101.0, 99.0, 100.5, 99.5)) -> dict:
    """Measurements as ``measure`` returns them (5 rounds, batches 1, 2, 4)."""
    if step_b1 is None:  # 83 % of the GEMV floor, as on the AMD EPYC VM
        step_b1 = [BYTES / (g * 1e9) / 0.83 * f for g, f in zip(gemv, (1, 1.01, 0.99, 1.02, 0.98))]
    if steps is None:
        steps = [list(step_b1), [1.05 * s for s in step_b1], [1.1 * s for s in step_b1]]
    return {"repeats": len(read), "prompt_len": 256, "context_len": 64, "decode_tokens": 8,
            "batch_sizes": [1, 2, 4][:len(steps)], "bandwidth_read_gbps": list(read),
            "gemv_gbps": list(gemv), "matmul_gflops": list(matmul), "prefill_s": list(prefill),
            "decode_step_s": [list(s) for s in steps],
            "probes": {"read_bytes": 2**30, "gemv_working_set_bytes": 1_342_177_280,
                       "gemv_shape": [8192, 2048], "matmul_n": 2048, "torch_threads": 1}}


def analysed(measured: dict) -> tuple[dict, dict]:
    step = analyse_step(measured, CFG, "float32")
    curve = analyse_batching(measured, CFG, "float32", step)
    part = departure_batch(curve.batch_sizes, curve.measured_s, curve.predicted_s,
                           PARAMS["tolerance"])
    return step, with_departure(curve, part, PARAMS["tolerance"])


def contract_of(measured: dict) -> dict:
    step, curve = analysed(measured)
    body = report(Findings(CFG, "float32", PARAMS, measured, step, curve))
    return assemble_contract("roofline", 0, "ci", PARAMS, body, "cpu")


KERNELS, MEMORY = "manda el suelo de los kernels", "manda el suelo de la memoria"


def test_slow_gemv_kernels_bind_and_the_step_runs_near_their_floor():
    """The issue's AMD EPYC case: read probe 78 GB/s, cold GEMV 23,6 GB/s, the engine at 83 %
    of the GEMV floor (25 % of the read floor). The verdict must say the kernels bind."""
    step, curve = analysed(synthetic())
    floors, share = step.floors, step.share
    assert floors.outcome == claims.LOWER and KERNELS in floors.text and MEMORY not in floors.text
    assert share.outcome == claims.PASSED and "explica más de la mitad" in share.text
    assert step.efficiency_gemv == pytest.approx(0.83, rel=0.03)
    assert step.efficiency_read == pytest.approx(0.83 * 23.6 / 78, rel=0.05)


def test_gemv_at_the_memory_rate_means_the_memory_binds():
    read = (20.0, 21.0, 19.5, 20.5, 20.2)
    step, _ = analysed(synthetic(read=read, gemv=[1.1 * r for r in read]))
    floors = step.floors
    assert floors.outcome == claims.HIGHER and MEMORY in floors.text and KERNELS not in floors.text


def test_overlapping_probes_are_inconclusive():
    step, _ = analysed(synthetic(read=(20, 30, 20, 30, 25), gemv=(29, 21, 31, 19, 25)))
    floors = step.floors
    assert floors.outcome == claims.INCONCLUSIVE
    assert "no se distinguen" in floors.text and MEMORY not in floors.text
    assert KERNELS not in floors.text


def test_a_step_far_above_its_floor_is_not_read_bound():
    gemv = (23.6, 23.0, 24.1, 23.8, 23.3)
    slow = [BYTES / (g * 1e9) / 0.3 for g in gemv]
    share = analysed(synthetic(gemv=gemv, step_b1=slow))[0].share
    assert share.outcome == claims.FAILED and "no llega a la mitad" in share.text
    noisy = [BYTES / (g * 1e9) / e for g, e in zip(gemv, (0.2, 0.9, 0.3, 0.8, 0.5))]
    share = analysed(synthetic(gemv=gemv, step_b1=noisy))[0].share
    assert share.outcome == claims.INCONCLUSIVE and "no se puede decir" in share.text


def test_prefill_vs_decode_follows_the_numbers():
    step, _ = analysed(synthetic())
    assert step.phases.outcome == claims.HIGHER
    assert "más tokens por segundo" in step.phases.text
    # a prefill so slow that it makes fewer tokens/s than decode (swapped roles)
    step, _ = analysed(synthetic(prefill=(60.0, 61.0, 59.0, 62.0, 60.5)))
    phases = step.phases
    assert phases.outcome == claims.LOWER and "menos tokens por segundo" in phases.text
    assert "más tokens por segundo" not in phases.text


def test_regimes_against_the_measured_ridge():
    step, _ = analysed(synthetic())  # ridge ~1,3 FLOP/byte; decode 0,5; prefill ~129
    assert step.decode_regime.outcome == claims.PASSED
    assert "limitada por la memoria" in step.decode_regime.text
    assert step.prefill_regime.outcome == claims.PASSED
    assert "limitado por el cálculo" in step.prefill_regime.text
    # a machine that computes slower than it reads: even batch-1 decode is compute-bound
    step, _ = analysed(synthetic(matmul=(5.0, 5.1, 4.9, 5.0, 5.05)))
    regime = step.decode_regime
    assert regime.outcome == claims.FAILED and "limitada por el cálculo" in regime.text
    assert "limitada por la memoria" not in regime.text


def test_departure_batch_claim_takes_the_branch_its_rounds_support():
    b1 = [0.1, 0.11, 0.09, 0.1, 0.105]
    # batch 2 twice the prediction in every round: it departs there
    steps = [b1, [2 * s for s in b1], [2.1 * s for s in b1]]
    _, curve = analysed(synthetic(step_b1=b1, steps=steps))
    dep = curve.departure
    assert curve.departure_batch == 2 and dep.outcome == claims.FAILED
    assert "se separa de la predicción del roofline en el lote 2" in dep.text
    # flat curve: none departs
    _, curve = analysed(synthetic(step_b1=b1, steps=[b1, b1, b1]))
    dep = curve.departure
    assert curve.departure_batch is None and dep.outcome == claims.PASSED
    assert "ningún lote medido se separa" in dep.text.lower() and "no se puede" not in dep.text
    # the median departs, but the rounds straddle the tolerance
    noisy = [0.1, 0.2, 0.1, 0.2, 0.14]
    _, curve = analysed(synthetic(step_b1=b1, steps=[b1, noisy, noisy]))
    dep = curve.departure
    assert curve.departure_batch == 2 and dep.outcome == claims.INCONCLUSIVE
    assert "no se puede afirmar" in dep.text


def test_a_slow_round_hits_every_batch_alike_and_does_not_fake_a_departure():
    """Interleaving: round 2 is three times slower for every batch size (a busy machine); the
    calibration moves with it, so batch 2 stays within the tolerance."""
    b1 = [0.1, 0.3, 0.1, 0.1, 0.1]
    _, curve = analysed(synthetic(step_b1=b1, steps=[b1, [1.1 * s for s in b1],
                                                     [1.15 * s for s in b1]]))
    assert curve.departure_batch is None
    assert curve.departure.outcome == claims.PASSED


def test_batching_gain_claim():
    b1 = [0.1, 0.11, 0.09, 0.1, 0.105]
    _, curve = analysed(synthetic(step_b1=b1, steps=[b1, b1, [1.5 * s for s in b1]]))
    gain = curve.gain
    assert gain.outcome == claims.HIGHER and "más tokens por segundo que una sola" in gain.text
    _, curve = analysed(synthetic(step_b1=b1, steps=[b1, b1, [6 * s for s in b1]]))
    gain = curve.gain
    assert gain.outcome == claims.LOWER and "menos tokens por segundo que una sola" in gain.text


def test_report_stores_the_same_claims_and_they_recheck():
    measured = synthetic()
    step, curve = analysed(measured)
    contract = contract_of(measured)
    assert claims.recheck_contract(contract) == []
    statements = [item["statement"] for item in claims.claims_of(contract)]
    for c in [*step.verdicts.values(), *curve.verdicts.values()]:
        assert c.text in statements
    assert contract["results"]["verdicts"]["floors"] == claims.LOWER
    assert contract["results"]["floor"]["gemv_efficiency"] == pytest.approx(step.efficiency_gemv)
    # a tampered sentence is caught
    item = next(i for i in contract["evidence"] if "claim" in i)
    item["statement"] = item["statement"].replace("más despacio", "más deprisa")
    assert claims.recheck_contract(contract)


def test_a_contrast_model_adds_its_curve_and_a_departure_claim_that_names_it():
    b1 = [0.1, 0.11, 0.09, 0.1, 0.105]
    measured = synthetic(step_b1=b1, steps=[b1, b1, b1])            # the control follows
    step, curve = analysed(measured)
    small = [0.01, 0.011, 0.009, 0.01, 0.0105]
    other = synthetic(step_b1=small, steps=[small, [2 * s for s in small], [4 * s for s in small]])
    contrast = analyse_batching(other, CFG, "float32", step)
    part = departure_batch(contrast.batch_sizes, contrast.measured_s, contrast.predicted_s,
                           PARAMS["tolerance"])
    contrast = with_departure(contrast, part, PARAMS["tolerance"], subject="tiny-es")
    assert contrast.departure.outcome == claims.FAILED and "con tiny-es," in contrast.departure.text
    body = report(Findings(CFG, "float32", PARAMS, measured, step, curve, contrast, "tiny-es"))
    contract = assemble_contract("roofline", 0, "ci", PARAMS, body, "cpu")
    assert claims.recheck_contract(contract) == []
    assert contract["results"]["verdicts"]["contrast_departure"] == claims.FAILED
    assert contract["results"]["batching_contrast"]["model"] == "tiny-es"
    assert contract["results"]["batching_contrast"]["departure_batch"] == 2
    assert contrast.departure.text in [i["statement"] for i in claims.claims_of(contract)]
    assert control_lesson(curve, contrast).startswith("El control sigue la predicción")
    # a control that departs itself validates the method only below its departure
    _, departing = analysed(synthetic(step_b1=b1, steps=[b1, [2 * s for s in b1], [2 * s for s in b1]]))
    assert "no queda validado para ningún lote" in control_lesson(departing, contrast)
    _, later = analysed(synthetic(step_b1=b1, steps=[b1, b1, [2 * s for s in b1]]))
    assert "solo queda validado por debajo de ese lote" in control_lesson(later, contrast)


def test_supports_chapter_counts_what_the_claims_say():
    step, curve = analysed(synthetic())
    assert supports_chapter(step, curve).startswith("Esta ejecución cumple 3 de las 3")
    step, curve = analysed(synthetic(prefill=(60.0, 61.0, 59.0, 62.0, 60.5)))
    text = supports_chapter(step, curve)
    assert "cumple 2 de las 3" in text and "No se cumple: un prefill" in text


def test_mid_context_is_the_average_context_of_the_timed_steps():
    assert mid_context(synthetic()) == 68


# --- probes, departure, parameters ---------------------------------------------------------------
def test_stream_probes_interleave_with_the_callers_timings():
    calls = []
    out = measure_stream_bandwidths(repeats=3, size_bytes=2**20, working_set_bytes=4 * 2**20,
                                    k=256, n=1024, between=calls.append, progress=False)
    assert calls == [0, 1, 2]
    assert len(out["read"].samples) == len(out["gemv"].samples) == 3
    assert out["gemv"].params["num_matrices"] == 4 and out["gemv"].unit == "GB/s"
    assert all(s > 0 for s in out["read"].samples + out["gemv"].samples)


@pytest.mark.parametrize("measured,expected", [
    ([1.0, 1.1, 1.3, 2.0], 8),     # 1.3 is within 25 % of 1.2; 2.0 is not
    ([1.0, 1.0, 1.0, 1.0], None),  # never departs
    ([1.0, 1.3, 1.0, 2.0], 2),     # the first departure counts, even if it comes back
    ([1.0, 1.25, 1.5, 2.0], 8),    # exactly at the tolerance (1.25, 1.5) is not a departure
])
def test_departure_batch_is_the_first_relative_excess(measured, expected):
    assert departure_batch([1, 2, 4, 8], measured, [1.0, 1.0, 1.2, 1.2], 0.25) == expected


def test_departure_batch_rejects_unsorted_batches():
    with pytest.raises(ValueError, match="ordenada"):
        departure_batch([2, 1], [1, 1], [1, 1], 0.1)


def test_sequences_longer_than_the_model_are_rejected_in_spanish():
    with pytest.raises(LabParamError, match="posiciones del modelo tiny-es"):
        run_lab("roofline", profile="ci", model="tiny-es", prompt_len=4096, repeats=1)


def test_bad_batch_list_names_accepted_values():
    with pytest.raises(LabParamError, match="batch_sizes"):
        run_lab("roofline", profile="ci", batch_sizes="1,cero")


@pytest.mark.parametrize("batches", ["2,4", "1,4,2", "1,1,2"])
def test_batch_list_must_start_at_one_and_grow(batches):
    with pytest.raises(LabParamError, match="debe empezar en 1"):
        run_lab("roofline", profile="ci", model="tiny-es", batch_sizes=batches, repeats=1)
