"""The engine's step loop (``LLMEngine``) and the offline facade (``LLM``).

``LLMEngine.step()`` is one iteration: schedule, execute, record. A lab can call it by hand and
inspect ``engine.history`` (what every step ran, when, in which KV row) and every request's
timing record. ``LLM.generate`` is the vLLM-style shortcut that runs the loop to completion.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, Protocol, Sequence

import torch

from ..model.checkpoint import load_pretrained
from ..model.decoder import Transformer
from ..model.tokenizer import Tokenizer, load_tokenizer, shipped_names
from .request import (FinishReason, Request, RequestOutput, RequestRejected, RequestStatus,
                      SamplingParams, validate_prompt)
from .runner import ModelRunner
from .scheduler import Policy, Scheduler, SchedulerOutput


class Executor(Protocol):
    """What the engine needs from whoever runs a step: the real model or the simulator."""

    def now(self) -> float: ...
    def idle_until(self, t: float) -> None: ...
    def execute(self, out: SchedulerOutput) -> dict[str, int]: ...


class StepEntry(NamedTuple):
    """One request's part in a step."""

    request_id: str
    slot: int
    num_tokens: int   # tokens computed for it in this step
    context_len: int  # tokens in its cache after the step
    is_prefill: bool


@dataclass(frozen=True)
class StepRecord:
    """One executed step: when it ran and what each KV row held."""

    step: int
    start: float
    end: float
    scheduled: tuple[StepEntry, ...]
    slots: dict[str, int]  # every holder of a row (finished-but-held ones too) -> slot
    num_slots: int

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
                 eos_token_id: int | None = None) -> None:
        self.scheduler = scheduler
        self.executor = executor
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

    def add_request(self, prompt_token_ids: Sequence[int], params: SamplingParams | None = None,
                    request_id: str | None = None, arrival_time: float | None = None) -> Request:
        """Queue a request (it may arrive while others run). Invalid input raises
        ``RequestRejected`` and leaves the engine exactly as it was."""
        params = SamplingParams() if params is None else params
        if not isinstance(params, SamplingParams):
            raise RequestRejected(f"params debe ser un SamplingParams; se recibió {type(params).__name__}")
        problems = params.problems(self.vocab_size)
        if problems:
            raise RequestRejected("; ".join(problems))
        prompt = validate_prompt(prompt_token_ids, self.vocab_size, self.max_model_len)
        if request_id is None:
            request_id = str(next(self._ids))
            while request_id in self.requests:
                request_id = str(next(self._ids))
        elif request_id in self.requests:
            raise RequestRejected(f"ya existe una petición con request_id={request_id!r}")
        req = Request(str(request_id), prompt, params,
                      arrival_time=self.now() if arrival_time is None else arrival_time,
                      eos_token_id=self.eos_token_id)
        self.requests[req.request_id] = req
        self.scheduler.add_request(req)
        return req

    def abort_request(self, request_id: str) -> None:
        self.scheduler.abort_request(request_id, self.now())

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def step(self) -> list[RequestOutput]:
        """One iteration: schedule, execute, record. Returns the requests that got a token."""
        out = self.scheduler.schedule()
        if out.is_empty:
            return []
        start = self.executor.now()
        for s in out.scheduled:
            if s.request.first_scheduled_time is None:
                s.request.first_scheduled_time = start
        sampled = self.executor.execute(out)
        end = self.executor.now()
        self.scheduler.update_from_output(out, sampled, end)
        self.history.append(StepRecord(out.step, start, end,
                                       tuple(StepEntry(s.request_id, s.slot, s.num_tokens,
                                                       s.context_len, s.is_prefill)
                                             for s in out.scheduled),
                                       out.slots, out.num_slots))
        return [RequestOutput.of(s.request) for s in out.scheduled if s.request_id in sampled]

    def run(self, arrivals: Sequence[tuple[float, Sequence[int], SamplingParams]] = ()) -> list[Request]:
        """Serve ``(arrival_time, prompt, params)`` online: each request is added when the clock
        reaches its arrival time (relative to now), and the loop runs until all have finished.
        Returns the requests in the order given."""
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
        self.scheduler.schedule()  # retire what finished last, so every KV row is free again
        return [added[i] for i in range(len(pending))]


def _as_model(model, dtype, device) -> Transformer:
    if isinstance(model, Transformer):
        return model
    if isinstance(model, (str, Path)):
        return load_pretrained(model, dtype=dtype or torch.float32, device=device or "cpu")
    raise TypeError(f"model must be a Transformer, a shipped model name ({', '.join(shipped_names())}) "
                    f"or a checkpoint folder; got {type(model).__name__}")


class LLM:
    """``LLM("tiny-es").generate(["Hola"], SamplingParams(max_tokens=8))``, vLLM-style.

    ``policy`` is ``"continuous"`` (default), ``"static"`` or a policy function; ``max_num_seqs``
    is the batch width and the number of KV rows; ``max_model_len`` the tokens a row holds
    (default: the model's maximum).
    """

    def __init__(self, model: str | Path | Transformer = "tiny-es", *, tokenizer: Tokenizer | str | None = None,
                 max_num_seqs: int = 8, max_model_len: int | None = None,
                 policy: str | Policy = "continuous", dtype: torch.dtype | None = None,
                 device: str | torch.device | None = None) -> None:
        self.model = _as_model(model, dtype, device)
        config = self.model.config
        if tokenizer is None and isinstance(model, str) and model in shipped_names():
            tokenizer = model
        self.tokenizer = load_tokenizer(tokenizer) if isinstance(tokenizer, (str, Path)) else tokenizer
        max_model_len = max_model_len or config.max_position_embeddings
        scheduler = Scheduler(max_num_seqs, max_model_len, policy)
        eos = config.eos_token_id
        if eos is None and self.tokenizer is not None:
            eos = self.tokenizer.eos_token_id
        self.engine = LLMEngine(scheduler, ModelRunner(self.model, max_num_seqs, max_model_len),
                                config.vocab_size, eos)

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
        if isinstance(prompts, str) or (prompts and not isinstance(prompts[0], (str, list, tuple, torch.Tensor))):
            prompts = [prompts]
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            sampling_params = [sampling_params or SamplingParams()] * len(prompts)
        if len(sampling_params) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(sampling_params)} SamplingParams; "
                             "give one, or one per prompt")
        slots: list[Request | RequestOutput] = []
        for prompt, params in zip(prompts, sampling_params):
            try:
                slots.append(self.engine.add_request(self._encode(prompt), params))
            except RequestRejected as e:
                ids = list(prompt) if not isinstance(prompt, str) else []
                slots.append(RequestOutput("rejected", ids, [], True, FinishReason.REJECTED, error=str(e)))
        while self.engine.has_unfinished_requests():
            self.engine.step()
        self.engine.scheduler.schedule()  # retire the last finished requests
        outputs = []
        for s in slots:
            if isinstance(s, RequestOutput):
                outputs.append(s)
                continue
            text = self.tokenizer.decode(s.output_token_ids) if self.tokenizer is not None else None
            outputs.append(RequestOutput.of(s, text))
        return outputs


__all__ = ["Executor", "LLM", "LLMEngine", "StepEntry", "StepRecord"]
