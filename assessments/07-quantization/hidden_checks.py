"""Hidden checks of lab 7 (``quantization``). Loaded by path by the autograder; never imported by
a notebook. Each function is named after a criterion of ``rubric.json`` and yields its stages:
the notebook's public self-check first, then checks the student never saw."""

from __future__ import annotations

import math
import numbers

import torch

from ai_evolution.checks import call_student, failed, passed
from ai_evolution.checks import quantization as checks
from ai_evolution.fmt import es, es_sig, es_value
from ai_evolution.grading import hidden, public
from ai_evolution.labs.quantization import CHALLENGE_TOLERANCE
from ai_evolution.model import ModelConfig, get_preset
from ai_evolution.model.memory import linear_shapes, quantized_weight_bytes
from ai_evolution.reference.quantization import reference_predict_step_s


def _number(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


# --- exercise 1: int8 -----------------------------------------------------------------------
def quantize_int8(fn, ctx):
    yield public(checks.check_quantize_int8, fn, seed=ctx.seed, model=ctx.model())
    for s in ctx.hidden_seeds:
        yield hidden(checks.check_quantize_int8, fn, seed=s)
    yield hidden(_int8_edges, fn)


def _int8_edges(fn, raise_on_fail=False):
    """One weight; a constant row (every weight at the largest value); a row with a single
    non-zero weight; a long row; rows whose scales differ by twelve orders of magnitude."""
    name = "int8 por canal de salida (casos límite)"
    long_row = torch.linspace(-3, 2, 4096)[None]
    cases = [("matriz 1 × 1", torch.tensor([[-0.75]])),
             ("fila constante", torch.full((2, 9), 0.3)),
             ("un solo peso distinto de cero", torch.tensor([[0.0, 0.0, -2.5, 0.0]])),
             ("una fila de 4096", long_row),
             ("escalas muy distintas", torch.tensor([[1e-6, -2e-6, 3e-6], [1e6, 2e6, -3e6]]))]
    for i, (label, w) in enumerate(cases):
        got, crash = call_student(name, fn, w.clone())
        if crash:
            return failed(name, i, label, crash)
        wrong = checks.compare_int8(got, w)
        if wrong:
            return failed(name, i, label, *wrong)
    return passed(name, len(cases))


def dequantize_int8(fn, ctx):
    yield public(checks.check_dequantize_int8, fn, seed=ctx.seed)
    for s in ctx.hidden_seeds:
        yield hidden(checks.check_dequantize_int8, fn, seed=s)
    yield hidden(_dequantize_edges, fn)


def _dequantize_edges(fn, raise_on_fail=False):
    """A wide matrix (more columns than rows), a tall one, and scales in bf16."""
    g = torch.Generator().manual_seed(5)
    cases = [("matriz ancha 2 × 7", torch.randn(2, 7, generator=g)),
             ("matriz alta 9 × 2", torch.randn(9, 2, generator=g)),
             ("escalas en bf16", torch.randn(4, 6, generator=g).to(torch.bfloat16))]
    return checks.dequantize_result("descuantizar int8 (casos límite)", fn, cases)


# --- exercise 2: int4 -----------------------------------------------------------------------
def quantize_int4(fn, ctx):
    yield public(checks.check_quantize_int4_groups, fn, seed=ctx.seed, model=ctx.model())
    for s in ctx.hidden_seeds:
        yield hidden(checks.check_quantize_int4_groups, fn, seed=s)
    yield hidden(_int4_edges, fn)


def _int4_edges(fn, raise_on_fail=False):
    """One group per row; an all-zero matrix; groups of 128 on a long row; a group whose only
    non-zero weight is negative."""
    name = "int4 por grupos (casos límite)"
    g = torch.Generator().manual_seed(11)
    neg = torch.zeros(2, 64)
    neg[0, 5] = -1.5
    cases = [("un solo grupo por fila (3 × 32, grupos de 32)",
              torch.randn(3, 32, generator=g), 32),
             ("matriz toda a cero (2 × 64, grupos de 64)", torch.zeros(2, 64), 64),
             ("fila larga (1 × 1024, grupos de 128)", torch.randn(1, 1024, generator=g), 128),
             ("un grupo con un único peso negativo (grupos de 32)", neg, 32)]
    for i, (label, w, gs) in enumerate(cases):
        got, crash = call_student(name, fn, w.clone(), gs)
        if crash:
            return failed(name, i, label, crash)
        wrong = checks.compare_int4(got, w, gs)
        if wrong:
            return failed(name, i, label, *wrong)
    return passed(name, len(cases))


# --- exercise 3: the step a format allows ----------------------------------------------------
def predict_step(fn, ctx):
    yield public(checks.check_predict_step_s, fn, seed=ctx.seed)
    for s in ctx.hidden_seeds:
        yield hidden(checks.check_predict_step_s, fn, seed=s)
    yield hidden(_predict_edges, fn)


def _predict_edges(fn, raise_on_fail=False):
    """An empty context, an untied lm_head (its own matrix besides the embedding table), a model
    with biases and a head_dim that is not hidden / heads, and fp32 with int8."""
    name = "tiempo de un paso según los bytes del formato (casos límite)"
    odd = ModelConfig(num_layers=3, hidden_size=192, num_heads=3, num_kv_heads=1, head_dim=128,
                      intermediate_size=640, vocab_size=1000, attention_bias=True,
                      tie_word_embeddings=False, name="sesgos-head_dim-propio")
    cases = [(get_preset("llama-3.1-8b"), "int4-g128", "bf16", 0, 3.35e12, 0.0),
             (get_preset("llama-2-7b"), "int8", "fp16", 100, 1e12, 1e-3),
             (odd, "int4-asym-g64", "bf16", 7, 50e9, 0.0),
             (odd, "int8", "fp32", 0, 50e9, 0.0),
             (odd, None, "bf16", 31, 50e9, 2e-4)]
    for i, (config, fmt, dtype, ctx_len, bw, overhead) in enumerate(cases):
        label = (f"{config.name}, formato {fmt or 'sin cuantizar'}, {dtype}, contexto {ctx_len}")
        expected = reference_predict_step_s(config, fmt, dtype, ctx_len, bw, overhead)
        got, crash = call_student(name, fn, config, fmt, dtype, ctx_len, bw, overhead)
        if crash:
            return failed(name, i, label, crash)
        if not _number(got) or not math.isclose(float(got), expected, rel_tol=1e-6):
            return failed(name, i, label, f"se esperaban {es_sig(1e3 * expected)} ms y su "
                          f"función dio {es_value(got)} s.")
    return passed(name, len(cases))


# --- the challenge ----------------------------------------------------------------------------
def extension(ext, contract, ctx):
    yield hidden(_cheapest_format, ext, contract, ctx.params)


def _bytes_per_weight(label: str) -> float | None:
    """What a weight of tiny-es's linear layers costs in ``label`` (bf16 scales), or None."""
    cfg = get_preset("tiny-es")
    n = sum(o * k for _, o, k in linear_shapes(cfg))
    if label == "bf16":
        return 2.0
    try:
        return quantized_weight_bytes(cfg, label, "bf16") / n
    except ValueError:
        return None


def _cheapest_format(ext, contract, params, raise_on_fail=False):
    """The tolerance is the challenge's; the table holds bf16 and every quantized format of the
    lab with its true bytes per weight; the choice is the cheapest whose increase, at the top of
    its interval, stays within the tolerance; the derived numbers follow from the table; and,
    when the contract carries the run's quality table, the perplexities are the measured ones."""
    name = "reto: el formato más barato que cumple"
    m = ext["measurement"]
    tol = 100 * CHALLENGE_TOLERANCE
    if not math.isclose(m["tolerance_pct"], tol, rel_tol=1e-9):
        return failed(name, 0, "tolerance_pct", f"el reto fija un {es(tol, 0)} % y measurement "
                      f"dice {es_value(m['tolerance_pct'])}.")
    table = m.get("table")
    wanted = {"bf16", *params["quality_formats"]}
    if not isinstance(table, dict) or not wanted <= set(table):
        return failed(name, 1, "table", "measurement['table'] debe tener una fila por formato "
                      f"comparado ({', '.join(sorted(wanted))}), cada una con bytes_per_weight, "
                      "perplexity e increase_high_pct.")
    try:
        rows = {k: {f: float(table[k][f]) for f in ("bytes_per_weight", "perplexity",
                                                     "increase_high_pct")} for k in wanted}
    except (TypeError, ValueError, KeyError):
        return failed(name, 1, "table", "cada fila de table necesita bytes_per_weight, "
                      "perplexity e increase_high_pct numéricos.")
    for k, r in rows.items():
        true = _bytes_per_weight(k)
        if true is None or not math.isclose(r["bytes_per_weight"], true, rel_tol=1e-9):
            return failed(name, 2, f"table['{k}']['bytes_per_weight']", f"un peso de las capas "
                          f"lineales de tiny-es en {k} ocupa {es_sig(true) if true else '?'} bytes "
                          f"con sus escalas; la tabla dice {es_value(r['bytes_per_weight'])}.")
    ok = [k for k, r in rows.items() if r["increase_high_pct"] <= tol]
    if "bf16" not in ok:
        return failed(name, 3, "table['bf16']", "el aumento de bf16 frente a sí mismo es 0.")
    best = min(ok, key=lambda k: (rows[k]["bytes_per_weight"], rows[k]["perplexity"]))
    if m.get("chosen_format") != best:
        return failed(name, 4, "chosen_format", f"con esa tabla, el más barato cuyo aumento no "
                      f"pasa del {es(tol, 0)} % en el extremo alto de su intervalo es {best}; "
                      f"measurement elige {es_value(m.get('chosen_format'))}.")
    chosen, base = rows[best], rows["bf16"]
    derived = {"bf16_perplexity": base["perplexity"],
               "chosen_bytes_per_weight": chosen["bytes_per_weight"],
               "chosen_perplexity": chosen["perplexity"],
               "chosen_increase_pct": 100 * (chosen["perplexity"] / base["perplexity"] - 1),
               "chosen_increase_high_pct": chosen["increase_high_pct"],
               "formats_compared": len(table) - ("fp32" in table),
               "cheaper_rejected": sum(r["bytes_per_weight"] < chosen["bytes_per_weight"]
                                       for r in rows.values())}
    for j, (key, value) in enumerate(derived.items()):
        if not math.isclose(m[key], value, rel_tol=1e-6, abs_tol=1e-9):
            return failed(name, 5 + j, key, f"de la tabla sale {es_sig(value)} y measurement "
                          f"dice {es_value(m[key])}.")
    measured = (contract or {}).get("results", {}).get("quality", {}).get("formats")
    if measured:
        by_label = {r["label"]: r for r in measured}
        for k, r in rows.items():
            run = by_label.get(k)
            if run is None or not math.isclose(r["perplexity"], run["perplexity"], rel_tol=1e-9) \
                    or not math.isclose(r["increase_high_pct"], 100 * run["increase_interval"][1],
                                        rel_tol=1e-9, abs_tol=1e-12):
                return failed(name, 12, f"table['{k}']", "la perplejidad o el extremo alto del "
                              "aumento no son los que midió esta ejecución (results.quality del "
                              "contrato).")
    return passed(name, 13)
