"""The scheduler decides *what* runs at each step; an executor runs it.

At every step the scheduler asks its **policy** which requests leave the batch and which join
it, applies that plan to the KV cache (freeing and reserving blocks), and hands the executor a
``SchedulerOutput``: a frozen snapshot of which requests run, with their tokens, positions and
blocks (``engine/step.py``). The same object drives the real model (``engine.runner.ModelRunner``)
and the simulator (``sim.executor.SimExecutor``); their ``StepResult`` comes back to
``update_from_output``, and only the scheduler writes the requests' state.

Policies are plain functions ``policy(running, waiting, max_num_seqs) -> BatchPlan``:

- ``static_batching``: a batch is formed from the waiting queue and held until its last member
  finishes; finished members keep their KV rows (idle) until then, and nobody joins meanwhile.
- ``continuous_batching`` (Orca's iteration-level scheduling): at every step, finished members
  leave at once and waiting requests join up to ``max_num_seqs``.

A step runs, in one forward pass, the whole prompt of every request that has just joined
(prefill) and one token of every other running request (decode): prefill is batched *with*
decode, as Orca does. Chapter 5 replaces this with a token budget and chunked prefill.

Token budget (chapter 5): with ``max_num_batched_tokens`` a step computes at most that many
tokens. Running requests go first, oldest first (one decode token each, or the next chunk of
a prompt), then the plan's admissions; with ``enable_chunked_prefill`` a prompt that does not fit
in what is left is split into chunks over several steps, running alongside the others' decodes
(the vLLM v1 design: no separate prefill and decode phases). A chunk samples nothing; the token
comes with the chunk that completes the prompt.

Retirement: a request leaves the batch (and frees its KV) when the policy retires it, which
for static batching is only when its whole batch has finished. ``retire_finished()`` is the end
of the work: every finished request leaves, whatever the policy (the engine calls it when nothing
is left to run).

Scheduling policy (chapter 12, ``scheduling_policy.py``): the queue is handed to the batching
policy in the order a scheduling policy gives (``"fcfs"``: arrival; ``"priority"``; ``"vtc"``
fair share between tenants), which also names the preemption victim.

Memory: the plan's admissions are applied in order while the KV cache can hold them (the rest
keep waiting behind the first that does not fit). With paged KV a running request may find no block for
its next token; then the newest running request is **preempted by recompute**: its blocks are
freed, its computed tokens forgotten, and it goes back to the head of the queue (whatever of its
prefix is still cached is reused when it returns; vLLM's reason to take the newest is
first-come-first-served priority). A step that preempts admits nobody.
"""

from __future__ import annotations

import numbers
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

import torch

from ..speculative import greedy_accept, rejection_sample
from .kv_cache import ContiguousKVManager, KVManager
from .request import FinishReason, Request, RequestStatus
from .scheduling_policy import SchedulingPolicy, make_scheduling_policy, newest_unfinished
from .step import ScheduledRequest, SchedulerOutput, StepResult


class PolicyError(ValueError):
    """A policy returned a plan the scheduler cannot apply (the message says why, in Spanish)."""


@dataclass
class BatchPlan:
    """What changes in the batch before this step: ``retire`` leave, ``admit`` join (in order)."""

    retire: list[Request] = field(default_factory=list)
    admit: list[Request] = field(default_factory=list)


Policy = Callable[[Sequence[Request], Sequence[Request], int], BatchPlan]


def static_batching(running: Sequence[Request], waiting: Sequence[Request],
                    max_num_seqs: int) -> BatchPlan:
    """Hold the batch until every member has finished; then replace it by the next one."""
    if any(not r.is_finished for r in running):
        return BatchPlan()
    return BatchPlan(retire=list(running), admit=list(waiting[:max_num_seqs]))


def continuous_batching(running: Sequence[Request], waiting: Sequence[Request],
                        max_num_seqs: int) -> BatchPlan:
    """Retire every finished request and fill the freed places from the queue, first come first."""
    retire = [r for r in running if r.is_finished]
    free = max_num_seqs - (len(running) - len(retire))
    return BatchPlan(retire=retire, admit=list(waiting[:free]))


