"""Lab ``distributed`` (chapter 13): beyond one GPU.

1. :func:`split_study`: Megatron-LM's split of one layer of the served model: its ``q_proj``
   column-parallel (each rank's output features, concatenated) and its ``down_proj``
   row-parallel (each rank's partial product, summed: what the all-reduce does) over
   ``split_ranks`` ranks, against the whole layer. The notebook plugs the student's
   ``shard_linear`` in here.
2. :func:`tp_study`: the served model on one process (TP=1) and split over two (TP=2, gloo on
   this CPU), the same greedy workload run alternately ``tp_pairs`` times: the tokens (identical
   or not: a computed boolean), the bytes rank 0 all-reduced against the formula (the student's
   ``allreduce_bytes``), and each pair's decode step time (measured: the verdict is
   ``claims.compare`` over the pairs, with an inconclusive branch).
3. :func:`allreduce_study`: gloo all-reduce time against message size (``hardware.allreduce``),
   and the ring model fitted to it (the latency and bandwidth of this machine's "link").
4. :func:`h100_study`: the cost model with the datasheet interconnect (``sim.interconnect``):
   decode step and throughput of ``dc_model`` on ``dc_device`` at TP = 1, 2, 4, 8 over NVLink and
   PCIe, and where TP pays.
5. :func:`routing_comparison`: the router's policies in front of N simulated replicas (the real
   scheduler and prefix cache on the simulator's clock, ``sim.routing``) on conversations that
   share system prompts, with the student's prefix-affinity rule; and round-robin's miss of a
   second turn's own first turn, against (N - 1) / N.

:class:`Findings` holds the numbers and the claims; :func:`report` makes the contract's body.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from functools import cached_property

import torch

from .. import claims
from ..engine import build_engine
from ..engine.tensor_parallel import AllReduceTimer, check_shardable, decode_rate
from ..fmt import es
from ..hardware import get_device_spec
from ..hardware.allreduce import fit_allreduce, measure_allreduce
from ..loadgen.shared_prefix import prefix_sharing_workload
from ..model import get_preset, load_model, weight_bytes
from ..reference.distributed import reference_allreduce_bytes, reference_shard_linear
from ..router.policies import PrefixAffinity, make_policy
from ..sim import RooflineCostModel
from ..sim.interconnect import ASSUMED_LATENCY_S, ring_allreduce_s, tp_scaling, tp_sweep
from ..sim.routing import routing_engine_factory, routing_study, simulate_routing
from ..timing import torch_threads
from .common import SERVED_MODELS
from .contract import datasheet_sim_limitation, evidence as _ev, threads_limitation
from .registry import LabParamError, LabSpec, Param

POLICY_ES = {"round-robin": "round-robin", "least-outstanding": "menos peticiones en curso",
             "prefix-affinity": "afinidad de prefijo"}
SPLIT_TOLERANCE = 1e-5  # float32: a sum in another order differs in the last bits, not more


# --- 1. Megatron's split of one layer ---------------------------------------------------------------
def split_study(model, params: dict, seed: int, shard_fn=None) -> dict:
    """Layer 0's ``q_proj`` split by columns and ``down_proj`` by rows over ``split_ranks``
    ranks (``shard_fn(weight, rank, n, mode)``, default the reference), applied to seeded inputs:
    the largest error of the rebuilt output against the whole layer's, relative to its largest
    value, and whether it is bit-identical."""
    shard_fn = shard_fn or reference_shard_linear
    n = params["split_ranks"]
    layer = model.model.layers[0]
    q, down = layer.self_attn.q_proj.weight.detach(), layer.mlp.down_proj.weight.detach()
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(4, q.shape[1], generator=g, dtype=q.dtype)
    h = torch.randn(4, down.shape[1], generator=g, dtype=down.dtype)
    col = torch.cat([x @ shard_fn(q, r, n, "column").T for r in range(n)], dim=-1)
    k = down.shape[1] // n
    row = sum(h[:, r * k:(r + 1) * k] @ shard_fn(down, r, n, "row").T for r in range(n))
    out = {"ranks": n}
    for name, got, full, w in (("column", col, x @ q.T, q), ("row", row, h @ down.T, down)):
        err = (got - full).abs().max().item() if got.shape == full.shape else math.inf
        out[name] = {"weight_shape": list(w.shape), "rel_error": err / full.abs().max().item(),
                     "identical": bool(got.shape == full.shape and torch.equal(got, full))}
    return out


# --- 2. TP=2 against TP=1 on this machine --------------------------------------------------------
def tp_study(model, params: dict, seed: int, bytes_fn=None) -> dict:
    """The same greedy workload on TP=1 and TP=2 engines, alternately (TP=1 first in even pairs,
    TP=2 first in odd ones): per pair, decode step time of each (batch / decode tokens/s) and
    rank 0's seconds inside ``all_reduce``; overall, requests whose tokens differ and the bytes
    all-reduced against ``bytes_fn(config, num_tokens, dtype_bytes)`` (default the reference)
    summed over TP=2's steps."""
    bytes_fn = bytes_fn or reference_allreduce_bytes
    cfg = model.config
    check_shardable(cfg, 2)  # check_params says it in the lab's words first
    rng = random.Random(seed)
    b, plen, new = params["tp_batch"], params["tp_prompt_len"], params["tp_max_tokens"]
    prompts = [[rng.randrange(3, cfg.vocab_size) for _ in range(plen)] for _ in range(b)]
    options = dict(max_num_seqs=b, kv_layout="paged", enable_prefix_caching=False,
                   max_model_len=plen + new, decode_graphs=None)
    element = next(model.parameters()).element_size()
    pairs, mismatched, counted, predicted = [], 0, 0, 0.0
    with torch_threads(params["torch_threads"]):  # the TP=2 worker copies this process's threads
        tp2 = build_engine(model, tensor_parallel_size=2, **options)
        try:
            tp1 = build_engine(model, **options)
            for k in range(params["tp_pairs"]):
                row = {}
                for which in ((1, 2) if k % 2 == 0 else (2, 1)):
                    engine = tp1 if which == 1 else tp2
                    first = len(engine.history)
                    with AllReduceTimer() as timer:
                        rate, busy, tokens = decode_rate(engine, prompts, new)
                    row[f"tp{which}_step_s"] = b / rate
                    row[f"tp{which}_tokens"] = tokens
                    if which == 2:
                        row["allreduce_s"] = timer.seconds
                        row["busy_s"] = busy
                        row["allreduce_calls"] = timer.calls
                        counted += timer.bytes
                        predicted += sum(float(bytes_fn(cfg, s.num_tokens, element))
                                         for s in engine.history[first:])
                mismatched += sum(a != c for a, c in zip(row.pop("tp1_tokens"), row.pop("tp2_tokens")))
                pairs.append(row)
        finally:
            tp2.executor.close()
    return {"exact": {"requests": b * params["tp_pairs"], "mismatched_requests": mismatched,
                      "allreduce_bytes_counted": counted, "allreduce_bytes_predicted": predicted,
                      "calls_per_step": 2 * cfg.num_layers},
            "timing": {"pairs": pairs}}


