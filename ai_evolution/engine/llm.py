"""The engine's step loop (``LLMEngine``) and the offline facade (``LLM``).

``LLMEngine.step()`` is one iteration: schedule, execute, record. A lab can call it by hand and
inspect ``engine.history`` (what every step ran, when, who joined, left or was preempted, who held
KV) and every request's timing record. ``LLM.generate`` is the vLLM-style shortcut that runs the
loop to completion.

One request's path: ``add_request`` validates it and queues it in the scheduler; each ``step()``
asks the scheduler for a ``SchedulerOutput`` (the policy retires and admits; the KV manager gives
blocks), the executor runs it and returns the sampled tokens, and ``update_from_output`` appends
them and finishes the request on a stop token or its length. When nothing is left to run,
``retire_finished()`` frees the KV of the last finished requests.
"""

from __future__ import annotations

import itertools
import numbers
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NamedTuple, Protocol, Sequence

import torch

from ..model.checkpoint import load_pretrained
from ..model.decoder import Transformer
from ..model.hub import looks_like_hub_id
from ..model.tokenizer import Tokenizer, load_tokenizer, shipped_names
from .request import (FinishReason, Request, RequestOutput, RequestRejected, SamplingParams,
                      validate_prompt)
from .drafter import DraftProposer
from .kv_cache import ContiguousKVManager, KVCacheManager, KVManager
from .runner import ModelRunner
from .scheduler import Policy, PolicyError, Scheduler, SchedulerOutput


class Executor(Protocol):
    """What the engine needs from whoever runs a step: the real model (``ModelRunner``) or the
    simulator (``SimExecutor``). Its partner on the scheduler's side is ``KVManager``."""

    def now(self) -> float:
        """The clock every timestamp is read from (seconds)."""

    def idle_until(self, t: float) -> None:
        """Nothing to run before ``t``: let the clock reach it."""

    def execute(self, out: SchedulerOutput) -> dict[str, int | Exception]:
        """Run the step: the sampled token of every request whose pending tokens it completed
        (or the exception its part raised)."""


class StepEntry(NamedTuple):
    """One request's part in a step."""

    request_id: str
    first_block: int  # with the contiguous layout, the request's row
    num_tokens: int   # tokens computed for it in this step
    context_len: int  # tokens in its cache after the step
    is_prefill: bool
    num_draft_tokens: int = 0  # of num_tokens, draft proposals verified (speculative decoding)


@dataclass(frozen=True)
class StepRecord:
    """One executed step: when it ran, what it computed, who joined, left or was preempted to
    make it, and who held KV (finished-but-held requests too)."""

    step: int
    start: float
    end: float
    scheduled: tuple[StepEntry, ...]
    holders: dict[str, int]  # every request holding KV -> its first block (its row, contiguous)
    num_blocks: int
    admitted: tuple[str, ...] = ()
    retired: tuple[str, ...] = ()
    preempted: tuple[str, ...] = ()

    @property
    def duration(self) -> float:
        return self.end - self.start

    @property
    def query_lens(self) -> list[int]:
        return [s.num_tokens for s in self.scheduled]

    @property
    def context_lens(self) -> list[int]:
        return [s.context_len for s in self.scheduled]

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.scheduled)

    @property
    def batch_size(self) -> int:
        return len(self.scheduled)


