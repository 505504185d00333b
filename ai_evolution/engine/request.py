"""Requests, their sampling parameters, their states and what the engine returns for them.

The names follow vLLM (``SamplingParams``, ``Request``, ``RequestOutput``) so that a student who
opens vLLM later finds the same map. Every request carries its own timing record (arrival, first
token, every token, finish), read from the executor's clock: wall time for the real model,
simulated time for the simulator.
"""

from __future__ import annotations

import enum
import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from ..model.sampling import SAMPLING_EPS


class RequestRejected(ValueError):
    """A request the engine refuses (bad prompt or parameters); the others keep being served."""


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED = "finished"


class FinishReason(str, enum.Enum):
    LENGTH = "length"    # reached max_tokens, or the model's max length
    STOP = "stop"        # produced a stop token (EOS or one of stop_token_ids)
    ABORT = "abort"      # aborted by the caller
    REJECTED = "rejected"  # never admitted: its input was invalid
    ERROR = "error"      # its part of a step failed; the other requests went on


# torch.Generator.manual_seed accepts any integer in [-2**63, 2**64).
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1
# An error message lists at most this many offending values.
MAX_LISTED = 5


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _short(x, limit: int = 40) -> str:
    """``repr(x)`` cut to ``limit`` characters: error messages stay small whatever came in."""
    text = repr(x)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _plain_bounds(stops) -> tuple[int, int] | None:
    """``(min, max)`` of a non-empty collection of plain ints, else None; C-level passes only
    (``map(type)``, ``min``, ``max``), so a list as long as a vocabulary costs milliseconds."""
    if stops and set(map(type, stops)) == {int}:
        return min(stops), max(stops)
    return None


@dataclass(frozen=True)
class SamplingParams:
    """How to pick the tokens of one request.

    ``temperature == 0`` (or below ``SAMPLING_EPS``) is greedy; otherwise sample from
    ``softmax(logits / temperature)`` restricted to ``top_k`` tokens and to the nucleus
    ``top_p`` (the most likely token always stays), with a generator seeded by ``seed`` (an
    integer in [-2**63, 2**64); same seed, same tokens, whatever else shares the batch). Generation ends after
    ``max_tokens`` tokens, or at a stop token (the model's EOS and ``stop_token_ids``) unless
    ``ignore_eos`` (which ignores EOS but still honours ``stop_token_ids``).

    ``stop_token_ids`` (any iterable of ids) is deduplicated once, here, into a ``frozenset``
    whose bounds are kept: checking it against a vocabulary later costs nothing, and the engine
    tests each new token against it without rebuilding it.
    """

    max_tokens: int = 16
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    stop_token_ids: frozenset[int] = frozenset()
    ignore_eos: bool = False
    _stop_bounds: tuple[int, int] | None = field(default=None, init=False, repr=False,
                                                 compare=False)

    def __post_init__(self) -> None:
        stops = self.stop_token_ids
        if isinstance(stops, (str, bytes)) or not hasattr(stops, "__iter__"):
            raise RequestRejected(f"stop_token_ids debe ser una lista de ids de token (vacía si no "
                                  f"hay ninguno); se recibió {_short(stops)}")
        if not isinstance(stops, frozenset):
            try:
                stops = frozenset(stops)
            except TypeError:  # an unhashable item: kept as given, problems() names it
                stops = tuple(stops)
            object.__setattr__(self, "stop_token_ids", stops)
        object.__setattr__(self, "_stop_bounds", _plain_bounds(stops))
        problems = self.problems()
        if problems:
            raise RequestRejected("; ".join(problems))

    @property
    def greedy(self) -> bool:
        """Pick the most likely token (temperature 0, or too small to divide by)."""
        return self.temperature < SAMPLING_EPS

    def problems(self, vocab_size: int | None = None) -> list[str]:
        """Spanish descriptions of every invalid field (empty when all are valid)."""
        out = []
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            out.append(f"max_tokens debe ser un entero >= 1; se recibió {_short(self.max_tokens)}")
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, numbers.Real) or not math.isfinite(t) or t < 0:
            out.append(f"temperature debe ser un número finito >= 0 (0 = voraz); se recibió {_short(t)}")
        if self.top_k is not None and (not _is_int(self.top_k) or self.top_k < 1):
            out.append(f"top_k debe ser un entero >= 1 o None; se recibió {_short(self.top_k)}")
        if self.top_p is not None and (isinstance(self.top_p, bool) or not isinstance(self.top_p, numbers.Real)
                                       or not 0 < self.top_p <= 1):
            out.append(f"top_p debe estar en (0, 1] o ser None; se recibió {_short(self.top_p)}")
        if self.seed is not None and (not _is_int(self.seed) or not SEED_MIN <= self.seed <= SEED_MAX):
            out.append(f"seed debe ser un entero entre -2**63 y 2**64 - 1, o None; se recibió "
                       f"{_short(self.seed)}")
        bounds = self._stop_bounds
        if not self.stop_token_ids or (bounds is not None and bounds[0] >= 0 and (
                vocab_size is None or bounds[1] < vocab_size)):
            bad = []  # decided from the bounds computed once, at construction
        else:
            bad = [t for t in self.stop_token_ids
                   if not _is_int(t) or t < 0 or (vocab_size is not None and t >= vocab_size)]
        if bad:
            accepted = ">= 0" if vocab_size is None else f"0..{vocab_size - 1}"
            listed = ", ".join(_short(t) for t in bad[:MAX_LISTED])
            more = f" y {len(bad) - MAX_LISTED} más" if len(bad) > MAX_LISTED else ""
            out.append(f"stop_token_ids contiene {len(bad)} "
                       f"{'valor que no es token' if len(bad) == 1 else 'valores que no son tokens'} del "
                       f"vocabulario (enteros {accepted}): {listed}{more}")
        return out


