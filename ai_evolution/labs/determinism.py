"""Lab ``determinism`` (chapter 10): the same request, another batch, other bits; and the mode
that removes the difference.

1. Logits (measured, :func:`measure_divergence`): per dtype, one request served alone and then
   inside batches of ``batch_sizes`` requests (itself first, the others different prompts), with
   the usual kernels and with ``batch_invariant=True``: the largest absolute difference between
   its logits in the batch and alone, and the first step at which its greedy tokens differ.
2. Identical requests under load (measured, :func:`measure_identical`): ``identical`` copies of
   one request (sampled with one seed, and greedy in a half-precision dtype) arrive as a Poisson
   process (chapter 6's generator) among as many other requests; the number of distinct
   completions without and with the mode. How many differ without it depends on how the load
   happened to batch them (a volatile number); with it, every copy gets the bits it gets alone.

:class:`Findings` holds the measurements and the conclusions, each a :mod:`ai_evolution.claims`
claim; :func:`report` turns them into the contract's body; ``run`` = measure + findings + report.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from .. import claims
from ..engine import LLM, SamplingParams
from ..engine.batch_invariant import generate_with_logits
from ..fmt import es
from ..hardware import supported_dtypes
from ..loadgen.arrivals import poisson_arrivals
from ..model import load_model
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
                       max_model_len: int) -> dict:
    """Request 0 (greedy) alone, then first in batches of each size, with both kernel sets: per
    mode and batch size, the max abs difference of its logits from its solo logits and the first
    step its greedy tokens differ."""
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
            rows.append({"batch_size": b, "max_abs_diff": float((logits - solo_logits).abs().max()),
                         "bit_equal": bool(torch.equal(logits, solo_logits)),
                         "first_divergent_step": first_divergence(tokens, solo_tokens)})
        out[mode] = rows
    return out


# --- 2. identical requests under Poisson load ----------------------------------------------------

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


# --- findings ------------------------------------------------------------------------------------

def _worst(rows: list[dict]) -> float:
    return max(r["max_abs_diff"] for r in rows)


def verdicts(divergence: dict, identical: dict) -> dict[str, claims.Claim]:
    """The page's conclusions, by key."""
    found = {}
    for dtype, modes in divergence.items():
        sizes = ", ".join(str(r["batch_size"]) for r in modes["usual"])
        # below the criterion (0) = identical bits; the usual kernels are expected to miss it
        for mode, (kernels, passed, failed) in {
                "usual": ("con los núcleos habituales",
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
            found[f"identical_{case}_{mode}"] = claims.threshold(
                r["differing"] / r["copies"], 0.0,
                what=(f"{r['copies']} copias idénticas ({case}) bajo carga de Poisson, "
                      f"{'modo invariante' if mode == 'invariant' else 'núcleos habituales'}: "
                      f"fracción de copias cuya respuesta difiere de la más común "
                      f"(respuestas distintas: {r['distinct']})"),
                passed="todas las copias dan la misma respuesta",
                failed="algunas copias dan otra respuesta")
    return found


CRITERIA = (
    ("invariant_logits", "con el modo, los logits de una petición son los mismos bit a bit en "
                         "cada lote y cada dtype"),
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

    @classmethod
    def from_measurements(cls, params: dict, divergence: dict, identical: dict,
                          found: dict[str, claims.Claim] | None = None) -> "Findings":
        return cls(params, divergence, identical,
                   verdicts(divergence, identical) if found is None else found)

    @property
    def criteria_met(self) -> dict[str, bool]:
        ok = lambda key: self.found[key].outcome == claims.PASSED  # noqa: E731
        return {"invariant_logits": all(ok(f"invariant_{d}") for d in self.divergence),
                "invariant_identical": all(ok(f"identical_{c}_invariant") for c in self.identical)}


def criteria_sentence(met: dict[str, bool]) -> str:
    return met_criteria_sentence(CRITERIA, met)


def divergence_sentence(dtype: str, rows: list[dict]) -> str:
    """Where the usual kernels' greedy tokens first left the solo ones, in words."""
    steps = [(r["batch_size"], r["first_divergent_step"]) for r in rows
             if r["first_divergent_step"] is not None]
    if not steps:
        logits = ("aunque sus logits sí" if _worst(rows) > 0 else "ni sus logits")
        return (f"En {dtype}, con los núcleos habituales, los tokens voraces de la petición no "
                f"cambiaron en ningún lote durante los pasos medidos, {logits}.")
    b, step = min(steps, key=lambda x: x[1])
    return (f"En {dtype}, con los núcleos habituales, los tokens voraces de la petición se separan "
            f"de los que da sola en el paso {step} (lote {b}); desde ahí el texto es otro.")


def report(f: Findings) -> dict:
    evidence = []
    for dtype, modes in f.divergence.items():
        evidence += [f.found[f"usual_{dtype}"].evidence("logit"),
                     f.found[f"invariant_{dtype}"].evidence("logit"),
                     _ev(divergence_sentence(dtype, modes["usual"]),
                         min((r["first_divergent_step"] for r in modes["usual"]
                              if r["first_divergent_step"] is not None), default=-1),
                         "paso", source="measured")]
    for case in f.identical:
        evidence += [f.found[f"identical_{case}_{m}"].evidence("fracción") for m in MODES]
    evidence.append(_ev(criteria_sentence(f.criteria_met), sum(f.criteria_met.values()),
                        "criterios", source="measured"))
    return {
        "environment": {"model": f.params["model"]},
        "results": {"divergence": f.divergence, "identical": f.identical,
                    "chapter_criteria": f.criteria_met},
        "evidence": evidence,
        "limitations": [
            "Cuántas copias idénticas difieren sin el modo depende de cómo la carga las agrupó en "
            "lotes: otra ejecución, u otra máquina, da otro número; con el modo el número es 0 "
            "en cualquier caso.",
            "El modelo es pequeño y corre en esta máquina; en una GPU los núcleos son otros (cuBLAS, "
            "FlashAttention con división de claves) y las diferencias también, pero la causa es la "
            "misma: el orden de la suma depende de la forma del lote.",
            threads_limitation(f.params["torch_threads"]),
        ],
        "volatile_fields": ["results.identical"],
    }


def check_params(params: dict) -> None:
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
        divergence, models = {}, {}
        for name in dtypes:
            models[name] = load_model(params["model"], seed, device, dtype=DTYPES[name])
            prompts = make_prompts(params["prompts"], params["prompt_len"],
                                   models[name].config.vocab_size, seed)
            divergence[name] = measure_divergence(models[name], prompts, params["batch_sizes"],
                                                  params["new_tokens"], params["max_model_len"])
        sampled = SamplingParams(max_tokens=params["new_tokens"], ignore_eos=True,
                                 temperature=params["temperature"], seed=seed)
        greedy = SamplingParams(max_tokens=params["new_tokens"], ignore_eos=True)
        half = next((d for d in ("bf16", "fp16") if d in models), dtypes[0])
        identical = {
            f"muestreo {half}": measure_identical(models[half], prompts, params, sampled, seed),
            f"voraz {half}": measure_identical(models[half], prompts, params, greedy, seed),
        }
    return report(Findings.from_measurements(params, divergence, identical))


SPEC = LabSpec(
    kind="determinism",
    title="Determinismo",
    chapter=10,
    folder="labs/10-determinism",
    ci_budget_s=60,
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
        "identical": Param(64, int, "copias idénticas bajo carga", min=2, max=1000,
                           by_profile={"ci": 16}),
        "rate": Param(50.0, float, "llegadas por segundo (Poisson)", min=0.1, max=10000.0),
        "max_num_seqs": Param(16, int, "lote máximo del motor bajo carga", min=1, max=64),
        "temperature": Param(0.8, float, "temperatura de las copias muestreadas", min=0.05,
                             max=2.0),
        "torch_threads": Param(0, int, "hilos de torch durante el laboratorio (0: los que elija "
                               "torch)", min=0, max=256, by_profile={"ci": 1}),
    },
)
