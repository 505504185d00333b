"""Lab ``paged_attention`` (chapter 4): what paged KV blocks and prefix caching buy.

Measured on the reader's device (the real engine) and simulated (the same scheduler):
1. fragmentation: the same KV memory as contiguous rows of ``max_model_len`` or as blocks of
   ``block_size``; the share of reserved memory holding real tokens and the concurrency it allows
   (counts), the throughput that follows (interleaved pairs, a ``claims.compare``); and the
   block-size sweep (internal waste vs block-table size);
2. prefix caching: requests sharing a long system prompt (hit rate and prefill tokens saved,
   counts; TTFT with and without the cache, interleaved pairs), a multi-turn chat, and eviction
   under memory pressure;
3. datacenter scale: Llama-3.1-8B on an H100 in the simulator, contiguous vs paged.

The measurement functions run the lab; ``Findings`` holds what they measured and the claims
drawn from it, and ``report`` turns the findings into the contract's body, so a notebook that
measured with the student's functions builds its contract from its own numbers (``Findings`` +
``report`` + ``assemble_contract``) and ``run`` (= measure + findings + report) serves
``run_lab``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from .. import claims
from ..engine import BlockPool, KVCacheManager, LLMEngine, SamplingParams, build_engine
from ..fmt import es
from ..hardware import get_device_spec
from ..loadgen import WorkItem, varied_workload
from ..metrics import summarize
from ..model import get_preset, kv_bytes_per_token, load_model
from ..sim import RooflineCostModel, sim_engine
from ..timing import torch_threads
from .contract import (datasheet_sim_limitation, evidence as _ev, threads_limitation,
                       timing_limitation)
from .common import SERVED_MODELS, worked_examples, MODEL_DTYPE_PARAM, served_dtype
from .registry import LabParamError, LabSpec, Param


def serve_tracked(engine: LLMEngine, items: list[WorkItem]) -> dict:
    """Run ``items`` (all at t = 0) and record KV usage after every step."""
    for it in items:
        engine.add_request(it.prompt_token_ids, it.params, arrival_time=it.arrival_time)
    util, batch, reserved, start = [], [], [], time.perf_counter()
    while engine.has_unfinished_requests():
        engine.step(outputs=False)
        u = engine.kv_usage()
        util.append(u["utilization"])
        reserved.append(u["reserved_token_slots"])
        batch.append(engine.history[-1].batch_size)
    wall = time.perf_counter() - start
    reqs = list(engine.requests.values())
    return {"wall_s": wall, "steps": len(engine.history), "mean_utilization": float(np.mean(util)),
            "peak_batch": max(batch), "mean_batch": float(np.mean(batch)),
            "num_preemptions": engine.scheduler.num_preemptions,
            "output_tokens": sum(len(r.output_token_ids) for r in reqs), "requests": reqs,
            "utilization_series": util, "batch_series": batch}


def block_size_sweep(final_lens: list[int], block_sizes: list[int]) -> list[dict]:
    """Computed from the final lengths: the share of a request's blocks left empty in its last
    block (internal waste) and the block-table entries it needs."""
    lens = np.asarray(final_lens)
    rows = []
    for bs in block_sizes:
        blocks = -(-lens // bs)
        rows.append({"block_size": bs, "internal_waste": float(1 - lens.sum() / (blocks * bs).sum()),
                     "mean_table_entries": float(blocks.mean())})
    return rows


def prefix_study(model, params: dict, seed: int, enable: bool) -> dict:
    """A warm-up request, then ``prefix_requests - 1`` requests sharing its system prompt."""
    cfg = model.config
    rng = np.random.default_rng(seed + 1)
    system = rng.integers(3, cfg.vocab_size, params["system_len"]).tolist()
    prompts = [system + rng.integers(3, cfg.vocab_size, params["user_len"]).tolist()
               for _ in range(params["prefix_requests"])]
    sp = SamplingParams(max_tokens=params["prefix_output"], ignore_eos=True)
    max_len = params["system_len"] + params["user_len"] + params["prefix_output"]
    engine = build_engine(model, max_num_seqs=params["prefix_requests"], max_model_len=max_len,
                          kv_layout="paged", block_size=params["block_size"],
                          enable_prefix_caching=enable)
    engine.run([(0.0, prompts[0], sp)])
    first_steps = len(engine.history)
    rest = engine.run([(0.0, p, sp) for p in prompts[1:]])
    prefill = sum(e.num_tokens for h in engine.history[first_steps:] for e in h.scheduled if e.is_prefill)
    usage = engine.kv_usage()
    queried = sum(r.num_prompt_tokens for r in rest)
    return {"hit_tokens": usage["prefix_hit_tokens"], "prefill_tokens": prefill,
            "prompt_tokens": queried, "hit_rate": usage["prefix_hit_tokens"] / queried,
            "ttft_mean_s": float(np.mean([r.ttft for r in rest]))}


def chat_study(model, params: dict, seed: int) -> list[dict]:
    """A multi-turn chat: each turn's prompt is the whole conversation so far plus a new message."""
    cfg = model.config
    rng = np.random.default_rng(seed + 2)
    turns, user, answer = params["chat_turns"], params["user_len"], params["prefix_output"]
    max_len = params["system_len"] + turns * (user + answer) + 1
    engine = build_engine(model, max_num_seqs=1, max_model_len=max_len, kv_layout="paged",
                          block_size=params["block_size"])
    history = rng.integers(3, cfg.vocab_size, params["system_len"]).tolist()
    out, before = [], 0
    for t in range(turns):
        history = history + rng.integers(3, cfg.vocab_size, user).tolist()
        (req,) = engine.run([(0.0, history, SamplingParams(max_tokens=answer, ignore_eos=True))])
        hits = engine.kv_usage()["prefix_hit_tokens"] - before
        before += hits
        out.append({"turn": t + 1, "prompt_tokens": len(history), "hit_tokens": hits})
        history = history + req.output_token_ids
    return out