class TimingRecord:
    """Latency metrics from a timing record: ``arrival_time``, ``first_token_time``,
    ``token_times`` (one per token) and ``finish_time``, in seconds of one clock; each metric is
    None until the times it needs exist. Shared by the engine's ``Request`` and the HTTP load
    generator's records, so that both are summarized by the same code."""

    arrival_time: float | None
    first_token_time: float | None
    token_times: list[float]
    finish_time: float | None

    @property
    def ttft(self) -> float | None:
        """Time to first token: arrival -> first token."""
        if self.first_token_time is None or self.arrival_time is None:
            return None
        return self.first_token_time - self.arrival_time

    @property
    def itls(self) -> list[float]:
        """Inter-token latencies: the gaps between consecutive tokens."""
        return [b - a for a, b in zip(self.token_times, self.token_times[1:])]

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first: (last - first) / (n - 1)."""
        n = len(self.token_times)
        return None if n < 2 else (self.token_times[-1] - self.token_times[0]) / (n - 1)

    @property
    def e2e_latency(self) -> float | None:
        """Arrival -> finish."""
        if self.finish_time is None or self.arrival_time is None:
            return None
        return self.finish_time - self.arrival_time


@dataclass(eq=False)
class Request(TimingRecord):
    """One prompt on its way through the engine (compared by identity: two requests are the same
    only if they are the same object, so a copy can never stand in for the original).

    ``num_computed_tokens`` counts the tokens whose K/V are in the cache; the scheduler compares
    it with ``num_tokens`` (prompt + generated) to know whether the request needs a prefill (many
    tokens) or a decode (one token).
    """

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    arrival_time: float = 0.0
    eos_token_id: int | None = None
    status: RequestStatus = RequestStatus.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    finish_reason: FinishReason | None = None
    error: str | None = None  # why it failed (finish_reason ERROR)
    num_preemptions: int = 0
    # Speculative decoding (chapter 9): the draft tokens for the next step (set by the scheduler,
    # ``update_draft_token_ids``), and how many were verified and accepted so far (their ratio is
    # the acceptance rate). ``draft_probs``: for a sampled request whose drafts a model sampled,
    # the draft's distribution ``[len(draft_token_ids), V]`` each was drawn from (None: each
    # draft is a point mass, as n-gram proposals are).
    draft_token_ids: list[int] = field(default_factory=list)
    draft_probs: Any = field(default=None, repr=False, compare=False)
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    # Timing record, in the executor's clock (seconds).
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    finish_time: float | None = None
    # The stop tokens (stop_token_ids, plus EOS unless ignore_eos), set by __post_init__.
    stop_token_set: frozenset[int] = field(init=False, repr=False, default=frozenset())

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def token_ids_between(self, start: int, stop: int) -> list[int]:
        """``all_token_ids[start:stop]``, without building the whole list (a decode step reads
        one token)."""
        n = len(self.prompt_token_ids)
        if start >= n:
            return self.output_token_ids[start - n:stop - n]
        return self.prompt_token_ids[start:stop] + self.output_token_ids[:max(0, stop - n)]

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    def __post_init__(self) -> None:
        # Built once per request: the scheduler tests every new token against it.
        stops = self.sampling_params.stop_token_ids
        if self.eos_token_id is not None and not self.sampling_params.ignore_eos:
            stops = stops | {self.eos_token_id}
        self.stop_token_set = stops


@dataclass
class RequestOutput:
    """What ``LLM.generate`` and ``LLMEngine.step`` report for one request."""

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    finished: bool
    finish_reason: FinishReason | None = None
    text: str | None = None
    error: str | None = None
    metrics: dict = field(default_factory=dict)

    @classmethod
    def of(cls, req: Request, text: str | None = None) -> "RequestOutput":
        return cls(req.request_id, list(req.prompt_token_ids), list(req.output_token_ids),
                   req.is_finished, req.finish_reason, text, req.error, request_metrics(req))


def request_metrics(req: Request) -> dict:
    """The request's timing record as plain numbers (seconds; None where not reached yet)."""
    return {"arrival_time": req.arrival_time, "first_token_time": req.first_token_time,
            "finish_time": req.finish_time, "ttft": req.ttft, "tpot": req.tpot,
            "e2e_latency": req.e2e_latency, "num_prompt_tokens": req.num_prompt_tokens,
            "num_output_tokens": len(req.output_token_ids)}


