"""Lab ``speculative`` (chapter 9): a draft proposes, the target verifies.

1. Acceptance (measured, :func:`measure_acceptance`): ``speculative_generate`` with ``tiny-es``
   and ``tiny-es-draft`` on prompts of the corpus's held-out text, for each ``k``; every step is
   replayed through a greedy verification (the student's ``greedy_accept`` in the notebook) fed
   with the target's plain greedy tokens, which gives the acceptance rate per draft position,
   the mean accepted length and the tokens per step, next to the formula
   ``(1 - alpha^(k+1)) / (1 - alpha)``. The speculative tokens are compared with plain greedy.
2. Step costs (measured, volatile, :func:`measure_step_costs`): one decode step of the draft and
   of the target, and the target's verification of k + 1 tokens, interleaved; their ratios
   predict the speedup.
3. Time (measured, volatile, :func:`measure_timing`): plain greedy and speculative generation of
   the same prompts, interleaved call by call; the speedup is their paired ratio.
4. The engine (measured, :func:`measure_engine`): the same requests with and without a draft at
   batch sizes 1, 2, 4...; wall time, steps and output equality with plain greedy.
5. Sampling verification (measured, :func:`measure_distribution`): tokens emitted by the
   accept / residual rule on a small vocabulary, against the target's distribution (chi-square),
   and the draft's own samples as a negative control.
6. The H100 prediction (computed, :func:`h100_prediction`): Llama 3.1 8B with a Llama 3.2 1B
   draft, speedup vs batch size from the roofline cost model.

:func:`report` turns the measurements into the contract's body, every conclusion about this
machine a :mod:`ai_evolution.claims` claim; ``run`` = measure + report.
"""

from __future__ import annotations

import json
import math
import time
from importlib import resources
from typing import Callable

import numpy as np
import torch

from .. import claims
from ..engine import SamplingParams, build_engine
from ..fmt import es
from ..generation import generate
from ..model import load_model
from ..model.attention import ContiguousKVCache
from ..reference.speculative import reference_acceptance_and_residual
from ..sim.cost_model import (best_k, expected_tokens_per_step, predict_speculation_h100,
                              speculative_speedup)
from ..speculative import (SpecStep, SpeculativeOutput, chi_square_gof, greedy_accept, pooled,
                           speculative_generate)
from ..timing import torch_threads
from .common import MODEL_DTYPE_PARAM, served_dtype
from .contract import (evidence as _ev, met_criteria_sentence, threads_limitation,
                       timing_limitation)
from .registry import LabParamError, LabSpec, Param

# |measured tokens per step - formula| / formula that still reads as "the formula predicts it":
# the formula assumes every position is accepted independently with the same alpha; the
# measured rate per position varies by a few tens of percent, which moves E by a few percent.
FORMULA_TOLERANCE = 0.10
# Significance of the chi-square tests: a p-value below it rejects "same distribution".
GOF_LEVEL = 0.01


# --- prompts ---------------------------------------------------------------------------------------

def held_out_prompts(model: str, count: int, length: int) -> list[list[int]]:
    """``count`` prompts of ``length`` tokens from the model's held-out text: the first tokens of
    each held-out file (in the file's order), then later windows of the same files."""
    path = resources.files("ai_evolution.model") / "shipped" / model / "held_out.json"
    files = [f["tokens"] for f in json.loads(path.read_text(encoding="utf-8"))["files"]]
    out, start = [], 0
    while len(out) < count:
        fresh = [f[start:start + length] for f in files if len(f) >= start + length]
        if not fresh:
            raise LabParamError(f"el texto reservado de {model} no da {count} prompts de {length} tokens")
        out.extend(fresh[:count - len(out)])
        start += length
    return out


# --- 1. acceptance -----------------------------------------------------------------------------------

