"""Self-checks of the distributed lab (chapter 13).

Failure messages carry the second tier of each exercise's hint ("Pista: ..."): which quantity is
off and why, in words, never the code line. Numbers are written with a decimal comma."""

from __future__ import annotations

import math
import random
from typing import Callable

import torch

from ..fmt import es, es_value
from ..model import ModelConfig, get_preset
from ..reference.distributed import (reference_affinity_choice, reference_allreduce_bytes,
                                     reference_shard_linear)
from . import CheckResult, call_student, check_student_extension, failed, passed, self_check  # noqa: F401

CHALLENGE_KEYS = ("batch_size", "context_len", "tp8_tokens_per_s_nvlink",
                  "tp4x2_tokens_per_s_nvlink", "tp8_tokens_per_s_pcie", "tp4x2_tokens_per_s_pcie")


# --- exercise 1: a linear layer split column- and row-wise ---------------------------------------

def shard_cases(seed: int = 0) -> list[tuple[str, torch.Tensor, int, int, str]]:
    """(label, weight [out, in], rank, n, mode)."""
    g = torch.Generator().manual_seed(seed)
    cases = []
    for out_f, in_f, n in ((8, 4, 2), (6, 12, 3), (16, 16, 4), (4, 8, 1)):
        w = torch.randn(out_f, in_f, generator=g)
        for mode in ("column", "row"):
            for rank in sorted({0, n - 1}):
                cases.append((f"{out_f}x{in_f} en {n} rangos, {mode}, rango {rank}", w, rank, n, mode))
    rng = random.Random(seed)
    for i in range(6):
        n = rng.choice([2, 4, 8])
        out_f, in_f = n * rng.randint(1, 6), n * rng.randint(1, 6)
        w = torch.randn(out_f, in_f, generator=g)
        cases.append((f"aleatorio {i + 1} ({out_f}x{in_f}, {n} rangos)", w, rng.randrange(n), n,
                      rng.choice(["column", "row"])))
    return cases


@self_check
def check_shard_linear(fn: Callable, seed: int = 0, raise_on_fail: bool = True) -> CheckResult:
    """``fn(weight, rank, n, mode) -> shard`` as ``reference_shard_linear`` (bit for bit), and the
    shards of every rank rebuild the layer: the column shards' outputs concatenated, the row
    shards' partial products summed (what the all-reduce does)."""
    name = "reparto de una capa lineal"
    cases = shard_cases(seed)
    for i, (label, w, rank, n, mode) in enumerate(cases):
        want = reference_shard_linear(w, rank, n, mode)
        shown = f"{label} (weight de forma {tuple(w.shape)}: [salidas, entradas])"
        got, crash = call_student(name, fn, w.clone(), rank, n, mode)
        if crash:
            return failed(name, i, shown, crash)
        if not isinstance(got, torch.Tensor):
            return failed(name, i, shown, f"se esperaba un tensor y se obtuvo {es_value(got)}.")
        if got.shape == want.shape and torch.equal(got, want):
            continue
        problem = (f"se esperaba un trozo de forma {tuple(want.shape)} y su función devolvió uno "
                   f"de forma {tuple(got.shape)}" + ("." if got.shape != want.shape else
                                                     " con otros valores."))
        other = reference_shard_linear(w, rank, n, "row" if mode == "column" else "column")
        if got.shape == other.shape and torch.equal(got, other):
            hint = ("en column se reparten las SALIDAS: cada rango guarda filas de weight "
                    "(nn.Linear guarda [salidas, entradas]); en row se reparten las ENTRADAS: "
                    "columnas de weight.")
        elif got.shape == want.shape and any(
                torch.equal(got, reference_shard_linear(w, r, n, mode)) for r in range(n)):
            hint = ("es el trozo de otro rango: el rango r se queda con el r-ésimo bloque "
                    "contiguo, empezando en r × (tamaño / n).")
        else:
            hint = ("cada rango guarda un bloque contiguo de tamaño / n de la dimensión que se "
                    "reparte (filas en column, columnas en row), en orden de rango.")
        return failed(name, i, shown, problem, hint)
    # the shards rebuild the layer (float tolerance for the sum: its order is not x @ W.T's)
    g = torch.Generator().manual_seed(seed + 1)
    w, x = torch.randn(12, 8, generator=g), torch.randn(3, 8, generator=g)
    full = x @ w.T
    cols, _ = call_student(name, lambda: torch.cat([x @ fn(w, r, 4, "column").T for r in range(4)], -1))
    rows, _ = call_student(name, lambda: sum(x[:, r * 2:(r + 1) * 2] @ fn(w, r, 4, "row").T
                                             for r in range(4)))
    for j, (what, y) in enumerate((("column: salidas concatenadas", cols),
                                   ("row: sumas parciales sumadas", rows))):
        if not isinstance(y, torch.Tensor) or not torch.allclose(y, full, rtol=1e-5, atol=1e-5):
            return failed(name, len(cases) + j, f"reconstrucción, {what}",
                          "los trozos de los 4 rangos no reconstruyen x @ weight.T.")
    return passed(name, len(cases) + 2, "Los trozos de todos los rangos reconstruyen la capa.")


