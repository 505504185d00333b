"""The autograder: it grades a folder of real notebooks within limits, writes the same gradebook
twice, and for every lab gives the reference full marks while each plausible wrong solution
loses exactly the points of its own criterion."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jupytext
import nbformat
import psutil
import pytest

from ai_evolution.grading import (DEFAULTS, find_assessment, grade_folder, grade_namespace,
                                  student_ids)
from ai_evolution.grading.assessment import available_kinds, resolve_reference
from ai_evolution.grading.notebook import RunInfo
from ai_evolution.grading.score import score
from ai_evolution.labs import get_spec, list_labs
from ai_evolution.labs.contract import evidence
from ai_evolution.labs.observability import datacenter_target, measure_capacity
from ai_evolution.model import get_preset, kv_bytes_per_token

ROOT = Path(__file__).resolve().parents[1]
KV = ROOT / "labs" / "02-kv-cache"
KINDS = ["roofline", "kv_cache", "continuous_batching", "paged_attention", "scheduler",
         "observability", "quantization", "flash_attention", "speculative", "determinism",
         "hybrid", "operations", "distributed"]


def rows(gradebook: Path) -> dict[str, dict]:
    with open(gradebook, newline="", encoding="utf-8") as fh:
        return {r["student_id"]: r for r in csv.DictReader(fh)}


def points(row: dict, assessment) -> dict[str, float]:
    return {c.id: float(row[c.id]) for c in assessment.criteria}


# --- assessments are complete and consistent with the labs ----------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_assessment_folder_is_complete_and_names_exist_in_the_solution(kind):
    a = find_assessment(kind)
    text = (a.folder / "assessment.md").read_text(encoding="utf-8")
    for heading in ("## Preguntas", "## Rúbrica", "## Criterios de aceptación",
                    "## Reto verificable"):
        assert heading in text, f"{a.folder}/assessment.md: falta {heading!r}"
    for key in ("assumption", "measurement", "conclusion", "limitation"):
        assert f"`{key}`" in text
    assert f"**{a.max_points:g} puntos automáticos**" in text
    assert f"**{a.manual_points:g} puntos de lectura humana**" in text
    for c in a.criteria:  # the rubric table lists every column of the gradebook with its points
        assert f"| `{c.id}` | {c.points:g} |" in text, c.id
    source = (a.lab_folder / "notebook_solution.md").read_text(encoding="utf-8")
    for c in a.functions:  # the graded names are the notebook's, and each has hidden checks
        assert f"def {c.name}(" in source or f"class {c.name}(" in source, c.name
        # The rubric says that delegating to the reference scores 0, and names it.
        assert f"`{c.reference.replace(':', '.')}" in " ".join(text.split()), c.reference
    assert "**Código propio.**" in text and "vale **0** en su criterio" in " ".join(text.split())
    ext = next(c for c in a.criteria if c.type == "extension")
    for key in ext.measurement_keys:
        assert key in text, f"assessment.md must name the measurement key {key!r}"
    assert kind in available_kinds()


def test_every_lab_folder_has_an_assessment_folder_for_its_kind():
    labs = sorted(p for p in (ROOT / "labs").iterdir() if p.is_dir() and re.match(r"\d\d-", p.name))
    kinds = []
    for lab in labs:
        found = re.search(r'main\(\["run", "(\w+)"', (lab / "lab.py").read_text(encoding="utf-8"))
        assert found, f"{lab}/lab.py no dice qué laboratorio ejecuta run_lab"
        kind = found.group(1)
        assert get_spec(kind).folder == f"labs/{lab.name}", kind
        folder = ROOT / "assessments" / lab.name
        for name in ("assessment.md", "rubric.json", "hidden_checks.py"):
            assert (folder / name).is_file(), f"falta {folder / name}"
        rubric = json.loads((folder / "rubric.json").read_text(encoding="utf-8"))
        assert rubric["kind"] == kind, f"{folder}/rubric.json: {rubric['kind']!r}, no {kind!r}"
        kinds.append(kind)
    assert sorted(kinds) == sorted(KINDS) == sorted(list_labs())  # the tests here cover every lab
    assessed = {p.name for p in (ROOT / "assessments").iterdir() if re.match(r"\d\d-", p.name)}
    assert assessed == {p.name for p in labs}  # no assessment without its lab


def test_student_ids_come_from_file_names_and_stay_unique():
    got = student_ids([Path("b/Ana María.ipynb"), Path("a/ana maría.ipynb"), Path("x/ .ipynb"),
                       Path("y/Ana_María.ipynb")])
    # Unique also where file names ignore case: ana_maría.md would replace Ana_María.md.
    assert [sid for sid, _ in got] == ["entrega", "Ana_María", "Ana_María-2", "ana_maría-3"]


# --- discrimination, in process: the grading cell's logic on namespaces ----------------------------

def solution_namespace(kind: str) -> dict:
    """The lab's own solution: its imports cell and every exercise cell, executed in a dict."""
    folder = ROOT / get_spec(kind).folder
    cells = [c for c in jupytext.read(folder / "notebook_solution.md").cells if c.cell_type == "code"]
    params = next(i for i, c in enumerate(cells) if "parameters" in c.metadata.get("tags", []))
    ns: dict = {"seed": 0, "profile": "ci"}
    with contextlib.redirect_stdout(io.StringIO()):
        exec(cells[params + 1].source, ns)  # noqa: S102 - the repository's own notebook
        for cell in cells[params + 2:]:
            if "# BEGIN SOLUTION" in cell.source and "student_extension" not in cell.source:
                exec(cell.source, ns)  # noqa: S102
    return ns


def synthetic_contract(kind: str, measurement: dict) -> dict:
    return {
        "schema_version": 1, "kind": kind, "seed": 0, "profile": "ci",
        "params": get_spec(kind).resolve_params("ci", {}),
        "environment": {"device": "cpu", "device_name": "prueba",
                        "versions": {"torch": "0", "ai_evolution": "0.1.0"}},
        "results": {}, "evidence": [evidence("Una evidencia de prueba con su número.", 1, "B")],
        "limitations": ["Un contrato sintético, solo para las pruebas."], "volatile_fields": [],
        "student_extension": {"assumption": "Lo que se espera antes de medir.",
                              "measurement": measurement,
                              "conclusion": "Lo que dicen los números medidos.",
                              "limitation": "Por qué esto no es una afirmación de producción."},
    }


def good_measurement(kind: str) -> dict:
    if kind == "roofline":
        return {"fp32_floor_ms": 40.0, "half_floor_ms": 20.0, "fp32_step_ms": 60.0,
                "half_step_ms": 48.0, "bytes_ratio": 2.0, "time_ratio": 1.25,
                "time_ratio_low": 1.1, "time_ratio_high": 1.4, "repeats": 5}
    if kind == "kv_cache":
        per_token = kv_bytes_per_token(get_preset("tiny-es"), "fp32")
        return {"short_prompt_len": 16, "long_prompt_len": 256, "new_tokens": 32, "repeats": 5,
                "short_kv_bytes": per_token * 17, "long_kv_bytes": per_token * 257,
                "bytes_ratio": 1.07, "short_ms_per_token": 6.5, "long_ms_per_token": 6.76,
                "time_ratio": 6.76 / 6.5, "time_ratio_low": 1.0, "time_ratio_high": 1.08}
    if kind == "continuous_batching":
        p = get_spec(kind).resolve_params("ci", {})
        from ai_evolution.reference.continuous_batching import simulated_gains
        gains = simulated_gains(
            p["dc_device"], p["dc_model"], p["dc_requests"], p["dc_prompt_len"],
            p["dc_mean_output"], p["dc_caps"][-1], max(p["dc_caps"]), 0)  # simulated once
        return ({f"gain_width_{b}": g for b, g in gains.items()}
                | {f"hb_width_{b}": sum(1 / k for k in range(1, b + 1)) for b in gains}
                | {"cap": p["dc_caps"][-1]})
    if kind == "paged_attention":
        return {f"{k}_bs{b}": v for b in (4, 16, 64)
                for k, v in (("utilization", 0.9), ("tokens_per_s", 300.0))}
    if kind == "observability":
        return {"capacity_req_s": simulated_capacity(), "worst_ttft_p99_s_at_0.5": 0.08,
                "worst_ttft_p99_s_at_0.6": 0.15, "worst_ttft_p99_s_at_0.7": 0.21}
    if kind == "quantization":
        return quantization_measurement()
    if kind == "flash_attention":
        return flash_measurement()
    if kind == "speculative":
        return speculative_measurement()
    if kind == "determinism":
        return determinism_measurement()
    if kind == "operations":
        return operations_measurement()
    if kind == "distributed":
        from ai_evolution.checks.distributed import challenge_answer
        return challenge_answer(get_spec("distributed").resolve_params("ci", {}))
    if kind == "hybrid":
        from ai_evolution.checks.hybrid import challenge_answer
        return challenge_answer()
    budgets = get_spec(kind).resolve_params("ci", {})["budgets"]
    return {"normal_step_ms": 10.0} | {f"{k}_ms_budget_{b}": 12.0 + b for b in budgets
                                       for k in ("itl_p99", "ttft")}