POLICIES: dict[str, Policy] = {"static": static_batching, "continuous": continuous_batching}


def resolve_policy(policy: str | Policy) -> tuple[str, Policy]:
    if callable(policy):
        return getattr(policy, "__name__", "custom"), policy
    if policy not in POLICIES:
        raise ValueError(f"política {policy!r} desconocida; aceptadas: {', '.join(POLICIES)} "
                         f"o una función policy(running, waiting, max_num_seqs) -> BatchPlan")
    return policy, POLICIES[policy]


def check_positive_int(name: str, value, allow_none: bool = False) -> None:
    """``value`` must be an integer >= 1 (or None, with ``allow_none``): a Spanish
    ``ValueError`` otherwise."""
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} debe ser un entero >= 1{' o None' if allow_none else ''}; "
                         f"se recibió {value!r}")


def check_token_budget(max_num_batched_tokens: int | None, max_model_len: int,
                       enable_chunked_prefill: bool) -> None:
    """The step's token budget must be None or an integer >= 1, and, without chunked prefill,
    hold the longest prompt (a Spanish ``ValueError`` otherwise)."""
    budget = max_num_batched_tokens
    check_positive_int("max_num_batched_tokens", budget, allow_none=True)
    if budget is not None and not enable_chunked_prefill and budget < max_model_len:
        raise ValueError(f"sin prefill troceado, max_num_batched_tokens ({budget}) debe ser >= "
                         f"max_model_len ({max_model_len}): si no, un prompt largo no cabría "
                         "nunca en un paso; suba el presupuesto o active enable_chunked_prefill")


def derived_seed(seed: int, stream: int) -> int:
    """A seed for the ``stream``-th random stream of a request seeded with ``seed`` (the
    executor's sampling uses ``seed`` itself; rejection sampling and a draft model's sampling
    use others, so that their draws are independent)."""
    return (seed * 0x9E3779B1 + stream * 0x632BE59BD9B4E019) % 2**63


def step_error(step: int, err: BaseException, limit: int = 300) -> str:
    """The Spanish message of a request whose part of step ``step`` raised ``err``."""
    text = f"la petición falló en el paso {step}: {type(err).__name__}: {err}"
    return text if len(text) <= limit else text[:limit - 1] + "…"


def tokens_for(want: int, budget: float, chunked: bool) -> int:
    """Tokens a request that still needs ``want`` gets from what is left of the step's budget:
    all of them if they fit; otherwise a chunk of what is left (chunked prefill) or none (it
    waits for the next step)."""
    if want <= budget:
        return want
    return int(budget) if chunked and budget >= 1 else 0


