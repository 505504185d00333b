"""The draft side of speculative decoding in the engine (chapter 9).

Two proposers, one interface (``propose_drafts(running) -> {request id: draft tokens}``), as
vLLM's ``speculative_config={"method": ...}`` names them:

- ``NgramProposer`` (``method="ngram"``, prompt lookup): the last ``n`` tokens of the request
  (``prompt_lookup_max`` down to ``prompt_lookup_min``) are searched for earlier in its own
  context, and the tokens that followed the most recent earlier occurrence are proposed. No
  model runs: a proposal costs a list search, so it pays whenever the output repeats its input
  (editing, quoting, code, retrieval-augmented answers) and costs only the verification's extra
  positions when it does not.
- ``DraftProposer`` (``method="draft_model"``): a small draft model proposes greedily.

After every step, ``propose_drafts`` gives each running greedy request up to
``num_speculative_tokens`` draft tokens, and the engine hands them to the
scheduler (``Scheduler.update_draft_token_ids``); the scheduler sends them with the request's next
decode token, the target verifies all of them in that one forward pass, and
``Scheduler.update_from_output`` accepts the longest agreeing prefix plus the target's next token. The output is the target's
greedy output, token for token, whatever the draft proposes: a bad draft only costs speed.

The draft keeps its own KV cache per request (one row of ``max_model_len`` tokens): it writes
its proposals' K/V as it drafts, and at the next proposal keeps only the part the target
accepted (the rest is recomputed from the real tokens).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

from ..model.attention import ContiguousKVCache
from ..model.decoder import Transformer
from .request import Request
from ..model.sampling import token_probs
from .scheduler import check_positive_int, derived_seed


def ngram_propose(tokens: Sequence[int], num_tokens: int, min_n: int, max_n: int) -> list[int]:
    """Prompt lookup: for ``n`` from ``max_n`` down to ``min_n``, find the most recent earlier
    occurrence of the last ``n`` tokens of ``tokens`` and return (up to) ``num_tokens`` tokens
    that followed it; ``[]`` if no suffix of those lengths occurs earlier. The longest matching
    suffix wins (a longer match is stronger evidence that the text is being repeated)."""
    size = len(tokens)
    for n in range(min(max_n, size - 1), min_n - 1, -1):
        suffix = list(tokens[size - n:])
        # candidate starts, most recent first; the suffix itself (start size - n) is excluded
        for start in range(size - n - 1, -1, -1):
            if tokens[start] == suffix[0] and list(tokens[start:start + n]) == suffix:
                return list(tokens[start + n:start + n + num_tokens])
    return []


def speculating(r: Request, max_model_len: int, k: int) -> int:
    """How many draft tokens ``r`` may take for its next step: none unless it is a running
    request that is decoding (greedy or sampled); else at most ``k``, fewer near its
    ``max_tokens`` or ``max_model_len``."""
    if r.is_finished or r.num_computed_tokens != r.num_tokens - 1:
        return 0
    return max(0, min(k, r.sampling_params.max_tokens - len(r.output_token_ids) - 1,
                      max_model_len - r.num_tokens))


class NgramProposer:
    """Draft tokens copied from the request's own context (``method="ngram"``): see
    ``ngram_propose``. Stateless: nothing to keep per request and no model to run. Its drafts
    are point masses (``draft_probs`` stays empty), for greedy and sampled requests alike."""

    def __init__(self, num_speculative_tokens: int, prompt_lookup_min: int, prompt_lookup_max: int,
                 max_model_len: int) -> None:
        check_positive_int("num_speculative_tokens (tokens borrador por paso)", num_speculative_tokens)
        check_lookup_window(prompt_lookup_min, prompt_lookup_max)
        self.num_speculative_tokens, self.max_model_len = num_speculative_tokens, max_model_len
        self.prompt_lookup_min, self.prompt_lookup_max = prompt_lookup_min, prompt_lookup_max
        self.draft_probs: dict = {}  # none: n-gram drafts are point masses

    def check_target(self, target) -> None:
        """Any target: the proposals are the request's own token ids."""

    def propose_drafts(self, running: Sequence[Request]) -> dict[str, list[int]]:
        """The proposals of every running request that is decoding (none where its last tokens
        occur nowhere earlier in its context)."""
        drafts = {}
        for r in running:
            n = speculating(r, self.max_model_len, self.num_speculative_tokens)
            if n > 0:
                found = ngram_propose(r.all_token_ids, n, self.prompt_lookup_min, self.prompt_lookup_max)
                if found:
                    drafts[r.request_id] = found
        return drafts


def check_lookup_window(prompt_lookup_min, prompt_lookup_max) -> None:
    """The n-gram window must be two integers with ``1 <= min <= max`` (Spanish ``ValueError``)."""
    check_positive_int("prompt_lookup_min (n-grama más corto buscado)", prompt_lookup_min)
    check_positive_int("prompt_lookup_max (n-grama más largo buscado)", prompt_lookup_max)
    if prompt_lookup_min > prompt_lookup_max:
        raise ValueError(f"la ventana de búsqueda del n-grama no es válida: prompt_lookup_min "
                         f"({prompt_lookup_min}) debe ser <= prompt_lookup_max ({prompt_lookup_max})")