def flash_measurement(**changes) -> dict:
    """Lab 8's challenge answered from the IO model: the tiles that move the fewest bytes in a
    48 KiB fast memory (causal prefill of 2048 tokens, d = 64, fp16) and their byte counts."""
    from ai_evolution.sim.attention_io import best_tiles, flash_io, naive_io, working_set_bytes
    n, d, mem = 2048, 64, 48 * 1024
    bq, bk = best_tiles(n, d, mem, 2, causal=True)
    tiled = flash_io(n, d, bq, bk, 2, causal=True).hbm_bytes
    return {"n": n, "head_dim": d, "fast_memory_bytes": mem, "block_q": bq, "block_k": bk,
            "working_set_bytes": working_set_bytes(bq, bk, d), "tiled_bytes": tiled,
            "naive_bytes": naive_io(n, d, 2).hbm_bytes, "counted_bytes": tiled} | changes


def speculative_measurement(**changes) -> dict:
    """Lab 9's challenge answered from the simulator: the first batch size at which the H100
    speedup (alpha = 0.5, k = 4, 4096 tokens of context) drops below 1, and the speedups around it."""
    from ai_evolution.sim.cost_model import predict_speculation_h100
    steps = predict_speculation_h100(0.5, 4, list(range(1, 513)), 4096)
    b = next(s.batch_size for s in steps if s.speedup < 1)
    return {"alpha": 0.5, "k": 4, "context_len": 4096, "break_even_batch": b,
            "speedup_batch1": steps[0].speedup, "speedup_before": steps[b - 2].speedup,
            "speedup_at_break_even": steps[b - 1].speedup} | changes


def determinism_measurement(**changes) -> dict:
    """Lab 10's challenge answered from the reference: the float32 split-K sums of the challenge's
    vector for every power-of-two split, and the split farthest from the exact sum."""
    import math

    from ai_evolution.checks.determinism import challenge_values
    from ai_evolution.reference.determinism import reference_split_sum
    v = challenge_values()
    splits = [2 ** j for j in range(13)]
    results = [reference_split_sum(v, s) for s in splits]
    exact = math.fsum(float(x) for x in v)
    errors = [abs(r - exact) for r in results]
    worst = max(range(13), key=lambda j: (errors[j], -splits[j]))
    return {"n": 4096, "seed": 10, "split_sizes": splits, "results": results,
            "distinct_results": len(set(results)), "exact_sum": exact,
            "worst_split": splits[worst], "worst_abs_error": errors[worst]} | changes


def operations_measurement(**changes) -> dict:
    """Lab 12's challenge answered from the simulator: the goodput of one replica on an H100 and
    on the challenge's GPU (the lab's ci capacity study, seed 0) and the replicas each needs."""
    from ai_evolution.checks.operations import challenge_capacity
    p = get_spec("operations").resolve_params("ci", {})
    device, target = p["challenge_device"], p["challenge_target_rate"]
    h100 = challenge_capacity(p, 0, "h100-sxm", target)
    other = challenge_capacity(p, 0, device, target)
    return {"target_rate": target,
            "h100_goodput_rate": h100["goodput_rate"], "device_goodput_rate": other["goodput_rate"],
            "h100_replicas": h100["replicas"], "device_replicas": other["replicas"]} | changes


def quantization_measurement(**changes) -> dict:
    """Lab 7's challenge answered from a plausible table (bytes per weight are tiny-es's): within
    2 % at the top of the interval, int4-asym-g32 is the cheapest; three cheaper formats miss."""
    from ai_evolution.model.memory import linear_shapes, quantized_weight_bytes
    cfg = get_preset("tiny-es")
    n = sum(o * k for _, o, k in linear_shapes(cfg))
    ppl = {"bf16": (520.0, 0.0), "int8": (521.0, 0.5), "int4-g64": (530.0, 3.0),
           "int4-g32": (528.0, 2.5), "int4-asym-g64": (540.0, 4.0), "int4-asym-g32": (524.0, 1.5)}
    table = {k: {"bytes_per_weight": 2.0 if k == "bf16" else
                 quantized_weight_bytes(cfg, k, "bf16") / n,
                 "perplexity": p, "increase_high_pct": high} for k, (p, high) in ppl.items()}
    chosen = table["int4-asym-g32"]
    m = {"tolerance_pct": 2.0, "bf16_perplexity": 520.0,
         "chosen_bytes_per_weight": chosen["bytes_per_weight"], "chosen_perplexity": 524.0,
         "chosen_increase_pct": 100 * (524.0 / 520.0 - 1), "chosen_increase_high_pct": 1.5,
         "formats_compared": 6, "cheaper_rejected": 3, "chosen_format": "int4-asym-g32",
         "table": table}
    return m | changes


def simulated_capacity(seed: int = 0) -> float:
    """The capacity (req/s) of lab 6's simulated server under ``ci``, as its notebook prints it."""
    params = get_spec("observability").resolve_params("ci", {})
    dc, shape, _ = datacenter_target(params)
    width = params["dc_max_num_seqs"]
    return measure_capacity(dc, width, 8 * width, *shape, seed)[0]["capacity_req_s"]


def grade(ns: dict, kind: str, result: dict | None = None) -> dict[str, float]:
    """Points per criterion; ``result`` reuses graded functions with the contract of ``ns``."""
    a = find_assessment(kind)
    if result is None:
        with contextlib.redirect_stdout(io.StringIO()):
            result = grade_namespace(ns, a, 0)
    else:
        result = result | {"contract": json.loads(json.dumps(ns["contract"]))
                           if "contract" in ns else None}
    info = RunInfo(status="ok", exported=True, contract=result["contract"],
                   contract_error=result.get("contract_error"), kernel_seed="0",
                   kernel_profile="'ci'")
    g = score("prueba", "prueba.ipynb", info, a, 0, functions=result["functions"])
    return {s.id: s.earned for s in g.scores}


