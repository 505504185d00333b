"""When requests arrive, and how long they are: the load generator of the load-testing chapter.

Two ways to load a server:

- **Open loop** (``poisson_arrivals``, ``burst_arrivals``, ``open_loop_workload``): requests
  arrive on a schedule fixed in advance, whatever the server does. A Poisson process of rate
  ``lambda`` (independent exponential gaps of mean ``1 / lambda``) models many independent users;
  if the server is slower than the offered rate, the queue (and the TTFT) grows without bound.
- **Closed loop** (``closed_loop``): ``C`` clients each send their next request as soon as their
  previous one finishes. The server can never hold more than ``C`` requests, and the offered
  rate adapts to the server's speed (Little's law: throughput = C / latency).

Every function is seeded: the same seed gives the same workload.
"""

from __future__ import annotations

import math
import numbers
from typing import Callable, Sequence

import numpy as np

from ..engine.request import Request, RequestRejected, SamplingParams
from .workload import WorkItem

LENGTH_KINDS = ("fixed", "exponential", "lognormal", "list")

LengthSampler = Callable[[int], list[int]]


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _is_real(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _check_n(n) -> None:
    if not _is_int(n) or n < 1:
        raise ValueError(f"n debe ser un entero >= 1; se recibió {n!r}")


def poisson_arrivals(n: int, rate: float, seed: int) -> list[float]:
    """``n`` arrival times (seconds, the first at 0) of an open-loop Poisson process of ``rate``
    requests/s: the gaps between consecutive arrivals are independent ``Exponential(1 / rate)``
    draws from ``np.random.default_rng(seed)``.

    The first request is sent at t = 0 (as vLLM's ``benchmark_serving`` does), so ``n`` arrivals
    span ``n - 1`` gaps. Same seed, same times.
    """
    _check_n(n)
    if not _is_real(rate) or not math.isfinite(rate) or rate <= 0:
        raise ValueError(f"rate (peticiones/s) debe ser un número finito > 0; se recibió {rate!r}")
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / rate, n - 1)
    return np.concatenate(([0.0], np.cumsum(gaps))).tolist()