class Scheduler:
    """FCFS queue + running batch + KV placement, driven by a batching policy."""

    def __init__(self, max_num_seqs: int, max_model_len: int, policy: str | Policy = "continuous",
                 kv: KVManager | None = None,
                 max_num_batched_tokens: int | None = None,
                 enable_chunked_prefill: bool = False, token_fn=None, victim_fn=None,
                 scheduling_policy: "str | SchedulingPolicy | None" = None) -> None:
        check_positive_int("max_num_seqs", max_num_seqs)
        check_token_budget(max_num_batched_tokens, max_model_len, enable_chunked_prefill)
        self.max_num_batched_tokens = max_num_batched_tokens
        self.enable_chunked_prefill = enable_chunked_prefill
        # Plug-ins for the chapter 5 exercises: token_fn(want, budget, chunked) -> tokens, and
        # victim_fn(running) -> the request to preempt.
        self.token_fn = token_fn or tokens_for
        # The scheduling policy (chapter 12) orders the queue and names the preemption victim
        # (a victim_fn given here wins over it).
        self.scheduling = (scheduling_policy if isinstance(scheduling_policy, SchedulingPolicy)
                           else make_scheduling_policy(scheduling_policy))
        self.victim_fn = victim_fn or self.scheduling.victim
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.policy_name, self.policy = resolve_policy(policy)
        self.kv = kv if kv is not None else ContiguousKVManager(max_num_seqs, max_model_len)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # holders of KV, in join order
        self._step = 0
        self.num_preemptions = 0
        self.preempted_tokens = 0  # computed tokens thrown away by preemption (to recompute)
        self._finished_ids: set[str] = set()  # finished since the last step handed out
        self._generators: dict[str, torch.Generator] = {}  # speculative sampling, per request

    # --- queue ---------------------------------------------------------------------------------
    def add_request(self, request: Request, priority: int = 0, tenant: str | None = None) -> None:
        """Queue ``request`` with its scheduling tags (see ``scheduling_policy``): ``priority``
        (an integer, lower first) and ``tenant`` (a name, or None)."""
        self.scheduling.on_arrival(request, priority, tenant)
        request.status = RequestStatus.WAITING
        self.waiting.append(request)

    def abort_request(self, request_id: str, now: float) -> Request | None:
        for r in list(self.waiting) + self.running:
            if r.request_id == request_id and not r.is_finished:
                if r in self.waiting:
                    self._leave_queue(r)
                self._finish(r, FinishReason.ABORT, now)
                return r
        return None

    def fail_request(self, request: Request, message: str, now: float) -> None:
        """Finish ``request`` with ``FinishReason.ERROR``: its part of a step failed. Its KV is
        freed like an aborted request's; the other requests are untouched."""
        if request.is_finished:
            return
        if request in self.waiting:
            self._leave_queue(request)
        request.error = message
        self._finish(request, FinishReason.ERROR, now)

    def _leave_queue(self, request: Request) -> None:
        self.waiting.remove(request)
        self.kv.free(request)
        self.scheduling.on_left_queue(request)

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting) or any(not r.is_finished for r in self.running)

    @property
    def num_running(self) -> int:
        """Requests in the batch that have not finished."""
        return sum(1 for r in self.running if not r.is_finished)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def retire_finished(self) -> list[Request]:
        """The work is over: every finished request leaves the batch and frees its KV, whatever
        the policy (static batching holds finished members until its batch ends: this is that
        end). Returns them, in batch order."""
        done = [r for r in self.running if r.is_finished]
        for r in done:
            self.running.remove(r)
            self.kv.free(r)
        return done

    def update_draft_token_ids(self, draft_token_ids: dict[str, list[int]],
                               draft_probs: dict | None = None) -> None:
        """The draft tokens of every running request for its next step (speculative decoding;
        as vLLM v1's method of the same name): request id -> tokens, none for a request not
        named. They ride along with the request's next decode token if the token budget and the
        memory allow, and are verified in that same forward pass. ``draft_probs``: for sampled
        requests whose drafts a model sampled, the distributions ``[k, V]`` they were drawn
        from (a request not named there has point-mass drafts, as n-gram proposals)."""
        draft_probs = draft_probs or {}
        for r in self.running:
            r.draft_token_ids = list(draft_token_ids.get(r.request_id, ()))
            r.draft_probs = draft_probs.get(r.request_id) if r.draft_token_ids else None

    # --- one step ------------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        """Plan the next step (see ``_plan_once``). A plan that changes the batch (retires or
        preempts) but leaves nothing to run is followed by a fresh plan on the new state (e.g.
        static batching on paged KV: its last unfinished member yields its blocks to members that
        have finished, and only the next plan retires them and admits the next batch). Each such
        round takes at least one request out of the batch and admits none, so there are at most
        ``len(running) + 1`` rounds; the output lists every round's retirements and preemptions."""
        retired: list[str] = []
        preempted: list[str] = []
        while True:
            out = self._plan_once()
            retired += out.retired
            preempted += out.preempted
            if not out.is_empty or not (out.retired or out.preempted):
                break
        finished = frozenset(self._finished_ids)
        if not out.is_empty:  # the executor hears of them with the next step it runs
            self._finished_ids.clear()
        return replace(out, retired=tuple(retired), preempted=tuple(preempted),
                       finished_req_ids=finished)

    def _plan_once(self) -> SchedulerOutput:
        """Apply the policy's plan, find KV for every running request's new tokens (preempting
        the newest running requests if memory is short), admit what fits, and take a snapshot
        of the work."""
        running, waiting = list(self.running), list(self.scheduling.order(self.waiting))
        plan = self.policy(tuple(running), tuple(waiting), self.max_num_seqs)
        self._check_plan(plan, running, waiting)
        for r in plan.retire:
            self.running.remove(r)
            self.kv.free(r)
        budget = self.max_num_batched_tokens if self.max_num_batched_tokens is not None else float("inf")
        preempted: list[Request] = []
        work: dict[str, tuple[int, list[int]]] = {}  # request id -> (its tokens, draft tokens)
        # Running requests first, oldest first: each takes what it needs from the token budget
        # (a prefill chunk, or one decode token and the draft tokens that fit).
        for r in list(self.running):
            if r.is_finished or r in preempted:
                continue
            pending = r.num_tokens - r.num_computed_tokens
            n = self._tokens(pending, budget)
            if n == 0:
                continue
            drafts = self._reserve_with_drafts(r, n, budget) if n == pending else []
            if not drafts:
                preempted += self._reserve_or_preempt(r, n)
            if r in self.running:
                work[r.request_id] = (n, drafts)
                budget -= n + len(drafts)
        # a step that had to preempt admits nobody
        admitted = [] if preempted else self._admit(plan.admit, budget, work)
        scheduled = tuple(self._snapshot(r, *work[r.request_id])
                          for r in self.running if r.request_id in work)
        out = SchedulerOutput(self._step, scheduled, tuple(r.request_id for r in admitted),
                              tuple(r.request_id for r in plan.retire), self.kv.holders,
                              self.kv.num_blocks, tuple(r.request_id for r in preempted))
        if scheduled:
            self._step += 1
        return out

    def _reserve_with_drafts(self, r: Request, n: int, budget: float) -> list[int]:
        """The draft tokens that ride along with a decode token, with KV reserved for both: as
        many as the budget leaves room for, or none when memory is short (drafts never cost a
        preemption)."""
        drafts = r.draft_token_ids[:max(0, int(min(budget - n, len(r.draft_token_ids))))]
        if not drafts:
            return []
        new_blocks = self.kv.allocate_slots(r, n + len(drafts))
        return [] if new_blocks is None else drafts

    def _reserve_or_preempt(self, r: Request, n: int) -> list[Request]:
        """KV for ``n`` more tokens of ``r``, preempting the victims ``victim_fn`` names until
        it fits (or until ``r`` itself is the victim). Returns the preempted requests."""
        preempted: list[Request] = []
        new_blocks = self.kv.allocate_slots(r, n)
        while new_blocks is None:
            victim = self.victim_fn(tuple(self.running))
            # by identity: a Request compares equal to a copy of itself, and preempting a
            # copy would take the real request out of the batch and lose it
            if not any(victim is x for x in self.running) or victim.is_finished:
                raise PolicyError(f"la víctima elegida ({getattr(victim, 'request_id', victim)!r}) "
                                  "no es una petición en curso sin terminar")
            self._preempt(victim)
            preempted.append(victim)
            if victim is r:
                break
            new_blocks = self.kv.allocate_slots(r, n)
        return preempted

    def _admit(self, candidates: Sequence[Request], budget: float,
               work: dict[str, tuple[int, list[int]]]) -> list[Request]:
        """Admit the plan's candidates in order while the budget and the KV cache hold them
        (first come, first served: the rest wait behind the first that does not fit). A prompt
        prefix already in the cache is not computed again: the KV manager finds it, and that
        count is the request's computed tokens."""
        admitted = []
        for r in candidates:
            cached_blocks, num_cached_tokens = self.kv.get_computed_blocks(r)
            n = self._tokens(r.num_tokens - num_cached_tokens, budget)
            new_blocks = None if n == 0 else self.kv.allocate_slots(r, n, cached_blocks)
            if new_blocks is None:
                break
            r.num_computed_tokens = num_cached_tokens
            self.waiting.remove(r)
            self.running.append(r)
            r.status = RequestStatus.RUNNING
            self.scheduling.on_admitted(r)
            admitted.append(r)
            work[r.request_id] = (n, [])
            budget -= n
        return admitted

    def _snapshot(self, r: Request, n: int, drafts: list[int]) -> ScheduledRequest:
        """What the executor needs of ``r`` for this step, as values."""
        start = r.num_computed_tokens
        return ScheduledRequest(r.request_id, tuple(r.token_ids_between(start, start + n)) + tuple(drafts),
                                start, tuple(self.kv.block_table(r.request_id)), r.num_prompt_tokens,
                                r.sampling_params, start + n == r.num_tokens, tuple(drafts),
                                **self._state_step(r, start, n))

    def _state_step(self, r: Request, start: int, n: int) -> dict:
        """The request's state slot, checkpoint to restore and checkpoints to save in this step,
        when the KV manager keeps a hybrid's states (``state_slots.HybridKVManager``)."""
        state_step = getattr(self.kv, "state_step", None)
        return {} if state_step is None else state_step(r, start, n, self._step)

    def _tokens(self, want: int, budget: float) -> int:
        n = self.token_fn(want, budget, self.enable_chunked_prefill)
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= min(want, budget):
            raise PolicyError(f"el reparto de tokens devolvió {n!r} para una petición que necesita "
                              f"{want} con {budget} de presupuesto: debe ser un entero entre 0 y "
                              f"{min(want, budget)}")
        return n

    def _preempt(self, r: Request) -> None:
        """Preemption by recompute: free its KV, forget what it computed, queue it first."""
        self.running.remove(r)
        self.kv.free(r)
        self.num_preemptions += 1
        self.preempted_tokens += r.num_computed_tokens
        r.num_preemptions += 1
        r.num_computed_tokens = 0
        r.draft_token_ids, r.draft_probs = [], None
        r.status = RequestStatus.PREEMPTED
        self.waiting.appendleft(r)
        self.scheduling.on_requeued(r)

    def update_from_output(self, output: SchedulerOutput, result: StepResult, start: float,
                           now: float) -> list[Request]:
        """Record the step ``output`` that ran from ``start`` to ``now``: a request whose part
        failed finishes with its error; the others append their new tokens and finish on a stop
        token or their length. Returns the requests that got a token or an error, in step order.

        A request that verified draft tokens gets the target's token at each of the k + 1
        verified positions: the longest prefix of drafts the target agrees with is accepted, plus
        the target's next token (``speculative.greedy_accept``); the K/V of rejected drafts are
        forgotten (``num_computed_tokens`` stops before them) and their surplus blocks freed. A
        sampled request's drafts are verified by rejection sampling (``_verify``). A request in
        ``result.recompute`` (a hybrid's state the failed step may have half-updated) is
        preempted by recompute."""
        by_id = {r.request_id: r for r in self.running}
        updated = []
        for s in output.scheduled:
            r = by_id[s.request_id]
            if s.request_id in result.recompute:
                self._preempt(r)
                continue
            if r.first_scheduled_time is None:
                r.first_scheduled_time = start
            if s.request_id in result.errors:
                self.fail_request(r, step_error(output.step, result.errors[s.request_id]), now)
                updated.append(r)
                continue
            k = len(s.draft_token_ids)
            r.num_computed_tokens = s.context_len - k
            draft_probs, r.draft_token_ids, r.draft_probs = r.draft_probs, [], None
            if not s.samples:  # a prompt chunk that samples nothing
                self.kv.cache_full_blocks(r)
                continue
            sampled = result.sampled_token_ids[s.request_id]
            if k:
                accepted, nxt = self._verify(r, s.draft_token_ids, sampled,
                                             result.target_probs.get(s.request_id), draft_probs)
                new = [*s.draft_token_ids[:accepted], nxt]
                r.num_computed_tokens += accepted  # their K/V were computed on the right prefix
                r.num_draft_tokens += k
                r.num_accepted_tokens += accepted
            else:
                new = [sampled[0]]
            for token in new:
                self._append(r, token, now)
                if r.is_finished:
                    break
            r.num_computed_tokens = min(r.num_computed_tokens, r.num_tokens)
            if k:
                self.kv.trim(r, r.num_computed_tokens)
            self.kv.cache_full_blocks(r)
            updated.append(r)
        return updated

    def _verify(self, r: Request, drafts: tuple[int, ...], sampled: tuple[int, ...], target_probs,
                draft_probs) -> tuple[int, int]:
        """``(num_accepted, next_token)`` for ``r``'s verified drafts: greedy (the target's
        argmax at each place, ``sampled``), or, when the executor returned the target's
        distributions, rejection sampling (Leviathan et al.): keep ``d_i`` with probability
        ``min(1, p_i(d_i) / q_i(d_i))``, resample the first rejected place from
        ``norm(max(0, p_i - q_i))``. With point-mass drafts (n-gram proposals, no
        ``draft_probs``) ``q_i`` is the one-hot of ``d_i``: keep it with probability
        ``p_i(d_i)``, else sample from ``p_i`` without it. The emitted tokens are distributed
        as the target's own samples; the draws use the request's generator (its ``seed``)."""
        if target_probs is None:
            return greedy_accept(drafts, sampled)
        k, vocab = len(drafts), target_probs.shape[-1]
        if draft_probs is None:
            q = torch.nn.functional.one_hot(torch.tensor(drafts), vocab).to(target_probs.dtype)
        else:
            q = draft_probs[:k].to(target_probs.dtype)
        return rejection_sample(drafts, q, target_probs, self._generator(r))

    def _generator(self, r: Request) -> torch.Generator:
        """The generator of ``r``'s rejection-sampling draws, seeded from its ``seed`` (kept
        until it finishes)."""
        g = self._generators.get(r.request_id)
        if g is None:
            g = self._generators[r.request_id] = torch.Generator()
            seed = r.sampling_params.seed
            # a stream of its own: the executor's sampling generator starts from ``seed`` itself
            g.manual_seed(derived_seed(seed, 1)) if seed is not None else g.seed()
        return g

    def _append(self, r: Request, token: int, now: float) -> None:
        r.output_token_ids.append(token)
        r.token_times.append(now)
        self.scheduling.on_output_tokens(r, 1)
        if r.first_token_time is None:
            r.first_token_time = now
        if token in r.stop_token_set:
            self._finish(r, FinishReason.STOP, now)
        elif len(r.output_token_ids) >= r.sampling_params.max_tokens or r.num_tokens >= self.max_model_len:
            self._finish(r, FinishReason.LENGTH, now)

    def _finish(self, r: Request, reason: FinishReason, now: float) -> None:
        r.status = RequestStatus.FINISHED
        r.finish_reason = reason
        r.finish_time = now
        self._finished_ids.add(r.request_id)
        self._generators.pop(r.request_id, None)
        self.scheduling.on_finished(r)

    def _check_plan(self, plan, running: list[Request], waiting: list[Request]) -> None:
        """Refuse a plan that would lose a request, duplicate one or overfill the batch."""
        if not isinstance(plan, BatchPlan):
            raise PolicyError(f"la política debe devolver un BatchPlan(retire=[...], admit=[...]); "
                              f"devolvió {type(plan).__name__}")
        ids = lambda rs: [r.request_id for r in rs]  # noqa: E731
        for name, group, pool, where in (("retire", plan.retire, running, "el lote (running)"),
                                         ("admit", plan.admit, waiting, "la cola (waiting)")):
            if not group:  # most steps: nothing to check against the (long) queue
                continue
            if len(set(ids(group))) != len(group):
                raise PolicyError(f"{name} repite alguna petición: {ids(group)}")
            pool_objs = {id(r) for r in pool}
            stray = [getattr(r, "request_id", r) for r in group if id(r) not in pool_objs]
            if stray:
                raise PolicyError(f"{name} contiene {stray}, que no están en {where} (hay que "
                                  f"devolver las mismas peticiones recibidas, no copias); en "
                                  f"{where} están {ids(pool)}")
        early = [r.request_id for r in plan.retire if not r.is_finished]
        if early:
            raise PolicyError(f"retire contiene {early}, que aún no han terminado: retirarlas "
                              f"perdería su trabajo (solo se retiran peticiones con is_finished)")
        size = len(running) - len(plan.retire) + len(plan.admit)
        if size > self.max_num_seqs:
            raise PolicyError(f"tras el plan el lote tendría {size} peticiones y max_num_seqs es "
                              f"{self.max_num_seqs} ({len(running)} en el lote - {len(plan.retire)} "
                              f"retiradas + {len(plan.admit)} admitidas)")
