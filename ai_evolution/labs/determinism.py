"""Lab ``determinism`` (chapter 10): the same request, another batch, other bits; and the mode
that removes the difference.

1. Logits (measured, :func:`measure_divergence`): per dtype, one request served alone and then
   inside batches of ``batch_sizes`` requests (itself first, the others different prompts), with
   the usual kernels and with ``batch_invariant=True``: the largest absolute difference between
   its logits in the batch and alone, and the first step at which its greedy tokens differ.
2. Identical requests in other batches (measured, :func:`measure_compositions`): ``copies``
   copies of one greedy request in a half-precision dtype, each served inside a different seeded
   batch (other requests of other lengths around it, at another place; the first copy alone):
   the number of distinct completions and the step at which each copy leaves the solo one,
   without and with the mode. The request is the prompt whose greedy run comes closest to a tie
   between its two best tokens (:func:`tightest_prompt`): where a last-bit difference decides.
3. Identical requests under load (measured, :func:`measure_identical`): ``identical`` copies of
   one request (sampled with one seed, and greedy in a half-precision dtype) arrive as a Poisson
   process (chapter 6's generator) among as many other requests; the number of distinct
   completions without and with the mode. How many differ without it depends on how the load
   happened to batch them (a volatile number); with it, every copy gets the bits it gets alone.

:class:`Findings` holds the measurements and the conclusions, each a :mod:`ai_evolution.claims`
claim; :func:`report` turns them into the contract's body; ``run`` = measure + findings + report.
"""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass

import torch

from .. import claims
from ..engine import LLM, SamplingParams, build_engine
from ..engine.batch_invariant import generate_with_logits
from ..fmt import es_count
from ..hardware import supported_dtypes
from ..loadgen.arrivals import poisson_arrivals
from ..model import load_model
from ..reference.determinism import reference_compare_runs
from ..timing import torch_threads
from .contract import evidence as _ev, met_criteria_sentence, threads_limitation
from .registry import LabParamError, LabSpec, Param

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
MODES = {"usual": False, "invariant": True}


def available_dtypes(wanted: list[str], device: torch.device | str) -> list[str]:
    """The dtypes of ``wanted`` that ``device`` runs (a T4 has no bf16; the CPU runs all three,
    fp16 with torch's CPU half kernels)."""
    device = torch.device(device)
    if device.type == "cpu":
        return list(wanted)
    names = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
    here = {names[d] for d in supported_dtypes(device)}
    return [d for d in wanted if d in here]


def corpus_prompts(model: str, count: int, length: int) -> list[list[int]]:
    """``count`` prompts of ``length`` tokens from the model's held-out text (as in chapter 9)."""
    from .speculative import held_out_prompts
    return held_out_prompts(model, count, length)