def eviction_study(config, params: dict, seed: int) -> list[dict]:
    """In the simulator: warm the system prompt, push unrelated traffic through pools of several
    sizes, then ask again; a small pool has evicted the prefix, a large one still has it."""
    rng = np.random.default_rng(seed + 3)
    bs = params["block_size"]
    system = rng.integers(3, config.vocab_size, params["system_len"]).tolist()
    noise = [rng.integers(3, config.vocab_size, params["system_len"]).tolist() for _ in range(8)]
    sp = SamplingParams(max_tokens=params["prefix_output"], ignore_eos=True)
    max_len = params["system_len"] + params["user_len"] + params["prefix_output"]
    cost = RooflineCostModel(1e11, 1e12, 1e-3, name="toy")
    rows = []
    need = -(-max_len // bs)
    for blocks in (need, 4 * need, 8 * need, 10 * need):
        kv = KVCacheManager(blocks, bs, max_len)
        engine = sim_engine(config, cost, 1, max_len, dtype="fp32", kv=kv)
        engine.run([(0.0, system + [5] * params["user_len"], sp)])
        engine.run([(0.0, n + [6] * params["user_len"], sp) for n in noise])
        before = kv.hit_tokens
        engine.run([(0.0, system + [7] * params["user_len"], sp)])
        rows.append({"num_blocks": blocks, "hit_tokens": kv.hit_tokens - before,
                     "evictions": kv.pool.evictions})
    return rows


def datacenter(params: dict, seed: int) -> dict:
    """Llama-3.1-8B on an H100 (datasheet roofline) with the KV memory left after the weights:
    contiguous rows of ``dc_max_model_len`` vs blocks of 16, same workload."""
    gpu, cfg = get_device_spec("h100-sxm"), get_preset("llama-3.1-8b")
    budget = worked_examples()["h100_llama31_8b"]
    kv_tokens = int(budget.kv_budget_bytes // kv_bytes_per_token(cfg, "bf16"))
    max_len = params["dc_max_model_len"]
    items = varied_workload(params["dc_requests"], params["dc_prompt_len"], params["dc_mean_output"],
                            max_len - params["dc_prompt_len"], cfg.vocab_size, seed)
    cost = RooflineCostModel.from_device_spec(gpu, "bf16")
    out = {"kv_tokens": kv_tokens, "max_model_len": max_len}
    for name, kv, width in (("contiguous", None, kv_tokens // max_len),
                            ("paged", KVCacheManager(kv_tokens // 16, 16, max_len, False), 256)):
        engine = sim_engine(cfg, cost, width, max_len, kv=kv)
        reqs = engine.run([(it.arrival_time, it.prompt_token_ids, it.params) for it in items])
        out[name] = {"max_num_seqs": width, "peak_batch": max(h.batch_size for h in engine.history),
                     "throughput_tok_s": summarize(reqs)["throughput_tok_s"],
                     "num_preemptions": engine.kv_usage()["num_preemptions"]}
    out["throughput_ratio"] = out["paged"]["throughput_tok_s"] / out["contiguous"]["throughput_tok_s"]
    return out


def fragmentation_study(model, params: dict, items: list[WorkItem], repeats: int,
                        pool_cls=BlockPool) -> dict:
    """The same KV memory as ``kv_rows`` contiguous rows or as blocks (from ``pool_cls``: a
    student's pool plugs in here), serving ``items``, timed in ``repeats`` interleaved pairs.

    Pair k runs contiguous then paged (paged then contiguous when k is odd, so warm-up and a
    slow drift of the machine favour neither side). Every run must give the first run's tokens
    and steps; the counts (steps, utilization, concurrency) come from the first pair, and each
    pair gives one tokens/s sample and one mean step time per layout."""
    max_len, rows, bs = params["max_model_len"], params["kv_rows"], params["block_size"]
    num_blocks = rows * max_len // bs

    def contiguous():
        return serve_tracked(build_engine(model, max_num_seqs=rows, max_model_len=max_len), items)

    def paged():
        kv = KVCacheManager(num_blocks, bs, max_len, enable_prefix_caching=False,
                            pool=pool_cls(num_blocks, bs))
        return serve_tracked(build_engine(model, max_num_seqs=params["paged_max_num_seqs"],
                                          max_model_len=max_len, kv=kv), items)

    runs: dict[str, list[dict]] = {"contiguous": [], "paged": []}
    with torch_threads(params.get("torch_threads", 0)):
        for k in range(repeats):
            for name in (("contiguous", "paged") if k % 2 == 0 else ("paged", "contiguous")):
                runs[name].append(contiguous() if name == "contiguous" else paged())

    def tokens(r):
        return [q.output_token_ids for q in r["requests"]]

    first = {name: rs[0] for name, rs in runs.items()}
    reproduced = all(tokens(r) == tokens(rs[0]) and r["steps"] == rs[0]["steps"]
                     for rs in runs.values() for r in rs)
    out = {name: first[name] for name in runs}
    out.update({
        "outputs_identical": tokens(first["contiguous"]) == tokens(first["paged"]),
        "repeats_identical": reproduced,
        "final_lengths": [len(it.prompt_token_ids) + it.params.max_tokens for it in items],
        "timing": {f"{name}_{key}": [f(r) for r in rs] for name, rs in runs.items()
                   for key, f in (("tok_s", lambda r: r["output_tokens"] / r["wall_s"]),
                                  ("step_ms", lambda r: 1e3 * r["wall_s"] / r["steps"]))},
    })
    return out


def prefix_timing_study(model, params: dict, seed: int, repeats: int) -> dict:
    """``prefix_study`` with and without the cache in ``repeats`` interleaved pairs (order
    alternating). The counts come from the first pair (every repeat must reproduce them); each
    pair gives one mean TTFT per side."""
    runs: dict[bool, list[dict]] = {True: [], False: []}
    with torch_threads(params.get("torch_threads", 0)):
        for k in range(repeats):
            for enable in ((True, False) if k % 2 == 0 else (False, True)):
                runs[enable].append(prefix_study(model, params, seed, enable))
    counts = ("hit_tokens", "prefill_tokens", "prompt_tokens", "hit_rate")
    reproduced = all({c: r[c] for c in counts} == {c: rs[0][c] for c in counts}
                     for rs in runs.values() for r in rs)
    return {"with_cache": {c: runs[True][0][c] for c in counts},
            "without_cache": {c: runs[False][0][c] for c in counts},
            "repeats_identical": reproduced,
            "timing": {"ttft_mean_s_with": [r["ttft_mean_s"] for r in runs[True]],
                       "ttft_mean_s_without": [r["ttft_mean_s"] for r in runs[False]]}}


# --- conclusions -------------------------------------------------------------------------------
def layout_verdicts(frag: dict) -> dict[str, claims.Claim]:
    """Paged vs contiguous, from ``fragmentation_study``'s interleaved pairs: tokens/s and the
    mean time of a step (the paged run usually takes fewer, wider steps)."""
    t = frag["timing"]
    return {
        "throughput": claims.compare(
            t["paged_tok_s"], t["contiguous_tok_s"],
            what="tokens/s con bloques / con reserva contigua",
            higher="con la misma memoria, los bloques generan más tokens por segundo en esta máquina",
            lower="con la misma memoria, los bloques generan menos tokens por segundo en esta máquina"),
        "step_time": claims.compare(
            t["paged_step_ms"], t["contiguous_step_ms"],
            what="tiempo medio por paso con bloques / con reserva contigua",
            higher="cada paso con bloques cuesta más en esta máquina",
            lower="cada paso con bloques cuesta menos en esta máquina"),
    }


def ttft_claim(prefix: dict) -> claims.Claim:
    """Mean TTFT with the prefix cache / without it, from ``prefix_timing_study``'s pairs."""
    p = prefix["timing"]
    return claims.compare(
        p["ttft_mean_s_with"], p["ttft_mean_s_without"],
        what="TTFT medio con caché de prefijos / sin ella",
        higher="con la caché de prefijos el TTFT medio es mayor en esta máquina",
        lower="la caché de prefijos acorta el TTFT medio en esta máquina")


def verdicts(frag: dict, prefix: dict) -> dict[str, claims.Claim]:
    """Every timed conclusion of the lab: ``throughput``, ``step_time`` and ``ttft``."""
    return {**layout_verdicts(frag), "ttft": ttft_claim(prefix)}


def same_tokens_sentence(same: bool) -> str:
    return ("Las dos disposiciones generan exactamente los mismos tokens." if same else
            "Las dos disposiciones NO generan los mismos tokens: la lectura por bloques tiene un error.")


def prefix_sentence(with_cache: dict, without: dict) -> str:
    """Hit rate and prefill saved, with the branch the counts support."""
    if without["prefill_tokens"] == 0:
        return "Sin caché el prefill no calculó ningún token: no hay nada que ahorrar."
    saved = 1 - with_cache["prefill_tokens"] / without["prefill_tokens"]
    rate = es(100 * with_cache["hit_rate"], 0)
    if saved > 0:
        return (f"Con caché de prefijos, el {rate} % de los tokens de prompt sale de la caché y el "
                f"prefill calcula un {es(100 * saved, 0)} % menos de tokens "
                f"({with_cache['prefill_tokens']} frente a {without['prefill_tokens']}).")
    return (f"Con caché de prefijos, el {rate} % de los tokens de prompt sale de la caché y el "
            f"prefill no calcula menos tokens ({with_cache['prefill_tokens']} frente a "
            f"{without['prefill_tokens']}).")


def datacenter_comparison(dc: dict) -> str:
    """The simulated H100 case: how the throughput gain compares with the concurrency gain."""
    c, p = dc["contiguous"], dc["paged"]
    conc, thr = p["peak_batch"] / c["peak_batch"], dc["throughput_ratio"]
    head = (f"El rendimiento simulado con bloques es {es(thr, 2)} veces el contiguo, y la "
            f"concurrencia máxima, {es(conc, 2)} veces la contigua")
    if thr < 1:
        return head + ": con bloques el rendimiento simulado baja."
    if thr < conc:
        return (head + ": la ganancia en rendimiento es menor que en concurrencia porque, con lotes "
                "grandes, cada paso lee además la caché de todas las peticiones y deja de costar lo "
                "mismo.")
    return head + ": la ganancia en rendimiento alcanza la de concurrencia."


def datacenter_sentence(dc: dict) -> str:
    c, p = dc["contiguous"], dc["paged"]
    return (f"Simulado en una H100 con Llama-3.1-8B: {c['peak_batch']} peticiones a la vez con "
            f"filas de {dc['max_model_len']} tokens y {p['peak_batch']} con bloques. "
            + datacenter_comparison(dc))


@dataclass(frozen=True)
class Findings:
    """What the lab found, between its measurements and its report: the six measurements
    (``fragmentation_study``, ``block_size_sweep``, ``prefix_timing_study``, ``chat_study``,
    ``eviction_study``, ``datacenter``) and the timed claims drawn from them, by name."""

    model_name: str
    params: dict
    frag: dict
    sweep: list[dict]
    prefix: dict
    chat: list[dict]
    eviction: list[dict]
    dc: dict
    throughput: claims.Claim
    step_time: claims.Claim
    ttft: claims.Claim

    @classmethod
    def from_measurements(cls, model_name: str, params: dict, frag: dict, sweep: list[dict],
                          prefix: dict, chat: list[dict], eviction: list[dict], dc: dict,
                          found: dict[str, claims.Claim] | None = None) -> Findings:
        """``found``: the notebook's own ``verdicts(frag, prefix)`` (computed here when not
        given), so the page and its contract carry the same claims."""
        v = verdicts(frag, prefix) if found is None else found
        return cls(model_name, params, frag, sweep, prefix, chat, eviction, dc,
                   throughput=v["throughput"], step_time=v["step_time"], ttft=v["ttft"])

    @property
    def kv_tokens(self) -> int:
        """The KV memory both layouts share, in tokens."""
        return self.params["kv_rows"] * self.params["max_model_len"]


def _layout(r: dict) -> dict:
    """One layout's counts in ``results.fragmentation``."""
    return {k: r[k] for k in ("steps", "mean_utilization", "peak_batch", "mean_batch",
                              "num_preemptions", "output_tokens")}


def _results(f: Findings) -> dict:
    frag, prefix, ft, pt = f.frag, f.prefix, f.frag["timing"], f.prefix["timing"]
    g24 = worked_examples()["gpu24_7b"]
    return {
        "model": {"name": f.model_name, "max_model_len": f.params["max_model_len"],
                  "kv_tokens": f.kv_tokens},
        "fragmentation": {"contiguous": _layout(frag["contiguous"]), "paged": _layout(frag["paged"]),
                          "block_size": f.params["block_size"],
                          "outputs_identical": frag["outputs_identical"],
                          "repeats_identical": frag["repeats_identical"],
                          "final_lengths_mean": float(np.mean(frag["final_lengths"]))},
        "fragmentation_timing": {**{k: claims.as_inputs(x) for k, x in ft.items()},
                                 "contiguous_tok_s_median": float(np.median(ft["contiguous_tok_s"])),
                                 "paged_tok_s_median": float(np.median(ft["paged_tok_s"])),
                                 "throughput_ratio": f.throughput.value,
                                 "step_time_ratio": f.step_time.value},
        "block_size_sweep": f.sweep,
        "prefix": {**{k: prefix[k] for k in ("with_cache", "without_cache")},
                   "repeats_identical": prefix["repeats_identical"]},
        "prefix_timing": {**{k: claims.as_inputs(x) for k, x in pt.items()},
                          "ttft_ratio": f.ttft.value},
        "chat": f.chat,
        "eviction": f.eviction,
        "datacenter": f.dc,
        "gpu24_example": {"static_slots": g24.static_slots, "on_demand_sequences": g24.on_demand_sequences},
    }


def _evidence(f: Findings) -> list[dict]:
    contiguous, paged, bs = f.frag["contiguous"], f.frag["paged"], f.params["block_size"]
    waste_c, waste_p = 1 - contiguous["mean_utilization"], 1 - paged["mean_utilization"]
    return [
        _ev(f"Con la misma memoria de caché ({f.kv_tokens} tokens), la reserva contigua deja vacío "
            f"el {es(100 * waste_c, 0)} % de lo reservado de media y los bloques de {bs} tokens el "
            f"{es(100 * waste_p, 1)} %.", waste_c, "fracción"),
        _ev(f"Caben a la vez {contiguous['peak_batch']} peticiones con filas contiguas y hasta "
            f"{paged['peak_batch']} con bloques; la carga termina en {contiguous['steps']} y "
            f"{paged['steps']} pasos.", paged["peak_batch"], "peticiones"),
        f.throughput.evidence("x"),
        f.step_time.evidence("x"),
        _ev(same_tokens_sentence(f.frag["outputs_identical"]), f.frag["outputs_identical"], "bool"),
        _ev(prefix_sentence(f.prefix["with_cache"], f.prefix["without_cache"]),
            f.prefix["with_cache"]["hit_rate"], "fracción"),
        f.ttft.evidence("x"),
        _ev(datacenter_sentence(f.dc), f.dc["throughput_ratio"], "x"),
    ]


def _limitations(f: Findings) -> list[str]:
    return [
        f"El modelo medido ({f.model_name}) es pequeño; la memoria de caché se fija en filas de "
        "max_model_len, no sale de una GPU llena.",
        "La atención paginada de referencia copia los bloques de cada petición en cada capa "
        "(gather); un kernel real los lee en su sitio.",
        "La caché de prefijos solo reutiliza bloques llenos; el último token del prompt siempre se "
        "calcula.",
        datasheet_sim_limitation(),
        timing_limitation(len(f.frag["timing"]["paged_tok_s"])),
        threads_limitation(f.params.get("torch_threads", 0)),
    ]


def report(f: Findings) -> dict:
    """The contract's body from the lab's findings."""
    return {"environment": {"model": f.model_name}, "results": _results(f),
            "evidence": _evidence(f), "limitations": _limitations(f),
            "volatile_fields": ["results.fragmentation_timing", "results.prefix_timing"]}


def check_params(params: dict, config) -> None:
    """Spanish errors for parameters the model cannot serve."""
    max_len = params["max_model_len"]
    if max_len > config.max_position_embeddings:
        raise LabParamError(f"max_model_len={max_len} supera las {config.max_position_embeddings} "
                            f"posiciones de {config.name}")
    if params["prompt_len"] >= max_len:
        raise LabParamError(f"prompt_len={params['prompt_len']} debe ser menor que max_model_len={max_len}")


def run(seed: int, profile: str, params: dict, device: torch.device) -> dict:
    model = load_model(params["model"], seed, device,
                       dtype=served_dtype(params["model_dtype"], device))
    cfg = model.config
    check_params(params, cfg)
    repeats = params["timing_repeats"]
    items = varied_workload(params["num_requests"], params["prompt_len"], params["mean_output"],
                            params["max_model_len"] - params["prompt_len"], cfg.vocab_size, seed)
    frag = fragmentation_study(model, params, items, repeats)
    sweep = block_size_sweep(frag["final_lengths"], params["block_sizes"])
    prefix = prefix_timing_study(model, params, seed, repeats)
    chat = chat_study(model, params, seed)
    eviction = eviction_study(cfg, params, seed)
    dc = datacenter(params, seed)
    return report(Findings.from_measurements(cfg.name, params, frag, sweep, prefix, chat,
                                             eviction, dc))


SPEC = LabSpec(
    kind="paged_attention",
    title="PagedAttention y caché de prefijos",
    chapter=4,
    folder="labs/04-paged-attention",
    ci_budget_s=130,
    run=run,
    params={
        "model": Param("tiny-es", str, "modelo servido", choices=SERVED_MODELS),
        "model_dtype": MODEL_DTYPE_PARAM,
        "num_requests": Param(64, int, "peticiones de la carga", min=2, max=10_000,
                              by_profile={"ci": 32}),
        "timing_repeats": Param(5, int, "pares intercalados cronometrados (contigua/bloques y "
                                "con/sin caché de prefijos)", min=1, max=100),
        "torch_threads": Param(0, int, "hilos de torch mientras se miden los tiempos (0: los que "
                               "elija torch)", min=0, max=256, by_profile={"ci": 1}),
        "prompt_len": Param(64, int, "longitud máxima de prompt (se sortea de 4 a este valor)",
                            min=4, max=4096),
        "mean_output": Param(48, float, "media de la exponencial de salidas", min=1, max=10_000),
        "max_model_len": Param(512, int, "tokens por petición como máximo", min=16, max=8192),
        "kv_rows": Param(4, int, "memoria de caché, en filas de max_model_len", min=1, max=1024),
        "paged_max_num_seqs": Param(32, int, "ancho máximo del lote con bloques", min=1, max=4096),
        "block_size": Param(16, int, "tokens por bloque", min=1, max=4096),
        "block_sizes": Param([1, 8, 16, 32, 128, 256], int, "tamaños de bloque del barrido",
                             min=1, max=4096, is_list=True),
        "system_len": Param(96, int, "tokens del prompt de sistema compartido", min=1, max=4096),
        "user_len": Param(8, int, "tokens propios de cada petición", min=1, max=4096),
        "prefix_requests": Param(16, int, "peticiones que comparten el prefijo", min=2, max=1024,
                                 by_profile={"ci": 12}),
        "prefix_output": Param(8, int, "tokens generados por petición del estudio de prefijos",
                               min=1, max=1024),
        "chat_turns": Param(4, int, "turnos de la conversación", min=1, max=64),
        "dc_requests": Param(512, int, "peticiones simuladas", min=2, max=100_000,
                             by_profile={"ci": 256}),
        "dc_prompt_len": Param(512, int, "prompt máximo simulado", min=4, max=100_000),
        "dc_mean_output": Param(256, float, "media de salida simulada", min=1, max=100_000),
        "dc_max_model_len": Param(4096, int, "max_model_len simulado", min=16, max=131_072),
    },
)
