"""Scheduling policies: who is admitted first, and who yields memory (chapter 12).

The batching policy (``scheduler.continuous_batching``...) says *how many* requests join the
batch; a **scheduling policy** says *which*, by ordering the waiting queue, and which running
request is preempted when memory is short. The one ``Scheduler`` consults it, so the engine and
the simulator share it. vLLM's names (``--scheduling-policy``):

- ``"fcfs"``: first come, first served (the queue's order; the newest running request yields).
- ``"priority"``: vLLM's semantics: the lowest ``priority`` value first, then the earliest
  arrival; the preemption victim is the running request with the highest value, then the latest
  arrival (vLLM v1's ``max(running, key=(priority, arrival_time))``).
- ``"vtc"``: the Virtual Token Counter of Sheng et al. (OSDI'24, "Fairness in Serving Large
  Language Models"). Each tenant has a counter of the weighted tokens it was served
  (``input_weight`` per prompt token, charged when its request is admitted; ``output_weight`` per
  generated token); the next admission comes from the backlogged tenant (one with requests in the
  queue) with the smallest counter, its earliest request. A tenant that becomes backlogged again
  has its counter lifted to the smallest counter of the backlogged tenants (or, if none, to that
  of the last tenant that left the queue): idle time is not credit to spend later. Between two
  continuously backlogged tenants the service difference stays within a bound (``vtc_bound``).

A policy changes who runs when, never the tokens: every request's tokens are those of the
request served alone.

Each request carries two scheduling tags, given to ``add_request``: ``priority`` (an integer,
lower first; default 0) and ``tenant`` (a name; default ``None``, one anonymous tenant). The
policy keeps them: ``Request`` gets no new fields.
"""

from __future__ import annotations

import numbers
from collections import Counter
from typing import Callable, Sequence

from .request import Request, RequestRejected, _short

# vLLM's names; "vtc" is this course's (vLLM has no fair-share policy).
SCHEDULING_POLICIES = ("fcfs", "priority", "vtc")
MAX_TENANT_LEN = 128
# The range of a priority: what a 64-bit signed integer holds.
PRIORITY_MIN, PRIORITY_MAX = -(2**63), 2**63 - 1


def newest_unfinished(running: Sequence[Request]) -> Request:
    """The preemption victim, as vLLM chooses it: the most recently admitted request that has
    not finished (first come, first served: the last to arrive yields first; it is not always
    the one that loses least work, since a long prompt admitted last loses most)."""
    return next(r for r in reversed(running) if not r.is_finished)


def check_tags(priority, tenant) -> None:
    """``priority`` must be an integer and ``tenant`` None or a non-empty name of at most
    ``MAX_TENANT_LEN`` characters: ``RequestRejected`` (Spanish) otherwise."""
    if (isinstance(priority, bool) or not isinstance(priority, numbers.Integral)
            or not PRIORITY_MIN <= priority <= PRIORITY_MAX):
        raise RequestRejected(f"priority debe ser un entero entre -2**63 y 2**63 - 1 (menor = "
                              f"antes); se recibió {_short(priority)}")
    if tenant is not None and (not isinstance(tenant, str) or not tenant
                               or len(tenant) > MAX_TENANT_LEN):
        raise RequestRejected(f"tenant debe ser None o un nombre de 1 a {MAX_TENANT_LEN} "
                              f"caracteres; se recibió {_short(tenant)}")


class SchedulingPolicy:
    """First come, first served; the base of every scheduling policy.

    The scheduler calls ``on_arrival`` when a request is queued, ``order`` to get the waiting
    queue in admission order, ``victim`` to choose whom to preempt, and tells the policy what
    happened: ``on_admitted``, ``on_requeued`` (preempted, back in the queue), ``on_left_queue``
    (aborted or failed while waiting), ``on_output_tokens`` and ``on_finished``."""

    name = "fcfs"

    def __init__(self) -> None:
        self.priority: dict[Request, int] = {}
        self.tenant: dict[Request, str | None] = {}

    def on_arrival(self, request: Request, priority: int = 0, tenant: str | None = None) -> None:
        check_tags(priority, tenant)
        self.priority[request] = int(priority)
        self.tenant[request] = tenant

    def order(self, waiting: Sequence[Request]) -> Sequence[Request]:
        """The waiting requests in the order they should be admitted."""
        return tuple(waiting)

    # The running request to preempt: the newest that has not finished (vLLM's FCFS).
    victim = staticmethod(newest_unfinished)

    def on_admitted(self, request: Request) -> None:
        pass

    def on_requeued(self, request: Request) -> None:
        pass

    def on_left_queue(self, request: Request) -> None:
        pass

    def on_output_tokens(self, request: Request, n: int) -> None:
        pass

    def on_finished(self, request: Request) -> None:
        self.priority.pop(request, None)
        self.tenant.pop(request, None)


