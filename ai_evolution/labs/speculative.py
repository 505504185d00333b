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
7. Where n-gram speculation pays (measured, :func:`measure_ngram`): a copy-heavy workload
   ("repeat this paragraph") and a free-generation one, each request served alone by the engine
   plainly, with n-gram proposals (``method="ngram"``) and with the draft model, interleaved;
   acceptance, tokens per step, speedup, and how much of the paragraph the model really copies.
   The target here is ``ngram_model`` (``tiny-es-copy``: tiny-es fine-tuned on copy tasks), and
   the copy fraction of ``tiny-es`` itself is measured beside it: tiny-es never learned to copy,
   so prompt lookup has nothing to find in what it writes.

:class:`Findings` holds the measurements and every conclusion about this machine, each a
:mod:`ai_evolution.claims` claim; :func:`report` turns the findings into the contract's body.
``run`` = measure + findings + report.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
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
from ..model.tokenizer import load_tokenizer
from ..reference.speculative import reference_acceptance_and_residual
from ..sim.cost_model import (best_k, expected_tokens_per_step, predict_speculation_h100,
                              speculative_speedup)
from ..speculative import (SpecStep, SpeculativeOutput, chi_square_gof, greedy_accept, pooled,
                           speculative_generate)
from ..timing import torch_threads
from .common import MODEL_DTYPE_PARAM, served_dtype
from .contract import (claims_starting, evidence as _ev, met_criteria_sentence,
                       threads_limitation, timing_limitation)
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


# --- 7. n-gram proposals: where they pay ----------------------------------------------------------

NGRAM_WINDOW = (1, 3)  # prompt_lookup_min, prompt_lookup_max of the lab's n-gram proposer
COPY_CUE = 8           # tokens of the paragraph repeated after it in the copy-heavy prompt
COPIES = 0.5           # copy fraction from which a model "copies" in the lab's sentences