# --- 3. gloo's all-reduce on this machine --------------------------------------------------------
def allreduce_study(params: dict) -> dict:
    """``measure_allreduce`` over ``ar_sizes`` bytes and the ring model fitted to it."""
    rows = measure_allreduce(list(params["ar_sizes"]), repeats=params["ar_repeats"], warmup=5,
                             threads=max(1, params["torch_threads"]))
    link = fit_allreduce(rows)
    bw = link.bandwidth_bytes_per_s  # inf when the larger messages were not slower (noise)
    return {"rows": [{k: r[k] for k in ("bytes", "median_s", "min_s", "max_s",
                                        "algbw_bytes_per_s")} for r in rows],
            "latency_s": link.latency_s, "bandwidth_bytes_per_s": bw if math.isfinite(bw) else None,
            "link": link}


def link_text(allreduce: dict) -> str:
    """The fitted link in words: latency per call and bandwidth (or why there is none)."""
    bw = allreduce["bandwidth_bytes_per_s"]
    return (f"una latencia de {es(1e6 * allreduce['latency_s'], 0)} µs por llamada y "
            + (f"{es(bw / 1e9, 2)} GB/s" if bw else "un ancho de banda que las medidas no "
               "distinguen del infinito (los mensajes grandes no tardaron más)"))