def validate_prompt(prompt_token_ids: Sequence[int], vocab_size: int, max_model_len: int) -> list[int]:
    """The prompt as a list of ints, or ``RequestRejected`` naming what is wrong (in Spanish)."""
    if isinstance(prompt_token_ids, torch.Tensor):
        prompt_token_ids = prompt_token_ids.tolist()
    if isinstance(prompt_token_ids, (str, bytes)):
        raise RequestRejected("el prompt debe ser una lista de ids de token; para texto, crea el LLM "
                              "con un tokenizador (LLM('tiny-es') lo trae)")
    try:
        ids = list(prompt_token_ids)
    except TypeError:
        raise RequestRejected(f"el prompt debe ser una lista de ids de token (enteros "
                              f"0..{vocab_size - 1}); se recibió {type(prompt_token_ids).__name__}"
                              ) from None
    if not ids:
        raise RequestRejected("el prompt está vacío: hace falta al menos un token")
    bounds = _plain_bounds(ids)  # C-level passes: a long prompt of plain ints costs little
    ids_ok = bounds is not None and bounds[0] >= 0 and bounds[1] < vocab_size
    for j, t in enumerate(() if ids_ok else ids):
        if not _is_int(t) or not 0 <= t < vocab_size:
            raise RequestRejected(f"el token {j} del prompt ({_short(t)}) no está en el vocabulario "
                                  f"(enteros 0..{vocab_size - 1})")
    if len(ids) >= max_model_len:
        raise RequestRejected(f"el prompt tiene {len(ids)} tokens y max_model_len es "
                              f"{max_model_len}: no queda sitio para generar ni uno (máximo "
                              f"{max_model_len - 1} tokens de prompt)")
    return list(ids) if ids_ok else [int(t) for t in ids]