def ngram_workloads(model: str, count: int, length: int, separator: list[int]) -> dict[str, dict]:
    """The copy-heavy and free-generation prompts from the held-out text: ``copia`` is a
    paragraph, ``separator`` and the paragraph's first ``COPY_CUE`` tokens again (a model that
    copies continues with the rest of the paragraph, its ``expected`` tokens); ``libre`` is the
    paragraph's first half alone."""
    passages = held_out_prompts(model, count, length)
    return {"copia": {"prompts": [p + separator + p[:COPY_CUE] for p in passages],
                      "expected": [p[COPY_CUE:] for p in passages]},
            "libre": {"prompts": [p[:length // 2] for p in passages], "expected": None}}


def copy_rate(outputs: list[list[int]], expected: list[list[int]]) -> float:
    """Fraction of generated tokens, over the positions both have, equal to the paragraph's
    continuation at the same place: how much the model copies."""
    pairs = [(a, b) for out, want in zip(outputs, expected) for a, b in zip(out, want)]
    return sum(a == b for a, b in pairs) / len(pairs) if pairs else math.nan


def measure_copy_rate(model, workload: dict, new_tokens: int) -> float:
    """How much of the paragraph ``model`` reproduces in its place when a ``copia`` workload asks
    it to repeat it: plain greedy decoding of ``new_tokens`` tokens per prompt (``copy_rate``)."""
    outputs = [generate(model, p, new_tokens)[0] for p in workload["prompts"]]
    return copy_rate(outputs, workload["expected"])


def measure_ngram(target, draft, workloads: dict[str, dict], params: dict, base=None) -> dict:
    """For each workload and each k in ``ngram_ks``: every prompt served alone by an engine
    plainly, with n-gram proposals and with the draft model, interleaved prompt by prompt over
    ``ngram_repeats`` rounds after a warm-up; wall milliseconds (one paired sample per round and
    prompt), proposals, acceptances, engine steps, and output equality with plain greedy. With
    ``base`` (another model, ``params["model"]``), its copy fraction on the ``copia`` workload
    too: what the same workload would give a model that did not learn to copy."""
    n_new = params["ngram_tokens"]
    sp = SamplingParams(max_tokens=n_new, ignore_eos=True)
    methods = {"plain": lambda k: None,
               "ngram": lambda k: {"method": "ngram", "num_speculative_tokens": k,
                                   "prompt_lookup_min": NGRAM_WINDOW[0],
                                   "prompt_lookup_max": NGRAM_WINDOW[1]},
               "draft_model": lambda k: {"model": draft, "num_speculative_tokens": k}}
    out = {}
    for name, w in workloads.items():
        max_len = max(map(len, w["prompts"])) + n_new + max(params["ngram_ks"]) + 2
        rows = []
        for k in params["ngram_ks"]:
            ms = {m: [] for m in methods}
            facts = {m: {"proposed": 0, "accepted": 0, "steps": 0, "outputs": []} for m in methods}
            for r in range(params["ngram_repeats"] + 1):
                for p in w["prompts"]:
                    for m, spec in methods.items():
                        engine = build_engine(target, max_num_seqs=1, max_model_len=max_len,
                                              speculative_config=spec(k))
                        t = time.perf_counter()
                        req = engine.run([(0.0, p, sp)])[0]
                        elapsed = 1e3 * (time.perf_counter() - t)
                        if r:
                            ms[m].append(elapsed)
                        if r == 1:
                            f = facts[m]
                            f["proposed"] += req.num_draft_tokens
                            f["accepted"] += req.num_accepted_tokens
                            f["steps"] += len(engine.history)
                            f["outputs"].append(req.output_token_ids)
            plain = facts["plain"]["outputs"]
            rows.append({"k": k, "ms": ms, **{m: {
                "proposed": f["proposed"], "accepted": f["accepted"], "steps": f["steps"],
                "acceptance": f["accepted"] / f["proposed"] if f["proposed"] else 0.0,
                # generated tokens per engine step after the prefill (the steps that verify)
                "tokens_per_step": len(w["prompts"]) * (n_new - 1) / (f["steps"] - len(w["prompts"])),
                "identical": f["outputs"] == plain} for m, f in facts.items() if m != "plain"}})
        out[name] = {"prompts": len(w["prompts"]), "per_k": rows,
                     "copy_rate": None if w["expected"] is None else copy_rate(plain, w["expected"])}
    result = {"model": params["ngram_model"], "tokens_per_request": n_new,
              "repeats": params["ngram_repeats"], "window": list(NGRAM_WINDOW), "workloads": out}
    if base is not None and "copia" in workloads:
        result["base"] = {"model": params["model"],
                          "copy_rate": measure_copy_rate(base, workloads["copia"], n_new)}
    return result


def ngram_verdicts(ngram: dict) -> dict[str, claims.Claim]:
    """Per workload, method and k: plain time over speculative time (the speedup), paired."""
    out = {}
    for name, w in ngram["workloads"].items():
        for row in w["per_k"]:
            for m, label in (("ngram", "n-grama"), ("draft_model", "modelo borrador")):
                out[f"ngram_{name}_{m}_k{row['k']}"] = claims.compare(
                    row["ms"]["plain"], row["ms"][m],
                    what=(f"aceleración con {label}, carga «{name}», k = {row['k']} (tiempo sin "
                          f"especular / con {label}, lote 1)"),
                    higher=f"con esta carga el {label} paga", lower=f"con esta carga el {label} no paga")
    return out


def ngram_sentence(ngram: dict, found: dict[str, claims.Claim]) -> str:
    """Where n-gram proposals pay, from the claims, and why not where they do not: how much
    of the paragraph the model copies and how many of the proposals it keeps."""
    parts = []
    for name, w in ngram["workloads"].items():
        row = max(w["per_k"], key=lambda r: found[f"ngram_{name}_ngram_k{r['k']}"].value)
        claim = found[f"ngram_{name}_ngram_k{row['k']}"]
        verdict = {claims.HIGHER: "paga", claims.LOWER: "no paga"}.get(
            claim.outcome, "no paga de forma concluyente")
        parts.append(f"con la carga «{name}» el n-grama {verdict} (mejor k = {row['k']}: "
                     f"{es(claim.value, 2)} veces, {es(100 * row['ngram']['acceptance'], 0)} % de "
                     f"sus propuestas aceptadas, {es(row['ngram']['tokens_per_step'], 2)} tokens "
                     "por paso)")
    text = "En esta máquina, " + "; ".join(parts) + "."
    copied = ngram["workloads"].get("copia", {}).get("copy_rate")
    model = ngram.get("model", "el modelo")
    if copied is not None:
        text += (f" Al pedirle que repita el párrafo, {model} reproduce el "
                 f"{es(100 * copied, 0)} % de sus tokens en su sitio: ")
        text += ("copia, y el n-grama propone justo lo que va a escribir." if copied >= COPIES else
                 "no copia, así que las propuestas copiadas del contexto casi nunca son su "
                 "siguiente token.")
    base = ngram.get("base")
    if base is not None and base["model"] != model:
        text += (f" Con el mismo pedido, {base['model']} reproduce el "
                 f"{es(100 * base['copy_rate'], 0)} %: ")
        text += ("también copia." if base["copy_rate"] >= COPIES else
                 "nunca aprendió a copiar, y con él las propuestas del n-grama casi nunca "
                 "serían su siguiente token.")
    return text


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
    """Per k >= 2: do the measured tokens per step match the formula with the measured alpha?
    (With k = 1 they always do: alpha is measured as accepted / examined proposals, and each
    step examines its one proposal, so tokens per step is 1 + alpha by definition; a check
    there could not fail.)"""
    out = {}
    for row in acceptance["per_k"]:
        if row["k"] < 2:
            continue
        pred, got = row["predicted_tokens_per_step"], row["tokens_per_step"]
        out[f"formula_k{row['k']}"] = claims.threshold(
            abs(got - pred) / pred, FORMULA_TOLERANCE,
            what=(f"diferencia relativa entre los tokens por paso medidos ({es(got, 3)}) y los que "
                  f"predice la fórmula con α = {es(row['alpha'], 3)} ({es(pred, 3)}), "
                  f"k = {row['k']}"),
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
            what=(f"ejecuciones del bucle especulativo cuyos tokens difieren de la decodificación "
                  f"voraz normal ({runs} ejecuciones, {acceptance['prompts']} prompts × "
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


def verdicts(acceptance, timing, engine, dist, ngram) -> dict[str, claims.Claim]:
    return (formula_verdicts(acceptance) | speedup_verdicts(timing) | engine_verdicts(engine)
            | exactness_verdicts(acceptance, engine) | distribution_verdicts(dist)
            | ngram_verdicts(ngram))


CRITERIA = (
    ("exact_loop", "la generación especulativa da los mismos tokens que la voraz"),
    ("exact_engine", "el motor con borrador da los mismos tokens que sin él, en cada lote"),
    ("replay", "la verificación voraz repetida sobre los pasos medidos da las mismas aceptaciones"),
    ("distribution", "los tokens de la verificación por muestreo siguen la distribución del objetivo"),
    ("control", "la prueba estadística distingue la distribución del borrador"),
    ("exact_ngram", "el motor con n-grama y con borrador da los mismos tokens que sin especular, "
                    "en cada carga"),
)


@dataclass(frozen=True)
class Findings:
    """What the lab found, between its measurements and its report: the measurements
    (:func:`measure_acceptance`, :func:`measure_step_costs`, :func:`measure_timing`,
    :func:`measure_engine`, :func:`measure_distribution`, :func:`h100_prediction`) and the claims
    drawn from them by name (``formula``, ``speedup`` and ``per_batch`` hold one claim per k or
    per batch size, by their keys in :func:`verdicts`)."""

    params: dict
    acceptance: dict
    costs: dict
    timing: dict
    engine: dict
    dist: dict
    h100: dict
    ngram: dict
    formula: dict[str, claims.Claim]
    speedup: dict[str, claims.Claim]
    per_batch: dict[str, claims.Claim]
    exact_loop: claims.Claim
    exact_engine: claims.Claim
    distribution: claims.Claim
    control: claims.Claim
    ngram_speedup: dict[str, claims.Claim]

    @classmethod
    def from_measurements(cls, params: dict, acceptance: dict, costs: dict, timing: dict,
                          engine: dict, dist: dict, h100: dict, ngram: dict,
                          found: dict[str, claims.Claim] | None = None) -> Findings:
        """``found``: the claims of :func:`verdicts` the page already glued (computed here
        otherwise)."""
        found = verdicts(acceptance, timing, engine, dist, ngram) if found is None else found
        return cls(params, acceptance, costs, timing, engine, dist, h100, ngram,
                   formula=claims_starting(found, "formula_"),
                   speedup=claims_starting(found, "speedup_"),
                   per_batch=claims_starting(found, "engine_"), exact_loop=found["exact_loop"],
                   exact_engine=found["exact_engine"], distribution=found["distribution"],
                   control=found["control"], ngram_speedup=claims_starting(found, "ngram_"))

    @property
    def criteria_met(self) -> dict[str, bool]:
        """Which of ``CRITERIA`` this run meets. Time is not one: whether speculation pays
        depends on the machine and on alpha, and the lab reports it either way."""
        def ok(claim: claims.Claim) -> bool:
            return claim.outcome == claims.PASSED
        return {"exact_loop": ok(self.exact_loop), "exact_engine": ok(self.exact_engine),
                "replay": self.acceptance["replays_matching"] == self.acceptance["runs_compared"],
                "distribution": ok(self.distribution), "control": ok(self.control),
                "exact_ngram": all(row[m]["identical"] for w in self.ngram["workloads"].values()
                                   for row in w["per_k"] for m in ("ngram", "draft_model"))}

    @property
    def measured_speedup(self) -> dict[int, float]:
        """The measured speedup of each k."""
        return {k: self.speedup[f"speedup_k{k}"].value for k in self.params["ks"]}


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


def alpha_vs_c_sentence(alpha: float, cost_ratio: float) -> str:
    """What the formula says for k = 1, where it reduces to alpha > c."""
    pays = alpha > cost_ratio
    return (f"Con k = 1 la fórmula se reduce a comparar α con c, y aquí α = {es(alpha, 2)} "
            f"{'supera' if pays else 'no supera'} a c = {es(cost_ratio, 2)}: aun suponiendo que "
            f"verificar dos tokens cuesta lo mismo que un paso normal, predice que la especulación "
            f"{'paga' if pays else 'no paga'}.")


def best_k_sentence(speedup: dict[int, claims.Claim], formula: dict[int, float]) -> str:
    """Which k paid best, from the measured speedup claims (``speedup``: k -> claim) and the
    formula's speedups with the measured alpha and c (``formula``: k -> speedup). Says that no
    k pays when none does, instead of naming the least bad one as the best."""
    measured = {k: c.value for k, c in speedup.items()}
    best = max(measured, key=measured.get)
    paying = [k for k, c in speedup.items() if c.outcome == claims.HIGHER]
    if paying:
        best = max(paying, key=measured.get)
        head = f"El mejor k medido fue {best}, con una aceleración de {es(measured[best], 2)}"
    elif all(c.outcome == claims.LOWER for c in speedup.values()):
        head = (f"Ningún k paga aquí: con todos, la generación es más lenta que la normal (el "
                f"menos malo, k = {best}, da {es(measured[best], 2)})")
    else:
        head = (f"Ningún k paga de forma concluyente aquí (la mayor aceleración medida, con "
                f"k = {best}, es {es(measured[best], 2)})")
    f_best = max(formula, key=lambda k: (formula[k], -k))
    if formula[f_best] > 1:
        tail = (f"; la fórmula, con el α y el c medidos, elige k = {f_best} y predice "
                f"{es(formula[f_best], 2)}.")
    else:
        tail = (f"; la fórmula, con el α y el c medidos, tampoco ve ningún k que pague (su mejor "
                f"valor, con k = {f_best}, es {es(formula[f_best], 2)}).")
    return head + tail


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


def _results(f: Findings) -> dict:
    measured = f.measured_speedup
    timing = f.timing
    return {
        "acceptance": f.acceptance,
        "step_costs": f.costs,
        "timing": timing | {"median_ms": {k: float(np.median(v)) for k, v in timing["ms"].items()},
                            "speedup": measured},
        "predicted_speedup": predicted_speedups(f.acceptance, f.costs),
        "best_k_measured": max(measured, key=measured.get),
        "best_k_formula": best_k(main_row(f.acceptance)["alpha"], f.costs["cost_ratio"],
                                 max(f.params["ks"])),
        "engine": f.engine,
        "distribution": f.dist,
        "h100": f.h100,
        "ngram": f.ngram,
        "chapter_criteria": f.criteria_met,
    }


def _acceptance_evidence(f: Findings) -> list[dict]:
    """Acceptance per k, the formula's claims, exactness, and the measured step costs with the
    speedups they predict."""
    acceptance, costs, k_max = f.acceptance, f.costs, max(f.params["ks"])
    return [
        *(_ev(f"Con k = {r['k']}, sobre {acceptance['prompts']} prompts del texto reservado: tasa "
              f"de aceptación α = {es(r['alpha'], 3)}, {es(r['mean_accepted'], 2)} tokens del "
              f"borrador aceptados por paso y {es(r['tokens_per_step'], 2)} tokens por paso "
              f"(la fórmula predice {es(r['predicted_tokens_per_step'], 2)}).", r["alpha"], "α",
              source="measured") for r in acceptance["per_k"]),
        *(c.evidence("fracción") for c in f.formula.values()),
        f.exact_loop.evidence("fracción"),
        f.exact_engine.evidence("fracción"),
        _ev(f"Un paso del borrador cuesta {es(costs['cost_ratio'], 2)} pasos del objetivo en esta "
            f"máquina; verificar k + 1 = {k_max + 1} tokens cuesta "
            f"{es(costs['verify_ratio'][k_max], 2)} pasos del objetivo.",
            costs["cost_ratio"], "pasos del objetivo", source="measured", volatile=True),
        *(_ev(f"Con k = {k}, la fórmula de Leviathan et al. predice una aceleración de "
              f"{es(p['formula'], 2)} con el coste medido del borrador, y {es(p['with_verify'], 2)} "
              f"contando el tiempo medido de la verificación.", p["with_verify"], "x",
              source="measured", volatile=True)
          for k, p in predicted_speedups(acceptance, costs).items()),
    ]


def _speed_evidence(f: Findings) -> list[dict]:
    """The measured speedups, the engine per batch, sampling verification and the H100."""
    h100, a = f.h100, f.h100["assumed"]
    first_batch = f.per_batch[f"engine_b{f.engine['batches'][0]['batch_size']}"]
    return [
        *(c.evidence("x") for c in f.speedup.values()),
        *(c.evidence("x") for c in f.per_batch.values()),
        _ev(batch_sentence(f.engine, f.per_batch), first_batch.value, "x", source="measured",
            volatile=True),
        *(c.evidence("x") for c in f.ngram_speedup.values()),
        _ev(ngram_sentence(f.ngram, f.ngram_speedup),
            f.ngram["workloads"]["copia"]["copy_rate"], "fracción copiada", source="measured",
            volatile=True),
        f.distribution.evidence("valor p"),
        f.control.evidence("valor p"),
        _ev(f"Simulador, H100 con Llama 3.1 8B y borrador Llama 3.2 1B, α supuesto de "
            f"{es(a['alpha'], 2)}, k = {h100['k']}: aceleración de {es(a['speedup'][0], 2)} con "
            f"lote 1 y de {es(a['speedup'][-1], 2)} con lote {h100['batch_sizes'][-1]}; "
            + break_even_text(a["break_even_batch"]) + ".",
            a["speedup"][0], "x"),
        _ev(f"El mismo simulador con el α medido aquí ({es(h100['measured']['alpha'], 3)}) predice "
            f"{es(h100['measured']['speedup'][0], 2)} con lote 1.", h100["measured"]["speedup"][0],
            "x", source="measured", volatile=False),
    ]


def _limitations(f: Findings) -> list[str]:
    return [
        "Los modelos son pequeños y se ejecutan en esta máquina: un paso del borrador no cuesta "
        "aquí una fracción tan pequeña de uno del objetivo como en una GPU, donde el paso lo "
        "limita la lectura de los pesos.",
        "La tasa de aceptación depende del texto: se midió en el texto reservado del corpus del "
        "libro, con prompts cortos; otro texto da otro α.",
        "La predicción de la H100 usa el roofline de la hoja de datos sin sobrecarga y un α "
        "supuesto, no medido con esos modelos.",
        f"Las cargas «copia» y «libre» salen del texto reservado del corpus y las sirve "
        f"{f.ngram['model']}, un modelo de unos pocos millones de parámetros: lo que gana el "
        "n-grama depende de cuánto copie el modelo (la fracción copiada medida), y un modelo "
        "grande, que copia sin que se lo hayan enseñado aparte, puede dar otro resultado.",
        timing_limitation(f.timing["repeats"]),
        threads_limitation(f.timing["torch_threads"]),
    ]


def report(f: Findings) -> dict:
    """The contract's body from the lab's findings."""
    return {
        "environment": {"model": f.params["model"], "draft": f.params["draft"],
                        "ngram_model": f.params["ngram_model"]},
        "results": _results(f),
        "evidence": _acceptance_evidence(f) + _speed_evidence(f),
        "limitations": _limitations(f),
        "volatile_fields": ["results.step_costs", "results.timing", "results.predicted_speedup",
                            "results.best_k_measured", "results.engine",
                            "results.ngram"],
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
        separator = load_tokenizer(params["ngram_model"]).encode("\n\n", add_bos=False)
        copier = (target if params["ngram_model"] == params["model"]
                  else load_model(params["ngram_model"], seed, device, dtype=dtype))
        ngram = measure_ngram(copier, draft, ngram_workloads(params["ngram_model"], params["ngram_prompts"],
                                                             params["ngram_passage"], separator),
                              params, base=target)
    return report(Findings.from_measurements(params, acceptance, costs, timing, engine, dist,
                                             h100, ngram))


SPEC = LabSpec(
    kind="speculative",
    title="Decodificación especulativa",
    chapter=9,
    folder="labs/09-speculative",
    ci_budget_s=85,
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
        "ngram_model": Param("tiny-es-copy", str, "modelo objetivo de las cargas copia y libre "
                             "(mismo tokenizador que el borrador)", choices=("tiny-es-copy", "tiny-es")),
        "ngram_ks": Param([2, 4], int, "k del n-grama y del borrador en las cargas copia y libre",
                          min=1, max=16, is_list=True, by_profile={"ci": [3]}),
        "ngram_prompts": Param(6, int, "párrafos del texto reservado por carga", min=1, max=64,
                               by_profile={"ci": 4}),
        "ngram_passage": Param(40, int, "tokens de cada párrafo", min=2 * COPY_CUE, max=64),
        "ngram_tokens": Param(32, int, "tokens generados por petición en las cargas", min=2,
                              max=256, by_profile={"ci": 16}),
        "ngram_repeats": Param(3, int, "rondas intercaladas de las cargas", min=2, max=50,
                               by_profile={"ci": 2}),
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