# Plausible mistakes, each written as a student would: (criterion it must cost, source).
WRONG = {
    "roofline": [
        ("decode_roofline", "bytes en bits", '''
_ok = decode_roofline
def decode_roofline(config, dtype, batch_size, context_len, bandwidth_bytes_per_s):
    r = dict(_ok(config, dtype, batch_size, context_len, bandwidth_bytes_per_s))
    r["bytes"] *= 8
    r["intensity"], r["floor_s"] = r["flops"] / r["bytes"], r["bytes"] / bandwidth_bytes_per_s
    return r
'''),
        ("decode_roofline", "suelo sin los bytes de la caché KV", '''
_ok = decode_roofline
def decode_roofline(config, dtype, batch_size, context_len, bandwidth_bytes_per_s):
    r = dict(_ok(config, dtype, batch_size, context_len, bandwidth_bytes_per_s))
    r["floor_s"] = weight_bytes_read(config, dtype, batch_size) / bandwidth_bytes_per_s
    return r
'''),
        ("predict_step", "suma los dos límites", '''
_ok = predict_step
def predict_step(step_bytes, step_flops, bandwidth_bytes_per_s, peak_flops, overhead_s):
    r = _ok(step_bytes, step_flops, bandwidth_bytes_per_s, peak_flops, overhead_s)
    r["time_s"] = step_bytes / bandwidth_bytes_per_s + step_flops / peak_flops + overhead_s
    return r
'''),
        ("predict_step", "a igualdad dice que manda el cálculo", '''
_ok = predict_step
def predict_step(step_bytes, step_flops, bandwidth_bytes_per_s, peak_flops, overhead_s):
    r = _ok(step_bytes, step_flops, bandwidth_bytes_per_s, peak_flops, overhead_s)
    memory_s, compute_s = step_bytes / bandwidth_bytes_per_s, step_flops / peak_flops
    r["bound"] = "compute" if compute_s >= memory_s else "memory"
    return r
'''),
        ("departure_batch", ">= en vez de >", '''
def departure_batch(batch_sizes, measured_s, step_costs, bandwidth_bytes_per_s, peak_flops,
                    tolerance):
    c = step_costs[0]
    roof = predict_step(c["bytes"], c["flops"], bandwidth_bytes_per_s, peak_flops, 0.0)
    overhead = max(0.0, measured_s[0] - roof["time_s"])
    for b, m, c in zip(batch_sizes, measured_s, step_costs):
        p = predict_step(c["bytes"], c["flops"], bandwidth_bytes_per_s, peak_flops, overhead)
        if m >= p["time_s"] * (1 + tolerance):
            return b
    return None
'''),
        ("departure_batch", "overhead negativo si el lote 1 mide menos que su roofline", '''
def departure_batch(batch_sizes, measured_s, step_costs, bandwidth_bytes_per_s, peak_flops,
                    tolerance):
    c = step_costs[0]
    overhead = measured_s[0] - predict_step(c["bytes"], c["flops"], bandwidth_bytes_per_s,
                                            peak_flops, 0.0)["time_s"]
    for b, m, c in zip(batch_sizes, measured_s, step_costs):
        p = predict_step(c["bytes"], c["flops"], bandwidth_bytes_per_s, peak_flops, overhead)
        if m > p["time_s"] * (1 + tolerance):
            return b
    return None
'''),
    ],
    "kv_cache": [
        ("kv_bytes_per_token", "bits en vez de bytes", '''
def kv_bytes_per_token(config, dtype):
    return 8 * 2 * config.num_layers * config.num_kv_heads * config.head_dim * dtype_bytes(dtype)
'''),
        ("kv_bytes_per_token", "olvida el factor 2 de K y V", '''
def kv_bytes_per_token(config, dtype):
    return config.num_layers * config.num_kv_heads * config.head_dim * dtype_bytes(dtype)
'''),
        ("cached_attention", "índice de la caché desplazado en uno", '''
_ok = my_cached_attention
def my_cached_attention(q, k_new, v_new, k_cache, v_cache, positions):
    return _ok(q, k_new, v_new, k_cache, v_cache, positions + 1)
'''),
        ("fit_growth", "ajuste libre: admite coeficientes negativos", '''
def fit_growth(n, t):
    c2, c1, c0 = np.polyfit(np.asarray(n, float), np.asarray(t, float), 2)
    big = float(np.max(n))
    fitted = c0 + c1 * big + c2 * big**2
    return {"c0": c0, "c1": c1, "c2": c2, "quadratic_share": c2 * big**2 / fitted,
            "exponent": (c1 * big + 2 * c2 * big**2) / fitted}
'''),
        ("fit_growth", "cuota y exponente en el último n, no en el mayor", '''
_ok = fit_growth
def fit_growth(n, t):
    f = _ok(n, t)
    last = float(n[-1])
    fitted = f["c0"] + f["c1"] * last + f["c2"] * last**2
    return f | {"quadratic_share": f["c2"] * last**2 / fitted,
                "exponent": (f["c1"] * last + 2 * f["c2"] * last**2) / fitted}
'''),
        ("fit_growth", "quita a la vez todos los términos negativos y se queda con ese ajuste", '''
def fit_growth(n, t):
    n, t = np.asarray(n, float), np.asarray(t, float)
    design, cols = np.stack([np.ones_like(n), n, n**2], axis=1), [0, 1, 2]
    while True:
        coef, *_ = np.linalg.lstsq(design[:, cols], t, rcond=None)
        if np.all(coef >= 0):
            break
        cols = [c for c, v in zip(cols, coef) if v >= 0]
    c = np.zeros(3)
    c[cols] = coef
    big = n.max()
    fitted = c[0] + c[1] * big + c[2] * big**2
    return {"c0": c[0], "c1": c[1], "c2": c[2], "quadratic_share": c[2] * big**2 / fitted,
            "exponent": (c[1] * big + 2 * c[2] * big**2) / fitted}
'''),
        ("sequences_that_fit", "secuencias sin redondear a bloques enteros", '''
_ok = sequences_that_fit
def sequences_that_fit(config, gpu_memory_bytes, utilization, activation_bytes, weight_dtype,
                       kv_dtype, block_size, context_len):
    r = _ok(config, gpu_memory_bytes, utilization, activation_bytes, weight_dtype, kv_dtype,
            block_size, context_len)
    r["sequences"] = r["max_tokens"] // context_len
    return r
'''),
        ("sequences_that_fit", "la caché en el tipo de los pesos", '''
_ok = sequences_that_fit
def sequences_that_fit(config, gpu_memory_bytes, utilization, activation_bytes, weight_dtype,
                       kv_dtype, block_size, context_len):
    return _ok(config, gpu_memory_bytes, utilization, activation_bytes, weight_dtype,
               weight_dtype, block_size, context_len)
'''),
    ],
    "continuous_batching": [
        ("policy", "solo retira cuando todo el lote terminó", '''
def continuous_policy(running, waiting, max_num_seqs):
    if running and not all(r.is_finished for r in running):
        return BatchPlan(retire=[], admit=[])
    return BatchPlan(retire=list(running), admit=list(waiting[:max_num_seqs]))
'''),
        ("summarize", "percentiles sin ordenar", '''
def _pct(values, q):
    pos = (len(values) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (pos - lo)
def summarize(requests):
    tokens = sum(len(r.output_token_ids) for r in requests)
    span = max(r.finish_time for r in requests) - min(r.arrival_time for r in requests)
    ttft = [r.first_token_time - r.arrival_time for r in requests]
    e2e = [r.finish_time - r.arrival_time for r in requests]
    return {"throughput_tok_s": tokens / span, "ttft_p50_s": _pct(ttft, 50),
            "e2e_p50_s": _pct(e2e, 50), "e2e_p99_s": _pct(e2e, 99)}
'''),
    ],
    "paged_attention": [
        ("block_pool", "free no libera", '''
class RefCountedBlockPool(RefCountedBlockPool):
    def free(self, blocks):
        pass
'''),
        ("block_pool", "libera sin restar ref_cnt", '''
class RefCountedBlockPool(RefCountedBlockPool):
    def free(self, blocks):
        for block in blocks:
            self._free[block.block_id] = None
'''),
        ("prefix_lookup", "cubre también el último token", '''
def cached_prefix_blocks(token_ids, block_size, pool):
    hits, parent = [], None
    for i in range(len(token_ids) // block_size):
        parent = hash_block(parent, token_ids[i * block_size:(i + 1) * block_size])
        block = pool.lookup(parent)
        if block is None:
            break
        hits.append(block)
    return hits
'''),
    ],
    "scheduler": [
        ("token_split", "< en vez de <= (uno de menos)", '''
def tokens_granted(want, budget, chunked):
    if want < budget:
        return want
    return int(budget) if chunked and budget >= 1 else 0
'''),
        ("victim", "'newest' expulsa la última aunque haya terminado (solo la ve una comprobación "
                   "oculta)", '''
_ok = choose_victim
def choose_victim(running, rule):
    return running[-1] if rule == "newest" else _ok(running, rule)
'''),
        ("victim", "'newest' expulsa la más antigua", '''
_ok = choose_victim
def choose_victim(running, rule):
    if rule == "newest":
        return next(r for r in running if not r.is_finished)
    return _ok(running, rule)
'''),
        ("victim", "cuenta los tokens totales, no los calculados", '''
def choose_victim(running, rule):
    live = [r for r in running if not r.is_finished]
    if rule == "newest":
        return live[-1]
    pick = min if rule == "fewest_computed" else max
    return pick(reversed(live), key=lambda r: r.num_tokens)
'''),
        ("victim", "un empate va a la más antigua", '''
def choose_victim(running, rule):
    live = [r for r in running if not r.is_finished]
    if rule == "newest":
        return live[-1]
    pick = min if rule == "fewest_computed" else max
    return pick(live, key=lambda r: r.num_computed_tokens)
'''),
    ],
    "observability": [
        ("arrivals", "huecos fijos de 1/rate", '''
def poisson_arrival_times(n, rate, seed):
    if not (math.isfinite(rate) and rate > 0):
        raise ValueError(f"rate {rate!r}")
    return [k / rate for k in range(n)]
'''),
        ("arrivals", "huecos de media rate en vez de 1/rate", '''
def poisson_arrival_times(n, rate, seed):
    if not (math.isfinite(rate) and rate > 0):
        raise ValueError(f"rate {rate!r}")
    return [0.0] + np.cumsum(np.random.default_rng(seed).exponential(rate, n - 1)).tolist()
'''),
        ("arrivals", "ignora la semilla", '''
def poisson_arrival_times(n, rate, seed):
    if not (math.isfinite(rate) and rate > 0):
        raise ValueError(f"rate {rate!r}")
    return [0.0] + np.cumsum(np.random.default_rng().exponential(1 / rate, n - 1)).tolist()
'''),
        ("arrivals", "rechaza una tasa entera (solo la ve una comprobación oculta)", '''
def poisson_arrival_times(n, rate, seed):
    if not isinstance(rate, float) or not math.isfinite(rate) or rate <= 0:
        raise ValueError(f"rate {rate!r}")
    return [0.0] + np.cumsum(np.random.default_rng(seed).exponential(1 / rate, n - 1)).tolist()
'''),
        ("percentile", "sin ordenar", '''
def interpolated_percentile(values, q):
    h = (len(values) - 1) * q / 100
    lo = math.floor(h)
    hi = min(lo + 1, len(values) - 1)
    return values[lo] + (h - lo) * (values[hi] - values[lo])
'''),
        ("percentile", "posición n·q/100 (desplazada en uno)", '''
def interpolated_percentile(values, q):
    x = sorted(values)
    h = min(len(x) * q / 100, len(x) - 1)
    lo = math.floor(h)
    hi = min(lo + 1, len(x) - 1)
    return x[lo] + (h - lo) * (x[hi] - x[lo])
'''),
        ("percentile", "q <= 1 como fracción (solo la ve una comprobación oculta)", '''
def interpolated_percentile(values, q):
    if q <= 1:
        q = 100 * q
    x = sorted(values)
    h = (len(x) - 1) * q / 100
    lo = math.floor(h)
    hi = min(lo + 1, len(x) - 1)
    return x[lo] + (h - lo) * (x[hi] - x[lo])
'''),
        ("bootstrap", "remuestrea sin reemplazo", '''
def bootstrap_interval(values, q, n_boot=1000, alpha=0.05, seed=0):
    rng = np.random.default_rng(seed)
    stats = [interpolated_percentile(list(rng.permutation(values)), q) for _ in range(n_boot)]
    pct = interpolated_percentile
    return pct(stats, 100 * alpha / 2), pct(stats, 100 * (1 - alpha / 2))
'''),
        ("bootstrap", "ignora la semilla", '''
def bootstrap_interval(values, q, n_boot=1000, alpha=0.05, seed=0):
    x = np.asarray(values, dtype=float)
    idx = np.random.default_rng().integers(0, len(x), size=(n_boot, len(x)))
    stats = [interpolated_percentile(list(row), q) for row in x[idx]]
    pct = interpolated_percentile
    return pct(stats, 100 * alpha / 2), pct(stats, 100 * (1 - alpha / 2))
'''),
    ],
    "flash_attention": [
        ("online_softmax_update", "olvida reescalar lo acumulado", '''
def online_softmax_update(m, l, o, scores, v):
    m_new = torch.maximum(m, scores.amax(dim=-1))
    shift = torch.where(torch.isneginf(m_new), torch.zeros_like(m_new), m_new)
    p = torch.exp(scores - shift[..., None])
    return m_new, l + p.sum(dim=-1), o + p @ v
'''),
        ("online_softmax_update", "no actualiza el máximo después del primer bloque", '''
def online_softmax_update(m, l, o, scores, v):
    m_new = torch.where(torch.isneginf(m), scores.amax(dim=-1), m)
    shift = torch.where(torch.isneginf(m_new), torch.zeros_like(m_new), m_new)
    alpha = torch.exp(m - shift)
    p = torch.exp(scores - shift[..., None])
    return m_new, alpha * l + p.sum(dim=-1), alpha[..., None] * o + p @ v
'''),
        ("online_softmax_update", "NaN en una fila sin claves visibles", '''
def online_softmax_update(m, l, o, scores, v):
    m_new = torch.maximum(m, scores.amax(dim=-1))
    alpha = torch.exp(m - m_new)
    p = torch.exp(scores - m_new[..., None])
    return m_new, alpha * l + p.sum(dim=-1), alpha[..., None] * o + p @ v
'''),
        ("tiled_attention", "máscara con < : la diagonal queda fuera", '''
_ok = tiled_attention
def tiled_attention(q, k, v, causal=False, q_positions=None, block_q=64, block_k=64):
    if causal:
        S, T = k.shape[2], q.shape[2]
        pos = torch.arange(S - T, S) if q_positions is None else torch.as_tensor(q_positions)
        q_positions = pos - 1
    return _ok(q, k, v, causal, q_positions, block_q, block_k)
'''),
        ("tiled_attention", "las consultas en las posiciones 0..T-1 aunque haya claves en caché", '''
_ok = tiled_attention
def tiled_attention(q, k, v, causal=False, q_positions=None, block_q=64, block_k=64):
    if q_positions is None:
        q_positions = torch.arange(q.shape[2])
    return _ok(q, k, v, causal, q_positions, block_q, block_k)
'''),
        ("tiled_attention", "materializa la matriz de puntuaciones entera", '''
def tiled_attention(q, k, v, causal=False, q_positions=None, block_q=64, block_k=64):
    B, H, T, D = q.shape
    S, group = k.shape[2], q.shape[1] // k.shape[1]
    kk, vv = k.float().repeat_interleave(group, 1), v.float().repeat_interleave(group, 1)
    s = q.float() @ kk.transpose(-1, -2) / math.sqrt(D)
    if causal:
        pos = torch.arange(S - T, S) if q_positions is None else torch.as_tensor(q_positions)
        visible = torch.arange(S)[None, None, :] <= pos.expand(B, T)[:, :, None]
        s = s.masked_fill(~visible[:, None], -math.inf)
    return (torch.softmax(s, dim=-1) @ vv).to(q.dtype)
'''),
        ("flash_step", "no escribe la caché", '''
_ok = flash_step
def flash_step(q, k_new, v_new, k_cache, v_cache, positions, block_q=16, block_k=16):
    return _ok(q, k_new, v_new, k_cache.clone(), v_cache.clone(), positions, block_q, block_k)
'''),
        ("flash_step", "atiende sin máscara causal", '''
def flash_step(q, k_new, v_new, k_cache, v_cache, positions, block_q=16, block_k=16):
    B, Hkv, T, D = k_new.shape
    index = positions[:, None, :, None].expand(B, Hkv, T, D)
    k_cache.scatter_(2, index, k_new)
    v_cache.scatter_(2, index, v_new)
    L = int(positions.max()) + 1
    return tiled_attention(q, k_cache[:, :, :L], v_cache[:, :, :L], causal=False,
                           block_q=block_q, block_k=block_k)
'''),
        ("tiled_bytes", "K y V leídos una sola vez", '''
def tiled_bytes(n, d, block_q, block_k, elem_bytes=2, causal=False):
    return elem_bytes * 4 * n * d
'''),
        ("tiled_bytes", "el triángulo exacto en vez de bloques enteros de claves", '''
def tiled_bytes(n, d, block_q, block_k, elem_bytes=2, causal=False):
    keys = sum(min(n, r0 + block_q) if causal else n for r0 in range(0, n, block_q))
    return elem_bytes * (2 * n * d + 2 * keys * d)
'''),
    ],
    "quantization": [
        ("quantize_int8", "escala máx/128", '''
def quantize_int8(w):
    scale = w.abs().amax(dim=1) / 128
    safe = torch.where(scale == 0, torch.ones_like(scale), scale)
    return torch.round(w / safe[:, None]).clamp(-127, 127).to(torch.int8), scale
'''),
        ("quantize_int8", "trunca en vez de redondear", '''
def quantize_int8(w):
    scale = w.abs().amax(dim=1) / 127
    safe = torch.where(scale == 0, torch.ones_like(scale), scale)
    return torch.trunc(w / safe[:, None]).to(torch.int8), scale
'''),
        ("quantize_int8", "una escala para toda la matriz", '''
def quantize_int8(w):
    scale = torch.full((w.shape[0],), float(w.abs().max()) / 127, dtype=w.dtype)
    safe = torch.where(scale == 0, torch.ones_like(scale), scale)
    return torch.round(w / safe[:, None]).clamp(-127, 127).to(torch.int8), scale
'''),
        ("dequantize_int8", "escala por columna", '''
def dequantize_int8(q, scale):
    return q.float() * scale.float()[None, :1]
'''),
        ("quantize_int4", "nibbles intercambiados", '''
_ok = quantize_int4_groups
def quantize_int4_groups(w, group_size):
    packed, scale = _ok(w, group_size)
    return ((packed & 15) << 4) | (packed >> 4), scale
'''),
        ("quantize_int4", "escala máx/8", '''
def quantize_int4_groups(w, group_size):
    N, K = w.shape
    if K % group_size:
        raise ValueError("grupo")
    g = w.reshape(N, K // group_size, group_size)
    scale = g.abs().amax(dim=-1) / 8
    safe = torch.where(scale == 0, torch.ones_like(scale), scale)
    u = (torch.round(g / safe[..., None]).clamp(-8, 7) + 8).reshape(N, K).to(torch.uint8)
    return (u[:, 0::2] << 4) | u[:, 1::2], scale
'''),
        ("quantize_int4", "no avisa si el grupo no divide la fila", '''
_ok = quantize_int4_groups
def quantize_int4_groups(w, group_size):
    N, K = w.shape
    if K % group_size:
        return _ok(w[:, :K - K % group_size], group_size)
    return _ok(w, group_size)
'''),
        ("predict_step", "sin las escalas", '''
def predict_step_s(config, weight_format, dtype, context_len, bandwidth_bytes_per_s, overhead_s):
    b = dtype_bytes(dtype)
    per = b if weight_format is None else parse_weight_format(weight_format).bits / 8
    linear = sum(o * k * per for _, o, k in linear_shapes(config))
    rest = (unquantized_params(config) + config.hidden_size) * b
    kv = kv_bytes_per_token(config, dtype) * (context_len + 1)
    return (linear + rest + kv) / bandwidth_bytes_per_s + overhead_s
'''),
        ("predict_step", "caché de context_len tokens", '''
_ok = predict_step_s
def predict_step_s(config, weight_format, dtype, context_len, bandwidth_bytes_per_s, overhead_s):
    return _ok(config, weight_format, dtype, context_len - 1, bandwidth_bytes_per_s, overhead_s)
'''),
    ],    "speculative": [
        ("greedy_accept", "cuenta como aceptado el primer desacuerdo", '''
def greedy_accept(draft_tokens, target_argmax):
    n = 0
    while n < len(draft_tokens) and int(draft_tokens[n]) == int(target_argmax[n]):
        n += 1
    return min(n + 1, len(draft_tokens)), int(target_argmax[n])
'''),
        ("greedy_accept", "con todas aceptadas repite la última en vez del bonus", '''
def greedy_accept(draft_tokens, target_argmax):
    n = 0
    while n < len(draft_tokens) and int(draft_tokens[n]) == int(target_argmax[n]):
        n += 1
    return n, int(target_argmax[min(n, len(draft_tokens) - 1)])
'''),
        ("greedy_accept", "el token siguiente una posición más allá", '''
def greedy_accept(draft_tokens, target_argmax):
    n = 0
    while n < len(draft_tokens) and int(draft_tokens[n]) == int(target_argmax[n]):
        n += 1
    return n, int(target_argmax[min(n + 1, len(draft_tokens))])
'''),
        ("greedy_accept", "compara cada propuesta con la predicción siguiente", '''
def greedy_accept(draft_tokens, target_argmax):
    n = 0
    while n < len(draft_tokens) and int(draft_tokens[n]) == int(target_argmax[n + 1]):
        n += 1
    return n, int(target_argmax[n])
'''),
        ("acceptance_and_residual", "residual sin normalizar", '''
def acceptance_and_residual(p, q):
    safe_q = torch.where(q > 0, q, torch.ones_like(q))
    accept = torch.where(q > 0, torch.clamp(p / safe_q, max=1.0), torch.ones_like(p))
    return accept, torch.clamp(p - q, min=0.0)
'''),
        ("acceptance_and_residual", "cociente invertido: q / p", '''
_ok = acceptance_and_residual
def acceptance_and_residual(p, q):
    safe_p = torch.where(p > 0, p, torch.ones_like(p))
    return torch.clamp(q / safe_p, max=1.0), _ok(p, q)[1]
'''),
        ("acceptance_and_residual", "remuestrea de p en vez del residuo", '''
_ok = acceptance_and_residual
def acceptance_and_residual(p, q):
    return _ok(p, q)[0], p.clone()
'''),
        ("acceptance_and_residual", "NaN cuando p = q (nada que repartir)", '''
_ok = acceptance_and_residual
def acceptance_and_residual(p, q):
    excess = torch.clamp(p - q, min=0.0)
    return _ok(p, q)[0], excess / excess.sum()
'''),
        ("speedup_table", "olvida el token del propio objetivo", '''
def speedup_table(alpha, cost_ratio, k_max):
    s = [sum(alpha ** i for i in range(k)) / (1 + k * cost_ratio) for k in range(1, k_max + 1)]
    return {"speedup": s, "best_k": 1 + max(range(k_max), key=lambda i: (s[i], -i))}
'''),
        ("speedup_table", "el mejor k por tokens, no por aceleración", '''
_ok = speedup_table
def speedup_table(alpha, cost_ratio, k_max):
    out = _ok(alpha, cost_ratio, k_max)
    tokens = [sum(alpha ** i for i in range(k + 1)) for k in range(1, k_max + 1)]
    out["best_k"] = 1 + max(range(k_max), key=lambda i: (tokens[i], -i))
    return out
'''),
        ("speedup_table", "forma cerrada: divide entre cero con alpha = 1", '''
def speedup_table(alpha, cost_ratio, k_max):
    s = []
    for k in range(1, k_max + 1):
        tokens = (1 - alpha ** (k + 1)) / (1 - alpha) if alpha != 1 else float("nan")
        s.append(tokens / (1 + k * cost_ratio))
    return {"speedup": s, "best_k": 1 + max(range(k_max), key=lambda i: (s[i], -i))}
'''),
    ],
    "determinism": [
        ("invariant_linear", "F.linear con el lote entero: la fila depende del lote", '''
def invariant_linear(x, weight, bias=None):
    return F.linear(x, weight, bias)
'''),
        ("invariant_linear", "invariante pero sin el sesgo", '''
def invariant_linear(x, weight, bias=None):
    return torch.cat([F.linear(x[i:i + 1], weight) for i in range(x.shape[0])])
'''),
        ("invariant_linear", "calcula en float32 y no vuelve al dtype de x", '''
def invariant_linear(x, weight, bias=None):
    return torch.cat([F.linear(x[i:i + 1].float(), weight.float(),
                               None if bias is None else bias.float()) for i in range(x.shape[0])])
'''),
        ("compare_runs", "compara los logits con tolerancia", '''
_ok = compare_runs
def compare_runs(solo_tokens, solo_logits, batch_tokens, batch_logits):
    out = _ok(solo_tokens, solo_logits, batch_tokens, batch_logits)
    n = min(solo_logits.shape[0], batch_logits.shape[0])
    if out["first_token_step"] is not None:
        n = min(n, out["first_token_step"] + 1)
    close = [i for i in range(n) if not torch.allclose(solo_logits[i], batch_logits[i], atol=1e-3)]
    out["first_logit_step"] = close[0] if close else None
    return out
'''),
        ("compare_runs", "cuenta los logits después de que cambió el texto", '''
_ok = compare_runs
def compare_runs(solo_tokens, solo_logits, batch_tokens, batch_logits):
    out = _ok(solo_tokens, solo_logits, batch_tokens, batch_logits)
    n = min(solo_logits.shape[0], batch_logits.shape[0])
    out["max_abs_diff"] = float((solo_logits[:n] - batch_logits[:n]).abs().max()) if n else 0.0
    return out
'''),
        ("compare_runs", "no ve que una ejecución es prefijo de la otra", '''
_ok = compare_runs
def compare_runs(solo_tokens, solo_logits, batch_tokens, batch_logits):
    out = _ok(solo_tokens, solo_logits, batch_tokens, batch_logits)
    a, b = list(solo_tokens), list(batch_tokens)
    if len(a) != len(b) and a[:len(b)] == b[:len(a)]:
        out["first_token_step"] = None
    return out
'''),
    ],
    "hybrid": [
        ("reusable_tokens", "no deja ningún token del prompt por calcular", '''
def reusable_tokens(shared_len, prompt_len, interval):
    return min(shared_len, prompt_len) // interval * interval
'''),
        ("reusable_tokens", "redondea hacia arriba, a un punto de control después del prefijo", '''
def reusable_tokens(shared_len, prompt_len, interval):
    return -(-min(shared_len, prompt_len - 1) // interval) * interval
'''),
        ("reusable_tokens", "reutiliza todo el prefijo compartido, sin puntos de control", '''
def reusable_tokens(shared_len, prompt_len, interval):
    return min(shared_len, prompt_len - 1)
'''),
        ("state_bytes", "olvida la ventana de la convolución", '''
def state_bytes(config, dtype_bytes=4.0):
    return float(config.num_linear_layers * config.linear_num_value_heads
                 * config.linear_key_head_dim * config.linear_value_head_dim * dtype_bytes)
'''),
        ("state_bytes", "una matriz por cabeza de clave, no de valor", '''
def state_bytes(config, dtype_bytes=4.0):
    if not config.num_linear_layers:
        return 0.0
    channels = (2 * config.linear_num_key_heads * config.linear_key_head_dim
                + config.linear_num_value_heads * config.linear_value_head_dim)
    per_layer = (config.linear_num_key_heads * config.linear_key_head_dim
                 * config.linear_value_head_dim + channels * (config.linear_conv_kernel_dim - 1))
    return float(config.num_linear_layers * per_layer * dtype_bytes)
'''),
        ("state_bytes", "cuenta todas las capas", '''
_ok = state_bytes
def state_bytes(config, dtype_bytes=4.0):
    if not config.num_linear_layers:
        return 0.0
    return _ok(config, dtype_bytes) / config.num_linear_layers * config.num_layers
'''),
        ("delta_step", "escribe el valor entero, no la diferencia con la predicción", '''
def delta_step(state, q, k, v, g, beta):
    S = state.float() * g.float().exp()[..., None, None]
    S = S + k.float()[..., :, None] * (v.float() * beta.float()[..., None])[..., None, :]
    return torch.einsum("bhkv,bhk->bhv", S, q.float()), S
'''),
        ("delta_step", "se desvanece después de escribir", '''
def delta_step(state, q, k, v, g, beta):
    S = state.float()
    delta = (v.float() - torch.einsum("bhkv,bhk->bhv", S, k.float())) * beta.float()[..., None]
    S = (S + k.float()[..., :, None] * delta[..., None, :]) * g.float().exp()[..., None, None]
    return torch.einsum("bhkv,bhk->bhv", S, q.float()), S
'''),
        ("delta_step", "lee el estado antes de escribir", '''
def delta_step(state, q, k, v, g, beta):
    S = state.float() * g.float().exp()[..., None, None]
    out = torch.einsum("bhkv,bhk->bhv", S, q.float())
    delta = (v.float() - torch.einsum("bhkv,bhk->bhv", S, k.float())) * beta.float()[..., None]
    return out, S + k.float()[..., :, None] * delta[..., None, :]
'''),
        ("delta_step", "modifica el estado de entrada", '''
def delta_step(state, q, k, v, g, beta):
    state.mul_(g.exp()[..., None, None])
    delta = (v - torch.einsum("bhkv,bhk->bhv", state, k)) * beta[..., None]
    state.add_(k[..., :, None] * delta[..., None, :])
    return torch.einsum("bhkv,bhk->bhv", state, q), state
'''),
        ("sequences_that_fit", "sin el estado", '''
def sequences_that_fit(config, gpu_bytes, context_len, utilization=0.9):
    free = utilization * gpu_bytes - weight_bytes(config, "bf16")
    return int(free // (kv_bytes_per_token(config, "bf16") * context_len)) if free > 0 else 0
'''),
        ("sequences_that_fit", "sin restar los pesos", '''
def sequences_that_fit(config, gpu_bytes, context_len, utilization=0.9):
    per = kv_bytes_per_token(config, "bf16") * context_len + state_bytes(config, 4.0)
    return int(utilization * gpu_bytes // per)
'''),
        ("sequences_that_fit", "redondea al entero más cercano", '''
def sequences_that_fit(config, gpu_bytes, context_len, utilization=0.9):
    free = utilization * gpu_bytes - weight_bytes(config, "bf16")
    per = kv_bytes_per_token(config, "bf16") * context_len + state_bytes(config, 4.0)
    return max(0, round(free / per))
'''),
    ],
    "operations": [
        ("pick_tenant", "admite al que más servicio ha recibido", '''
def pick_tenant(counters, backlogged):
    return max(backlogged, key=lambda t: counters[t])
'''),
        ("pick_tenant", "el menor contador entre todos, también sin cola", '''
def pick_tenant(counters, backlogged):
    return min(counters, key=lambda t: counters[t])
'''),
        ("pick_tenant", "desempata por el nombre, no por la cola", '''
def pick_tenant(counters, backlogged):
    return min(backlogged, key=lambda t: (counters[t], str(t)))
'''),
        ("bucket_waits", "el cubo empieza vacío", '''
_ok = bucket_waits
def bucket_waits(times, costs, rate, capacity):
    if not times:
        return []
    return _ok([times[0]] + list(times), [capacity] + list(costs), rate, capacity)[1:]
'''),
        ("bucket_waits", "un rechazo también gasta fichas", '''
def bucket_waits(times, costs, rate, capacity):
    level, last, out = float(capacity), times[0] if times else 0.0, []
    for t, n in zip(times, costs):
        level = min(capacity, level + (t - last) * rate)
        last = t
        if n > capacity:
            out.append(math.inf)
            continue
        out.append(max(0.0, (n - level) / rate))
        level -= n
    return out
'''),
        ("bucket_waits", "el cubo no tiene tope", '''
def bucket_waits(times, costs, rate, capacity):
    level, last, out = float(capacity), times[0] if times else 0.0, []
    for t, n in zip(times, costs):
        level += (t - last) * rate
        last = t
        if n > capacity:
            out.append(math.inf)
        elif n <= level:
            level -= n
            out.append(0.0)
        else:
            out.append((n - level) / rate)
    return out
'''),
        ("bucket_waits", "Retry-After del coste entero", '''
_ok = bucket_waits
def bucket_waits(times, costs, rate, capacity):
    return [w if w in (0.0, math.inf) else n / rate
            for w, n in zip(_ok(times, costs, rate, capacity), costs)]
'''),
        ("goodput_rate", "la media en lugar del p99", '''
def goodput_rate(probes, slo_ttft_s, slo_tpot_s):
    best = None
    for rate in sorted(probes):
        ttft = [t for t, _ in probes[rate] if t is not None]
        tpot = [p for _, p in probes[rate] if p is not None]
        if np.mean(ttft) > slo_ttft_s or (tpot and np.mean(tpot) > slo_tpot_s):
            break
        best = rate
    return best
'''),
        ("goodput_rate", "cuenta sondas por encima de una que falla", '''
_ok = goodput_rate
def goodput_rate(probes, slo_ttft_s, slo_tpot_s):
    ok = [r for r in probes if _ok({r: probes[r]}, slo_ttft_s, slo_tpot_s) is not None]
    return max(ok) if ok else None
'''),
        ("goodput_rate", "descarta las peticiones sin terminar", '''
_ok = goodput_rate
def goodput_rate(probes, slo_ttft_s, slo_tpot_s):
    return _ok({r: [x for x in v if x[0] is not None] for r, v in probes.items()},
               slo_ttft_s, slo_tpot_s)
'''),
        ("goodput_rate", "solo mira el TTFT", '''
_ok = goodput_rate
def goodput_rate(probes, slo_ttft_s, slo_tpot_s):
    return _ok(probes, slo_ttft_s, math.inf)
'''),
    ],
    "distributed": [
        ("shard_linear", "reparte las entradas por columnas y las salidas por filas", '''
def shard_linear(weight, rank, n, mode):
    dim = 1 if mode == "column" else 0
    size = weight.shape[dim] // n
    return weight.narrow(dim, rank * size, size).clone()
'''),
        ("shard_linear", "el trozo del rango siguiente", '''
def shard_linear(weight, rank, n, mode):
    dim = 0 if mode == "column" else 1
    size = weight.shape[dim] // n
    return weight.narrow(dim, ((rank + 1) % n) * size, size).clone()
'''),
        ("shard_linear", "trozos intercalados, no contiguos", '''
def shard_linear(weight, rank, n, mode):
    return (weight[rank::n] if mode == "column" else weight[:, rank::n]).clone()
'''),
        ("allreduce_bytes", "un all-reduce por capa", '''
def allreduce_bytes(config, num_tokens, dtype_bytes):
    return config.num_layers * num_tokens * config.hidden_size * dtype_bytes
'''),
        ("allreduce_bytes", "la anchura del MLP en el mensaje", '''
def allreduce_bytes(config, num_tokens, dtype_bytes):
    return 2 * config.num_layers * num_tokens * config.intermediate_size * dtype_bytes
'''),
        ("allreduce_bytes", "cabezas por su tamaño en lugar de hidden_size", '''
def allreduce_bytes(config, num_tokens, dtype_bytes):
    return 2 * config.num_layers * num_tokens * config.num_heads * config.head_dim * dtype_bytes
'''),
        ("affinity_choice", "el prefijo común más corto", '''
def affinity_choice(prefix, owners, loads, candidates, max_imbalance):
    lightest = min(candidates, key=lambda i: (loads[i], i))
    for h in prefix:
        owner = owners.get(h)
        if owner is not None and owner in candidates:
            return lightest if loads[owner] - loads[lightest] > max_imbalance else owner
    return lightest
'''),
        ("affinity_choice", "sin guardián de carga", '''
def affinity_choice(prefix, owners, loads, candidates, max_imbalance):
    for h in reversed(prefix):
        owner = owners.get(h)
        if owner is not None and owner in candidates:
            return owner
    return min(candidates, key=lambda i: (loads[i], i))
'''),
        ("affinity_choice", "el dueño aunque no sea candidato", '''
def affinity_choice(prefix, owners, loads, candidates, max_imbalance):
    lightest = min(candidates, key=lambda i: (loads[i], i))
    for h in reversed(prefix):
        owner = owners.get(h)
        if owner is not None:
            return lightest if loads[owner] - loads[lightest] > max_imbalance else owner
    return lightest
'''),
        ("affinity_choice", "guardián con >= en lugar de >", '''
def affinity_choice(prefix, owners, loads, candidates, max_imbalance):
    lightest = min(candidates, key=lambda i: (loads[i], i))
    for h in reversed(prefix):
        owner = owners.get(h)
        if owner is not None and owner in candidates:
            return lightest if loads[owner] - loads[lightest] >= max_imbalance else owner
    return lightest
'''),
    ],
}