class LLMEngine:
    """Scheduler + executor + the requests' timing records."""

    def __init__(self, scheduler: Scheduler, executor: Executor, vocab_size: int,
                 eos_token_id: int | None = None, drafter: DraftProposer | None = None) -> None:
        self.scheduler = scheduler
        self.executor = executor
        self.drafter = drafter  # speculative decoding (chapter 9), greedy requests only
        self.vocab_size = vocab_size
        self.eos_token_id = eos_token_id
        self.requests: dict[str, Request] = {}
        self.history: list[StepRecord] = []
        self._ids = itertools.count()

    @property
    def max_model_len(self) -> int:
        return self.scheduler.max_model_len

    def now(self) -> float:
        return self.executor.now()

    @property
    def num_running(self) -> int:
        """Requests in the batch that have not finished."""
        return self.scheduler.num_running

    @property
    def num_waiting(self) -> int:
        """Requests queued for admission (preempted ones included)."""
        return self.scheduler.num_waiting

    def add_request(self, prompt_token_ids: Sequence[int], params: SamplingParams | None = None,
                    request_id: str | None = None, arrival_time: float | None = None) -> Request:
        """Queue a request (it may arrive while others run). Invalid input raises
        ``RequestRejected`` and leaves the engine exactly as it was."""
        params = SamplingParams() if params is None else params
        prompt = self._validate(prompt_token_ids, params)
        if request_id is None:
            request_id = str(next(self._ids))
            while request_id in self.requests:
                request_id = str(next(self._ids))
        elif request_id in self.requests or any(r.request_id == request_id
                                                for r in self.scheduler.running):
            # (a released request may still hold KV until the scheduler retires it)
            raise RequestRejected(f"ya existe una petición con request_id={request_id!r}; usa un "
                                  "request_id que no esté en engine.requests, o None para que el "
                                  "motor asigne uno")
        req = Request(str(request_id), prompt, params,
                      arrival_time=self.now() if arrival_time is None else arrival_time,
                      eos_token_id=self.eos_token_id)
        self.requests[req.request_id] = req
        self.scheduler.add_request(req)
        return req

    def _validate(self, prompt_token_ids, params) -> list[int]:
        """The prompt as a list of ids, or ``RequestRejected`` naming what is wrong."""
        if not isinstance(params, SamplingParams):
            raise RequestRejected(f"params debe ser un SamplingParams; se recibió {type(params).__name__}")
        problems = params.problems(self.vocab_size)
        if problems:
            raise RequestRejected("; ".join(problems))
        prompt = validate_prompt(prompt_token_ids, self.vocab_size, self.max_model_len)
        self._check_fits(len(prompt), params)
        return prompt

    def _check_fits(self, prompt_len: int, params: SamplingParams) -> None:
        longest = min(prompt_len + params.max_tokens, self.max_model_len)
        capacity = self.scheduler.kv.capacity_tokens
        if longest > capacity:
            raise RequestRejected(f"la petición puede llegar a {longest} tokens (prompt de "
                                  f"{prompt_len} + max_tokens {params.max_tokens}) y la caché KV "
                                  f"entera guarda {capacity}: no cabría ni sola")

    def kv_usage(self) -> dict:
        """KV memory accounting now: blocks total/used/cached-but-free, tokens vs reserved slots
        (overall and per request), and, for paged KV, preemptions and prefix-cache hits."""
        out = self.scheduler.kv.usage(self.requests)
        out["num_preemptions"] = self.scheduler.num_preemptions
        out["preempted_tokens"] = self.scheduler.preempted_tokens
        return out

    def abort_request(self, request_id: str) -> None:
        self.scheduler.abort_request(request_id, self.now())

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def release(self, request_id: str) -> Request:
        """Forget a finished (or aborted) request: drop it from ``requests`` and return it.

        ``requests`` keeps every request ever added, so that a lab can read their timing records
        afterwards; a long-running server calls this once it has reported a request, so that
        memory stays bounded. The request still leaves the batch (and frees its KV) when the
        policy retires it, or at ``retire_finished()``, as any finished request. An unknown id, or a request that has not
        finished, raises ``KeyError`` / ``ValueError`` and changes nothing.
        """
        req = self.requests.get(request_id)
        if req is None:
            raise KeyError(f"no hay ninguna petición con request_id={request_id!r} en engine.requests")
        if not req.is_finished:
            raise ValueError(f"la petición {request_id!r} no ha terminado (estado "
                             f"{req.status.value}): termínela o abórtela (abort_request) antes de "
                             "liberarla")
        return self.requests.pop(request_id)

    def step(self) -> list[RequestOutput]:
        """One iteration: schedule, execute, record. Returns the requests that got a token."""
        out = self.scheduler.schedule()
        if out.is_empty:
            if self.scheduler.has_unfinished_requests():
                waiting = [r.request_id for r in self.scheduler.waiting]
                raise PolicyError(f"la política {self.scheduler.policy_name!r} no dejó nada que "
                                  f"ejecutar aunque hay peticiones pendientes (en cola: {waiting}); "
                                  "el motor se quedaría parado para siempre")
            return []
        start = self.executor.now()
        for s in out.scheduled:
            if s.request.first_scheduled_time is None:
                s.request.first_scheduled_time = start
        sampled, failed = self._execute(out)
        end = self.executor.now()
        for s in out.scheduled:
            if s.request_id in failed:
                self.scheduler.fail_request(s.request, failed[s.request_id], end)
        self.scheduler.update_from_output(out, sampled, end)
        if self.drafter is not None:
            self._propose()
        self.history.append(StepRecord(out.step, start, end,
                                       tuple(StepEntry(s.request_id, s.first_block, s.num_tokens,
                                                       s.context_len, s.is_prefill,
                                                       len(s.draft_tokens))
                                             for s in out.scheduled),
                                       out.holders, out.num_blocks, tuple(out.admitted),
                                       tuple(out.retired), tuple(out.preempted)))
        return [RequestOutput.of(s.request) for s in out.scheduled
                if s.request_id in sampled or s.request_id in failed]

    def _propose(self) -> None:
        """Draft tokens for every running greedy request that is decoding, for the next step: at
        most ``k``, fewer near ``max_tokens`` or ``max_model_len``."""
        running = self.scheduler.running
        self.drafter.forget({r.request_id for r in running})
        for r in running:
            if r.is_finished or not r.sampling_params.greedy or r.num_computed_tokens != r.num_tokens - 1:
                continue
            k = min(self.drafter.k, r.sampling_params.max_tokens - len(r.output_token_ids) - 1,
                    self.max_model_len - r.num_tokens)
            if k > 0:
                r.spec_token_ids = self.drafter.propose(r, k)

    def _execute(self, out: SchedulerOutput) -> tuple[dict[str, int], dict[str, str]]:
        """Run a step: the sampled tokens, and a Spanish message for every request whose part
        failed. If the whole step raises, each request runs again alone to find the one that
        caused it (re-running writes the same K/V to the same positions), so one bad request
        fails only itself."""
        try:
            result = self.executor.execute(out)
        except Exception as err:  # noqa: BLE001 - isolated below, never lost
            if len(out.scheduled) == 1:
                return {}, {out.scheduled[0].request_id: _step_error(out.step, err)}
            sampled, failed = {}, {}
            for s in out.scheduled:
                one, bad = self._execute(replace(out, scheduled=[s]))
                sampled.update(one)
                failed.update(bad)
            return sampled, failed
        sampled = {rid: t for rid, t in result.items() if not isinstance(t, BaseException)}
        failed = {rid: _step_error(out.step, t) for rid, t in result.items()
                  if isinstance(t, BaseException)}
        return sampled, failed

    def run(self, arrivals: Sequence[tuple[float, Sequence[int], SamplingParams]] = ()) -> list[Request]:
        """Serve ``(arrival_time, prompt, params)`` online: each request is added when the clock
        reaches its arrival time (relative to now), and the loop runs until all have finished.
        Returns the requests in the order given. Every item is checked before anything runs: an
        invalid one raises ``RequestRejected`` naming its index, and nothing is added."""
        for i, (t, p, sp) in enumerate(arrivals):
            try:
                self._validate(p, sp)
                if isinstance(t, bool) or not isinstance(t, (int, float)) or not t >= 0:
                    raise RequestRejected(f"el instante de llegada debe ser >= 0; se recibió {t!r}")
            except RequestRejected as err:
                raise RequestRejected(f"llegada {i}: {err}") from None
        t0 = self.now()
        pending = sorted(((t0 + t, i, p, sp) for i, (t, p, sp) in enumerate(arrivals)),
                         key=lambda a: (a[0], a[1]))
        added: dict[int, Request] = {}
        k = 0
        while k < len(pending) or self.has_unfinished_requests():
            while k < len(pending) and pending[k][0] <= self.now():
                t, i, p, sp = pending[k]
                added[i] = self.add_request(p, sp, arrival_time=t)
                k += 1
            if self.has_unfinished_requests():
                self.step()
            elif k < len(pending):
                self.executor.idle_until(pending[k][0])
        self.retire_finished()
        return [added[i] for i in range(len(pending))]

    def retire_finished(self) -> list[str]:
        """Free the KV of every finished request still in the batch (the work is over; see
        ``Scheduler.retire_finished``). Returns their ids."""
        return [r.request_id for r in self.scheduler.retire_finished()]