FCFSPolicy = SchedulingPolicy


class PriorityPolicy(SchedulingPolicy):
    """vLLM's ``priority`` policy: admit by (priority, arrival); preempt the opposite end."""

    name = "priority"

    def order(self, waiting: Sequence[Request]) -> Sequence[Request]:
        # a stable sort: equal keys keep the queue's order (a preempted request goes first)
        return sorted(waiting, key=lambda r: (self.priority[r], r.arrival_time))

    def victim(self, running: Sequence[Request]) -> Request:
        candidates = [(self.priority[r], r.arrival_time, i) for i, r in enumerate(running)
                      if not r.is_finished]
        return running[max(candidates)[2]]


def least_served(counters: dict, backlogged: list) -> object:
    """VTC's admission rule: the backlogged tenant with the smallest counter (ties: the first
    in ``backlogged``, which lists them in queue order)."""
    return min(backlogged, key=counters.__getitem__)


class VTCPolicy(SchedulingPolicy):
    """The Virtual Token Counter (Sheng et al., OSDI'24): fair share of weighted tokens between
    tenants. ``counters[tenant]`` is the virtual counter (lifts included); ``served[tenant]`` the
    weighted tokens really served (prompt when admitted, outputs as generated). ``pick_fn
    (counters, backlogged) -> tenant`` is the admission rule (``least_served``; a student's
    function plugs in here: ``scheduling_policy=lambda: VTCPolicy(pick_fn=mine)``)."""

    name = "vtc"

    def __init__(self, input_weight: float = 1.0, output_weight: float = 2.0,
                 pick_fn: Callable[[dict, list], object] | None = None) -> None:
        super().__init__()
        self.pick_fn = pick_fn or least_served
        for label, w in (("input_weight", input_weight), ("output_weight", output_weight)):
            if isinstance(w, bool) or not isinstance(w, numbers.Real) or not w > 0:
                raise ValueError(f"{label} debe ser un número > 0; se recibió {_short(w)}")
        self.input_weight, self.output_weight = float(input_weight), float(output_weight)
        self.counters: dict[str | None, float] = {}
        self.served: dict[str | None, float] = {}
        self.queued: Counter = Counter()  # tenant -> its requests in the waiting queue
        self.last_left: str | None = None
        self._charged: set[Request] = set()  # requests whose prompt was already counted

    def backlogged(self) -> list[str | None]:
        return [t for t, n in self.queued.items() if n > 0]

    def on_arrival(self, request: Request, priority: int = 0, tenant: str | None = None) -> None:
        super().on_arrival(request, priority, tenant)
        if self.queued[tenant] == 0:  # the tenant (re)joins the queue: the counter lift
            c = self.counters.get(tenant, 0.0)
            others = [self.counters.get(t, 0.0) for t in self.backlogged()]
            if others:
                c = max(c, min(others))
            elif self.last_left in self.counters:
                c = max(c, self.counters[self.last_left])
            self.counters[tenant] = c
        self.queued[tenant] += 1

    def prompt_charge(self, request: Request) -> float:
        return 0.0 if request in self._charged else self.input_weight * request.num_prompt_tokens

    def order(self, waiting: Sequence[Request]) -> Sequence[Request]:
        """Repeatedly: the earliest request of the backlogged tenant with the smallest counter,
        charging its prompt to a copy of the counters (ties: the tenant first in the queue)."""
        queues: dict[str | None, list[Request]] = {}
        for r in waiting:
            queues.setdefault(self.tenant[r], []).append(r)
        counters = {t: self.counters.get(t, 0.0) for t in queues}
        heads = dict.fromkeys(queues, 0)
        out: list[Request] = []
        while heads:
            backlogged = list(heads)
            t = self.pick_fn(dict(counters), list(backlogged))
            if t not in heads:
                from .scheduler import PolicyError
                raise PolicyError(f"la regla de admisión devolvió {_short(t)}, que no es un tenant "
                                  f"con peticiones en cola; en cola: {backlogged}")
            r = queues[t][heads[t]]
            out.append(r)
            counters[t] += self.prompt_charge(r)
            heads[t] += 1
            if heads[t] == len(queues[t]):
                del heads[t]
        return out

    def on_admitted(self, request: Request) -> None:
        tenant = self.tenant[request]
        charge = self.prompt_charge(request)
        self._charged.add(request)
        self.counters[tenant] = self.counters.get(tenant, 0.0) + charge
        self.served[tenant] = self.served.get(tenant, 0.0) + charge
        self._leave_queue(tenant)

    def on_requeued(self, request: Request) -> None:
        self.queued[self.tenant[request]] += 1

    def on_left_queue(self, request: Request) -> None:
        self._leave_queue(self.tenant[request])

    def _leave_queue(self, tenant) -> None:
        self.queued[tenant] -= 1
        if self.queued[tenant] == 0:
            del self.queued[tenant]
            self.last_left = tenant

    def on_output_tokens(self, request: Request, n: int) -> None:
        tenant = self.tenant[request]
        self.counters[tenant] = self.counters.get(tenant, 0.0) + self.output_weight * n
        self.served[tenant] = self.served.get(tenant, 0.0) + self.output_weight * n

    def on_finished(self, request: Request) -> None:
        self._charged.discard(request)
        super().on_finished(request)