@pytest.mark.parametrize("kind", KINDS)
def test_reference_gets_full_marks_and_each_mistake_costs_only_its_criterion(kind, one_thread):
    a = find_assessment(kind)
    ns = solution_namespace(kind)
    ns["contract"] = synthetic_contract(kind, good_measurement(kind))
    full = {c.id: c.points for c in a.criteria}
    got = grade(dict(ns), kind)
    assert got == full, got
    # The library's references, in place of the notebook's solution, also pass everything.
    refs = dict(ns) | {c.name: resolve_reference(c.reference) for c in a.functions}
    assert grade(refs, kind) == full
    for criterion, what, source in WRONG[kind]:
        wrong = dict(ns)
        exec(source, wrong)  # noqa: S102
        expected = dict(full) | {criterion: 0}
        assert grade(wrong, kind) == expected, f"{kind}: {what}"


@pytest.mark.parametrize("kind", KINDS)
def test_contract_and_extension_mistakes_cost_their_own_points(kind, one_thread):
    a = find_assessment(kind)
    ns = {c.name: resolve_reference(c.reference) for c in a.functions}
    with contextlib.redirect_stdout(io.StringIO()):
        functions = grade_namespace(ns, a, 0)  # graded once; only the contract changes below
    full = {c.id: c.points for c in a.criteria}
    good = good_measurement(kind)
    bad_contracts = {
        "semilla distinta": (synthetic_contract(kind, good) | {"seed": 3}, ["contract"]),
        "parámetros cambiados": (synthetic_contract(kind, good) | {"params": {"otro": 1}},
                                 ["contract"]),
        "sin límites": (synthetic_contract(kind, good) | {"limitations": []}, ["contract"]),
        "sin student_extension": ({k: v for k, v in synthetic_contract(kind, good).items()
                                   if k != "student_extension"}, ["contract", "extension"]),
        "sin un número medido": (synthetic_contract(kind, {k: "?" for k in good}), ["extension"]),
        "sin la primera clave pedida": (synthetic_contract(kind, dict(list(good.items())[1:])),
                                        ["extension"]),
    }
    for what, (contract, lost) in bad_contracts.items():
        expected = dict(full) | {c: 0 for c in lost}
        assert grade(ns | {"contract": contract}, kind, functions) == expected, f"{kind}: {what}"
    expected = dict(full) | {"runs": 0, "contract": 0, "extension": 0}
    assert grade(dict(ns), kind, functions) == expected


