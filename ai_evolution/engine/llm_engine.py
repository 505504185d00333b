"""The engine's step loop: ``LLMEngine``.

``LLMEngine.step()`` is one iteration: schedule, execute, record. A lab can call it by hand and
inspect ``engine.history`` (what every step ran, when, who joined, left or was preempted, who held
KV) and every request's timing record; ``engine.step_hooks`` are called after every step (a
progress bar counts finished requests with one).

One request's path: ``add_request`` validates it and queues it in the scheduler; each ``step()``
asks the scheduler for a ``SchedulerOutput`` (a frozen snapshot: the policy retires and admits,
the KV manager gives blocks), the executor runs it and returns a ``StepResult`` (the sampled
tokens, the errors), and ``Scheduler.update_from_output`` appends the tokens and finishes the
request on a stop token or its length. With speculative decoding the drafter then proposes the
next draft tokens, which enter the scheduler through ``update_draft_token_ids``. When nothing is
left to run, the engine retires the finished requests (their KV goes back to the pool).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from typing import Callable, NamedTuple, Protocol, Sequence

from .drafter import DraftProposer, NgramProposer
from .request import Request, RequestOutput, RequestRejected, SamplingParams, validate_prompt
from .scheduler import PolicyError, Scheduler
from .scheduling_policy import check_tags
from .step import SchedulerOutput, StepResult


class Executor(Protocol):
    """What the engine needs from whoever runs a step: the real model (``ModelRunner``) or the
    simulator (``SimExecutor``). Its partner on the scheduler's side is ``KVManager``. An
    executor that holds the KV tensors also has ``check_kv(kv, max_model_len)``, which refuses a
    KV manager that places tokens outside them (the engine calls it when it is built)."""

    def now(self) -> float:
        """The clock every timestamp is read from (seconds)."""

    def idle_until(self, t: float) -> None:
        """Nothing to run before ``t``: let the clock reach it."""

    def execute(self, out: SchedulerOutput) -> StepResult:
        """Run the step: the sampled tokens of every request whose pending tokens it completed,
        and the exception of every request whose part failed."""


class ExecutorFailed(RuntimeError):
    """The executor can run no more steps (a tensor-parallel rank died or fell out of step): the
    engine raises it at once instead of retrying the step request by request."""


class StepEntry(NamedTuple):
    """One request's part in a step."""

    request_id: str
    first_block: int  # the first block of its table (contiguous layout: its row)
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

    @classmethod
    def of(cls, out: SchedulerOutput, start: float, end: float) -> "StepRecord":
        """The record of the step ``out``, run from ``start`` to ``end``."""
        return cls(out.step, start, end,
                   tuple(StepEntry(s.request_id, s.first_block, s.num_tokens, s.context_len,
                                   s.is_prefill, len(s.draft_token_ids)) for s in out.scheduled),
                   out.holders, out.num_blocks, out.admitted, out.retired, out.preempted)

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
                 eos_token_id: int | None = None,
                 drafter: DraftProposer | NgramProposer | None = None) -> None:
        check_kv = getattr(executor, "check_kv", None)  # (the simulator holds no KV tensors)
        if check_kv is not None:
            check_kv(scheduler.kv, scheduler.max_model_len)
        self.scheduler = scheduler
        self.executor = executor
        self.drafter = drafter  # speculative decoding (chapter 9), greedy requests only
        self.vocab_size = vocab_size
        self.eos_token_id = eos_token_id
        self.requests: dict[str, Request] = {}
        self.history: list[StepRecord] = []
        # called after every step with its record and outputs (progress bars, live metrics)
        self.step_hooks: list[Callable[[StepRecord, list[RequestOutput]], None]] = []
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
                    request_id: str | None = None, arrival_time: float | None = None,
                    priority: int = 0, tenant: str | None = None) -> Request:
        """Queue a request (it may arrive while others run), with its scheduling tags:
        ``priority`` (an integer, lower first, as vLLM's) and ``tenant`` (who sent it; see
        ``scheduling_policy``). Invalid input raises ``RequestRejected`` and leaves the engine
        exactly as it was."""
        params = SamplingParams() if params is None else params
        prompt = self._validate(prompt_token_ids, params)
        check_tags(priority, tenant)
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
        self.scheduler.add_request(req, priority, tenant)
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
        policy retires it, or when the engine runs dry, as any finished request. An unknown id, or a request that has not
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

    def step(self, outputs: bool = True) -> list[RequestOutput]:
        """Schedule, execute, record; the outputs of the requests that got a token or an error.
        ``outputs=False`` builds them only for the step hooks, if any, and returns an empty list
        otherwise: for a driver that reads the requests themselves, as ``run`` does (each output
        copies its request's prompt, a share of a simulated step's cost)."""
        out = self.scheduler.schedule()
        if out.is_empty:
            return self._nothing_to_run()
        start = self.now()
        result = self._execute(out)
        end = self.now()
        updated = self.scheduler.update_from_output(out, result, start, end)
        reported = [RequestOutput.of(r) for r in updated] if outputs or self.step_hooks else []
        if self.drafter is not None:
            drafts = self.drafter.propose_drafts(self.scheduler.running)
            self.scheduler.update_draft_token_ids(drafts, self.drafter.draft_probs)
        self._record(StepRecord.of(out, start, end), reported)
        if not self.scheduler.has_unfinished_requests():
            self.retire_finished()
        return reported

    def _nothing_to_run(self) -> list[RequestOutput]:
        if self.scheduler.has_unfinished_requests():
            waiting = [r.request_id for r in self.scheduler.waiting]
            raise PolicyError(f"la política {self.scheduler.policy_name!r} no dejó nada que "
                              f"ejecutar aunque hay peticiones pendientes (en cola: {waiting}); "
                              "el motor se quedaría parado para siempre")
        self.retire_finished()
        return []

    def _record(self, record: StepRecord, outputs: list[RequestOutput]) -> None:
        self.history.append(record)
        for hook in self.step_hooks:
            hook(record, outputs)

    def _execute(self, out: SchedulerOutput) -> StepResult:
        """Run a step. If it raises as a whole, each request runs again alone to find the one
        that caused it (re-running writes the same K/V to the same positions), so one bad
        request fails only itself. A hybrid's fixed state is updated in place, so running a
        request again would advance it twice: only the requests whose step starts their state
        afresh (from position 0 or from a checkpoint) run again; the others are listed in
        ``StepResult.recompute``, and the scheduler preempts them (they compute their state
        again)."""
        try:
            return self.executor.execute(out)
        except ExecutorFailed:
            raise
        except Exception as err:  # noqa: BLE001 - isolated below, never lost
            if len(out.scheduled) == 1:
                return StepResult(errors={out.scheduled[0].request_id: err})
        result = StepResult()
        if getattr(self.executor, "state", None) is not None:
            dirty = tuple(s.request_id for s in out.scheduled
                          if s.start > 0 and s.state_restore is None)
            result = StepResult(recompute=dirty)
            out = replace(out, scheduled=tuple(s for s in out.scheduled
                                               if s.request_id not in dirty))
        for s in out.scheduled:
            try:
                alone = self.executor.execute(replace(out, scheduled=(s,)))
            except Exception as err:  # noqa: BLE001 - that request's error
                alone = StepResult(errors={s.request_id: err})
            result = result.merged(alone)
        return result

    def run(self, arrivals: Sequence[tuple] = ()) -> list[Request]:
        """Serve ``(arrival_time, prompt, params)`` online: each request is added when the clock
        reaches its arrival time (relative to now), and the loop runs until all have finished.
        An item may carry a fourth element, its scheduling tags ``{"priority": p, "tenant":
        name}`` (either key may be left out; a ``loadgen.workload.WorkItem`` has them).
        Returns the requests in the order given. Every item is checked before anything runs: an
        invalid one raises ``RequestRejected`` naming its index, and nothing is added."""
        items = []
        for i, item in enumerate(arrivals):
            try:
                t, p, sp, tags = _arrival(item)
                self._validate(p, sp)
                check_tags(**tags)
                if isinstance(t, bool) or not isinstance(t, (int, float)) or not t >= 0:
                    raise RequestRejected(f"el instante de llegada debe ser >= 0; se recibió {t!r}")
            except RequestRejected as err:
                raise RequestRejected(f"llegada {i}: {err}") from None
            items.append((t, p, sp, tags))
        t0 = self.now()
        pending = sorted(((t0 + t, i, p, sp, tags) for i, (t, p, sp, tags) in enumerate(items)),
                         key=lambda a: (a[0], a[1]))
        added: dict[int, Request] = {}
        k = 0
        while k < len(pending) or self.has_unfinished_requests():
            while k < len(pending) and pending[k][0] <= self.now():
                t, i, p, sp, tags = pending[k]
                added[i] = self.add_request(p, sp, arrival_time=t, **tags)
                k += 1
            if self.has_unfinished_requests():
                self.step(outputs=False)
            elif k < len(pending):
                self.executor.idle_until(pending[k][0])
        return [added[i] for i in range(len(pending))]

    def retire_finished(self) -> list[str]:
        """Free the KV of every finished request still in the batch (the work is over; see
        ``Scheduler.retire_finished``). Returns their ids. ``step`` does it when nothing is left
        to run; a driver calls it only to end the work early."""
        return [r.request_id for r in self.scheduler.retire_finished()]




def _arrival(item) -> tuple:
    """``(t, prompt, params, tags)`` from an arrival of 3 or 4 elements (``RequestRejected``
    naming the accepted shapes otherwise)."""
    n = len(item) if isinstance(item, (tuple, list)) else -1
    if n not in (3, 4) or (n == 4 and item[3] is not None and not isinstance(item[3], dict)):
        raise RequestRejected("cada llegada debe ser (instante, prompt, params) o (instante, "
                              "prompt, params, {'priority': p, 'tenant': nombre}); se recibió "
                              f"{type(item).__name__} de {n} elementos")
    tags = dict(item[3] or {}) if n == 4 else {}
    unknown = sorted(set(tags) - {"priority", "tenant"})
    if unknown:
        raise RequestRejected(f"etiquetas de planificación desconocidas: {unknown}; aceptadas: "
                              "priority, tenant")
    return item[0], item[1], item[2], {"priority": tags.get("priority", 0),
                                       "tenant": tags.get("tenant")}


__all__ = ["Executor", "ExecutorFailed", "LLMEngine", "StepEntry", "StepRecord"]