def replay_steps(out: SpeculativeOutput, reference: list[int],
                 accept: Callable = greedy_accept) -> list[SpecStep]:
    """The steps of one speculative run verified again with ``accept(draft, target_argmax)``.

    In greedy decoding, while the proposals agree with the target, the target's argmax at each
    verified place is the next token of its plain greedy output ``reference``; the first
    disagreement ends the accepted prefix, so those tokens are all a verification reads. A step
    whose next token is not greedy's is recorded with ``emitted = 0``."""
    steps, pos = [], 1  # the prefill emitted the first token; the first step verifies the next ones
    for s in out.steps:
        window = reference[pos:pos + s.drafted + 1]
        n, nxt = accept(list(s.proposed), window)
        n = int(n)
        steps.append(SpecStep(drafted=s.drafted, accepted=n, emitted=n + 1, proposed=s.proposed))
        pos += n + 1
        if nxt != reference[pos - 1]:  # a wrong next token: the replay no longer follows greedy
            steps[-1] = SpecStep(drafted=s.drafted, accepted=n, emitted=0, proposed=s.proposed)
    return steps


def acceptance_stats(outputs: list[SpeculativeOutput], k: int) -> dict:
    """Acceptance rate, per position, mean accepted length and tokens per step of several runs."""
    p = pooled(outputs)
    alpha = p.alpha
    by_pos = p.acceptance_by_position()
    return {"k": k, "steps": len(p.steps), "alpha": alpha,
            "alpha_by_position": [None if math.isnan(a) else a for a in by_pos],
            "mean_accepted": p.mean_accepted, "tokens_per_step": p.tokens_per_step,
            "predicted_tokens_per_step": expected_tokens_per_step(alpha, k),
            "target_forwards": sum(1 + len(o.steps) for o in outputs)}


def measure_acceptance(target, draft, prompts: list[list[int]], params: dict,
                       accept: Callable = greedy_accept) -> dict:
    """For each ``k``: speculative runs of every prompt, their steps replayed through
    ``accept``, the acceptance statistics of the replay, and whether the speculative tokens and
    the replay agree with plain greedy."""
    n_new = params["new_tokens"]
    references = [generate(target, p, n_new)[0] for p in prompts]
    per_k, exact, replay_ok, compared = [], 0, 0, 0
    for k in params["ks"]:
        runs = [speculative_generate(target, draft, p, n_new, k) for p in prompts]
        replayed = []
        for run, ref in zip(runs, references):
            steps = replay_steps(run, ref, accept)
            replayed.append(SpeculativeOutput(tokens=[], k=k, steps=steps))
            compared += 1
            exact += run.tokens == ref
            got = [(s.accepted, s.emitted > 0) for s in steps]
            replay_ok += got == [(s.accepted, True) for s in run.steps]
        per_k.append(acceptance_stats(replayed, k))
    return {"prompts": len(prompts), "prompt_len": len(prompts[0]), "new_tokens": n_new,
            "per_k": per_k, "runs_compared": compared, "runs_identical": exact,
            "replays_matching": replay_ok}


# --- 2. step costs, 3. time ---------------------------------------------------------------------------

def measure_step_costs(target, draft, prompt: list[int], params: dict) -> dict:
    """Milliseconds of one forward pass after ``prompt`` (its K/V cached): the draft and the
    target on one token, and the target on k + 1 tokens (a verification) for each ``k``,
    interleaved over ``step_repeats`` rounds after one warm-up round."""
    device = next(target.parameters()).device
    ks = params["ks"]
    caches = {}
    with torch.inference_mode():
        for name, m in (("target", target), ("draft", draft)):
            kv = ContiguousKVCache(m.config, 1, len(prompt) + max(ks) + 2,
                                   dtype=next(m.parameters()).dtype, device=device)
            m.hidden_states(torch.tensor([prompt], device=device), kv_cache=kv)
            caches[name] = (m, kv)
        calls = {"draft": ("draft", 1), "target": ("target", 1),
                 **{f"verify_{k}": ("target", k + 1) for k in ks}}
        ms = {name: [] for name in calls}
        for r in range(params["step_repeats"] + 1):
            for name, (who, n) in calls.items():
                m, kv = caches[who]
                ids = prompt[-n:] if n <= len(prompt) else (prompt * n)[:n]
                pos = torch.arange(len(prompt), len(prompt) + n, device=device)[None]
                x = torch.tensor([ids], device=device)
                t = time.perf_counter()
                m.logits(m.hidden_states(x, pos, kv_cache=kv)[0])
                if r:
                    ms[name].append(1e3 * (time.perf_counter() - t))
    med = {name: float(np.median(v)) for name, v in ms.items()}
    return {"ms": ms, "median_ms": med, "cost_ratio": med["draft"] / med["target"],
            "verify_ratio": {k: med[f"verify_{k}"] / med["target"] for k in ks},
            "repeats": params["step_repeats"], "context_len": len(prompt)}