def served_prompts(params: dict, seed: int) -> tuple[list[list[int]], list[list[int]]]:
    """The lab's prompts from the held-out text: ``(mixed, candidates)``. ``candidates``: the
    first ``prompt_len`` tokens of each, the requests that may be followed; ``mixed``: the same
    texts cut to seeded lengths between half and twice ``prompt_len``, the requests around it (a
    request among longer ones gets its attention padded to their length, as in real traffic)."""
    n = params["prompt_len"]
    corpus = corpus_prompts(params["model"], params["prompts"], 2 * n)
    rng = random.Random(seed)
    mixed = [p[:rng.randint(max(1, n // 2), 2 * n)] for p in corpus]
    return mixed, [p[:n] for p in corpus]


def tightest_prompt(model, prompts: list[list[int]], new_tokens: int,
                    max_model_len: int) -> dict:
    """Among ``prompts``, the one whose greedy run of ``new_tokens`` tokens comes closest to a
    tie: the smallest gap between its two largest logits at any step. All are served in one
    batch with the mode, which gives each one the logits it gets alone. Returns ``{"index",
    "gap", "step"}`` (the first prompt on a tie)."""
    llm = LLM(model, max_num_seqs=len(prompts), max_model_len=max_model_len, batch_invariant=True)
    runs = generate_with_logits(llm, prompts, SamplingParams(max_tokens=new_tokens,
                                                             ignore_eos=True))
    gaps = []
    for _, logits in runs:
        top = logits.topk(2, dim=-1).values
        gap = top[:, 0] - top[:, 1]
        gaps.append((float(gap.min()), int(gap.argmin())))
    index = min(range(len(gaps)), key=lambda i: (gaps[i][0], i))
    return {"index": index, "gap": gaps[index][0], "step": gaps[index][1]}


def follow_tightest(model, mixed: list[list[int]], candidates: list[list[int]],
                    params: dict) -> tuple[list[list[int]], dict]:
    """The prompts in the order the lab serves them: first the candidate closest to a tie
    (:func:`tightest_prompt`, the request followed), then the mixed-length others; and the tie."""
    tight = tightest_prompt(model, candidates, params["composition_tokens"], params["max_model_len"])
    i = tight["index"]
    return [candidates[i]] + mixed[:i] + mixed[i + 1:], tight


def make_prompts(count: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    """``count`` seeded prompts (ids 3.. to skip the special ones): the first of ``length``
    tokens, the others between half and twice as long, as real traffic mixes lengths."""
    rng = random.Random(seed)
    lengths = [length] + [rng.randint(max(1, length // 2), 2 * length) for _ in range(count - 1)]
    return [[rng.randrange(3, vocab) for _ in range(n)] for n in lengths]


# --- 1. logits solo vs in a batch ----------------------------------------------------------------

def first_divergence(a: list[int], b: list[int]) -> int | None:
    """The first step at which two token sequences differ (None if they never do)."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y),
                None if len(a) == len(b) else min(len(a), len(b)))


def measure_divergence(model, prompts: list[list[int]], batch_sizes: list[int], new_tokens: int,
                       max_model_len: int, compare=None) -> dict:
    """Request 0 (greedy) alone, then first in batches of each size, with both kernel sets: per
    mode and batch size, the max abs difference of its logits from its solo logits (over the
    steps with the same prefix) and the first step its greedy tokens differ (``compare``: the
    student's comparison, default the library's)."""
    compare = compare or reference_compare_runs
    params = SamplingParams(max_tokens=new_tokens, ignore_eos=True)
    out = {}
    for mode, invariant in MODES.items():
        def serve(batch: list[list[int]]):
            llm = LLM(model, max_num_seqs=len(batch), max_model_len=max_model_len,
                      batch_invariant=invariant)
            return generate_with_logits(llm, batch, params)[0]
        solo_tokens, solo_logits = serve(prompts[:1])
        rows = []
        for b in batch_sizes:
            tokens, logits = serve(prompts[:b])
            c = compare(solo_tokens, solo_logits, tokens, logits)
            rows.append({"batch_size": b, "max_abs_diff": c["max_abs_diff"],
                         "bit_equal": c["first_logit_step"] is None and c["first_token_step"] is None,
                         "first_divergent_step": c["first_token_step"]})
        out[mode] = rows
    return out


# --- 2. identical requests, each in another batch --------------------------------------------------

def compositions(copies: int, pool: list[list[int]], max_batch: int, seed: int) -> list[dict]:
    """``copies`` seeded batch compositions for one request: the first alone, each other one a
    batch of 2..``max_batch`` requests (prompts of ``pool`` cut to other lengths) with the
    request at a random place. Per copy: ``{"others": [...], "place": i}``."""
    out = [{"others": [], "place": 0}]
    for i in range(1, copies):
        rng = random.Random(seed * 100_003 + i)
        b = rng.randint(2, max_batch)
        others = [p[:rng.randint(max(1, len(p) // 4), len(p))] for p in rng.sample(pool, b - 1)]
        out.append({"others": others, "place": rng.randrange(b)})
    return out


def measure_compositions(model, target: list[int], pool: list[list[int]], params: dict,
                         seed: int, compare=None) -> dict:
    """``target`` (greedy) served inside each of :func:`compositions`, without and with the mode:
    per mode, the number of distinct completions of the copies, how many differ from the solo
    copy, and each copy's comparison with the solo run (``compare(solo_tokens, solo_logits,
    tokens, logits)``, default the library's)."""
    compare = compare or reference_compare_runs
    sampling = SamplingParams(max_tokens=params["composition_tokens"], ignore_eos=True)
    plan = compositions(params["copies"], pool, params["composition_batch"], seed)
    out = {}
    for mode, invariant in MODES.items():
        runs = []
        for c in plan:
            batch = c["others"][:c["place"]] + [target] + c["others"][c["place"]:]
            llm = LLM(model, max_num_seqs=len(batch), max_model_len=params["max_model_len"],
                      batch_invariant=invariant)
            runs.append(generate_with_logits(llm, batch, sampling)[c["place"]])
        solo_tokens, solo_logits = runs[0]
        compared = [compare(solo_tokens, solo_logits, t, lg) for t, lg in runs]
        completions = [tuple(t) for t, _ in runs]
        out[mode] = {"copies": len(runs), "distinct": len(set(completions)),
                     "differing_from_solo": sum(c != completions[0] for c in completions),
                     "batch_sizes": [len(c["others"]) + 1 for c in plan],
                     "first_token_steps": [c["first_token_step"] for c in compared],
                     "first_logit_steps": [c["first_logit_step"] for c in compared],
                     "max_abs_diff": max(c["max_abs_diff"] for c in compared)}
    return out


# --- 3. identical requests under Poisson load ----------------------------------------------------

def measure_identical(model, prompts: list[list[int]], params: dict, sampling: SamplingParams,
                      seed: int) -> dict:
    """``identical`` copies of ``prompts[0]`` with ``sampling``, interleaved with as many other
    requests, arriving as a Poisson process of ``rate`` requests/s, served without and with the
    mode: per mode, how many distinct completions the copies got, and how many copies differ
    from the most common one."""
    n = params["identical"]
    times = poisson_arrivals(2 * n, params["rate"], seed)
    others = SamplingParams(max_tokens=params["new_tokens"], ignore_eos=True, temperature=0.8,
                            seed=seed)
    workload = [(t, prompts[0] if i % 2 == 0 else prompts[1 + (i // 2) % (len(prompts) - 1)],
                 sampling if i % 2 == 0 else others) for i, t in enumerate(times)]
    out = {}
    for mode, invariant in MODES.items():
        llm = LLM(model, max_num_seqs=params["max_num_seqs"], max_model_len=params["max_model_len"],
                  batch_invariant=invariant)
        requests = llm.engine.run(workload)
        copies = [tuple(r.output_token_ids) for i, r in enumerate(requests) if i % 2 == 0]
        common = max(set(copies), key=copies.count)
        batches = [len(h.scheduled) for h in llm.engine.history]
        out[mode] = {"distinct": len(set(copies)),
                     "differing": sum(c != common for c in copies),
                     "copies": len(copies), "largest_batch": max(batches),
                     "mean_batch": sum(batches) / len(batches)}
    return out


# --- 4. what the mode costs -----------------------------------------------------------------------

def timed_run(model, prompts: list[list[int]], new_tokens: int, invariant: bool,
              max_model_len: int = 512) -> tuple[float, float, list]:
    """One engine run of ``prompts`` (greedy, all arriving at t = 0): (output tokens/s, median
    decode-only step in ms, the outputs)."""
    engine = build_engine(model, max_num_seqs=len(prompts), max_model_len=max_model_len,
                          batch_invariant=invariant)
    params = SamplingParams(max_tokens=new_tokens, ignore_eos=True)
    start = time.perf_counter()
    requests = engine.run([(0.0, p, params) for p in prompts])
    wall = time.perf_counter() - start
    decode = [h.duration for h in engine.history if all(e.num_tokens == 1 for e in h.scheduled)]
    return (len(prompts) * new_tokens / wall, 1e3 * statistics.median(decode),
            [r.output_token_ids for r in requests])


def measure_cost(model, prompts: list[list[int]], params: dict) -> dict:
    """Tokens/s and the median decode step without and with the mode, for each of
    ``cost_batches``, the two alternating rep by rep (``cost_reps`` pairs) so that the shared
    machine's drift hits both alike. Measured time: volatile."""
    out = {}
    for b in params["cost_batches"]:
        batch = prompts[:b]
        timed_run(model, batch, 2, False, params["max_model_len"])  # warm-up
        timed_run(model, batch, 2, True, params["max_model_len"])
        runs = {mode: [] for mode in MODES}
        for _ in range(params["cost_reps"]):
            for mode, invariant in MODES.items():
                runs[mode].append(timed_run(model, batch, params["cost_tokens"], invariant,
                                            params["max_model_len"])[:2])
        out[str(b)] = {mode: {"tokens_per_s": [r[0] for r in rs], "step_ms": [r[1] for r in rs]}
                       for mode, rs in runs.items()}
    return out


def cost_verdicts(cost: dict) -> dict[str, claims.Claim]:
    """Per batch size: is the usual engine faster than the mode (ratio of tokens/s)?"""
    return {f"cost_b{b}": claims.compare(
        r["usual"]["tokens_per_s"], r["invariant"]["tokens_per_s"],
        what=f"tokens/s con los kernels habituales / con el modo, lote {b}",
        higher="el modo cuesta rendimiento en esta máquina",
        lower="el modo es más rápido en esta máquina") for b, r in cost.items()}


# --- findings ------------------------------------------------------------------------------------

def _worst(rows: list[dict]) -> float:
    return max(r["max_abs_diff"] for r in rows)


def verdicts(divergence: dict, identical: dict,
             composed: dict | None = None) -> dict[str, claims.Claim]:
    """The page's conclusions, by key."""
    found = {}
    for case, modes in (composed or {}).items():
        for mode, (kernels, passed, failed) in {
                "usual": ("con los kernels habituales",
                          "aquí ninguna copia se separó de la respuesta que da sola: no divergió "
                          "en esta máquina con estos lotes",
                          "algunas copias dan otra respuesta que la petición sola"),
                "invariant": ("con el modo invariante al lote",
                              "todas las copias dan la respuesta que da sola",
                              "el modo no da la misma respuesta en todos los lotes")}.items():
            r = modes[mode]
            found[f"composed_{mode}"] = claims.threshold(
                r["differing_from_solo"] / r["copies"], 0.0,
                what=(f"fracción de las {r['copies']} copias de la misma petición ({case}), cada "
                      f"una en otro lote de 1 a {max(r['batch_sizes'])} peticiones, cuya respuesta "
                      f"difiere de la que da sola, {kernels} "
                      f"({es_count(r['distinct'], 'respuesta distinta', 'respuestas distintas')})"),
                passed=passed, failed=failed)
    for dtype, modes in divergence.items():
        sizes = ", ".join(str(r["batch_size"]) for r in modes["usual"])
        # below the criterion (0) = identical bits; the usual kernels are expected to miss it
        for mode, (kernels, passed, failed) in {
                "usual": ("con los kernels habituales",
                          "en esta máquina los logits no cambian con el lote ni sin el modo",
                          "los logits cambian con el lote"),
                "invariant": ("con el modo invariante al lote", "idénticos bit a bit en cada lote",
                              "el modo no da los mismos bits en todos los lotes")}.items():
            found[f"{mode}_{dtype}"] = claims.threshold(
                _worst(modes[mode]), 0.0, scale=1.0, unit="", decimals=6,
                what=(f"en {dtype}, {kernels}, la mayor diferencia absoluta entre los logits de "
                      f"la petición en lotes de {sizes} y sola"),
                passed=passed, failed=failed)
    for case, modes in identical.items():
        for mode in MODES:
            r = modes[mode]
            kernels = "con el modo invariante" if mode == "invariant" else "con los kernels habituales"
            found[f"identical_{case}_{mode}"] = claims.threshold(
                r["differing"] / r["copies"], 0.0,
                what=(f"fracción de las {r['copies']} copias idénticas ({case}) bajo carga de "
                      f"Poisson cuya respuesta difiere de la más común, {kernels} "
                      f"({es_count(r['distinct'], 'respuesta distinta', 'respuestas distintas')})"),
                passed="todas las copias dan la misma respuesta",
                failed="algunas copias dan otra respuesta")
    return found


CRITERIA = (
    ("invariant_logits", "con el modo, los logits de una petición son los mismos bit a bit en "
                         "cada lote y cada dtype"),
    ("invariant_composed", "con el modo, la misma petición da la misma respuesta en cada lote"),
    ("invariant_identical", "con el modo, las copias idénticas bajo carga dan una sola respuesta"),
)


@dataclass(frozen=True)
class Findings:
    """The measurements (:func:`measure_divergence` per dtype, :func:`measure_identical` per
    case) and the claims drawn from them by key (see :func:`verdicts`)."""

    params: dict
    divergence: dict
    identical: dict
    found: dict[str, claims.Claim]
    composed: dict | None = None
    cost: dict | None = None

    @classmethod
    def from_measurements(cls, params: dict, divergence: dict, identical: dict,
                          found: dict[str, claims.Claim] | None = None,
                          composed: dict | None = None, cost: dict | None = None) -> "Findings":
        if found is None:
            found = verdicts(divergence, identical, composed) | cost_verdicts(cost or {})
        return cls(params, divergence, identical, found, composed, cost)

    @property
    def criteria_met(self) -> dict[str, bool]:
        ok = lambda key: self.found[key].outcome == claims.PASSED  # noqa: E731
        return {"invariant_logits": all(ok(f"invariant_{d}") for d in self.divergence),
                "invariant_composed": self.composed is not None and ok("composed_invariant"),
                "invariant_identical": all(ok(f"identical_{c}_invariant") for c in self.identical)}


def criteria_sentence(met: dict[str, bool]) -> str:
    return met_criteria_sentence(CRITERIA, met)


def divergence_sentence(dtype: str, rows: list[dict]) -> str:
    """Where the usual kernels' greedy tokens first left the solo ones, in words."""
    steps = [(r["batch_size"], r["first_divergent_step"]) for r in rows
             if r["first_divergent_step"] is not None]
    if not steps:
        logits = ("aunque sus logits sí" if _worst(rows) > 0 else "ni sus logits")
        return (f"En {dtype}, con los kernels habituales, los tokens voraces de la petición no "
                f"cambiaron en ningún lote durante los pasos medidos, {logits}.")
    b, step = min(steps, key=lambda x: x[1])
    return (f"En {dtype}, con los kernels habituales, los tokens voraces de la petición se separan "
            f"de los que da sola en el paso {step} (lote {b}); desde ahí el texto es otro.")


def composed_sentence(case: str, usual: dict) -> str:
    """Where the copies in other batches left the solo run (usual kernels), in words."""
    steps = [s for s in usual["first_token_steps"] if s is not None]
    logit_steps = [s for s in usual["first_logit_steps"][1:] if s is not None]
    if not steps:
        logits = ("aunque sus logits sí cambiaron" if logit_steps else "ni sus logits")
        return (f"Con los kernels habituales ({case}), ninguna de las {usual['copies']} copias se "
                f"separó de la respuesta sola en los pasos medidos, {logits}.")
    where = sorted(set(steps))
    first_logit = min(logit_steps) if logit_steps else None
    logits = (f"; sus logits ya eran otros desde el paso {first_logit}" if first_logit is not None
              else "")
    return (f"Con los kernels habituales ({case}), {len(steps)} de {usual['copies'] - 1} copias en "
            f"otro lote se separan de la respuesta sola, en el paso "
            f"{', '.join(str(s) for s in where)}{logits}: un empate casi exacto entre dos tokens "
            f"lo decide el último bit.")


def report(f: Findings) -> dict:
    evidence = []
    for dtype, modes in f.divergence.items():
        evidence += [f.found[f"usual_{dtype}"].evidence("logit"),
                     f.found[f"invariant_{dtype}"].evidence("logit"),
                     _ev(divergence_sentence(dtype, modes["usual"]),
                         min((r["first_divergent_step"] for r in modes["usual"]
                              if r["first_divergent_step"] is not None), default=-1),
                         "paso", source="measured")]
    for case, modes in (f.composed or {}).items():
        evidence += [f.found[f"composed_{m}"].evidence("fracción") for m in MODES]
        evidence.append(_ev(composed_sentence(case, modes["usual"]),
                            min((s for s in modes["usual"]["first_token_steps"] if s is not None),
                                default=-1), "paso", source="measured"))
    for case in f.identical:
        evidence += [f.found[f"identical_{case}_{m}"].evidence("fracción") for m in MODES]
    evidence += [f.found[f"cost_b{b}"].evidence("veces") for b in (f.cost or {})]
    evidence.append(_ev(criteria_sentence(f.criteria_met), sum(f.criteria_met.values()),
                        "criterios", source="measured"))
    return {
        "environment": {"model": f.params["model"]},
        "results": {"divergence": f.divergence, "composed": f.composed, "identical": f.identical,
                    "cost": f.cost,
                    "chapter_criteria": f.criteria_met},
        "evidence": evidence,
        "limitations": [
            "Cuántas copias idénticas difieren sin el modo depende de cómo la carga las agrupó en "
            "lotes: otra ejecución, u otra máquina, da otro número; con el modo el número es 0 "
            "en cualquier caso.",
            "El modelo es pequeño y corre en esta máquina; en una GPU los kernels son otros (cuBLAS, "
            "FlashAttention con división de claves) y las diferencias también, pero la causa es la "
            "misma: el orden de la suma depende de la forma del lote.",
            threads_limitation(f.params["torch_threads"]),
        ],
        "volatile_fields": ["results.identical", "results.cost"],
    }


def check_params(params: dict) -> None:
    if params["composition_batch"] > params["prompts"]:
        raise LabParamError(f"composition_batch ({params['composition_batch']}) no puede pasar del "
                            f"número de prompts ({params['prompts']})")
    if max(params["cost_batches"]) > params["prompts"]:
        raise LabParamError(f"el lote mayor de cost_batches ({max(params['cost_batches'])}) no "
                            f"puede pasar del número de prompts ({params['prompts']})")
    if max(params["batch_sizes"]) > params["prompts"]:
        raise LabParamError(f"el lote mayor ({max(params['batch_sizes'])}) no puede pasar del número "
                            f"de prompts ({params['prompts']})")


def run(seed: int, profile: str, params: dict, device: torch.device) -> dict:
    check_params(params)
    dtypes = available_dtypes(params["dtypes"], device)
    if not dtypes:
        raise LabParamError(f"ninguno de los dtypes pedidos ({', '.join(params['dtypes'])}) está "
                            f"disponible en {device}")
    with torch_threads(params["torch_threads"]):
        divergence, models, ordered = {}, {}, {}
        corpus, candidates = served_prompts(params, seed)
        for name in dtypes:
            models[name] = load_model(params["model"], seed, device, dtype=DTYPES[name])
            ordered[name], _ = follow_tightest(models[name], corpus, candidates, params)
            prompts = ordered[name]
            divergence[name] = measure_divergence(models[name], prompts, params["batch_sizes"],
                                                  params["new_tokens"], params["max_model_len"])
        sampled = SamplingParams(max_tokens=params["new_tokens"], ignore_eos=True,
                                 temperature=params["temperature"], seed=seed)
        greedy = SamplingParams(max_tokens=params["new_tokens"], ignore_eos=True)
        half = next((d for d in ("bf16", "fp16") if d in models), dtypes[0])
        prompts = ordered[half]
        composed = {f"voraz {half}": measure_compositions(models[half], prompts[0], prompts[1:],
                                                          params, seed)}
        identical = {
            f"muestreo {half}": measure_identical(models[half], prompts, params, sampled, seed),
            f"voraz {half}": measure_identical(models[half], prompts, params, greedy, seed),
        }
        cost = measure_cost(models[half], prompts, params)
    return report(Findings.from_measurements(params, divergence, identical, composed=composed,
                                             cost=cost))


SPEC = LabSpec(
    kind="determinism",
    title="Determinismo",
    chapter=10,
    folder="labs/10-determinism",
    ci_budget_s=90,
    run=run,
    params={
        "model": Param("tiny-es", str, "modelo servido", choices=("tiny-es",)),
        "dtypes": Param(["fp32", "bf16", "fp16"], str, "dtypes medidos (los que el dispositivo "
                        "tenga)", choices=tuple(DTYPES), is_list=True),
        "batch_sizes": Param([2, 4, 8, 16, 32], int, "lotes en los que se sirve la petición",
                             min=2, max=64, is_list=True, by_profile={"ci": [2, 8, 32]}),
        "prompts": Param(32, int, "prompts distintos", min=2, max=64),
        "prompt_len": Param(24, int, "tokens de cada prompt", min=1, max=128,
                            by_profile={"ci": 12}),
        "new_tokens": Param(32, int, "tokens generados por petición", min=2, max=128,
                            by_profile={"ci": 12}),
        "max_model_len": Param(256, int, "longitud máxima de una petición", min=16, max=512),
        "copies": Param(24, int, "copias de la petición, cada una en otro lote", min=2,
                        max=1000, by_profile={"ci": 12}),
        "composition_batch": Param(16, int, "lote mayor de las copias", min=2, max=64),
        "composition_tokens": Param(32, int, "tokens generados por cada copia", min=2, max=128,
                                    by_profile={"ci": 24}),
        "identical": Param(64, int, "copias idénticas bajo carga", min=2, max=1000,
                           by_profile={"ci": 8}),
        "rate": Param(50.0, float, "llegadas por segundo (Poisson)", min=0.1, max=10000.0),
        "max_num_seqs": Param(16, int, "lote máximo del motor bajo carga", min=1, max=64),
        "temperature": Param(0.8, float, "temperatura de las copias muestreadas", min=0.05,
                             max=2.0),
        "cost_batches": Param([1, 8, 32], int, "lotes en los que se mide el coste del modo", min=1,
                              max=64, is_list=True, by_profile={"ci": [1, 8]}),
        "cost_tokens": Param(16, int, "tokens por petición al medir el coste", min=2, max=128,
                             by_profile={"ci": 8}),
        "cost_reps": Param(5, int, "pares intercalados al medir el coste", min=2, max=50),
        "torch_threads": Param(0, int, "hilos de torch durante el laboratorio (0: los que elija "
                               "torch)", min=0, max=256, by_profile={"ci": 1}),
    },
)