def test_wrong_challenge_data_loses_the_extension_points(one_thread):
    ns = {c.name: resolve_reference(c.reference) for c in find_assessment("kv_cache").functions}
    with contextlib.redirect_stdout(io.StringIO()):
        functions = grade_namespace(ns, find_assessment("kv_cache"), 0)
    good = good_measurement("kv_cache")
    for m in (good | {"short_kv_bytes": 8 * good["short_kv_bytes"],    # bits, not bytes
                      "long_kv_bytes": 8 * good["long_kv_bytes"]},
              good | {"short_kv_bytes": good["short_kv_bytes"] * 16 / 17,  # without the new token
                      "long_kv_bytes": good["long_kv_bytes"] * 256 / 257},
              good | {"long_prompt_len": 64},                             # not eight times longer
              good | {"bytes_ratio": 257 / 17},                           # the cache alone
              good | {"time_ratio": 1.2},                                 # not the medians' ratio
              good | {"repeats": 1}):
        got = grade(ns | {"contract": synthetic_contract("kv_cache", m)}, "kv_cache", functions)
        assert got["extension"] == 0 and got["contract"] == 1, m
    ns = {c.name: resolve_reference(c.reference) for c in find_assessment("roofline").functions}
    good = good_measurement("roofline")
    for m in (good | {"bytes_ratio": 4.0, "half_floor_ms": 10.0},  # as if the KV cache were 8 bits
              good | {"time_ratio": 1.4},          # not the ratio of the two medians
              good | {"time_ratio_low": 1.3},      # an interval that misses its own ratio
              good | {"repeats": 1},               # one round cannot tell a difference from noise
              good | {"half_step_ms": 10.0, "time_ratio": 6.0}):  # a step well below its floor
        got = grade(ns | {"contract": synthetic_contract("roofline", m)}, "roofline")
        assert got["extension"] == 0 and got["contract"] == 1, m
    good = good_measurement("continuous_batching")
    ns = {c.name: resolve_reference(c.reference)
          for c in find_assessment("continuous_batching").functions}
    with contextlib.redirect_stdout(io.StringIO()):
        functions = grade_namespace(ns, find_assessment("continuous_batching"), 0)
    for m in (good | {"gain_width_32": 3.1},                        # a typed gain, not simulated
              good | {"hb_width_8": 8.0},                           # B, not H_B
              good | {"cap": 32}):                                  # the lowest cap
        got = grade(ns | {"contract": synthetic_contract("continuous_batching", m)},
                    "continuous_batching", functions)
        assert got["extension"] == 0 and got["contract"] == 1, m
    good = good_measurement("observability")
    ns = {c.name: resolve_reference(c.reference)
          for c in find_assessment("observability").functions}
    with contextlib.redirect_stdout(io.StringIO()):
        functions = grade_namespace(ns, find_assessment("observability"), 0)
    wrong = {"la capacidad de esta máquina, no la simulada": good | {"capacity_req_s": 3.2},
             "el p99 en milisegundos": {k: v * (1e3 if k.startswith("worst") else 1)
                                        for k, v in good.items()},
             "una sola fracción": dict(list(good.items())[:2]),
             "un p99 menor que el TTFT de una petición sola":
                 good | {"worst_ttft_p99_s_at_0.5": 1e-4}}
    for what, m in wrong.items():
        got = grade(ns | {"contract": synthetic_contract("observability", m)}, "observability",
                    functions)
        assert got["extension"] == 0 and got["contract"] == 1, what