# --- exercise 2: bytes all-reduced per step ------------------------------------------------------

def bytes_cases(seed: int = 0) -> list[tuple[str, ModelConfig, int, float]]:
    """(label, config, num_tokens, dtype_bytes)."""
    cases = [
        ("Llama 3.1 70B, un paso de decodificación de 32 secuencias, bf16",
         get_preset("llama-3.1-70b"), 32, 2.0),
        ("Llama 3.1 8B, un token, fp32", get_preset("llama-3.1-8b"), 1, 4.0),
        ("tiny-es, 7 tokens, fp32", get_preset("tiny-es"), 7, 4.0),
        ("un paso sin tokens", get_preset("llama-3.1-8b"), 0, 2.0),
        ("intermediate_size muy distinto de hidden_size",
         ModelConfig(num_layers=3, hidden_size=64, num_heads=4, num_kv_heads=2,
                     intermediate_size=1000, vocab_size=50), 5, 1.0),
        ("cabezas de tamaño distinto de hidden / heads",
         ModelConfig(num_layers=2, hidden_size=96, num_heads=4, num_kv_heads=4, head_dim=40,
                     intermediate_size=128, vocab_size=50), 3, 2.0),
    ]
    rng = random.Random(seed)
    for i in range(6):
        heads = rng.choice([2, 4, 8])
        cfg = ModelConfig(num_layers=rng.randint(1, 40), hidden_size=heads * rng.choice([16, 32, 64]),
                          num_heads=heads, num_kv_heads=rng.choice([1, heads]),
                          intermediate_size=rng.choice([128, 256, 344]), vocab_size=100)
        cases.append((f"aleatorio {i + 1}", cfg, rng.randint(1, 512), rng.choice([1.0, 2.0, 4.0])))
    return cases


@self_check
def check_allreduce_bytes(fn: Callable, seed: int = 0, raise_on_fail: bool = True) -> CheckResult:
    """``fn(config, num_tokens, dtype_bytes) -> bytes`` as ``reference_allreduce_bytes``."""
    name = "bytes de all-reduce por paso"
    for i, (label, cfg, tokens, b) in enumerate(bytes_cases(seed)):
        want = reference_allreduce_bytes(cfg, tokens, b)
        shown = (f"{label}: {cfg.num_layers} capas, hidden_size {cfg.hidden_size}, "
                 f"intermediate_size {cfg.intermediate_size}, {tokens} tokens, {es(b, 0)} bytes "
                 "por valor")
        got, crash = call_student(name, fn, cfg, tokens, b)
        if crash:
            return failed(name, i, shown, crash)
        try:
            ok = math.isclose(float(got), want, rel_tol=1e-12, abs_tol=0)
        except (TypeError, ValueError):
            ok = False
        if ok:
            continue
        problem = f"se esperaban {es(want, 0)} bytes y su función devolvió {es_value(got)}."
        per = cfg.num_layers * cfg.hidden_size * tokens * b
        try:
            value = float(got)
        except (TypeError, ValueError):
            value = None
        if value is not None and math.isclose(value, per, rel_tol=1e-9):
            hint = ("cada capa hace DOS all-reduces: uno tras la proyección de salida de la "
                    "atención (fila) y otro tras la proyección down del MLP (fila).")
        elif value is not None and math.isclose(value, per * 2 / cfg.num_layers, rel_tol=1e-9):
            hint = "los all-reduces se repiten en cada capa: multiplique por el número de capas."
        elif value is not None and cfg.intermediate_size != cfg.hidden_size and math.isclose(
                value, 2 * cfg.num_layers * cfg.intermediate_size * tokens * b, rel_tol=1e-9):
            hint = ("lo que se reduce es la salida de las capas fila: hidden_size valores por "
                    "token, no la anchura intermedia del MLP (esa se queda repartida).")
        else:
            hint = ("cada all-reduce suma la salida de una capa fila: tokens × hidden_size "
                    "valores de dtype_bytes bytes; hay dos por capa.")
        return failed(name, i, shown, problem, hint)
    return passed(name, len(bytes_cases(seed)))