# --- 4. the H100 predictions -----------------------------------------------------------------------
def h100_study(params: dict) -> dict:
    """``tp_sweep`` and ``tp_scaling`` of ``dc_model`` on ``dc_device``, plus the bytes each GPU
    stops reading per decode step at each TP against the bytes it all-reduces."""
    cfg, spec = get_preset(params["dc_model"]), get_device_spec(params["dc_device"])
    rows = tp_sweep(cfg, spec, tuple(params["dc_tps"]), tuple(params["dc_batches"]),
                    params["dc_context"])
    whole = weight_bytes(cfg, "bf16")
    return {"model": cfg.name, "device": spec.name, "rows": rows, "scaling": tp_scaling(rows),
            "weight_bytes": whole, "memory_bytes": spec.memory_bytes,
            "assumed_latency_s": dict(ASSUMED_LATENCY_S)}


# --- 5. routing ------------------------------------------------------------------------------------
def routing_comparison(params: dict, seed: int, rule=None) -> dict:
    """``sim.routing.routing_study`` at ``route_replicas`` replicas (``route_sessions``
    conversations per replica; ``rule``: the student's prefix-affinity rule, default the
    library's), and round-robin on second turns that can reuse only their own first turn."""
    def factory(name: str):
        return PrefixAffinity(rule=rule) if name == "prefix-affinity" and rule else make_policy(name)

    study = routing_study(seed, tuple(params["route_replicas"]),
                          sessions_per_replica=params["route_sessions"], policy_factory=factory)
    cfg = get_preset(study["settings"]["model"])
    make = routing_engine_factory(
        cfg, RooflineCostModel.from_device_spec(get_device_spec(study["settings"]["device"])),
        max_num_seqs=32, max_model_len=4096, num_blocks=4096)
    rr = []
    for n in params["route_replicas"]:
        sessions = n * params["rr_sessions"]
        work = prefix_sharing_workload(sessions, 12.0 * n, cfg.vocab_size, seed + 3,
                                       num_system_prompts=1, system_len=0, turns=2, turn_len=64,
                                       output_len=8)
        row = simulate_routing("round-robin", work, n, make)
        rr.append({"num_replicas": n, "second_turns": sessions,
                   "miss": 1 - row["reusable_hit_fraction"], "predicted_miss": (n - 1) / n})
    return {"settings": study["settings"], "rows": study["rows"], "round_robin": rr}


