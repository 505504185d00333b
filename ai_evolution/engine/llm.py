"""The offline facade: ``LLM("tiny-es").generate(prompts, params)``, as in vLLM.

``LLM`` loads a model (and its tokenizer), builds an engine with ``build_engine`` from an
``EngineConfig`` and runs every prompt to completion. The step loop itself is ``LLMEngine``
(``engine/llm_engine.py``); the settings and the builder are in ``engine/config.py``.
"""

from __future__ import annotations

import numbers
from pathlib import Path
from typing import Sequence

import torch

from ..model.decoder import Transformer
from ..model.hub import looks_like_hub_id
from ..model.tokenizer import Tokenizer, load_tokenizer, shipped_names
from .config import KV_LAYOUTS, EngineConfig, build_engine, load_model
from .llm_engine import Executor, LLMEngine, StepEntry, StepRecord
from .request import FinishReason, Request, RequestOutput, RequestRejected, SamplingParams


class LLM:
    """``LLM("tiny-es").generate(["Hola"], SamplingParams(max_tokens=8))``, vLLM-style.

    The engine's settings are an ``EngineConfig`` (``config=``) or its fields as keywords:
    ``max_num_seqs`` (default 8) is the batch width; ``max_model_len`` the longest request
    (default: the model's maximum); ``policy`` is ``"continuous"`` (default), ``"static"`` or a
    policy function; ``kv_layout`` is ``"contiguous"`` (one row of ``max_model_len`` per request)
    or ``"paged"`` (``num_blocks`` blocks of ``block_size`` tokens, prefix caching unless
    disabled); ``speculative_config={"model": "tiny-es-draft", "num_speculative_tokens": 4}``
    (a draft model) or ``{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}``
    (prompt lookup) turns on speculative decoding; ``enforce_eager=True`` turns off the CUDA graphs
    of decode steps (on a GPU they are on); ``batch_invariant=True`` gives each request the same
    logits whatever the batch (chapter 10), and ``kernels=`` another kernel set for it (a
    ``BatchInvariantKernels`` with a student's matmul). See ``EngineConfig`` for the rest.

    ``tensor_parallel_size=N`` splits the model across N processes (chapter 13): this process is
    rank 0 and keeps only its shard (``self.model`` is then rank 0's ``ShardedTransformer``; the
    full configuration is ``self.model.full_config``). Close it with ``close()`` or a ``with``
    block, which stops the worker processes (they also exit if this process dies). As with vLLM,
    a script that starts workers needs the ``if __name__ == "__main__":`` guard (they are spawned).
    """

    def __init__(self, model: str | Path | Transformer = "tiny-es", *, tokenizer: Tokenizer | str | None = None,
                 dtype: torch.dtype | None = None, device: str | torch.device | None = None,
                 config: EngineConfig | None = None, kernels=None, **options) -> None:
        config = EngineConfig.of(config, **options)
        self.model = load_model(model, dtype, device)
        if tokenizer is None and isinstance(model, str) and (model in shipped_names()
                                                             or looks_like_hub_id(model)):
            tokenizer = model
        self.tokenizer = load_tokenizer(tokenizer) if isinstance(tokenizer, (str, Path)) else tokenizer
        eos = self.model.config.eos_token_id
        if eos is None and self.tokenizer is not None:
            eos = self.tokenizer.eos_token_id
        self.engine = build_engine(self.model, config, eos_token_id=eos, kernels=kernels)
        if config.tensor_parallel_size > 1:  # rank 0 keeps its shard only
            self.model = self.engine.executor.model

    def close(self) -> None:
        """Release what the engine holds outside this object: with tensor parallelism, stop the
        worker processes. Idempotent; a closed tensor-parallel LLM refuses further steps."""
        close = getattr(self.engine.executor, "close", None)
        if close is not None:
            close()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _encode(self, prompt) -> Sequence[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise RequestRejected("este LLM no tiene tokenizador: pasa listas de ids de token")
            return self.tokenizer.encode(prompt, add_bos=True)
        return prompt

    def generate(self, prompts, sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 priority: Sequence[int] | None = None) -> list[RequestOutput]:
        """Run every prompt to completion; one ``RequestOutput`` per prompt, in order.

        ``priority``: one integer per prompt (lower first), as vLLM's; it orders admission and
        preemption with ``scheduling_policy="priority"`` (chapter 12) and never changes a token.
        A prompt or parameter set that is invalid gets an output with ``error`` set and
        ``finish_reason == "rejected"``; the others are served normally.
        """
        prompts, params_list = _prompts_and_params(prompts, sampling_params)
        if priority is None:
            priority = [0] * len(prompts)
        elif isinstance(priority, (str, bytes)) or not hasattr(priority, "__len__") or \
                len(priority) != len(prompts):
            raise ValueError(f"priority debe ser una lista con un entero por prompt ({len(prompts)}); "
                             f"se recibió {str(priority)[:40]}")
        entries: list[Request | RequestOutput] = []
        for prompt, params, prio in zip(prompts, params_list, priority):
            try:
                entries.append(self.engine.add_request(self._encode(prompt), params, priority=prio))
            except RequestRejected as e:
                entries.append(RequestOutput(f"rejected-{len(entries)}", _echo(prompt), [], True,
                                             FinishReason.REJECTED, error=str(e)))
        while self.engine.has_unfinished_requests():
            self.engine.step(outputs=False)
        return [e if isinstance(e, RequestOutput) else RequestOutput.of(e, self._decode(e))
                for e in entries]

    def _decode(self, request: Request) -> str | None:
        return None if self.tokenizer is None else self.tokenizer.decode(request.output_token_ids)


def _prompts_and_params(prompts, sampling_params) -> tuple[list, list[SamplingParams]]:
    """``generate``'s arguments as one list of prompts and one ``SamplingParams`` per prompt
    (a ``TypeError``/``ValueError`` in Spanish if they cannot be; a list may still hold a bad
    prompt: that prompt alone is rejected later)."""
    if prompts is None or isinstance(prompts, (bytes, dict)) or not hasattr(prompts, "__len__"):
        raise TypeError("prompts debe ser un texto, una lista de ids de token o una lista de "
                        f"ellos; se recibió {type(prompts).__name__}")
    if not (sampling_params is None or isinstance(sampling_params, (SamplingParams, list, tuple))):
        raise TypeError("sampling_params debe ser un SamplingParams o una lista con uno por "
                        f"prompt; se recibió {type(sampling_params).__name__} (para un dict, "
                        "use SamplingParams(**d))")
    if isinstance(prompts, torch.Tensor):  # one prompt [T], or a batch [B, T]
        prompts = [prompts] if prompts.dim() <= 1 else list(prompts)
    if isinstance(prompts, str) or (len(prompts) and isinstance(prompts[0], numbers.Integral)):
        prompts = [prompts]  # one prompt of token ids
    if sampling_params is None or isinstance(sampling_params, SamplingParams):
        sampling_params = [sampling_params or SamplingParams()] * len(prompts)
    if len(sampling_params) != len(prompts):
        raise ValueError(f"hay {len(prompts)} prompts y {len(sampling_params)} SamplingParams; "
                         "da uno para todos, o uno por prompt")
    return list(prompts), list(sampling_params)


def _echo(prompt) -> list[int]:
    """The token ids of a rejected prompt, to echo back (none for text or a non-sequence)."""
    try:
        return [] if isinstance(prompt, str) else list(
            prompt.tolist() if isinstance(prompt, torch.Tensor) else prompt)
    except TypeError:  # not a sequence at all (None, a number): nothing to echo
        return []


__all__ = ["Executor", "KV_LAYOUTS", "LLM", "LLMEngine", "StepEntry", "StepRecord", "build_engine"]