# --- exercise 3: the prefix-affinity rule ----------------------------------------------------------

def affinity_cases(seed: int = 0) -> list[tuple[str, list, dict, list, list, int]]:
    """(label, prefix, owners, loads, candidates, max_imbalance)."""
    a, b, c, d = b"A", b"AB", b"ABC", b"ABCD"
    cases = [
        ("nadie sirvió el prefijo: la menos cargada", [a, b], {}, [3, 1, 2], [0, 1, 2], 4),
        ("la réplica que sirvió el prefijo más largo", [a, b, c], {a: 0, b: 2, c: 1}, [0, 0, 0],
         [0, 1, 2], 4),
        ("el dueño del bloque más largo ya no es candidato", [a, b, c], {a: 0, b: 2, c: 1},
         [0, 0, 0], [0, 2], 4),
        ("el dueño está demasiado cargado", [a, b], {b: 1}, [0, 6, 2], [0, 1, 2], 4),
        ("el dueño justo en el límite de desequilibrio", [a, b], {b: 1}, [2, 6, 3], [0, 1, 2], 4),
        ("empate de carga: el índice más bajo", [d], {}, [2, 1, 1], [0, 1, 2], 4),
        ("empate de carga entre candidatos", [d], {}, [0, 1, 1], [1, 2], 4),
        ("un solo bloque conocido, el primero", [a, b, c, d], {a: 2}, [1, 1, 1], [0, 1, 2], 0),
        ("sin bloques completos (prompt corto)", [], {a: 0}, [5, 0], [0, 1], 4),
        ("desequilibrio 0: cualquier carga de más manda a la menos cargada", [a], {a: 0}, [1, 0],
         [0, 1], 0),
    ]
    rng = random.Random(seed)
    for i in range(10):
        n = rng.randint(2, 8)
        prefix = [bytes([65 + j]) * (j + 1) for j in range(rng.randint(0, 6))]
        owners = {h: rng.randrange(n) for h in prefix if rng.random() < 0.6}
        loads = [rng.randint(0, 8) for _ in range(n)]
        candidates = sorted(rng.sample(range(n), rng.randint(1, n)))
        cases.append((f"aleatorio {i + 1} ({n} réplicas)", prefix, owners, loads, candidates,
                      rng.choice([0, 2, 4])))
    return cases