def burst_arrivals(n: int, burst_size: int, gap_s: float, seed: int | None = None,
                   jitter_s: float = 0.0) -> list[float]:
    """``n`` arrival times in bursts: ``burst_size`` requests at once at t = 0, the next
    ``burst_size`` at ``gap_s``, then ``2 * gap_s``... (the last burst holds what is left).

    With ``jitter_s > 0``, each arrival is delayed by a ``Uniform(0, jitter_s)`` draw seeded by
    ``seed`` (bursts that are nearly, not exactly, simultaneous), and the times are returned
    sorted; ``jitter_s`` must then stay below ``gap_s`` so that bursts do not overlap. With the
    default ``jitter_s = 0`` the seed is not used and the bursts are exact.
    """
    _check_n(n)
    if not _is_int(burst_size) or burst_size < 1:
        raise ValueError(f"burst_size debe ser un entero >= 1; se recibió {burst_size!r}")
    if not _is_real(gap_s) or not math.isfinite(gap_s) or gap_s < 0:
        raise ValueError(f"gap_s (segundos entre ráfagas) debe ser un número finito >= 0; "
                         f"se recibió {gap_s!r}")
    if not _is_real(jitter_s) or not math.isfinite(jitter_s) or jitter_s < 0:
        raise ValueError(f"jitter_s debe ser un número finito >= 0; se recibió {jitter_s!r}")
    if jitter_s > 0 and n > burst_size and jitter_s >= gap_s:
        raise ValueError(f"jitter_s={jitter_s} debe ser menor que gap_s={gap_s} para que las "
                         "ráfagas no se mezclen")
    times = (np.arange(n) // burst_size) * float(gap_s)
    if jitter_s > 0:
        times = np.sort(times + np.random.default_rng(seed).uniform(0.0, jitter_s, n))
    return times.astype(float).tolist()


def realized_rate(arrival_times: Sequence[float]) -> float:
    """The arrival rate a run actually offered: ``(n - 1) / (last - first)`` requests/s.

    ``n`` arrivals span ``n - 1`` gaps, hence ``n - 1``. A Poisson process of rate ``lambda``
    only offers ``lambda`` on average: a short run (20 requests) draws few gaps, and their mean
    is off by about ``1 / sqrt(n - 1)`` (~23 % for 20 requests) in either direction. Report the
    realized rate next to the configured one, or a "rate sweep" will compare runs that did not
    offer the rates it claims.

    Rules: the times need not be sorted (first = min, last = max); fewer than 2 arrivals, or any
    NaN/infinite time, raise ``ValueError``; arrivals all at the same instant (a single burst)
    give ``math.inf``.
    """
    t = np.asarray(list(arrival_times), dtype=float)
    if t.size < 2:
        raise ValueError(f"hacen falta al menos 2 llegadas para medir una tasa; se recibieron "
                         f"{t.size}")
    if not np.all(np.isfinite(t)):
        raise ValueError("los instantes de llegada deben ser números finitos (sin NaN ni inf)")
    span = float(t.max() - t.min())
    return (t.size - 1) / span if span > 0 else math.inf


# --- lengths -----------------------------------------------------------------------------------
def _positive_int(name: str, x) -> int:
    if not _is_int(x) or x < 1:
        raise ValueError(f"{name} debe ser un entero >= 1; se recibió {x!r}")
    return int(x)


def _positive_real(name: str, x) -> float:
    if not _is_real(x) or not math.isfinite(x) or x <= 0:
        raise ValueError(f"{name} debe ser un número finito > 0; se recibió {x!r}")
    return float(x)


def length_sampler(kind: str, seed: int | None = None, **kw) -> LengthSampler:
    """A function ``n -> list[int]`` of ``n`` lengths (tokens, each >= 1), seeded.

    Kinds and their parameters:

    - ``"fixed"`` (``value``): always ``value``;
    - ``"exponential"`` (``mean``, ``cap``): ``min(cap, ceil(Exponential(mean)))``, the batching
      chapter's output lengths;
    - ``"lognormal"`` (``median``, ``sigma``, ``cap``): ``ceil(median * exp(sigma * Z))`` clipped
      to ``1..cap`` (the long right tail of real chat prompts);
    - ``"list"`` (``values``): uniform draws, with replacement, from ``values`` (for example the
      lengths of a real trace).

    The sampler keeps one ``np.random.default_rng(seed)``: two samplers with the same seed give
    the same sequence of calls, and successive calls of one sampler continue that sequence.
    """
    if kind not in LENGTH_KINDS:
        raise ValueError(f"tipo de longitud {kind!r} desconocido; aceptados: "
                         f"{', '.join(LENGTH_KINDS)}")
    needed = {"fixed": ("value",), "exponential": ("mean", "cap"),
              "lognormal": ("median", "sigma", "cap"), "list": ("values",)}[kind]
    missing = [k for k in needed if k not in kw]
    extra = [k for k in kw if k not in needed]
    if missing or extra:
        raise ValueError(f"el tipo {kind!r} lleva los parámetros {', '.join(needed)}"
                         + (f"; faltan: {', '.join(missing)}" if missing else "")
                         + (f"; sobran: {', '.join(extra)}" if extra else ""))
    rng = np.random.default_rng(seed)
    if kind == "fixed":
        value = _positive_int("value", kw["value"])
        draw = lambda n: np.full(n, value)  # noqa: E731
    elif kind == "exponential":
        mean, cap = _positive_real("mean", kw["mean"]), _positive_int("cap", kw["cap"])
        draw = lambda n: np.clip(np.ceil(rng.exponential(mean, n)), 1, cap)  # noqa: E731
    elif kind == "lognormal":
        median, cap = _positive_real("median", kw["median"]), _positive_int("cap", kw["cap"])
        sigma = kw["sigma"]
        if not _is_real(sigma) or not math.isfinite(sigma) or sigma < 0:
            raise ValueError(f"sigma debe ser un número finito >= 0; se recibió {sigma!r}")
        draw = lambda n: np.clip(np.ceil(rng.lognormal(math.log(median), sigma, n)), 1, cap)  # noqa: E731
    else:
        values = list(kw["values"])
        if not values:
            raise ValueError("values está vacía: hace falta al menos una longitud")
        values = np.array([_positive_int(f"values[{i}]", v) for i, v in enumerate(values)])
        draw = lambda n: values[rng.integers(0, len(values), n)]  # noqa: E731

    def sample(n: int) -> list[int]:
        if not _is_int(n) or n < 0:
            raise ValueError(f"n debe ser un entero >= 0; se recibió {n!r}")
        return [int(x) for x in draw(int(n))]

    sample.kind = kind  # type: ignore[attr-defined]
    sample.params = dict(kw)  # type: ignore[attr-defined]
    return sample


def _lengths(name: str, sampler, n: int) -> list[int]:
    if _is_int(sampler):
        return [_positive_int(name, sampler)] * n
    out = list(sampler(n))
    if len(out) != n:
        raise ValueError(f"{name} devolvió {len(out)} longitudes; se pidieron {n}")
    return [_positive_int(f"{name}[{i}]", x) for i, x in enumerate(out)]


def open_loop_workload(n: int, rate: float, prompt_len_sampler: LengthSampler | int,
                       output_len_sampler: LengthSampler | int, vocab_size: int, seed: int,
                       first_token: int = 3,
                       arrivals_fn: Callable[[int, float, int], Sequence[float]] = poisson_arrivals
                       ) -> list[WorkItem]:
    """``n`` requests arriving as a Poisson process of ``rate`` requests/s (``poisson_arrivals``
    with ``seed``), with prompt and output lengths drawn from the samplers (``length_sampler``;
    a plain int means a fixed length), random prompt tokens in ``[first_token, vocab_size)``
    (seeded from ``seed`` too), each generating exactly its output length (``ignore_eos``).

    ``arrivals_fn(n, rate, seed)`` replaces ``poisson_arrivals`` (a student's generator, for
    example); it must return ``n`` finite times >= 0, in seconds.

    Feed it to ``engine.run(workload)``: a ``WorkItem`` is an ``(arrival_time, prompt, params)``
    tuple.
    """
    times = [float(t) for t in arrivals_fn(n, rate, seed)]
    if len(times) != n or not all(math.isfinite(t) and t >= 0 for t in times):
        raise ValueError(f"el generador de llegadas debe devolver {n} instantes finitos >= 0; "
                         f"devolvió {len(times)}" + ("" if len(times) != n else
                                                     ", alguno negativo o no finito"))
    prompt_lens = _lengths("prompt_len_sampler", prompt_len_sampler, n)
    output_lens = _lengths("output_len_sampler", output_len_sampler, n)
    if not _is_int(vocab_size) or vocab_size <= first_token:
        raise ValueError(f"vocab_size debe ser un entero mayor que first_token={first_token}; "
                         f"se recibió {vocab_size!r}")
    rng = np.random.default_rng([seed, 1])  # a stream independent of the arrivals'
    return [WorkItem(float(t), rng.integers(first_token, vocab_size, p).tolist(),
                     SamplingParams(max_tokens=int(m), ignore_eos=True))
            for t, p, m in zip(times, prompt_lens, output_lens)]


# --- closed loop -------------------------------------------------------------------------------
class ClosedLoopRun(list):
    """The requests of a closed-loop run in send order; ``clients[i]`` sent request ``i``."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.clients: list[int] = []

    def by_client(self) -> dict[int, list[Request]]:
        """Each client's requests, in the order it sent them."""
        out: dict[int, list[Request]] = {}
        for c, r in zip(self.clients, self):
            out.setdefault(c, []).append(r)
        return out


def closed_loop(engine, clients: int, total_requests: int,
                make_item: Callable[[int], tuple[Sequence[int], SamplingParams]],
                seed: int | None = None) -> ClosedLoopRun:
    """Drive ``engine`` (an ``LLMEngine`` on the real model or on the simulator) with ``clients``
    concurrent clients and no think time: each client sends a request, waits for it to finish,
    and sends its next one at once, until ``total_requests`` have been sent in all.

    Request ``i`` (``i = 0, 1, ...`` in send order) is ``make_item(i) -> (prompt_token_ids,
    params)``. The first ``min(clients, total_requests)`` requests arrive at ``engine.now()``;
    every later one arrives exactly at the ``finish_time`` of the same client's previous request
    (its ``arrival_time``), so its TTFT counts any wait from that instant on. When several clients
    are freed by the same step they send in client order, or in an order shuffled by ``seed``
    when one is given.

    Returns the requests in send order, all finished, as a ``ClosedLoopRun`` (a ``list``) whose
    ``clients[i]`` is the client (``0..clients-1``) that sent request ``i``. A request the
    engine rejects raises ``RequestRejected`` naming its index (the ones already sent stay in
    the engine).
    """
    if not _is_int(clients) or clients < 1:
        raise ValueError(f"clients debe ser un entero >= 1; se recibió {clients!r}")
    if not _is_int(total_requests) or total_requests < 1:
        raise ValueError(f"total_requests debe ser un entero >= 1; se recibió {total_requests!r}")
    rng = None if seed is None else np.random.default_rng(seed)
    sent = ClosedLoopRun()
    in_flight: dict[int, Request] = {}

    def send(client: int, at: float) -> None:
        i = len(sent)
        prompt, params = make_item(i)
        try:
            req = engine.add_request(prompt, params, arrival_time=at)
        except RequestRejected as err:
            raise RequestRejected(f"petición {i} (cliente {client}): {err}") from None
        sent.append(req)
        sent.clients.append(client)
        in_flight[client] = req

    def send_all(free: list[int], at_of: Callable[[int], float]) -> None:
        if rng is not None:
            free = [free[j] for j in rng.permutation(len(free))]
        for c in free:
            if len(sent) < total_requests:
                send(c, at_of(c))

    t0 = engine.now()
    send_all(list(range(min(clients, total_requests))), lambda c: t0)
    while in_flight:
        if not engine.has_unfinished_requests():
            raise RuntimeError("el motor no tiene peticiones pendientes pero quedan "
                               f"{len(in_flight)} en vuelo sin terminar")
        engine.step(outputs=False)
        done = sorted(c for c, r in in_flight.items() if r.is_finished)
        finish = {c: in_flight.pop(c).finish_time for c in done}
        send_all(done, lambda c: finish[c])
    return sent  # (the engine retired the finished requests when it ran dry)