def measure_timing(target, draft, prompts: list[list[int]], params: dict) -> dict:
    """Milliseconds to generate ``new_tokens`` after each prompt, plain greedy and speculative for
    each ``k``, interleaved prompt by prompt (plain, k1, k2, ...) over ``repeats`` rounds after
    one warm-up round. Each (round, prompt) is one paired sample."""
    n_new, ks = params["new_tokens"], params["ks"]
    runs = {"plain": lambda p: generate(target, p, n_new),
            **{f"k{k}": (lambda p, k=k: speculative_generate(target, draft, p, n_new, k)) for k in ks}}
    ms = {name: [] for name in runs}
    with torch.inference_mode():
        for r in range(params["repeats"] + 1):
            for p in prompts:
                for name, fn in runs.items():
                    t = time.perf_counter()
                    fn(p)
                    if r:
                        ms[name].append(1e3 * (time.perf_counter() - t))
    return {"ms": ms, "repeats": params["repeats"], "prompts": len(prompts), "new_tokens": n_new,
            "torch_threads": torch.get_num_threads()}


# --- 4. the engine ------------------------------------------------------------------------------------

def measure_engine(target, draft, prompts: list[list[int]], params: dict) -> dict:
    """For each batch size ``b``: the first ``b`` prompts as greedy requests of ``engine_tokens``
    tokens, run by an engine without and with the draft (``engine_k`` proposals), interleaved over
    ``engine_repeats`` rounds after a warm-up; wall milliseconds, engine steps, draft tokens proposed and
    accepted, and whether every output equals plain greedy."""
    k, n_new = params["engine_k"], params["engine_tokens"]
    out = []
    for b in params["batch_sizes"]:
        batch = prompts[:b]
        refs = [generate(target, p, n_new)[0] for p in batch]
        max_len = max(map(len, batch)) + n_new + k + 2
        ms = {"plain": [], "speculative": []}
        facts = {}
        for r in range(params["engine_repeats"] + 1):
            for name, kw in (("plain", {}), ("speculative", dict(draft_model=draft,
                                                                  num_speculative_tokens=k))):
                engine = build_engine(target, max_num_seqs=b, max_model_len=max_len, **kw)
                work = [(0.0, p, SamplingParams(max_tokens=n_new, ignore_eos=True)) for p in batch]
                t = time.perf_counter()
                reqs = engine.run(work)
                if r:
                    ms[name].append(1e3 * (time.perf_counter() - t))
                facts[name] = {"steps": len(engine.history),
                               "identical": [q.output_token_ids for q in reqs] == refs,
                               "proposed": sum(q.num_draft_tokens for q in reqs),
                               "accepted": sum(q.num_accepted_tokens for q in reqs)}
        out.append({"batch_size": b, "ms": ms, **{f"{n}_{key}": v for n, f in facts.items()
                                                   for key, v in f.items()}})
    return {"k": k, "tokens_per_request": n_new, "repeats": params["engine_repeats"], "batches": out}


# --- 5. sampling verification -------------------------------------------------------------------------