@self_check
def check_affinity_choice(fn: Callable, seed: int = 0, raise_on_fail: bool = True) -> CheckResult:
    """``fn(prefix, owners, loads, candidates, max_imbalance) -> index`` as
    ``reference_affinity_choice``."""
    name = "regla de afinidad de prefijo"
    cases = affinity_cases(seed)
    for i, (label, prefix, owners, loads, candidates, k) in enumerate(cases):
        want = reference_affinity_choice(prefix, owners, loads, candidates, k)
        shown = (f"{label}: bloques {es_value([h.decode() for h in prefix])}, dueños "
                 f"{es_value({h.decode(): r for h, r in owners.items()})}, cargas "
                 f"{es_value(loads)}, candidatas {es_value(candidates)}, desequilibrio máximo {k}")
        got, crash = call_student(name, fn, list(prefix), dict(owners), list(loads),
                                  list(candidates), k)
        if crash:
            return failed(name, i, shown, crash)
        if got == want and not isinstance(got, bool):
            continue
        problem = f"se esperaba la réplica {want} y su función devolvió {es_value(got)}."
        owner = next((owners[h] for h in reversed(prefix)
                      if h in owners and owners[h] in candidates), None)
        first = next((owners[h] for h in prefix if h in owners and owners[h] in candidates), None)
        lightest = min(candidates, key=lambda r: (loads[r], r))
        if got not in candidates:
            hint = ("solo puede elegirse una réplica candidata (sana y no probada ya para esta "
                    "petición).")
        elif owner is not None and want == owner and got == lightest:
            hint = ("si una candidata sirvió el prefijo, la petición va a ella (su caché lo "
                    "guarda), salvo que el guardián de carga lo impida.")
        elif owner is not None and got == first and first != owner:
            hint = ("cuenta el prefijo común MÁS LARGO: recorra los bloques desde el último; el "
                    "primero lo comparten casi todos los prompts.")
        elif owner is not None and got == owner:
            hint = ("el guardián de carga: si el dueño tiene más de max_imbalance peticiones en "
                    "curso por encima de la candidata menos cargada, gana la menos cargada.")
        elif owner is not None:
            hint = ("si una candidata sirvió el prefijo, la petición va a ella (su caché lo "
                    "guarda), salvo que el guardián de carga lo impida.")
        else:
            hint = ("sin dueño, la candidata con menos peticiones en curso; en un empate, la de "
                    "índice más bajo.")
        return failed(name, i, shown, problem, hint)
    return passed(name, len(cases))


# --- the challenge ---------------------------------------------------------------------------------

def challenge_answer(params: dict) -> dict:
    """The challenge's measurement from the cost model: Llama-3.1-70B on 8 simulated H100s at
    ``challenge_batch`` sequences per replica and ``challenge_context`` tokens, as one TP=8
    replica or two TP=4 replicas, on NVLink and on PCIe (fleet decode tokens/s)."""
    from ..hardware import get_device_spec
    from ..sim.interconnect import tp_decode_step
    cfg, spec = get_preset(params["dc_model"]), get_device_spec(params["dc_device"])
    b, ctx = params["challenge_batch"], params["challenge_context"]
    out = {"batch_size": b, "context_len": ctx}
    for link in ("nvlink", "pcie"):
        out[f"tp8_tokens_per_s_{link}"] = tp_decode_step(cfg, spec, 8, b, ctx, link).tokens_per_s
        out[f"tp4x2_tokens_per_s_{link}"] = 2 * tp_decode_step(cfg, spec, 4, b, ctx, link).tokens_per_s
    return out


@self_check
def check_challenge(ext: dict, params: dict, seed: int = 0, raise_on_fail: bool = True) -> CheckResult:
    """The challenge's ``student_extension``: fleet decode tokens/s of 8 GPUs as one TP=8
    replica and as two TP=4 replicas, per link, from the lab's cost model and parameters."""
    name = "reto: ¿una réplica TP=8 o dos TP=4?"
    m = ext.get("measurement") if isinstance(ext, dict) else None
    if not isinstance(m, dict) or any(k not in m for k in CHALLENGE_KEYS):
        missing = [k for k in CHALLENGE_KEYS if not isinstance(m, dict) or k not in m]
        return failed(name, 0, "measurement", f"faltan las claves {', '.join(missing)}.")
    want = challenge_answer(params)
    for j, key in enumerate(CHALLENGE_KEYS):
        try:
            ok = math.isclose(float(m[key]), float(want[key]), rel_tol=1e-9)
        except (TypeError, ValueError):
            ok = False
        if not ok:
            hint = ("Use el modelo de costes del laboratorio (tp_decode_step) con los parámetros "
                    "del reto; la flota de dos réplicas TP=4 produce el doble de tokens/s que "
                    "una de ellas.") if key.startswith("tp") else \
                "Copie el tamaño de lote y el contexto de los parámetros del reto."
            return failed(name, 1 + j, key, f"se esperaba {es_value(want[key])} y measurement "
                          f"dice {es_value(m[key])}.", hint)
    return passed(name, len(CHALLENGE_KEYS) + 1)