def vtc_bound(max_prompt_tokens: int, max_batch_tokens: int, input_weight: float = 1.0,
              output_weight: float = 2.0) -> float:
    """VTC's bound on the service difference between two continuously backlogged tenants over
    any interval (Sheng et al., OSDI'24, section 4): ``2 * U`` with
    ``U = max(input_weight * L_input, output_weight * M)``, ``L_input`` the longest prompt and
    ``M`` the most tokens the running batch holds (the KV cache's capacity): what a tenant's
    requests already running can still generate while the other waits is bounded by ``M``."""
    return 2 * max(input_weight * max_prompt_tokens, output_weight * max_batch_tokens)


POLICY_CLASSES: dict[str, Callable[[], SchedulingPolicy]] = {
    "fcfs": SchedulingPolicy, "priority": PriorityPolicy, "vtc": VTCPolicy}


def check_scheduling_policy(value) -> None:
    """A policy name, or a class/factory that makes a ``SchedulingPolicy``; Spanish
    ``ValueError`` otherwise."""
    if isinstance(value, str) and value in POLICY_CLASSES:
        return
    if callable(value) and not isinstance(value, SchedulingPolicy):
        return
    raise ValueError(f"scheduling_policy={_short(value)} no es válida; aceptadas: "
                     f"{', '.join(SCHEDULING_POLICIES)} o una clase (o función sin argumentos) "
                     "que cree una SchedulingPolicy")


def make_scheduling_policy(value: "str | Callable[[], SchedulingPolicy] | None") -> SchedulingPolicy:
    """A fresh policy object for one scheduler (policies keep per-request state)."""
    value = "fcfs" if value is None else value
    check_scheduling_policy(value)
    policy = POLICY_CLASSES[value]() if isinstance(value, str) else value()
    if not isinstance(policy, SchedulingPolicy):
        raise ValueError(f"scheduling_policy debe crear una SchedulingPolicy; creó "
                         f"{type(policy).__name__}")
    return policy


__all__ = ["least_served", "FCFSPolicy", "POLICY_CLASSES", "PriorityPolicy", "SCHEDULING_POLICIES",
           "SchedulingPolicy", "VTCPolicy", "check_scheduling_policy", "check_tags",
           "make_scheduling_policy", "newest_unfinished", "vtc_bound"]