def test_wrong_quantization_choices_lose_the_extension_points(one_thread):
    a = find_assessment("quantization")
    ns = {c.name: resolve_reference(c.reference) for c in a.functions}
    with contextlib.redirect_stdout(io.StringIO()):
        functions = grade_namespace(ns, a, 0)
    good = quantization_measurement()
    table = good["table"]
    wrong = {
        "elige por el valor central (int4-g64 sube un 1,9 %)": quantization_measurement(
            table=table | {"int4-g64": table["int4-g64"] | {"perplexity": 530.0}},
            chosen_format="int4-g64"),
        "otra tolerancia": quantization_measurement(tolerance_pct=1.0),
        "bytes por peso sin las escalas": quantization_measurement(
            table=table | {"int4-g64": table["int4-g64"] | {"bytes_per_weight": 0.5}}),
        "falta un formato del laboratorio": quantization_measurement(
            table={k: v for k, v in table.items() if k != "int4-g32"}),
        "el aumento en tanto por uno": quantization_measurement(
            chosen_increase_pct=524.0 / 520.0 - 1),
        "cuenta fp32 entre los comparados": quantization_measurement(formats_compared=7),
    }
    for what, m in wrong.items():
        got = grade(ns | {"contract": synthetic_contract("quantization", m)}, "quantization",
                    functions)
        assert got["extension"] == 0 and got["contract"] == 1, what
    # A contract that carries the run's quality table: the perplexities must be the run's.
    contract = synthetic_contract("quantization", good)
    rows = [{"label": k, "perplexity": v["perplexity"],
             "increase_interval": [0.0, v["increase_high_pct"] / 100]} for k, v in table.items()]
    contract["results"] = {"quality": {"formats": rows}}
    assert grade(ns | {"contract": contract}, "quantization", functions)["extension"] == 2
    rows[1] = rows[1] | {"perplexity": 519.0}
    assert grade(ns | {"contract": contract}, "quantization", functions)["extension"] == 0