@dataclass
class _DraftState:
    cache: ContiguousKVCache
    valid: int = 0                 # tokens whose K/V in the draft cache are right
    base: int = 0                  # where the last proposals started
    drafts: list[int] = field(default_factory=list)
    generator: torch.Generator | None = None  # sampled requests' draws


class DraftProposer:
    """Draft tokens, ``num_speculative_tokens`` per step, from ``draft`` (same tokenizer as the
    target): its argmax for a greedy request; for a sampled one, a sample from its distribution
    under the request's temperature, top-k and top-p, kept in ``draft_probs`` (request id ->
    ``[k, V]``) for the target's rejection sampling."""

    def __init__(self, draft: Transformer, num_speculative_tokens: int, max_model_len: int) -> None:
        n = num_speculative_tokens
        check_positive_int("num_speculative_tokens (tokens borrador por paso)", n)
        if max_model_len > draft.config.max_position_embeddings:
            raise ValueError(f"max_model_len={max_model_len} supera las "
                             f"{draft.config.max_position_embeddings} posiciones del modelo borrador")
        self.draft, self.num_speculative_tokens, self.max_model_len = draft.eval(), n, max_model_len
        param = next(draft.parameters())
        self.dtype, self.device = param.dtype, param.device
        self._state: dict[str, _DraftState] = {}
        self.draft_probs: dict[str, torch.Tensor] = {}  # of the last proposals, sampled requests

    def check_target(self, target: Transformer) -> None:
        if target.config.vocab_size != self.draft.config.vocab_size:
            raise ValueError(f"el borrador tiene {self.draft.config.vocab_size} tokens de vocabulario "
                             f"y el objetivo {target.config.vocab_size}: deben compartir tokenizador")

    def forget(self, keep: set[str]) -> None:
        """Drop the state of every request not in ``keep`` (finished, aborted)."""
        for rid in [r for r in self._state if r not in keep]:
            del self._state[rid]

    def propose_drafts(self, running: Sequence[Request]) -> dict[str, list[int]]:
        """Draft tokens for the next step of every running greedy request that is decoding: at
        most ``num_speculative_tokens``, fewer near its ``max_tokens`` or ``max_model_len``.
        Forgets the requests that are no longer running."""
        self.forget({r.request_id for r in running})
        self.draft_probs = {}
        drafts = {}
        for r in running:
            n = speculating(r, self.max_model_len, self.num_speculative_tokens)
            if n > 0:
                drafts[r.request_id] = self.propose(r, n)
        return drafts

    @torch.inference_mode()
    def propose(self, request: Request, num_tokens: int) -> list[int]:
        """``num_tokens`` greedy draft tokens after ``request``'s tokens."""
        tokens = request.all_token_ids
        st = self._state.get(request.request_id)
        if st is None:
            st = self._state[request.request_id] = _DraftState(ContiguousKVCache(
                self.draft.config, 1, self.max_model_len, dtype=self.dtype, device=self.device))
        # the proposals' K/V are right only as far as the real tokens agree with them
        agree = 0
        while (agree < len(st.drafts) - 1 and st.base + agree < len(tokens)
               and tokens[st.base + agree] == st.drafts[agree]):
            agree += 1
        valid = min(st.valid, st.base + agree) if st.drafts else st.valid
        valid = min(valid, len(tokens) - 1)  # the last token is always fed
        feed = tokens[valid:]
        out: list[int] = []
        probs: list[torch.Tensor] = []
        sp = request.sampling_params
        pos = valid
        for _ in range(num_tokens):
            ids = torch.tensor([feed], device=self.device)
            positions = torch.arange(pos, pos + len(feed), device=self.device)[None]
            hidden = self.draft.hidden_states(ids, positions, kv_cache=st.cache)
            logits = self.draft.logits(hidden[0, -1]).float()
            if sp.greedy:
                nxt = int(logits.argmax())
            else:
                q = token_probs(logits[None], sp.temperature, sp.top_k, sp.top_p)[0].cpu()
                nxt = int(torch.multinomial(q, 1, generator=self._generator(request)))
                probs.append(q)
            out.append(nxt)
            pos += len(feed)
            feed = [nxt]
        st.valid, st.base, st.drafts = pos, len(tokens), out
        if probs:
            self.draft_probs[request.request_id] = torch.stack(probs)
        return out

    def _generator(self, request: Request) -> torch.Generator:
        """The draft's sampling generator for ``request`` (a stream of its own, from its seed)."""
        st = self._state[request.request_id]
        if st.generator is None:
            st.generator = torch.Generator()
            seed = request.sampling_params.seed
            st.generator.manual_seed(derived_seed(seed, 2)) if seed is not None else st.generator.seed()
        return st.generator