def distribution_case(seed: int, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A seeded target ``p`` and a draft ``q`` that disagree (float64, ``[vocab]``)."""
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(2 * torch.randn(vocab, generator=g, dtype=torch.float64), -1)
    q = torch.softmax(2 * torch.randn(vocab, generator=g, dtype=torch.float64), -1)
    return p, q


def sample_verified(p, q, n: int, seed: int,
                    pieces: Callable = reference_acceptance_and_residual) -> torch.Tensor:
    """``n`` tokens emitted at one position: draft ``x ~ q``, keep it with probability
    ``accept[x]``, else draw from ``residual``; ``pieces(p, q)`` gives ``(accept, residual)``."""
    accept, residual = pieces(p.clone(), q.clone())
    accept = torch.as_tensor(accept, dtype=torch.float64)
    residual = torch.as_tensor(residual, dtype=torch.float64)
    g = torch.Generator().manual_seed(seed)
    x = torch.multinomial(q, n, replacement=True, generator=g)
    keep = torch.rand(n, generator=g, dtype=torch.float64) < accept[x]
    fresh = torch.multinomial(residual.clamp(min=0), n, replacement=True, generator=g)
    return torch.where(keep, x, fresh)


def measure_distribution(params: dict, seed: int,
                         pieces: Callable = reference_acceptance_and_residual) -> dict:
    """Chi-square of the verified tokens against ``p`` and, as a negative control, of the
    draft's own samples against ``p``."""
    vocab, n = params["gof_vocab"], params["gof_samples"]
    p, q = distribution_case(seed, vocab)
    tokens = sample_verified(p, q, n, seed, pieces)
    g = torch.Generator().manual_seed(seed + 1)
    draft_only = torch.multinomial(q, n, replacement=True, generator=g)
    counts = torch.bincount(tokens, minlength=vocab)
    return {"vocab": vocab, "samples": n, "p": p.tolist(), "q": q.tolist(),
            "counts": counts.tolist(),
            "verified": chi_square_gof(counts, p),
            "draft_only": chi_square_gof(torch.bincount(draft_only, minlength=vocab), p),
            "accept_rate": float(torch.minimum(p, q).sum())}


# --- 6. the H100 prediction ---------------------------------------------------------------------------

def h100_prediction(params: dict, measured_alpha: float) -> dict:
    """Predicted speedup of Llama 3.1 8B + Llama 3.2 1B on an H100 at each batch size, with the
    assumed ``h100_alpha`` and with the alpha measured here."""
    out = {"k": params["h100_k"], "context_len": params["h100_context"],
           "batch_sizes": list(params["h100_batches"])}
    for name, alpha in (("assumed", params["h100_alpha"]), ("measured", measured_alpha)):
        steps = predict_speculation_h100(alpha, params["h100_k"], params["h100_batches"],
                                         params["h100_context"])
        below = [s.batch_size for s in steps if s.speedup < 1]
        out[name] = {"alpha": alpha, "speedup": [s.speedup for s in steps],
                     "cost_ratio": steps[0].cost_ratio,
                     "verify_compute_bound": [s.verify_compute_bound for s in steps],
                     "break_even_batch": below[0] if below else None}
    return out


# --- conclusions -----------------------------------------------------------------------------------

def speedup_verdicts(timing: dict) -> dict[str, claims.Claim]:
    """Per k: plain time over speculative time (the speedup), paired samples."""
    out = {}
    for name in timing["ms"]:
        if name == "plain":
            continue
        out[f"speedup_{name}"] = claims.compare(
            timing["ms"]["plain"], timing["ms"][name],
            what=(f"aceleración de la decodificación especulativa con k = {name[1:]} (tiempo "
                  f"voraz normal / tiempo especulativo, {timing['new_tokens']} tokens por prompt)"),
            higher="la especulación acelera la generación en esta máquina",
            lower="la especulación hace la generación más lenta en esta máquina")
    return out


def engine_verdicts(engine: dict) -> dict[str, claims.Claim]:
    out = {}
    for b in engine["batches"]:
        out[f"engine_b{b['batch_size']}"] = claims.compare(
            b["ms"]["plain"], b["ms"]["speculative"],
            what=(f"aceleración en el motor con lote {b['batch_size']} (tiempo sin borrador / con "
                  f"borrador, k = {engine['k']})"),
            higher="con este lote la especulación paga", lower="con este lote la especulación no paga")
    return out


def formula_verdicts(acceptance: dict) -> dict[str, claims.Claim]:
    out = {}
    for row in acceptance["per_k"]:
        pred, got = row["predicted_tokens_per_step"], row["tokens_per_step"]
        out[f"formula_k{row['k']}"] = claims.threshold(
            abs(got - pred) / pred, FORMULA_TOLERANCE,
            what=(f"diferencia relativa entre los tokens por paso medidos ({es(got, 3)}) y los que "
                  f"predice (1 − α^(k+1)) / (1 − α) con α = {es(row['alpha'], 3)} "
                  f"({es(pred, 3)}), k = {row['k']}"),
            passed="la fórmula predice los tokens por paso", failed=(
                "la fórmula no predice los tokens por paso: la aceptación no es la misma en cada "
                "posición"))
    return out


def exactness_verdicts(acceptance: dict, engine: dict) -> dict[str, claims.Claim]:
    runs = acceptance["runs_compared"]
    reqs = sum(b["batch_size"] for b in engine["batches"])
    bad_reqs = sum(b["batch_size"] for b in engine["batches"] if not b["speculative_identical"])
    return {
        "exact_loop": claims.threshold(
            (runs - acceptance["runs_identical"]) / runs, 0.0,
            what=(f"ejecuciones de speculative_generate cuyos tokens difieren de la decodificación "
                  f"voraz normal ({runs} ejecuciones: {acceptance['prompts']} prompts × "
                  f"{len(acceptance['per_k'])} valores de k)"),
            passed="la salida especulativa es la voraz, token a token",
            failed="la salida especulativa no es la voraz"),
        "exact_engine": claims.threshold(
            bad_reqs / reqs, 0.0,
            what=(f"peticiones del motor con borrador cuya salida difiere de la voraz normal "
                  f"({reqs} peticiones en lotes de "
                  f"{', '.join(str(b['batch_size']) for b in engine['batches'])})"),
            passed="el motor con borrador da la salida voraz, token a token",
            failed="el motor con borrador no da la salida voraz"),
    }


def distribution_verdicts(dist: dict) -> dict[str, claims.Claim]:
    return {
        "distribution": claims.threshold(
            dist["verified"]["p_value"], GOF_LEVEL, below=False, scale=1.0, unit="", decimals=3,
            what=(f"valor p de la prueba chi-cuadrado de los tokens verificados frente a p "
                  f"({dist['samples']} muestras, vocabulario de {dist['vocab']})"),
            passed="no se rechaza que los tokens verificados sigan la distribución del objetivo",
            failed="se rechaza que los tokens verificados sigan la distribución del objetivo"),
        "control": claims.threshold(
            dist["draft_only"]["p_value"], GOF_LEVEL, scale=1.0, unit="", decimals=3,
            what=(f"valor p de la misma prueba con las muestras del borrador sin verificar "
                  f"({dist['samples']} muestras)"),
            passed="la prueba sí distingue la distribución del borrador de la del objetivo",
            failed="la prueba no distingue el borrador del objetivo: con estas muestras no tiene potencia"),
    }


def verdicts(acceptance, timing, engine, dist) -> dict[str, claims.Claim]:
    return (formula_verdicts(acceptance) | speedup_verdicts(timing) | engine_verdicts(engine)
            | exactness_verdicts(acceptance, engine) | distribution_verdicts(dist))


CRITERIA = (
    ("exact_loop", "la generación especulativa da los mismos tokens que la voraz"),
    ("exact_engine", "el motor con borrador da los mismos tokens que sin él, en cada lote"),
    ("replay", "la verificación voraz repetida sobre los pasos medidos da las mismas aceptaciones"),
    ("distribution", "los tokens de la verificación por muestreo siguen la distribución del objetivo"),
    ("control", "la prueba estadística distingue la distribución del borrador"),
)


def chapter_criteria(acceptance: dict, found: dict[str, claims.Claim]) -> dict[str, bool]:
    """Which of ``CRITERIA`` this run meets. Time is not one: whether speculation pays depends
    on the machine and on alpha, and the lab reports it either way."""
    ok = lambda key: found[key].outcome == claims.PASSED  # noqa: E731
    return {"exact_loop": ok("exact_loop"), "exact_engine": ok("exact_engine"),
            "replay": acceptance["replays_matching"] == acceptance["runs_compared"],
            "distribution": ok("distribution"), "control": ok("control")}


def criteria_sentence(met: dict[str, bool]) -> str:
    """The sentence that says which of the chapter's criteria a run meets, from the booleans."""
    return met_criteria_sentence(CRITERIA, met)


def main_row(acceptance: dict, k: int | None = None) -> dict:
    """The acceptance row of ``k`` (default: the largest k measured)."""
    rows = acceptance["per_k"]
    return next((r for r in rows if r["k"] == k), rows[-1])


def predicted_speedups(acceptance: dict, costs: dict) -> dict:
    """Per k, with the measured alpha: Leviathan et al.'s formula with the measured draft/target
    cost ratio (verification = one target step), and the same with the measured verification
    time of k + 1 tokens."""
    c, t = costs["cost_ratio"], costs["median_ms"]["target"]
    out = {}
    for row in acceptance["per_k"]:
        k, e = row["k"], row["tokens_per_step"]
        out[k] = {"formula": speculative_speedup(row["alpha"], k, c),
                  "with_verify": e * t / (k * costs["median_ms"]["draft"]
                                          + costs["median_ms"][f"verify_{k}"])}
    return out


def break_even_text(batch: int | None) -> str:
    """Where the predicted speedup first drops below 1, in words."""
    if batch is None:
        return "no deja de pagar en los lotes calculados"
    if batch == 1:
        return "no paga ni con lote 1"
    return f"deja de pagar en el lote {batch}"


def batch_sentence(engine: dict, found: dict[str, claims.Claim]) -> str:
    """Where speculation stops paying in the engine, from the per-batch claims."""
    rows = [(b["batch_size"], found[f"engine_b{b['batch_size']}"]) for b in engine["batches"]]
    paying = [b for b, c in rows if c.outcome == claims.HIGHER]
    losing = [b for b, c in rows if c.outcome == claims.LOWER]
    ratios = ", ".join(f"lote {b}: {es(c.value, 2)}" for b, c in rows)
    if not paying:
        if losing == [b for b, _ in rows]:
            head = "En el motor, la especulación no paga con ningún lote medido"
        else:
            head = "En el motor, la especulación no paga de forma concluyente con ningún lote medido"
            if losing:
                head += (f"; con {'el lote' if len(losing) == 1 else 'los lotes'} "
                         f"{', '.join(map(str, losing))} es más lenta de forma concluyente")
    else:
        after = [b for b, c in rows if b > max(paying) and c.outcome != claims.HIGHER]
        head = (f"En el motor, la especulación paga hasta el lote {max(paying)}"
                + (f" y deja de pagar en el lote {after[0]}" if after else ""))
    return f"{head} (aceleración medida, {ratios})."


def report(params: dict, acceptance: dict, costs: dict, timing: dict, engine: dict, dist: dict,
           h100: dict, found: dict[str, claims.Claim] | None = None) -> dict:
    """The contract's body from the measurements."""
    found = verdicts(acceptance, timing, engine, dist) if found is None else found
    met = chapter_criteria(acceptance, found)
    preds = predicted_speedups(acceptance, costs)
    measured = {k: found[f"speedup_k{k}"].value for k in params["ks"]}
    best_measured = max(measured, key=measured.get)
    row = main_row(acceptance)
    formula_best = best_k(row["alpha"], costs["cost_ratio"], max(params["ks"]))
    results = {
        "acceptance": acceptance,
        "step_costs": costs,
        "timing": timing | {"median_ms": {k: float(np.median(v)) for k, v in timing["ms"].items()},
                            "speedup": measured},
        "predicted_speedup": preds,
        "best_k_measured": best_measured,
        "best_k_formula": formula_best,
        "engine": engine,
        "distribution": dist,
        "h100": h100,
        "chapter_criteria": met,
    }
    a = h100["assumed"]
    be = a["break_even_batch"]
    evidence = [
        *(_ev(f"Con k = {r['k']}, sobre {acceptance['prompts']} prompts del texto reservado: tasa "
              f"de aceptación α = {es(r['alpha'], 3)}, {es(r['mean_accepted'], 2)} tokens del "
              f"borrador aceptados por paso y {es(r['tokens_per_step'], 2)} tokens por paso "
              f"(la fórmula predice {es(r['predicted_tokens_per_step'], 2)}).", r["alpha"], "α",
              source="measured") for r in acceptance["per_k"]),
        *(c.evidence("fracción") for key, c in found.items() if key.startswith("formula_")),
        found["exact_loop"].evidence("fracción"),
        found["exact_engine"].evidence("fracción"),
        _ev(f"Un paso del borrador cuesta {es(costs['cost_ratio'], 2)} pasos del objetivo en esta "
            f"máquina; verificar k + 1 = {max(params['ks']) + 1} tokens cuesta "
            f"{es(costs['verify_ratio'][max(params['ks'])], 2)} pasos del objetivo.",
            costs["cost_ratio"], "pasos del objetivo", source="measured", volatile=True),
        *(_ev(f"Con k = {k}, la fórmula de Leviathan et al. predice una aceleración de "
              f"{es(p['formula'], 2)} con el coste medido del borrador, y {es(p['with_verify'], 2)} "
              f"contando el tiempo medido de la verificación.", p["with_verify"], "x",
              source="measured", volatile=True) for k, p in preds.items()),
        *(c.evidence("x") for key, c in found.items() if key.startswith("speedup_")),
        *(c.evidence("x") for key, c in found.items() if key.startswith("engine_")),
        _ev(batch_sentence(engine, found), found[f"engine_b{engine['batches'][0]['batch_size']}"].value,
            "x", source="measured", volatile=True),
        found["distribution"].evidence("valor p"),
        found["control"].evidence("valor p"),
        _ev(f"Simulador, H100 con Llama 3.1 8B y borrador Llama 3.2 1B, α supuesto de "
            f"{es(a['alpha'], 2)}, k = {h100['k']}: aceleración de {es(a['speedup'][0], 2)} con "
            f"lote 1 y de {es(a['speedup'][-1], 2)} con lote {h100['batch_sizes'][-1]}; "
            + break_even_text(be) + ".",
            a["speedup"][0], "x"),
        _ev(f"El mismo simulador con el α medido aquí ({es(h100['measured']['alpha'], 3)}) predice "
            f"{es(h100['measured']['speedup'][0], 2)} con lote 1.", h100["measured"]["speedup"][0],
            "x", source="measured", volatile=False),
    ]
    limitations = [
        "Los modelos son pequeños y se ejecutan en esta máquina: un paso del borrador no cuesta "
        "aquí una fracción tan pequeña de uno del objetivo como en una GPU, donde el paso lo "
        "limita la lectura de los pesos.",
        "La tasa de aceptación depende del texto: se midió en el texto reservado del corpus del "
        "libro, con prompts cortos; otro texto da otro α.",
        "La predicción de la H100 usa el roofline de la hoja de datos sin sobrecarga y un α "
        "supuesto, no medido con esos modelos.",
        timing_limitation(timing["repeats"]),
        threads_limitation(timing["torch_threads"]),
    ]
    return {
        "environment": {"model": params["model"], "draft": params["draft"]},
        "results": results,
        "evidence": evidence,
        "limitations": limitations,
        "volatile_fields": ["results.step_costs", "results.timing", "results.predicted_speedup",
                            "results.best_k_measured", "results.engine"],
    }


def check_params(params: dict) -> None:
    ks = params["ks"]
    if sorted(set(ks)) != list(ks):
        raise LabParamError(f"ks debe ir en orden creciente y sin repetir; se recibió {ks}")
    if max(params["batch_sizes"]) > params["prompts"]:
        raise LabParamError(f"el lote mayor ({max(params['batch_sizes'])}) no puede pasar del número "
                            f"de prompts ({params['prompts']})")


def run(seed: int, profile: str, params: dict, device: torch.device) -> dict:
    check_params(params)
    with torch_threads(params["torch_threads"]):
        dtype = served_dtype(params["model_dtype"], device)
        target = load_model(params["model"], seed, device, dtype=dtype)
        draft = load_model(params["draft"], seed, device, dtype=dtype)
        prompts = held_out_prompts(params["model"], params["prompts"], params["prompt_len"])
        acceptance = measure_acceptance(target, draft, prompts, params)
        costs = measure_step_costs(target, draft, prompts[0], params)
        timing = measure_timing(target, draft, prompts, params)
        engine = measure_engine(target, draft, prompts, params)
        dist = measure_distribution(params, seed)
        h100 = h100_prediction(params, main_row(acceptance, params["h100_k"])["alpha"])
    return report(params, acceptance, costs, timing, engine, dist, h100)


SPEC = LabSpec(
    kind="speculative",
    title="Decodificación especulativa",
    chapter=9,
    folder="labs/09-speculative",
    ci_budget_s=50,
    run=run,
    params={
        "model": Param("tiny-es", str, "modelo objetivo", choices=("tiny-es",)),
        "model_dtype": MODEL_DTYPE_PARAM,
        "draft": Param("tiny-es-draft", str, "modelo borrador (mismo tokenizador)",
                       choices=("tiny-es-draft", "tiny-es")),
        "ks": Param([1, 2, 3, 4, 6], int, "tokens propuestos por paso", min=1, max=16,
                    is_list=True, by_profile={"ci": [1, 2, 4]}),
        "prompts": Param(12, int, "prompts del texto reservado", min=1, max=64,
                         by_profile={"ci": 6}),
        "prompt_len": Param(16, int, "tokens de cada prompt", min=2, max=64),
        "new_tokens": Param(48, int, "tokens generados por prompt", min=4, max=256,
                            by_profile={"ci": 24}),
        "repeats": Param(5, int, "rondas intercaladas de las mediciones de tiempo", min=1, max=50,
                         by_profile={"ci": 3}),
        "step_repeats": Param(30, int, "rondas de la medición del coste de un paso", min=2,
                              max=500, by_profile={"ci": 15}),
        "torch_threads": Param(0, int, "hilos de torch durante el laboratorio (0: los que elija "
                               "torch)", min=0, max=256, by_profile={"ci": 1}),
        "batch_sizes": Param([1, 2, 4, 8], int, "lotes del motor", min=1, max=64, is_list=True,
                             by_profile={"ci": [1, 2, 4]}),
        "engine_repeats": Param(10, int, "rondas intercaladas de la medición del motor", min=1,
                                max=50, by_profile={"ci": 6}),
        "engine_k": Param(2, int, "tokens propuestos por paso en el motor", min=1, max=16),
        "engine_tokens": Param(32, int, "tokens por petición en el motor", min=2, max=256,
                               by_profile={"ci": 16}),
        "gof_vocab": Param(6, int, "vocabulario de la prueba de distribución", min=2, max=64),
        "gof_samples": Param(20000, int, "muestras de la prueba de distribución", min=100,
                             max=10**7, by_profile={"ci": 8000}),
        "h100_alpha": Param(0.75, float, "α supuesto para la predicción de la H100", min=0.0,
                            max=0.99),
        "h100_k": Param(4, int, "k de la predicción de la H100", min=1, max=16),
        "h100_context": Param(1024, int, "contexto de la predicción de la H100", min=1,
                              max=131072),
        "h100_batches": Param([1, 2, 4, 8, 16, 32, 64, 128, 256], int, "lotes de la predicción "
                              "de la H100", min=1, max=4096, is_list=True),
        "challenge_alpha": Param(0.5, float, "α del reto", min=0.05, max=0.95),
        "challenge_k": Param(4, int, "k del reto", min=1, max=8),
        "challenge_context": Param(4096, int, "contexto del reto", min=64, max=32768),
        "challenge_max_batch": Param(512, int, "lote máximo del reto", min=8, max=4096),
    },
)
