"""Self-checks of the FlashAttention lab (chapter 8).

Each check runs seeded cases against the library's reference (``model.flash``,
``sim.attention_io``), stops at the first case that fails and names it with what was expected
and what came back; the "Pista: ..." that follows says which quantity is off and why, in words,
never the code line (the first tier of each hint is the notebook's NotImplementedError).
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from ..fmt import es, es_bytes, es_sig, es_value
from ..model.flash import (init_state, online_softmax_update as reference_update,
                           peak_memory_bytes, quiet_native_stderr, random_qkv)
from ..reference.flash_attention import exact_attention, reference_tiled_bytes
from ..sim.attention_io import best_tiles, flash_io, naive_io, working_set_bytes
from . import CheckResult, call_student, check_student_extension, failed, passed, self_check  # noqa: F401
from ._attention import attention_step_result


def _close(got: torch.Tensor, expected: torch.Tensor, rtol: float = 1e-5, atol: float = 1e-6) -> bool:
    return got.shape == expected.shape and bool(torch.allclose(got.double(), expected.double(),
                                                               rtol=rtol, atol=atol))


def _worst(got: torch.Tensor, expected: torch.Tensor) -> str:
    diff = (got.double() - expected.double()).abs()
    diff = torch.where(torch.isnan(diff), torch.full_like(diff, math.inf), diff)
    return es_sig(float(diff.max()), 3)


# --- (1) the online-softmax update ---------------------------------------------------------------

def _fold(scores: torch.Tensor, v: torch.Tensor, tiles: list[int]):
    """The reference state after folding the first tiles of ``scores`` ([..., R, C]) and ``v``."""
    rows = scores.shape[:-1]
    state = init_state(rows, v.shape[-1], dtype=scores.dtype)
    j = 0
    for width in tiles:
        state = reference_update(*state, scores[..., j:j + width], v[..., j:j + width, :])
        j += width
    return state


def update_cases(seed: int = 0) -> list[tuple[str, tuple, torch.Tensor, torch.Tensor]]:
    """``(label, (m, l, o), scores, v)``: the state so far, then the tile to fold in."""
    g = torch.Generator().manual_seed(seed)

    def randn(*shape, scale=1.0):
        return scale * torch.randn(*shape, generator=g)

    cases = []
    s, v = randn(3, 5, scale=2.0), randn(5, 4)
    cases.append(("primer bloque: estado vacío (m = -inf, l = 0, o = 0), 3 filas × 5 claves",
                  init_state((3,), 4), s, v))
    s, v = randn(4, 12), randn(12, 3)
    s[:, 6:] += 5.0                                            # the second tile raises the max
    cases.append(("segundo bloque con un máximo mayor que el del primero: hay que reescalar",
                  _fold(s[:, :6], v[:6], [6]), s[:, 6:], v[6:]))
    s, v = randn(4, 10), randn(10, 3)
    s[:, :5] += 4.0                                            # the second tile stays below
    cases.append(("segundo bloque con un máximo menor que el del primero",
                  _fold(s[:, :5], v[:5], [5]), s[:, 5:], v[5:]))
    s, v = randn(2, 3, 4, 9), randn(2, 3, 9, 8)
    cases.append(("dimensiones delante (lote 2 × 3 cabezas × 4 filas), tercer bloque de 1 clave",
                  _fold(s[..., :8], v[..., :8, :], [5, 3]), s[..., 8:], v[..., 8:, :]))
    s, v = randn(3, 8, scale=1e4), randn(8, 4)
    s[:, 4:] += 1e3                                            # ~1e3 above the first max
    cases.append(("puntuaciones extremas (±10 000) y un segundo bloque 1000 por encima",
                  _fold(s[:, :4], v[:4], [4]), s[:, 4:], v[4:]))
    s, v = randn(3, 4), randn(4, 2)
    s[1] = -math.inf                                           # row 1 sees no key in this tile
    cases.append(("primer bloque con la fila 2 enteramente enmascarada (todas sus puntuaciones -inf)",
                  init_state((3,), 2), s, v))
    s, v = randn(3, 9), randn(9, 2)
    s[0, 5:] = -math.inf                                       # row 0 sees none of tile 2
    cases.append(("segundo bloque con la fila 1 enteramente enmascarada",
                  _fold(s[:, :5], v[:5], [5]), s[:, 5:], v[5:]))
    return cases


def _update_variants(m, l, o, scores, v) -> dict[str, tuple]:
    """What plausible mistakes return for one case (to name the mistake in the hint)."""
    s_max = scores.amax(-1)
    m_new = torch.maximum(m, s_max)
    safe = torch.where(torch.isneginf(m_new), torch.zeros_like(m_new), m_new)
    p = torch.exp(scores - safe[..., None])
    out = {"no_rescale": (m_new, l + p.sum(-1), o + p @ v)}
    first = torch.where(torch.isneginf(m), s_max, m)            # keeps the first tile's max
    safe_f = torch.where(torch.isneginf(first), torch.zeros_like(first), first)
    pf = torch.exp(scores - safe_f[..., None])
    alpha_f = torch.exp(m - safe_f)
    out["max_not_updated"] = (first, alpha_f * l + pf.sum(-1), alpha_f[..., None] * o + pf @ v)
    alpha = torch.exp(m - safe)
    l_new = alpha * l + p.sum(-1)
    out["normalised"] = (m_new, l_new, (alpha[..., None] * o + p @ v) / l_new[..., None])
    out["tile_max_only"] = (s_max, l_new, alpha[..., None] * o + p @ v)
    return out


UPDATE_HINTS = {
    "no_rescale": ("Cuando un bloque trae un máximo mayor, lo acumulado hasta entonces (la suma l y "
                   "la salida o) se calculó con el máximo viejo: multiplíquelo por la exponencial de "
                   "la diferencia entre el máximo viejo y el nuevo antes de sumar el bloque."),
    "max_not_updated": ("El máximo m del estado debe ser el mayor de todas las puntuaciones vistas "
                        "hasta ahora, el viejo o el del bloque nuevo: si se queda con el primero, "
                        "la exponencial de las puntuaciones mayores puede desbordar."),
    "normalised": ("La salida o del estado va sin normalizar: es la suma de los valores pesados "
                   "por la exponencial de cada puntuación menos m; la división por l se hace una "
                   "sola vez, al final (finish_state)."),
    "tile_max_only": ("El máximo nuevo es el mayor entre el máximo que ya tenía el estado y el "
                      "del bloque, no solo el del bloque."),
}


def _as_state(got) -> tuple[torch.Tensor, ...] | None:
    if isinstance(got, (tuple, list)) and len(got) == 3 and all(torch.is_tensor(t) for t in got):
        return tuple(got)
    return None


@self_check
def check_online_softmax_update(fn: Callable, seed: int = 0, raise_on_fail: bool = True) -> CheckResult:
    """``fn(m, l, o, scores, v) -> (m, l, o)``: one tile folded into the running softmax state,
    as ``model.flash.online_softmax_update`` (``o`` unnormalised)."""
    name = "actualización en línea del softmax"
    cases = update_cases(seed)
    for i, (label, (m, l, o), scores, v) in enumerate(cases):
        expected = reference_update(m, l, o, scores, v)
        got, crash = call_student(name, fn, m.clone(), l.clone(), o.clone(), scores.clone(), v.clone())
        if crash:
            return failed(name, i, label, crash)
        state = _as_state(got)
        if state is None:
            return failed(name, i, label, f"se esperaba una tupla (m, l, o) de tres tensores "
                          f"y se obtuvo {es_value(got) if not torch.is_tensor(got) else 'un solo tensor'}.")
        for key, g_, e in zip("mlo", state, expected):
            if g_.shape != e.shape:
                return failed(name, i, label, f"{key} tiene forma {tuple(g_.shape)}; se "
                              f"esperaba {tuple(e.shape)}.")
        if any(bool(torch.isnan(g_).any()) for g_ in state):
            hint = ("Una fila que todavía no ha visto ninguna clave visible tiene m = -inf, y "
                    "-inf menos -inf no es un número: en esas filas reste 0 en lugar del máximo "
                    "antes de tomar las exponenciales, y el estado queda como estaba."
                    if "enmascarada" in label else
                    "Reste siempre el máximo antes de tomar la exponencial: así ninguna "
                    "exponencial pasa de 1 y nada desborda.")
            return failed(name, i, label, "el estado devuelto contiene NaN.", hint)
        if any(bool(torch.isinf(g_).any()) for g_ in state[1:]):
            return failed(name, i, label, "l u o contienen valores infinitos: una "
                          "exponencial desbordó.", UPDATE_HINTS["max_not_updated"])
        wrong = [key for key, g_, e in zip("mlo", state, expected) if not _close(g_, e)]
        if wrong:
            key = wrong[0]
            idx = "mlo".index(key)
            problem = (f"{key} difiere del esperado (diferencia máxima "
                       f"{_worst(state[idx], expected[idx])}).")
            hint = ("Repase las tres fórmulas: el máximo nuevo, la suma reescalada y la salida "
                    "reescalada, las dos con la exponencial de cada puntuación menos el máximo nuevo.")
            for mistake, variant in _update_variants(m, l, o, scores, v).items():
                if all(_close(g_, e) for g_, e in zip(state, variant)):
                    hint = UPDATE_HINTS[mistake]
                    break
            return failed(name, i, label, problem, hint)
    return passed(name, len(cases))


# --- (2) the tiled loop with the causal mask -----------------------------------------------------

def tiled_cases(seed: int = 0) -> list[dict]:
    """Seeded cases: (shape, causal, positions, tiles) and a label naming what each tests."""
    specs = [
        (1, 2, 2, 32, 32, 8, False, None, 8, 8, "sin máscara causal, bloques que dividen N"),
        (1, 2, 2, 32, 32, 8, True, None, 8, 8, "causal, bloques que dividen N: el bloque diagonal"),
        (2, 2, 1, 37, 37, 8, True, None, 8, 5, "causal, N = 37 con bloques de 8 consultas y 5 "
                                                "claves, que no dividen N"),
        (1, 2, 2, 5, 29, 8, True, None, 4, 6, "causal con 24 claves ya en caché: 5 consultas "
                                              "en las posiciones 24 a 28"),
        (2, 4, 2, 20, 20, 8, True, None, 6, 7, "causal con 4 cabezas de consulta sobre 2 "
                                               "cabezas KV (GQA)"),
        (2, 2, 2, 3, 18, 4, True, [[4, 9, 15], [0, 1, 2]], 2, 4,
         "causal con posiciones distintas por fila (q_positions)"),
        (1, 1, 1, 7, 7, 4, True, None, 64, 64, "bloques más grandes que N"),
        (1, 2, 1, 16, 16, 8, False, None, 16, 3, "sin máscara, bloques de 3 claves"),
    ]
    g = torch.Generator().manual_seed(seed)
    out = []
    for b, h, hkv, t, s, d, causal, pos, bq, bk, label in specs:
        q = torch.randn(b, h, t, d, generator=g)
        k, v = torch.randn(b, hkv, s, d, generator=g), torch.randn(b, hkv, s, d, generator=g)
        out.append({"q": q, "k": k, "v": v, "causal": causal,
                    "q_positions": None if pos is None else torch.tensor(pos), "block_q": bq,
                    "block_k": bk, "label": label, "atol": 1e-4})
    q, k, v = random_qkv(1, 2, 1, 48, 48, 16, seed=seed + 1, dtype=torch.float16,
                         scores_around=1e4)
    scaled = float((q.double() @ k.double().transpose(-1, -2)).abs().max()) / 4.0
    eps = float(torch.finfo(torch.float32).eps)
    out.append({"q": q, "k": k, "v": v, "causal": True, "q_positions": None, "block_q": 16,
                "block_k": 12, "label": "fp16 con puntuaciones de ±10 000: la versión ingenua "
                "desborda", "atol": 1e-2 + 2 * eps * scaled * float(v.abs().max())})
    return out


TILED_HINTS = {
    "strict": ("La consulta de la posición p ve las claves de las posiciones 0 a p, ella misma "
               "incluida: en el bloque diagonal, la clave de su propia posición es visible."),
    "one_ahead": ("La consulta de la posición p no ve ninguna clave posterior a p: en el bloque "
                  "diagonal, la clave siguiente a la suya ya está enmascarada."),
    "top_left": ("Sin q_positions, las T consultas son las T últimas posiciones de las S claves "
                 "(S - T a S - 1): con claves ya en caché, la primera consulta no está en la "
                 "posición 0."),
    "no_mask": ("Con causal, cada consulta solo ve las claves hasta su posición: enmascare (con "
                "-inf) las posteriores dentro de cada bloque."),
    "gqa": ("Con GQA, la cabeza de consulta h usa la cabeza KV h // (H / Hkv): cabezas de "
            "consulta consecutivas comparten la misma cabeza KV."),
    "no_scale": "Las puntuaciones se escalan por la inversa de la raíz de la dimensión de cabeza.",
    "dropped_tile": ("Cuando el tamaño de bloque no divide N, el último bloque es más corto, pero "
                     "también cuenta: recorra las claves hasta la última."),
}


def _tiled_variants(case: dict) -> dict[str, torch.Tensor]:
    q, k, v, causal, pos = case["q"], case["k"], case["v"], case["causal"], case["q_positions"]
    out = {}
    if causal:
        out["strict"] = exact_attention(q, k, v, True, pos, offset=-1)
        out["one_ahead"] = exact_attention(q, k, v, True, pos, offset=1)
        out["no_mask"] = exact_attention(q, k, v, False)
        if pos is None and q.shape[2] < k.shape[2]:
            out["top_left"] = exact_attention(q, k, v, True, top_left=True)
    if q.shape[1] != k.shape[1]:
        out["gqa"] = exact_attention(q, k, v, causal, pos, gqa="repeat")
    out["no_scale"] = exact_attention(q, k, v, causal, pos, scale=1.0)
    S, bk = k.shape[2], case["block_k"]
    if S % bk and S > bk and not causal:
        kept = S - S % bk
        out["dropped_tile"] = exact_attention(q, k[:, :, :kept], v[:, :, :kept], False)
    return out


def _call_tiled(fn, case: dict):
    kwargs = {"causal": case["causal"], "block_q": case["block_q"], "block_k": case["block_k"]}
    if case["q_positions"] is not None:
        kwargs["q_positions"] = case["q_positions"]
    return call_student("", fn, case["q"].clone(), case["k"].clone(), case["v"].clone(), **kwargs)


@self_check
def check_tiled_attention(fn: Callable, seed: int = 0, memory_n: int = 1024,
                          raise_on_fail: bool = True) -> CheckResult:
    """``fn(q, k, v, causal=, q_positions=, block_q=, block_k=) -> out``: attention by tiles with
    the online softmax, equal to softmax attention (float64) in every case, finite in fp16 with
    extreme scores, and without an N x N matrix in memory (the last case)."""
    name = "atención por bloques"
    cases = tiled_cases(seed)
    for i, case in enumerate(cases):
        label = (f"{case['label']}; q {tuple(case['q'].shape)}, k {tuple(case['k'].shape)}, "
                 f"bloques de {case['block_q']} × {case['block_k']}")
        got, crash = _call_tiled(fn, case)
        if crash:
            return failed(name, i, label, crash)
        expected = exact_attention(case["q"], case["k"], case["v"], case["causal"],
                                   case["q_positions"])
        if not torch.is_tensor(got) or got.shape != expected.shape:
            shape = tuple(got.shape) if torch.is_tensor(got) else type(got).__name__
            return failed(name, i, label, f"se esperaba un tensor de forma "
                          f"{tuple(expected.shape)} y se obtuvo {shape}.")
        if got.dtype != case["q"].dtype:
            return failed(name, i, label, f"la salida es {got.dtype} y q es "
                          f"{case['q'].dtype}.", "Devuelva la salida en el dtype de q, "
                          "aunque calcule por dentro en float32.")
        if not bool(torch.isfinite(got).all()):
            hint = ("Calcule las puntuaciones, el máximo, la suma y la salida acumulada en "
                    "float32, como hace un núcleo de GPU en sus registros: en fp16, un producto "
                    "q · k de este tamaño no cabe." if case["q"].dtype == torch.float16 else
                    "Una fila sin claves visibles produce 0 / 0: compruebe la máscara del bloque "
                    "diagonal.")
            return failed(name, i, label, "la salida contiene valores no finitos.", hint)
        err = float((got.double() - expected).abs().max())
        if err > case["atol"]:
            hint = ("Compare su bucle con la definición: para cada bloque de consultas, recorra los "
                    "bloques de claves que puede ver, actualice el estado con cada uno y divida "
                    "por la suma al final.")
            for mistake, variant in _tiled_variants(case).items():
                if float((got.double() - variant).abs().max()) <= case["atol"]:
                    hint = TILED_HINTS[mistake]
                    break
            return failed(name, i, label, f"la salida difiere de la atención exacta "
                          f"(diferencia máxima {es_sig(err, 3)}, tolerancia "
                          f"{es_sig(case['atol'], 2)}).", hint)
    # The point of the tiles: no N x N matrix at once.
    q, k, v = random_qkv(1, 1, 1, memory_n, memory_n, 16, seed=seed + 2)
    label = (f"memoria: una cabeza, N = {memory_n}, bloques de 64 × 64; la matriz de "
             f"puntuaciones entera ocuparía {es_bytes(4 * memory_n ** 2)}")
    with quiet_native_stderr(), torch.inference_mode():
        (got, crash), peak = peak_memory_bytes(
            lambda: call_student(name, fn, q, k, v, causal=True, block_q=64, block_k=64))
    if crash:
        return failed(name, len(cases), label, crash)
    limit = memory_n ** 2 * 4 // 4
    if peak > limit:
        return failed(name, len(cases), label, f"su función llegó a tener "
                      f"{es_bytes(peak)} reservados a la vez; con bloques de 64 × 64 no "
                      f"debería pasar de {es_bytes(limit)}.",
                      "No guarde la matriz de puntuaciones entera: calcule y use las "
                      "puntuaciones de un bloque de consultas contra un bloque de claves, "
                      "y quédese solo con el estado de cada fila.")
    return passed(name, len(cases) + 1, f"Sin matrices de N × N: con N = {memory_n}, su "
                  f"función reservó menos de {es_bytes(limit)} a la vez.")


# --- (3) the attention step inside the model ----------------------------------------------------

def _step_cases(seed: int):
    g = torch.Generator().manual_seed(seed)
    # (batch, query heads, kv heads, new tokens, cache length, head_dim, start positions)
    shapes = [(1, 4, 4, 1, 40, 8, [33]), (2, 4, 2, 1, 48, 8, [3, 41]), (2, 8, 2, 21, 40, 16, [0, 0]),
              (3, 4, 1, 3, 50, 8, [0, 17, 40]), (2, 6, 3, 19, 60, 4, [2, 30])]
    for b, h, hkv, t, s, d, starts in shapes:
        positions = torch.tensor([[p + j for j in range(t)] for p in starts])
        tensors = [torch.randn(b, h, t, d, generator=g), torch.randn(b, hkv, t, d, generator=g),
                   torch.randn(b, hkv, t, d, generator=g), torch.randn(b, hkv, s, d, generator=g),
                   torch.randn(b, hkv, s, d, generator=g)]
        label = (f"lote {b}, {h} cabezas de consulta, {hkv} KV, {t} tokens nuevos desde las "
                 f"posiciones {starts}, caché de {s}")
        yield label, *tensors, positions


@self_check
def check_flash_step(fn: Callable, seed: int = 0, model=None, prompts=None,
                     max_new_tokens: int = 12, raise_on_fail: bool = True) -> CheckResult:
    """``fn(q, k_new, v_new, k_cache, v_cache, positions)``, ``cached_attention``'s contract,
    on random tensors and then as the attention of the real model: identical greedy tokens."""
    return attention_step_result(
        "atención por bloques dentro del modelo", fn, list(_step_cases(seed)), model=model,
        prompts=prompts, prompt_lens=(19, 37, 26), seed=seed, max_new_tokens=max_new_tokens,
        write_hint="Antes de atender, escriba las claves y los valores nuevos en la caché, cada "
                   "uno en la posición de su token, sin tocar el resto.",
        output_hint="Cada token nuevo está en la posición que dice positions, no en las últimas "
                    "de la caché: pase esas posiciones a su atención por bloques, con máscara "
                    "causal, sobre las ranuras de la caché hasta la mayor de ellas.")


# --- (4) the IO model: bytes the tiled loop moves ------------------------------------------------

def tiled_bytes_cases() -> list[tuple[int, int, int, int, int, bool]]:
    """(n, d, block_q, block_k, elem_bytes, causal)."""
    return [(1024, 64, 64, 64, 2, False), (1000, 64, 64, 64, 2, False),
            (1024, 128, 128, 32, 2, True), (1000, 64, 96, 40, 2, True),
            (4096, 64, 4096, 64, 4, False), (300, 16, 1, 7, 2, True), (2048, 64, 256, 1, 2, True),
            (777, 80, 50, 50, 1, True)]


def _bytes_variants(n, d, bq, bk, e, causal) -> dict[str, float]:
    """What plausible mistakes count (the first that matches names the mistake)."""
    out = {"kv_once": e * 4 * n * d, "elements": reference_tiled_bytes(n, d, bq, bk, 1, causal)}
    if n % bq:
        out["floor"] = e * (2 * n * d + 2 * (n // bq) * n * d)
    out["no_q_o"] = reference_tiled_bytes(n, d, bq, bk, e, causal) - 2 * e * n * d
    out["naive"] = naive_io(n, d, e).hbm_bytes
    if causal:
        out["ignores_causal"] = reference_tiled_bytes(n, d, bq, bk, e, False)
        exact = sum(min(n, r0 + bq) for r0 in range(0, n, bq))   # keys up to the last query
        out["exact_triangle"] = e * (2 * n * d + 2 * exact * d)
    else:
        out["causal_counted"] = reference_tiled_bytes(n, d, bq, bk, e, True)
    return out


BYTES_HINTS = {
    "kv_once": ("K y V no se leen una sola vez: cada bloque de consultas recorre las claves que "
                "ve, así que K y V se leen una vez por bloque de consultas."),
    "elements": "El resultado va en bytes: multiplique los elementos por los bytes de cada uno.",
    "floor": ("Cuando el bloque de consultas no divide n, el último bloque es más corto pero "
              "también lee sus claves: cuente los bloques redondeando hacia arriba."),
    "no_q_o": "Cuente también Q, que se lee una vez, y O, que se escribe una vez.",
    "naive": ("Esa es la cuenta de la atención ingenua: el bucle por bloques no escribe ni lee "
              "S ni P en la memoria lenta."),
    "ignores_causal": ("Con causal, un bloque de consultas no lee los bloques de claves que "
                       "empiezan después de su última posición."),
    "exact_triangle": ("Un bloque de claves se lee entero aunque solo parte de él sea visible: "
                       "cuente bloques enteros de claves hasta el que contiene la última posición "
                       "del bloque de consultas (el último de todos puede ser más corto)."),
    "causal_counted": "Sin causal, cada bloque de consultas lee todas las claves.",
}


@self_check
def check_tiled_bytes(fn: Callable, raise_on_fail: bool = True) -> CheckResult:
    """``fn(n, d, block_q, block_k, elem_bytes, causal) -> bytes``, as
    ``reference_tiled_bytes``."""
    name = "bytes que mueve la atención por bloques"
    cases = tiled_bytes_cases()
    for i, (n, d, bq, bk, e, causal) in enumerate(cases):
        label = (f"n = {n}, d = {d}, bloques de {bq} × {bk}, {e} bytes por elemento, "
                 f"{'causal' if causal else 'sin máscara'}")
        expected = reference_tiled_bytes(n, d, bq, bk, e, causal)
        got, crash = call_student(name, fn, n, d, bq, bk, e, causal)
        if crash:
            return failed(name, i, label, crash)
        if isinstance(got, bool) or not isinstance(got, (int, float)) and not (
                torch.is_tensor(got) and got.numel() == 1):
            return failed(name, i, label, f"devolvió {es_value(got)}; se espera un "
                          "número de bytes.")
        got = float(got)
        if not math.isclose(got, expected, rel_tol=1e-12):
            hint = ("Cuente, para cada bloque de consultas, sus filas de Q (una lectura), las "
                    "claves y valores de los bloques que visita y sus filas de O (una escritura).")
            for mistake, value in _bytes_variants(n, d, bq, bk, e, causal).items():
                if math.isclose(got, value, rel_tol=1e-12):
                    hint = BYTES_HINTS[mistake]
                    break
            return failed(name, i, label, f"se esperaban {es(expected, 0)} bytes y su "
                          f"función devolvió {es_sig(got, 9)}.", hint)
    return passed(name, len(cases))


# --- the challenge: the tiles that move the fewest bytes ----------------------------------------

CHALLENGE_KEYS = ("n", "head_dim", "fast_memory_bytes", "block_q", "block_k", "working_set_bytes",
                  "tiled_bytes", "naive_bytes", "counted_bytes")


@self_check
def check_challenge(ext: dict, raise_on_fail: bool = True) -> CheckResult:
    """The challenge's ``student_extension``: the tiles are those ``best_tiles`` picks for that
    fast memory (causal prefill, fp16), they fit, and every byte count is the IO model's; the
    counted bytes equal the predicted ones."""
    name = "reto: los bloques que mueven menos bytes"
    m = ext.get("measurement") if isinstance(ext, dict) else None
    if not isinstance(m, dict) or any(k not in m for k in CHALLENGE_KEYS):
        missing = [k for k in CHALLENGE_KEYS if not isinstance(m, dict) or k not in m]
        return failed(name, 0, "measurement", f"faltan las claves {', '.join(missing)}.")
    try:
        n, d, mem, bq, bk = (int(m[k]) for k in ("n", "head_dim", "fast_memory_bytes", "block_q",
                                                   "block_k"))
    except (TypeError, ValueError):
        return failed(name, 0, "measurement", "n, head_dim, fast_memory_bytes, block_q y "
                      "block_k deben ser números enteros.")
    if n < 1024 or d < 16 or mem < working_set_bytes(1, 1, d):
        return failed(name, 1, "n, head_dim, fast_memory_bytes", f"el reto pide un prefill "
                      f"de al menos 1024 tokens, d >= 16 y una memoria en la que quepa un "
                      f"bloque; measurement dice n = {n}, d = {d}, "
                      f"{es(mem, 0)} bytes.")
    want = best_tiles(n, d, mem, 2, causal=True)
    if (bq, bk) != want:
        fits = working_set_bytes(bq, bk, d) <= mem
        return failed(name, 2, "block_q, block_k", f"con {es_bytes(mem)} de memoria rápida, "
                      f"n = {n} y d = {d}, los bloques que mueven menos bytes son "
                      f"{want[0]} × {want[1]}; measurement dice {bq} × {bk}.",
                      "Ese par no cabe en la memoria rápida." if not fits else
                      "Recorra todas las potencias de dos de los dos bloques, descarte las "
                      "que no caben y, entre las demás, quédese con la de menos bytes; a "
                      "igualdad, con más claves y después con más consultas.")
    checks = [("working_set_bytes", working_set_bytes(bq, bk, d)),
              ("tiled_bytes", flash_io(n, d, bq, bk, 2, causal=True).hbm_bytes),
              ("naive_bytes", naive_io(n, d, 2).hbm_bytes)]
    for j, (key, value) in enumerate(checks):
        if not math.isclose(float(m[key]), value, rel_tol=1e-9):
            return failed(name, 3 + j, key, f"el modelo de E/S da {es(value, 0)} bytes y "
                          f"measurement dice {es_value(m[key])}.")
    if not math.isclose(float(m["counted_bytes"]), checks[1][1], rel_tol=1e-9):
        return failed(name, 6, "counted_bytes", f"el bucle, contado con IOCounter, mueve "
                      f"{es(checks[1][1], 0)} bytes con esos bloques; measurement dice "
                      f"{es_value(m['counted_bytes'])}.", "Cuente elementos con IOCounter "
                      "y multiplíquelos por los bytes de fp16.")
    return passed(name, 7)