# --- end to end: real notebooks, real kernels, real limits -----------------------------------------

def code_notebook(*sources: str, parameters: bool = True) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    cells = [nbformat.v4.new_code_cell(s) for s in sources]
    if parameters:
        p = nbformat.v4.new_code_cell("seed = 0\nprofile = None")
        p.metadata["tags"] = ["parameters"]
        cells.insert(0, p)
    nb.cells = cells
    return nb


KV_IMPORTS = """from ai_evolution.checks import kv_cache as checks
from ai_evolution.model import ModelConfig, dtype_bytes, get_preset
import numpy as np"""

KV_EXERCISE_1 = """def kv_bytes_per_token(config, dtype):
    return 2 * config.num_layers * config.num_kv_heads * config.head_dim * dtype_bytes(dtype)
checks.check_kv_bytes_per_token(kv_bytes_per_token, seed=seed)"""


def broken_solution() -> nbformat.NotebookNode:
    """The solution with exercise 3 replaced by code that raises."""
    nb = nbformat.read(KV / "notebook_solution.ipynb", as_version=4)
    cell = next(c for c in nb.cells if c.cell_type == "code" and c.source.startswith("def fit_growth"))
    cell.source = ('def fit_growth(n, t):\n    """Fit, badly."""\n'
                   '    return {"c0": 0.0, "c1": 0.0, "c2": 1 / 0, "quadratic_share": 0.0}\n')
    return nb


def realistic_folder(folder: Path) -> dict[str, int]:
    """Lab 2's solution, its untouched student notebook and a broken one, written into
    ``folder``; return the most each may score. Graded with the attacks of
    test_grading_adversarial in one run (the ``graded_kv_cache`` fixture)."""
    a = find_assessment("kv_cache")
    (folder / "solucion.ipynb").write_bytes((KV / "notebook_solution.ipynb").read_bytes())
    (folder / "sin tocar.ipynb").write_bytes((KV / "notebook_student.ipynb").read_bytes())
    nbformat.write(broken_solution(), folder / "rota.ipynb")
    full = sum(c.points for c in a.criteria)
    by_id = {c.id: c.points for c in a.criteria}
    return {"solucion": full, "sin_tocar": 0, "rota": full - by_id["runs"] - by_id["fit_growth"]}


@pytest.fixture(scope="module")
def realistic(graded_kv_cache):
    return graded_kv_cache["out"]


def test_solution_untouched_and_broken_notebooks_get_the_right_rows(realistic):
    out = realistic
    a = find_assessment("kv_cache")
    book = rows(out / "gradebook.csv")
    book = {sid: book[sid] for sid in ("rota", "sin_tocar", "solucion")}
    sol = book["solucion"]
    assert (sol["status"], sol["total"], sol["max_total"], sol["reason"]) == ("ok", "13", "13", "")
    untouched = book["sin_tocar"]
    assert untouched["status"] == "error" and untouched["total"] == "0"
    assert "NotImplementedError" in untouched["reason"] and "celda de código" in untouched["reason"]
    broken = book["rota"]
    assert broken["status"] == "error" and "ZeroDivisionError" in broken["reason"]
    assert points(broken, a) == {c.id: c.points for c in a.criteria} | {"runs": 0, "fit_growth": 0}
    feedback = (out / "feedback" / "rota.md").read_text(encoding="utf-8")
    assert "## Lo que falló" in feedback and "Ejercicio 3" in feedback
    assert "falla el caso 1" in feedback  # the first failing case, from the public check
    assert "## Pendiente de lectura humana" in feedback and "Pregunta 1" in feedback
    untouched_fb = (out / "feedback" / "sin_tocar.md").read_text(encoding="utf-8")
    assert untouched_fb.count("ejercicio sin resolver") == 4
    assert (out / "executed" / "solucion.ipynb").is_file()