def _step_error(step: int, err: BaseException, limit: int = 300) -> str:
    text = f"la petición falló en el paso {step}: {type(err).__name__}: {err}"
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _as_model(model, dtype, device) -> Transformer:
    if isinstance(model, Transformer):
        return model
    if isinstance(model, (str, Path)):
        return load_pretrained(model, dtype=dtype or torch.float32, device=device or "cpu")
    raise TypeError(f"model debe ser un Transformer, el nombre de un modelo incluido "
                    f"({', '.join(shipped_names())}), una carpeta de checkpoint o un id del Hub "
                    f"(organización/nombre); se recibió {type(model).__name__}")


KV_LAYOUTS = ("contiguous", "paged")


def build_engine(model: Transformer, *, max_num_seqs: int, max_model_len: int,
                 policy: str | Policy = "continuous", kv_layout: str = "contiguous",
                 block_size: int = 16, num_blocks: int | None = None,
                 enable_prefix_caching: bool = True, eos_token_id: int | None = None,
                 kv=None, max_num_batched_tokens: int | None = None,
                 enable_chunked_prefill: bool = False, token_fn=None, victim_fn=None,
                 kv_dtype: str | None = None, draft_model: Transformer | None = None,
                 num_speculative_tokens: int = 4, decode_graphs: str | None = "auto") -> LLMEngine:
    """An engine on the real model. ``kv_layout="contiguous"``: one ``max_model_len`` row per
    request (``max_num_seqs`` rows). ``"paged"``: ``num_blocks`` blocks of ``block_size`` tokens
    (default: the same memory as the contiguous rows), with optional prefix caching. ``kv``: a
    ready KV manager (for example a ``KVCacheManager`` with a student's pool), used as given.
    ``max_num_batched_tokens`` caps the tokens of a step; ``enable_chunked_prefill`` splits
    prompts that do not fit into chunks; ``token_fn`` and ``victim_fn`` replace the scheduler's
    token split and preemption choice (chapter 5). ``kv_dtype="int8"``: the KV tensors are stored
    as int8 with a scale per token and head (chapter 7), about half the bytes of fp16.
    ``draft_model``: speculative decoding (chapter 9), ``num_speculative_tokens`` proposals per
    step for every greedy request; the output stays the target's greedy output.
    ``decode_graphs``: ``"auto"`` captures pure decode steps as CUDA graphs on a GPU (a small
    model's step is otherwise bound by kernel launches) and does nothing on the CPU; None turns
    them off; ``"eager"`` runs their static padded step without capture (``engine.executor.graphs``)."""
    for name, value in (("max_num_seqs", max_num_seqs), ("max_model_len", max_model_len),
                        ("block_size", block_size)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise ValueError(f"{name} debe ser un entero >= 1; se recibió {value!r}")
    if num_blocks is not None and (isinstance(num_blocks, bool)
                                   or not isinstance(num_blocks, numbers.Integral) or num_blocks < 1):
        raise ValueError(f"num_blocks debe ser un entero >= 1 o None; se recibió {num_blocks!r}")
    if kv is not None:
        pass
    elif kv_layout == "contiguous":
        kv = ContiguousKVManager(max_num_seqs, max_model_len)
    elif kv_layout == "paged":
        if num_blocks is None:
            num_blocks = max_num_seqs * -(-max_model_len // block_size)
        kv = KVCacheManager(num_blocks, block_size, max_model_len, enable_prefix_caching)
    else:
        raise ValueError(f"kv_layout {kv_layout!r} desconocido; aceptados: {', '.join(KV_LAYOUTS)}")
    if max_model_len > model.config.max_position_embeddings:
        raise ValueError(f"max_model_len={max_model_len} supera las "
                         f"{model.config.max_position_embeddings} posiciones del modelo")
    scheduler = Scheduler(max_num_seqs, max_model_len, policy, kv=kv,
                          max_num_batched_tokens=max_num_batched_tokens,
                          enable_chunked_prefill=enable_chunked_prefill, token_fn=token_fn,
                          victim_fn=victim_fn)
    drafter = None
    if draft_model is not None:
        drafter = DraftProposer(draft_model, num_speculative_tokens, max_model_len)
        drafter.check_target(model)
    runner = ModelRunner.for_kv(model, kv, kv_dtype, decode_graphs=decode_graphs,
                                max_num_seqs=max_num_seqs, max_model_len=max_model_len)
    return LLMEngine(scheduler, runner, model.config.vocab_size, eos_token_id, drafter)


class LLM:
    """``LLM("tiny-es").generate(["Hola"], SamplingParams(max_tokens=8))``, vLLM-style.

    ``policy`` is ``"continuous"`` (default), ``"static"`` or a policy function; ``max_num_seqs``
    is the batch width; ``max_model_len`` the longest request (default: the model's maximum).
    ``kv_layout`` is ``"contiguous"`` (one row of ``max_model_len`` per request) or ``"paged"``
    (``num_blocks`` blocks of ``block_size`` tokens, prefix caching unless disabled).
    ``enforce_eager=True`` turns off the CUDA graphs of decode steps (on a GPU they are on).
    """

    def __init__(self, model: str | Path | Transformer = "tiny-es", *, tokenizer: Tokenizer | str | None = None,
                 max_num_seqs: int = 8, max_model_len: int | None = None,
                 policy: str | Policy = "continuous", kv_layout: str = "contiguous",
                 block_size: int = 16, num_blocks: int | None = None,
                 enable_prefix_caching: bool = True, max_num_batched_tokens: int | None = None,
                 enable_chunked_prefill: bool = False, dtype: torch.dtype | None = None,
                 device: str | torch.device | None = None, kv_dtype: str | None = None,
                 enforce_eager: bool = False) -> None:
        self.model = _as_model(model, dtype, device)
        config = self.model.config
        if tokenizer is None and isinstance(model, str) and (model in shipped_names()
                                                             or looks_like_hub_id(model)):
            tokenizer = model
        self.tokenizer = load_tokenizer(tokenizer) if isinstance(tokenizer, (str, Path)) else tokenizer
        max_model_len = max_model_len or config.max_position_embeddings
        eos = config.eos_token_id
        if eos is None and self.tokenizer is not None:
            eos = self.tokenizer.eos_token_id
        self.engine = build_engine(self.model, max_num_seqs=max_num_seqs, max_model_len=max_model_len,
                                   policy=policy, kv_layout=kv_layout, block_size=block_size,
                                   num_blocks=num_blocks, enable_prefix_caching=enable_prefix_caching,
                                   eos_token_id=eos, max_num_batched_tokens=max_num_batched_tokens,
                                   enable_chunked_prefill=enable_chunked_prefill, kv_dtype=kv_dtype,
                                   decode_graphs=None if enforce_eager else "auto")

    def _encode(self, prompt) -> Sequence[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise RequestRejected("este LLM no tiene tokenizador: pasa listas de ids de token")
            return self.tokenizer.encode(prompt, add_bos=True)
        return prompt

    def generate(self, prompts, sampling_params: SamplingParams | Sequence[SamplingParams] | None = None
                 ) -> list[RequestOutput]:
        """Run every prompt to completion; one ``RequestOutput`` per prompt, in order.

        A prompt or parameter set that is invalid gets an output with ``error`` set and
        ``finish_reason == "rejected"``; the others are served normally.
        """
        if prompts is None or isinstance(prompts, (bytes, dict)) or not hasattr(prompts, "__len__"):
            raise TypeError("prompts debe ser un texto, una lista de ids de token o una lista de "
                            f"ellos; se recibió {type(prompts).__name__}")
        # (a list may hold a bad entry: that prompt alone is rejected below)
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
            raise ValueError(f"{len(prompts)} prompts but {len(sampling_params)} SamplingParams; "
                             "give one, or one per prompt")
        entries: list[Request | RequestOutput] = []
        for prompt, params in zip(prompts, sampling_params):
            try:
                entries.append(self.engine.add_request(self._encode(prompt), params))
            except RequestRejected as e:
                try:
                    ids = [] if isinstance(prompt, str) else list(
                        prompt.tolist() if isinstance(prompt, torch.Tensor) else prompt)
                except TypeError:  # not a sequence at all (None, a number): nothing to echo
                    ids = []
                entries.append(RequestOutput(f"rejected-{len(entries)}", ids, [], True,
                                             FinishReason.REJECTED, error=str(e)))
        while self.engine.has_unfinished_requests():
            self.engine.step()
        self.engine.retire_finished()
        outputs = []
        for s in entries:
            if isinstance(s, RequestOutput):
                outputs.append(s)
                continue
            text = self.tokenizer.decode(s.output_token_ids) if self.tokenizer is not None else None
            outputs.append(RequestOutput.of(s, text))
        return outputs


__all__ = ["Executor", "KVManager", "KV_LAYOUTS", "LLM", "LLMEngine", "StepEntry", "StepRecord", "build_engine"]