# --- findings and claims ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Findings:
    """What the lab measured and simulated; ``found``: the claims drawn from it."""

    params: dict
    model_name: str
    split: dict
    tp: dict
    allreduce: dict
    h100: dict
    routing: dict

    @cached_property
    def found(self) -> dict:
        return verdicts(self)

    def h100_row(self, link: str, tp: int, batch: int) -> dict:
        return next(r for r in self.h100["rows"]
                    if (r["link"], r["tp"], r["batch_size"]) == (link, tp, batch))

    def route(self, n: int, policy: str) -> dict:
        return next(r for r in self.routing["rows"]
                    if (r["num_replicas"], r["policy"]) == (n, policy))

    @property
    def tp_ratio(self) -> float:
        pairs = self.tp["timing"]["pairs"]
        ratios = sorted(p["tp2_step_s"] / p["tp1_step_s"] for p in pairs)
        return ratios[len(ratios) // 2]

    @property
    def allreduce_share(self) -> float:
        """Share of TP=2's busy time rank 0 spent inside ``all_reduce`` (all pairs)."""
        pairs = self.tp["timing"]["pairs"]
        return sum(p["allreduce_s"] for p in pairs) / sum(p["busy_s"] for p in pairs)


def verdicts(f: Findings) -> dict:
    p, out = f.params, {}
    for mode, label in (
            ("column", "por columnas (la proyección de consultas, salidas concatenadas)"),
            ("row", "por filas (la proyección de bajada del MLP, sumas parciales sumadas)")):
        s = f.split[mode]
        out[f"split_{mode}"] = claims.threshold(
            s["rel_error"], SPLIT_TOLERANCE, scale=1e6, unit="ppm", decimals=2,
            what=(f"Capa 0 de {f.model_name} repartida {label} en {f.split['ranks']} rangos: "
                  f"mayor error relativo frente a la capa entera"
                  + (" (idéntica bit a bit)" if s["identical"] else "")),
            passed="los trozos reconstruyen la capa", failed="los trozos no reconstruyen la capa")
    e = f.tp["exact"]
    out["bytes"] = claims.threshold(
        abs(e["allreduce_bytes_counted"] - e["allreduce_bytes_predicted"]), 0, scale=1,
        unit="bytes", decimals=0,
        what=(f"Bytes que el rango 0 redujo con TP=2 ({es(e['allreduce_bytes_counted'], 0)}), "
              f"menos los que da la fórmula paso a paso"),
        passed="la fórmula cuenta exactamente lo que se redujo",
        failed="la fórmula no cuenta lo que se redujo")
    out["tokens"] = claims.threshold(
        e["mismatched_requests"], 0, scale=1, unit="peticiones", decimals=0,
        what=(f"Peticiones cuyos tokens voraces con TP=2 difieren de los de TP=1 (de "
              f"{e['requests']})"),
        passed="TP=2 genera los mismos tokens que un solo proceso",
        failed="TP=2 cambia los tokens")
    pairs = f.tp["timing"]["pairs"]
    out["tp_ratio"] = claims.compare(
        [q["tp2_step_s"] for q in pairs], [q["tp1_step_s"] for q in pairs],
        what="tiempo de un paso de decodificación con TP=2 / con TP=1, en esta máquina",
        higher=("aquí TP=2 es más lento: los dos procesos comparten los mismos núcleos y la "
                "misma memoria, y cada capa añade dos all-reduces"),
        lower="aquí TP=2 es más rápido que un solo proceso",
        inconclusive="el intervalo contiene el 1: en esta máquina no se distinguen")
    h, b_lo, b_hi = f.h100, min(p["dc_batches"]), max(p["dc_batches"])
    one = f.h100_row("nvlink", 1, b_lo)
    out["h100_fit"] = claims.threshold(
        one["memory_per_gpu_bytes"] / (0.9 * h["memory_bytes"]), 1.0, scale=100, unit="%",
        decimals=0, what=(f"Pesos y caché KV de {h['model']} (lote {b_lo}) en una sola "
                          f"{h['device']}, respecto del 90 % de su memoria"),
        passed="cabe en una GPU", failed="no cabe en una GPU: hay que repartirlo")
    scale = {(r["link"], r["batch_size"], r["tp"]): r for r in h["scaling"]}
    top = max(p["dc_tps"])
    for link in ("nvlink", "pcie"):
        r = scale.get((link, b_lo, top))
        if r is None:
            continue
        out[f"h100_latency_{link}"] = claims.threshold(
            r["speedup"], 1.0, below=False, scale=1, unit="veces", decimals=2,
            what=(f"Paso de decodificación (lote {b_lo}) con TP={r['min_tp']} / con TP={top}, "
                  f"{'NVLink' if link == 'nvlink' else 'PCIe'} (eficiencia por GPU "
                  f"{es(100 * r['per_gpu_efficiency'], 0)} %)"),
            passed=f"TP={top} acorta el paso: paga en latencia",
            failed=f"TP={top} no acorta el paso")
    lo, hi = f.h100_row("pcie", top, b_lo), f.h100_row("pcie", top, b_hi)
    out["h100_pcie_batch"] = claims.threshold(
        hi["comm_fraction"] / lo["comm_fraction"], 1.0, below=False, scale=1, unit="veces",
        decimals=2, what=(f"Con TP={top} en PCIe, parte del paso que es comunicación con lote "
                          f"{b_hi} ({es(100 * hi['comm_fraction'], 0)} %) / con lote {b_lo} "
                          f"({es(100 * lo['comm_fraction'], 0)} %)"),
        passed="la comunicación pesa más con lote grande: crece con los tokens del paso",
        failed="la comunicación pesa más con lote pequeño: la domina la latencia fija")
    for n in p["route_replicas"]:
        pa, rr = f.route(n, "prefix-affinity"), f.route(n, "round-robin")
        out[f"route_{n}"] = claims.threshold(
            pa["reusable_hit_fraction"] / rr["reusable_hit_fraction"], 1.0, below=False, scale=1,
            unit="veces", decimals=2,
            what=(f"{n} réplicas simuladas: parte de lo reutilizable que la caché encontró con "
                  f"afinidad de prefijo ({es(100 * pa['reusable_hit_fraction'], 0)} %) / con "
                  f"round-robin ({es(100 * rr['reusable_hit_fraction'], 0)} %)"),
            passed="la afinidad de prefijo encuentra más en caché",
            failed="la afinidad de prefijo no encuentra más en caché")
    for row in f.routing["round_robin"]:
        n, m = row["num_replicas"], row["second_turns"]
        se = math.sqrt(row["predicted_miss"] * (1 - row["predicted_miss"]) / m)
        out[f"rr_miss_{n}"] = claims.threshold(
            abs(row["miss"] - row["predicted_miss"]), 3 * se, scale=100, unit="puntos",
            decimals=1,
            what=(f"Round-robin sobre {n} réplicas: segundos turnos que no encuentran su primer "
                  f"turno en caché ({es(100 * row['miss'], 1)} % de {m}) frente a (N − 1)/N = "
                  f"{es(100 * row['predicted_miss'], 1)} %, diferencia frente a tres errores "
                  f"típicos de una binomial"),
            passed="round-robin falla (N − 1)/N de las veces",
            failed="la fracción de fallos no es (N − 1)/N")
    return out


def fit_sentence(f: Findings) -> str:
    return (f"En esta máquina, el all-reduce de gloo entre dos procesos se ajusta a "
            f"{link_text(f.allreduce)}; el rango 0 pasó el {es(100 * f.allreduce_share, 0)} % "
            "del tiempo de TP=2 dentro de all_reduce (su suma y la espera al otro rango).")


def _results(f: Findings) -> dict:
    a = {k: v for k, v in f.allreduce.items() if k != "link"}
    return {"split": f.split, "tp_exact": f.tp["exact"], "tp_timing": f.tp["timing"],
            "allreduce": a, "h100": f.h100, "routing": f.routing}


def _evidence(f: Findings) -> list[dict]:
    fd = f.found
    items = [fd["split_column"].evidence("ppm", source="computed", volatile=False),
             fd["split_row"].evidence("ppm", source="computed", volatile=False),
             fd["bytes"].evidence("bytes", source="measured", volatile=True),
             fd["tokens"].evidence("peticiones", source="measured", volatile=True),
             fd["tp_ratio"].evidence("veces"),
             _ev(fit_sentence(f), f.allreduce["latency_s"], "s", source="measured", volatile=True),
             fd["h100_fit"].evidence("%", source="computed", volatile=False)]
    items += [fd[k].evidence("veces", source="computed", volatile=False)
              for k in fd if k.startswith(("h100_latency_", "h100_pcie", "route_"))]
    items += [fd[k].evidence("puntos", source="computed", volatile=False)
              for k in fd if k.startswith("rr_miss_")]
    return items


def _limitations(f: Findings) -> list[str]:
    p = f.params
    return [
        ("TP=2 corre aquí en dos procesos de la misma CPU, con gloo por la interfaz local: "
         "comparten núcleos y ancho de banda de memoria, así que su tiempo no predice el de dos "
         "GPU unidas por NVLink; lo que sí se traslada es la exactitud y los bytes reducidos."),
        datasheet_sim_limitation(),
        (f"La latencia de cada all-reduce en las predicciones es un SUPUESTO del modelo "
         f"({es(1e6 * ASSUMED_LATENCY_S['nvlink'], 0)} µs en NVLink, "
         f"{es(1e6 * ASSUMED_LATENCY_S['pcie'], 0)} µs en PCIe), no una cifra de hoja de datos; "
         "los anchos de banda sí lo son. El modelo no solapa comunicación y cómputo."),
        ("El enrutado se simula con el planificador y la caché de prefijos reales del motor y el "
         "roofline de la hoja de datos; los enrutadores reales por HTTP están en el benchmark "
         "(benchmarks/router.py)."),
        threads_limitation(p["torch_threads"]),
    ]


def report(f: Findings) -> dict:
    return {"environment": {"model": f.model_name}, "results": _results(f),
            "evidence": _evidence(f), "limitations": _limitations(f),
            "volatile_fields": ["results.tp_timing", "results.allreduce"]}


def check_params(params: dict, config) -> None:
    n = params["split_ranks"]
    if (config.num_heads * config.head_dim) % n or config.intermediate_size % n:
        raise LabParamError(f"split_ranks={n} no divide las salidas de q_proj "
                            f"({config.num_heads * config.head_dim}) ni las entradas de down_proj "
                            f"({config.intermediate_size}) de {config.name}")
    if params["tp_prompt_len"] + params["tp_max_tokens"] > config.max_position_embeddings:
        raise LabParamError(f"tp_prompt_len + tp_max_tokens supera las "
                            f"{config.max_position_embeddings} posiciones de {config.name}")
    try:
        check_shardable(config, 2)
    except ValueError as err:
        raise LabParamError(f"el modelo {config.name} no se puede servir con TP=2: {err}") from None


def run(seed: int, profile: str, params: dict, device: torch.device) -> dict:
    # tensor parallelism here runs on the CPU (gloo): a GPU run would need two GPUs
    model = load_model(params["model"], seed, "cpu")
    check_params(params, model.config)
    split = split_study(model, params, seed)
    tp = tp_study(model, params, seed)
    allreduce = allreduce_study(params)
    h100 = h100_study(params)
    routing = routing_comparison(params, seed)
    return report(Findings(params, model.config.name, split, tp, allreduce, h100, routing))


SPEC = LabSpec(
    kind="distributed",
    title="Más allá de una GPU",
    chapter=13,
    folder="labs/13-distributed",
    ci_budget_s=45,
    run=run,
    params={
        "model": Param("tiny-es", str, "modelo servido con TP=1 y TP=2", choices=SERVED_MODELS),
        "torch_threads": Param(1, int, "hilos de torch de cada proceso (0: los de torch)", min=0,
                               max=256),
        "split_ranks": Param(4, int, "rangos del reparto de una capa", min=1, max=64),
        "tp_batch": Param(4, int, "peticiones del lote con TP=1 y TP=2", min=1, max=256),
        "tp_prompt_len": Param(16, int, "tokens de cada prompt", min=1, max=4096),
        "tp_max_tokens": Param(32, int, "tokens generados por petición", min=2, max=4096,
                               by_profile={"ci": 12}),
        "tp_pairs": Param(7, int, "pares intercalados TP=1 / TP=2", min=5, max=100,
                          by_profile={"ci": 5}),
        "ar_sizes": Param([1024, 16384, 262144, 1048576], int, "tamaños de mensaje del "
                          "all-reduce (bytes)", min=4, max=2**30, is_list=True),
        "ar_repeats": Param(9, int, "all-reduces cronometrados por tamaño", min=1, max=1000,
                            by_profile={"ci": 5}),
        "dc_model": Param("llama-3.1-70b", str, "modelo simulado",
                          choices=("llama-3.1-70b", "llama-3.1-8b")),
        "dc_device": Param("h100-sxm", str, "GPU simulada", choices=("h100-sxm", "h200",
                                                                     "a100-80gb")),
        "dc_tps": Param([1, 2, 4, 8], int, "grados de TP simulados", min=1, max=64, is_list=True),
        "dc_batches": Param([1, 16, 128], int, "tamaños de lote simulados", min=1, max=4096,
                            is_list=True),
        "dc_context": Param(2048, int, "tokens de contexto de cada secuencia simulada", min=1,
                            max=131_072),
        "route_replicas": Param([2, 8], int, "réplicas del enrutado simulado", min=1, max=64,
                                is_list=True),
        "route_sessions": Param(40, int, "conversaciones por réplica en el enrutado", min=1,
                                max=10_000, by_profile={"ci": 5}),
        "rr_sessions": Param(24, int, "conversaciones de dos turnos por réplica (fallos de "
                             "round-robin)", min=1, max=10_000),
        "challenge_batch": Param(64, int, "reto: secuencias por réplica", min=1, max=4096),
        "challenge_context": Param(2048, int, "reto: tokens de contexto", min=1, max=131_072),
    },
)