def cheap_folder(folder: Path) -> None:
    """Submissions that misbehave, built to be cheap (no lab experiment)."""
    folder.mkdir()
    # The loop sleeps: a cell that never ends need not burn the core the suite's other worker
    # uses for its 15 s, twice.
    nbformat.write(code_notebook(KV_IMPORTS, KV_EXERCISE_1, "import time",
                                 "while True:\n    time.sleep(1)",
                                 "from ai_evolution.timing import fit_growth",
                                 "print('después del bucle')"),
                   folder / "bucle.ipynb")
    nbformat.write(code_notebook(KV_IMPORTS, KV_EXERCISE_1, """import os, shutil
for name in os.listdir('.'):
    shutil.rmtree(name) if os.path.isdir(name) else os.remove(name)
with open('basura.bin', 'wb') as fh:
    fh.write(b'x' * 10_000)"""), folder / "borra archivos.ipynb")
    nbformat.write(code_notebook(KV_IMPORTS, KV_EXERCISE_1), folder / "sin_contrato.ipynb")
    nbformat.write(code_notebook(parameters=False), folder / "vacio.ipynb")
    nbformat.write(code_notebook(KV_IMPORTS, KV_EXERCISE_1, "x = bytearray(8 * 2**30)"),
                   folder / "memoria.ipynb")
    (folder / "no_es_cuaderno.ipynb").write_text("esto no es JSON", encoding="utf-8")
    (folder / "notas.txt").write_text("no es una entrega", encoding="utf-8")


def run_cli(folder: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ai_evolution.grading", "--lab", "kv_cache",
                           str(folder), "--out", str(out), "--timeout", "120", "--cell-timeout",
                           "15", "--memory-mb", "3072", "--jobs", "2", *extra],
                          capture_output=True, text=True, timeout=600)


def test_misbehaving_notebooks_are_recorded_and_grading_twice_gives_the_same_files(tmp_path):
    folder = tmp_path / "entregas"
    cheap_folder(folder)
    before = sorted(p.name for p in folder.iterdir())
    lab_before = sorted(p.name for p in KV.iterdir())
    first = run_cli(folder, tmp_path / "una")
    assert first.returncode == 0, first.stderr[-3000:]
    second = run_cli(folder, tmp_path / "otra")
    assert second.returncode == 0, second.stderr[-3000:]
    written = ["gradebook.csv"] + [f"feedback/{p.name}" for p in (tmp_path / "una/feedback").iterdir()]
    for name in written:
        assert (tmp_path / "una" / name).read_bytes() == (tmp_path / "otra" / name).read_bytes(), name
    assert sorted(p.name for p in folder.iterdir()) == before  # submissions untouched
    assert sorted(p.name for p in KV.iterdir()) == lab_before  # the lab's folder untouched

    a = find_assessment("kv_cache")
    book = rows(tmp_path / "una" / "gradebook.csv")
    assert list(book) == ["borra_archivos", "bucle", "memoria", "no_es_cuaderno", "sin_contrato",
                          "vacio"]
    zero = {c.id: 0 for c in a.criteria}
    ex1 = zero | {"kv_bytes_per_token": 2}
    loop = book["bucle"]  # the loop is interrupted; the cells after it still ran
    assert loop["status"] == "timeout" and "while True" in loop["reason"]
    assert "15 s por celda" in loop["reason"]
    assert "después del bucle" in (tmp_path / "una" / "executed" / "bucle.ipynb").read_text()
    # Importing the library's fit_growth is delegation: the worker's library has no reference
    # to delegate to (0 for that exercise), and the delegation walk flags it.
    assert points(loop, a) == ex1
    loop_fb = (tmp_path / "una" / "feedback" / "bucle.md").read_text(encoding="utf-8")
    assert "no está disponible en el corrector" in loop_fb
    assert "delegar en la biblioteca" in loop_fb and "ai_evolution.timing:fit_growth" in loop_fb
    files = book["borra_archivos"]
    assert files["status"] == "no_contract" and points(files, a) == ex1
    assert book["sin_contrato"]["status"] == "no_contract"
    assert points(book["sin_contrato"], a) == ex1
    assert "contract" in book["sin_contrato"]["reason"]
    empty = book["vacio"]
    assert empty["status"] == "no_contract" and empty["total"] == "0"
    memory = book["memoria"]
    assert memory["status"] == "memory" and "3072 MiB" in memory["reason"]
    assert points(memory, a) == ex1
    invalid = book["no_es_cuaderno"]
    assert invalid["status"] == "invalid" and invalid["total"] == "0"
    fb = (tmp_path / "una" / "feedback" / "vacio.md").read_text(encoding="utf-8")
    assert "no se encontró `kv_bytes_per_token`" in fb


def test_a_loop_that_ignores_interrupts_is_killed_with_its_kernel(tmp_path, monkeypatch):
    folder = tmp_path / "entregas"
    folder.mkdir()
    nbformat.write(code_notebook(KV_IMPORTS, KV_EXERCISE_1, """import signal, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
while True:
    time.sleep(1)  # deaf to interrupts, and idle: the suite's other worker keeps the core"""),
                   folder / "terco.ipynb")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # scratch under tmp_path
    start = time.monotonic()
    grades = grade_folder("kv_cache", folder, out=tmp_path / "notas", timeout_s=15,
                          cell_timeout_s=5)
    assert time.monotonic() - start < 75
    (g,) = grades
    # The whole notebook was stopped; its exercise function is still graded, apart.
    assert g.status == "timeout" and g.total == 2 and "15 s" in g.reason
    assert {s.id: s.earned for s in g.scores}["kv_bytes_per_token"] == 2
    assert any("signal.signal" in f for f in g.flags)
    left = [p for p in psutil.process_iter(["cmdline"])
            if str(tmp_path) in " ".join(p.info["cmdline"] or [])]
    assert not left, [p.info["cmdline"] for p in left]


# Each exercise takes 20 s per call (under the per-call limit); four of them outlast the budget.
SLOW_CALLS = "import time\n" + "".join(f"def {name}(*args, **kwargs):\n    time.sleep(20)\n"
                                      for name in ("kv_bytes_per_token", "my_cached_attention",
                                                   "fit_growth", "sequences_that_fit"))


def test_one_wall_clock_budget_covers_the_notebook_and_the_checks_of_its_exercises(tmp_path,
                                                                                 monkeypatch):
    """Exercises that take 20 s per call, each under the per-call limit: one call each after a
    ~20 s notebook without a budget for the whole submission; with one, the submission stops
    at it, whichever process (kernel, checker, function worker) is running then."""
    folder = tmp_path / "entregas"
    folder.mkdir()
    nbformat.write(code_notebook(KV_IMPORTS, SLOW_CALLS), folder / "rehen.ipynb")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # scratch under tmp_path
    start = time.monotonic()
    (g,) = grade_folder("kv_cache", folder, out=tmp_path / "notas", timeout_s=40,
                        cell_timeout_s=30, budget_s=45)
    elapsed = time.monotonic() - start
    assert elapsed < 45 + 30, elapsed  # the budget, plus killing and cleaning up
    assert g.status == "timeout" and "tiempo total de esta entrega (45 s" in g.reason, g.reason
    by_id = {s.id: s for s in g.scores}
    assert g.total == 0 and any("tiempo total" in s.message for s in by_id.values()), by_id


def test_defaults_are_documented_in_the_instructor_guide():
    guide = (ROOT / "book" / "instructor-guide.md").read_text(encoding="utf-8")
    assert "NotImplementedError" not in guide  # test_book rejects it on any built page
    assert "python -m ai_evolution.grading --lab kv_cache" in guide
    assert f"{DEFAULTS['memory_mb']}" in guide.replace(".", "")
    for status in ("ok", "error", "timeout", "memory", "crashed", "invalid", "no_contract",
                   "disk", "refused", "grader_error"):
        assert f"`{status}`" in guide
    for word in ("--budget", "--disk-mb", "grading.json", "`similarity`", "`notes`",
                 "make book EDITION=student", f"{DEFAULTS['disk_mb']} MiB"):
        assert word in guide, word
    assert "assessments/NN-nombre/" in guide or "assessments/NN-name/" in guide
    for word in ("--shard i/n", "python -m ai_evolution.grading merge", "`bwrap`", "`session`",
                 "`isolation`", "no se ejecutan en el\n  kernel del estudiante"):
        assert word in guide, word
    assert json.loads((ROOT / "assessments" / "02-kv-cache" / "rubric.json").read_text())["kind"] \
        == "kv_cache"
