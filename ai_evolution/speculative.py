"""Speculative decoding: a small draft model proposes k tokens, the target verifies them all in
one forward pass (Leviathan et al., 2023; Chen et al., 2023).

Decode reads every weight of the target once per step to produce one token; verifying k drafted
tokens costs one step that reads the weights once and can produce up to k + 1 tokens.

Indexing (the classic off-by-one). The draft proposes ``d_0 .. d_{k-1}`` after the last committed
token ``t``. The target runs over ``[t, d_0, .., d_{k-1}]`` (k + 1 inputs); its prediction at
input ``i`` is the token that belongs *at* ``d_i``'s place, so there are k + 1 predictions:
``target[i]`` is compared with ``d_i`` for ``i < k``, and ``target[k]`` follows ``d_{k-1}``.
After the longest agreeing prefix of length ``n``, the target's own ``target[n]`` is emitted
too (a correction if ``n < k``, the bonus if all k agreed): every verification yields
``n + 1`` tokens.

The pieces, pure and reused by the engine and the chapter's exercises:

- ``greedy_accept``: greedy verification on token ids.
- ``acceptance_probs``, ``residual_distribution``, ``rejection_sample``: sampling verification
  (accept ``d_i`` with probability ``min(1, p/q)``, on the first rejection resample from
  ``norm(max(0, p - q))``, bonus from ``p`` if all are accepted); ``output_distribution`` is the
  exact distribution of one verified token, which equals ``p`` (``chi_square_gof`` tests samples
  against it).
- ``speculative_generate``: a plain loop (no engine) over the two models, each with its own
  ``ContiguousKVCache``; rejected positions are rolled back by resetting the cached length.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import torch
from torch import Tensor

from .generation import _check_eos, _check_prompts
from .model.attention import ContiguousKVCache
from .model.decoder import Transformer
from .model.sampling import SAMPLING_EPS, token_probs


# --- greedy verification -----------------------------------------------------------------------
def _as_ints(tokens, name: str) -> list[int]:
    if isinstance(tokens, Tensor):
        tokens = tokens.tolist()
    out = []
    for j, t in enumerate(tokens):
        if isinstance(t, bool) or not isinstance(t, numbers.Integral):
            raise ValueError(f"{name}[{j}]={t!r} no es un id de token (se esperaba un entero)")
        out.append(int(t))
    return out


def greedy_accept(draft_tokens: Sequence[int] | Tensor,
                  target_argmax: Sequence[int] | Tensor) -> tuple[int, int]:
    """Greedy verification: ``(num_accepted, next_token)``.

    ``draft_tokens``: the k tokens the draft proposed. ``target_argmax``: the target's argmax at
    each of the k + 1 verified inputs (``[t, d_0, .., d_{k-1}]``), so ``target_argmax[i]`` is
    the target's choice for ``d_i``'s place. The longest prefix where they agree is accepted;
    ``next_token = target_argmax[num_accepted]`` follows it (the target's correction at the
    first disagreement, or the bonus ``target_argmax[k]`` when all k agree).
    """
    draft = _as_ints(draft_tokens, "draft_tokens")
    target = _as_ints(target_argmax, "target_argmax")
    if len(target) != len(draft) + 1:
        raise ValueError(f"target_argmax debe tener k + 1 = {len(draft) + 1} tokens (uno por cada "
                         f"posición verificada, incluida la que sigue al último borrador); "
                         f"tiene {len(target)}")
    n = 0
    while n < len(draft) and draft[n] == target[n]:
        n += 1
    return n, target[n]


# --- sampling verification ---------------------------------------------------------------------
def acceptance_probs(p: Tensor, q: Tensor) -> Tensor:
    """``min(1, p(x) / q(x))`` for every token ``x`` (``[..., V]``): the probability of keeping a
    drafted ``x``. Where ``q(x) = 0`` the draft never proposes ``x``; the value there is 1 if
    ``p(x) > 0`` and 0 otherwise (it never matters for exactness)."""
    ratio = p / torch.where(q > 0, q, torch.ones_like(q))
    return torch.where(q > 0, ratio.clamp(max=1.0), (p > 0).to(p.dtype))


def residual_distribution(p: Tensor, q: Tensor) -> Tensor:
    """``norm(max(0, p - q))`` over the last dimension: where the target wants more than the draft
    offers. If ``p == q`` (nothing is ever rejected) it is ``p`` itself."""
    r = (p - q).clamp(min=0)
    total = r.sum(dim=-1, keepdim=True)
    return torch.where(total > 0, r / torch.where(total > 0, total, torch.ones_like(total)), p)


def output_distribution(p: Tensor, q: Tensor) -> Tensor:
    """Exact distribution of the token one verification emits at a position where the draft
    samples from ``q`` and the target's distribution is ``p``:

        P(x) = q(x) min(1, p(x)/q(x)) + (1 - sum_y q(y) min(1, p(y)/q(y))) residual(x)

    (drafted and kept, or rejected and resampled). It equals ``p``: ``q min(1, p/q) = min(p, q)``
    and the rejected mass ``sum max(0, q - p) = sum max(0, p - q)`` is spread as ``max(0, p - q)``.
    """
    kept = q * acceptance_probs(p, q)
    rejected = 1 - kept.sum(dim=-1, keepdim=True)
    return kept + rejected * residual_distribution(p, q)


def _check_probs(name: str, probs: Tensor, rows: int, vocab: int | None = None) -> None:
    if probs.dim() != 2 or probs.shape[0] != rows or (vocab is not None and probs.shape[1] != vocab):
        want = f"[{rows}, V]" if vocab is None else f"[{rows}, {vocab}]"
        raise ValueError(f"{name} tiene forma {list(probs.shape)}; se esperaba {want}")


def rejection_sample(draft_tokens: Sequence[int] | Tensor, draft_probs: Tensor, target_probs: Tensor,
                     generator: torch.Generator | None = None) -> tuple[int, int]:
    """Sampling verification of k drafted tokens: ``(num_accepted, next_token)``.

    ``draft_probs`` ``[k, V]``: the draft's distribution ``q_i`` each ``d_i`` was sampled from;
    ``target_probs`` ``[k + 1, V]``: the target's ``p_i`` at the same places plus the one after.
    For ``i = 0..k-1``: draw ``u ~ U[0, 1)``; keep ``d_i`` if ``u < min(1, p_i(d_i)/q_i(d_i))``;
    otherwise stop and sample ``next_token`` from ``residual_distribution(p_i, q_i)``. If all k
    are kept, ``next_token`` is sampled from ``p_k`` (the bonus). Every emitted token is then
    distributed as the target's own sample (``output_distribution``). ``generator`` seeds it.
    """
    draft = _as_ints(draft_tokens, "draft_tokens")
    k = len(draft)
    _check_probs("target_probs", target_probs, k + 1)
    vocab = target_probs.shape[1]
    if k:
        _check_probs("draft_probs", draft_probs, k, vocab)
    for i, x in enumerate(draft):
        if not 0 <= x < vocab:
            raise ValueError(f"draft_tokens[{i}]={x} está fuera del vocabulario (0..{vocab - 1})")
        p, q = target_probs[i], draft_probs[i]
        keep = acceptance_probs(p[x:x + 1], q[x:x + 1])[0]
        u = torch.rand((), generator=generator, device=p.device, dtype=p.dtype)
        if not u < keep:
            residual = residual_distribution(p, q)
            return i, int(torch.multinomial(residual, 1, generator=generator))
    return k, int(torch.multinomial(target_probs[k], 1, generator=generator))


def chi_square_gof(counts: Sequence[int] | Tensor, probs: Sequence[float] | Tensor) -> dict:
    """Pearson's chi-square goodness-of-fit of observed ``counts`` to ``probs``.

    Categories with probability 0 must have no counts (else the p-value is 0) and are left out
    of the degrees of freedom. Returns ``{"statistic", "dof", "p_value", "num_samples"}``; the
    p-value is ``Q(dof/2, statistic/2)`` (regularized upper incomplete gamma).
    """
    counts = torch.as_tensor(counts, dtype=torch.float64).flatten()
    probs = torch.as_tensor(probs, dtype=torch.float64).flatten()
    if counts.shape != probs.shape:
        raise ValueError(f"counts ({counts.numel()}) y probs ({probs.numel()}) deben tener la misma longitud")
    n = float(counts.sum())
    if n <= 0:
        raise ValueError("counts está vacío: hace falta al menos una muestra")
    support = probs > 0
    if bool((counts[~support] > 0).any()):
        return {"statistic": math.inf, "dof": int(support.sum()) - 1, "p_value": 0.0, "num_samples": int(n)}
    expected = n * probs[support] / probs[support].sum()
    stat = float(((counts[support] - expected) ** 2 / expected).sum())
    dof = int(support.sum()) - 1
    if dof < 1:
        return {"statistic": stat, "dof": dof, "p_value": 1.0, "num_samples": int(n)}
    p_value = float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                            torch.tensor(stat / 2, dtype=torch.float64)))
    return {"statistic": stat, "dof": dof, "p_value": p_value, "num_samples": int(n)}


# --- a plain speculative generation loop -------------------------------------------------------
@dataclass(frozen=True)
class SpecStep:
    """One draft-and-verify step: ``drafted`` tokens proposed (``proposed``, the tokens
    themselves), ``accepted`` of them kept by the verification, ``emitted`` tokens appended to
    the output (``accepted + 1`` unless the output stopped on EOS or on ``max_new_tokens``
    inside this step)."""

    drafted: int
    accepted: int
    emitted: int
    proposed: tuple[int, ...] = field(default=(), compare=False)


@dataclass
class SpeculativeOutput:
    """The new tokens (the first comes from the target's prefill) and one ``SpecStep`` per step."""

    tokens: list[int]
    k: int
    steps: list[SpecStep] = field(default_factory=list)

    @property
    def target_forwards(self) -> int:
        """Forward passes of the target: the prefill plus one verification per step."""
        return 1 + len(self.steps)

    @property
    def draft_forwards(self) -> int:
        """Forward passes of the draft: its prefill plus one per drafted token."""
        return 1 + sum(s.drafted for s in self.steps)

    def acceptance_by_position(self) -> list[float]:
        """For draft position ``j = 0..k-1``: of the steps whose verification reached ``d_j`` (it
        was drafted and ``d_0..d_{j-1}`` were kept), the fraction that kept it; NaN if none."""
        rates = []
        for j in range(self.k):
            reached = [s for s in self.steps if s.drafted > j and s.accepted >= j]
            kept = sum(1 for s in reached if s.accepted > j)
            rates.append(kept / len(reached) if reached else math.nan)
        return rates

    @property
    def alpha(self) -> float:
        """Acceptance rate: kept drafted tokens / drafted tokens the verification examined (each
        step examines its kept ones plus the first rejected one, if any). The maximum-likelihood
        estimate of a constant per-token acceptance probability; NaN if nothing was drafted."""
        examined = sum(min(s.accepted + 1, s.drafted) for s in self.steps)
        return sum(s.accepted for s in self.steps) / examined if examined else math.nan

    @property
    def mean_accepted(self) -> float:
        """Mean drafted tokens kept per step (NaN without steps)."""
        return sum(s.accepted for s in self.steps) / len(self.steps) if self.steps else math.nan

    @property
    def tokens_per_step(self) -> float:
        """Mean tokens a verification yields (``accepted + 1``) over the steps that drafted ``k``
        tokens, the quantity ``(1 - alpha^(k+1)) / (1 - alpha)`` predicts; NaN if none did (the
        last step drafts fewer when fewer tokens remain)."""
        full = [s for s in self.steps if s.drafted == self.k]
        return sum(s.accepted + 1 for s in full) / len(full) if full else math.nan


def pooled(outputs: Sequence[SpeculativeOutput]) -> SpeculativeOutput:
    """The steps of several runs with one ``k`` as one output (no tokens), so that its
    ``alpha``, ``acceptance_by_position()``, ``mean_accepted`` and ``tokens_per_step`` are
    those of all the runs together (every verification weighs the same)."""
    ks = {o.k for o in outputs}
    if len(ks) != 1:
        raise ValueError(f"hay que agrupar ejecuciones con el mismo k; se recibieron k = {sorted(ks)}")
    return SpeculativeOutput(tokens=[], k=ks.pop(), steps=[s for o in outputs for s in o.steps])


def check_draft(target: Transformer, draft: Transformer) -> None:
    """A draft must speak the target's vocabulary (verification compares token ids) and live on
    the same device. Raises ``ValueError`` in Spanish otherwise."""
    vt, vd = target.config.vocab_size, draft.config.vocab_size
    if vt != vd:
        raise ValueError(f"el modelo borrador tiene un vocabulario de {vd} tokens y el objetivo de {vt}: "
                         "la verificación compara ids de token, así que ambos deben usar el mismo "
                         "tokenizador")
    dt, dd = next(target.parameters()).device, next(draft.parameters()).device
    if dt != dd:
        raise ValueError(f"el modelo objetivo está en {dt} y el borrador en {dd}; póngalos en el mismo dispositivo")


def check_k(k) -> int:
    """``k`` (tokens drafted per step) must be an integer >= 1; Spanish ``ValueError`` otherwise."""
    if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 1:
        raise ValueError(f"k (tokens propuestos por paso) debe ser un entero >= 1; se recibió {k!r}")
    return int(k)


def speculative_generate(target: Transformer, draft: Transformer, prompt_ids: Sequence[int] | Tensor,
                         max_new_tokens: int, k: int, *, temperature: float = 0.0,
                         top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
                         eos_token_id: int | Iterable[int] | None = None) -> SpeculativeOutput:
    """Generate up to ``max_new_tokens`` after one prompt with speculative decoding.

    The target prefills the prompt and picks the first token; the draft prefills it too. Then,
    each step: the draft proposes ``k`` tokens one at a time on its own cache; the target runs
    once over the last committed token and the k proposals (k + 1 positions) on its cache; the
    verification (``greedy_accept`` at ``temperature == 0``, else ``rejection_sample`` on the
    distributions ``token_probs`` gives for ``temperature``, ``top_k``, ``top_p``) keeps a
    prefix and adds one target token. Rejected positions are rolled back by resetting each
    model's cached length to the tokens that stay; their stale K/V is overwritten later.
    The last steps draft fewer than ``k`` tokens when fewer remain.

    Greedy output equals ``generation.generate(target, prompt_ids, max_new_tokens)`` token for
    token; sampled output is distributed as the target's own sampling (not the same tokens: the
    random draws differ). Output stops after ``eos_token_id`` (kept), as ``generate`` does.
    """
    check_draft(target, draft)
    k = check_k(k)
    prompts = _check_prompts(prompt_ids, target.config.vocab_size)
    if len(prompts) != 1:
        raise ValueError(f"speculative_generate genera para un solo prompt; se recibieron {len(prompts)}")
    prompt = prompts[0]
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens debe ser un entero >= 1; se recibió {max_new_tokens!r}")
    if not temperature >= 0 or temperature == float("inf"):
        raise ValueError(f"temperature debe ser un número finito >= 0 (0 = voraz); se recibió {temperature!r}")
    eos = _check_eos(eos_token_id, target.config.vocab_size)
    greedy = temperature < SAMPLING_EPS
    device = next(target.parameters()).device
    generator = None
    if not greedy:
        generator = torch.Generator(device=device)
        if seed is None:
            generator.seed()
        else:
            generator.manual_seed(seed)

    max_len = len(prompt) + max_new_tokens + k + 1
    target_kv = ContiguousKVCache(target.config, 1, max_len, dtype=next(target.parameters()).dtype, device=device)
    draft_kv = ContiguousKVCache(draft.config, 1, max_len, dtype=next(draft.parameters()).dtype, device=device)

    def forward(model: Transformer, kv: ContiguousKVCache, tokens: list[int], start: int,
                last_only: bool = False) -> Tensor:
        """Logits ``[T, V]`` (float32) of ``tokens`` written at positions ``start..``."""
        ids = torch.tensor([tokens], device=device)
        positions = torch.arange(start, start + len(tokens), device=device)[None]
        hidden = model.hidden_states(ids, positions, kv_cache=kv)[0]
        return model.logits(hidden[-1:] if last_only else hidden).float()

    def probs(logits: Tensor) -> Tensor:
        return token_probs(logits, temperature, top_k, top_p)

    def pick(p: Tensor) -> int:
        return int(p.argmax()) if greedy else int(torch.multinomial(p, 1, generator=generator))

    with torch.inference_mode():
        first = pick(probs(forward(target, target_kv, prompt, 0, last_only=True)[0]))
        draft.hidden_states(torch.tensor([prompt], device=device), kv_cache=draft_kv)
        seq = prompt + [first]
        out = SpeculativeOutput(tokens=[first], k=k)
        # Cached lengths: how many leading tokens of seq each cache holds valid K/V for. The
        # target always holds all but the last token; the draft lags by one more after a step
        # that kept all k proposals (it never ran its own last proposal).
        target_len, draft_len = len(prompt), len(prompt)
        while len(out.tokens) < max_new_tokens and out.tokens[-1] not in eos:
            k_step = min(k, max_new_tokens - len(out.tokens) - 1)
            drafts: list[int] = []
            draft_dists: list[Tensor] = []
            feed = seq[draft_len:]
            for _ in range(k_step):
                q = probs(forward(draft, draft_kv, feed, draft_len, last_only=True)[0])
                draft_len += len(feed)
                drafts.append(pick(q))
                draft_dists.append(q)
                feed = drafts[-1:]
            verify = forward(target, target_kv, [seq[-1]] + drafts, target_len)      # [k_step+1, V]
            if greedy:
                n, nxt = greedy_accept(drafts, verify.argmax(dim=-1))
            else:
                q_rows = torch.stack(draft_dists) if drafts else verify.new_zeros(0, verify.shape[-1])
                n, nxt = rejection_sample(drafts, q_rows, probs(verify), generator)
            new = drafts[:n] + [nxt]
            new = new[:max_new_tokens - len(out.tokens)]
            for j, t in enumerate(new):
                if t in eos:
                    new = new[:j + 1]
                    break
            out.steps.append(SpecStep(drafted=k_step, accepted=n, emitted=len(new), proposed=tuple(drafts)))
            out.tokens.extend(new)
            seq.extend(new)
            # Roll back: each cache keeps the K/V of the committed tokens it has run, at most all
            # but the new last one; the slots of rejected proposals are stale, overwritten later.
            target_len = len(seq) - 1
            draft_len = min(draft_len, len(seq) - 1)
    return out
