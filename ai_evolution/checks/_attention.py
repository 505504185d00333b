"""What the two attention-step checks share (chapter 2's cached attention, chapter 8's tiled
one): the student's ``attn_fn`` against ``cached_attention`` on random tensors, then as the
attention of the real model, where it must give the same greedy tokens."""

from __future__ import annotations

from typing import Callable

import torch

from ..fmt import es_sig
from ..model.attention import cached_attention
from . import CheckResult, call_student, failed, passed


def attention_step_result(name: str, fn: Callable, cases: list, *, write_hint: str,
                          output_hint: str, model=None, prompts=None, prompt_lens=(5, 11, 8),
                          seed: int = 0, max_new_tokens: int = 12) -> CheckResult:
    """``cases``: (label, q, k_new, v_new, k_cache, v_cache, positions); the first failing case
    named (cache written wrong, output off), then the greedy tokens inside the model."""
    from ..generation import generate

    for i, (label, q, k_new, v_new, k_cache, v_cache, positions) in enumerate(cases):
        ref_k, ref_v = k_cache.clone(), v_cache.clone()
        expected = cached_attention(q, k_new, v_new, ref_k, ref_v, positions)
        got, crash = call_student(name, fn, q, k_new.clone(), v_new.clone(), k_cache, v_cache,
                                  positions)
        if crash:
            return failed(name, i, label, crash)
        if not torch.is_tensor(got) or got.shape != expected.shape:
            shape = tuple(got.shape) if torch.is_tensor(got) else type(got).__name__
            return failed(name, i, label, f"se esperaba un tensor de forma "
                          f"{tuple(expected.shape)} y se obtuvo {shape}.")
        if not torch.equal(k_cache, ref_k) or not torch.equal(v_cache, ref_v):
            bad = (k_cache != ref_k).any(-1) | (v_cache != ref_v).any(-1)
            b, hk, pos = [int(x) for x in bad.nonzero()[0]]
            return failed(name, i, label, f"la caché quedó mal escrita: la fila {b}, cabeza KV "
                          f"{hk}, posición {pos} no contiene lo esperado.", write_hint)
        err = float((got - expected).abs().max())
        if not torch.allclose(got, expected, atol=1e-4, rtol=1e-4):
            return failed(name, i, label, f"la salida difiere de la referencia (diferencia "
                          f"máxima {es_sig(err, 3)}).", output_hint)
    # Inside the real model: identical greedy tokens.
    if model is None:
        from ..model.checkpoint import load_pretrained

        model = load_pretrained("tiny-es")
    if prompts is None:
        g = torch.Generator().manual_seed(seed)
        prompts = [torch.randint(3, model.config.vocab_size, (n,), generator=g).tolist()
                   for n in prompt_lens]
    expected_tokens = generate(model, prompts, max_new_tokens, cache="contiguous")
    got_tokens, crash = call_student(name, generate, model, prompts, max_new_tokens,
                                     cache="contiguous", attn_fn=fn)
    label = (f"generación voraz de {max_new_tokens} tokens con el modelo {model.config.name}, "
             f"prompts de {', '.join(str(len(p)) for p in prompts)} tokens")
    if crash:
        return failed(name, len(cases), label, crash)
    for row, (e, g_) in enumerate(zip(expected_tokens, got_tokens)):
        if e != g_:
            j = next(k for k in range(len(e)) if k >= len(g_) or e[k] != g_[k])
            got_j = g_[j] if j < len(g_) else "nada"
            return failed(name, len(cases), label, f"en el prompt {row + 1}, el token "
                          f"generado {j + 1} debía ser {e[j]} y fue {got_j}.")
    return passed(name, len(cases) + 1, "Dentro del modelo real genera exactamente los "
                  "mismos tokens que la referencia.")
