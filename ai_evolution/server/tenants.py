"""Tenants and their limits (chapter 12): who sent a request, and whether it may enter now.

A request's **tenant** is the name its API key maps to (``api_keys``: ``Authorization: Bearer
KEY`` -> tenant; with keys configured, an unknown or missing key is refused with 401), or else
the OpenAI ``user`` field, or else ``"anonymous"``. Without keys the ``user`` field is a label the
client chooses: good for fair share between cooperating clients, not a security boundary.

Each tenant has ``TenantLimits``: a token bucket of requests per second, a token bucket of
tokens per second (a request costs its prompt plus ``max_tokens``, as OpenAI's and most
providers' token-per-minute limits count), and a cap on its requests in flight. A request over a
limit is answered **429** with ``Retry-After`` (whole seconds until the bucket holds enough, or 1
for the concurrency cap) before it costs the engine anything; a request larger than the tenant's
token burst could never pass and is answered 400. The buckets start full.
"""

from __future__ import annotations

import math
import numbers
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping

ANONYMOUS = "anonymous"


def _check_rate(name: str, value, integer: bool = False) -> None:
    bad = isinstance(value, bool) or not isinstance(value, numbers.Real) or not (
        math.isfinite(value) and value > 0)
    if integer:
        bad = bad or not isinstance(value, numbers.Integral)
    if value is not None and bad:
        kind = "un entero >= 1" if integer else "un número > 0"
        raise ValueError(f"{name} debe ser {kind} o None (sin límite); se recibió {value!r}")


@dataclass(frozen=True)
class TenantLimits:
    """``requests_per_s`` and ``tokens_per_s``: refill rates of the two buckets (None: no limit);
    ``burst_requests``/``burst_tokens``: their capacities (default: one second's worth, and at
    least one request); ``max_concurrent``: requests in flight at once (None: no cap)."""

    requests_per_s: float | None = None
    tokens_per_s: float | None = None
    max_concurrent: int | None = None
    burst_requests: float | None = None
    burst_tokens: float | None = None

    def __post_init__(self) -> None:
        _check_rate("requests_per_s", self.requests_per_s)
        _check_rate("tokens_per_s", self.tokens_per_s)
        _check_rate("max_concurrent", self.max_concurrent, integer=True)
        _check_rate("burst_requests", self.burst_requests)
        _check_rate("burst_tokens", self.burst_tokens)


class TokenBucket:
    """``capacity`` tokens, refilled at ``rate`` per second; starts full."""

    def __init__(self, rate: float, capacity: float, now: float) -> None:
        self.rate, self.capacity = float(rate), float(capacity)
        self.level, self.t = self.capacity, now

    def _refill(self, now: float) -> None:
        if now > self.t:
            self.level = min(self.capacity, self.level + (now - self.t) * self.rate)
            self.t = now

    def wait_s(self, n: float, now: float) -> float:
        """Seconds until ``n`` can be taken (0: now; ``inf``: never, ``n`` > capacity)."""
        self._refill(now)
        if n > self.capacity:
            return math.inf
        return max(0.0, (n - self.level) / self.rate)

    def take(self, n: float, now: float) -> None:
        self._refill(now)
        self.level -= n


class Refused(Exception):
    """A request a tenant's limits refuse: ``status`` (429 or 400), Spanish ``message``,
    ``retry_after_s`` (429 only) and ``reason`` (for the metrics)."""

    def __init__(self, status: int, message: str, reason: str, retry_after_s: int | None = None):
        super().__init__(message)
        self.status, self.message, self.reason, self.retry_after_s = status, message, reason, retry_after_s


@dataclass
class _TenantState:
    limits: TenantLimits
    requests: TokenBucket | None
    tokens: TokenBucket | None
    in_flight: int = 0


class Lease:
    """A request admitted by its tenant's limits; ``release()`` (idempotent) when it is over."""

    def __init__(self, tenants: "Tenants", tenant: str) -> None:
        self.tenants, self.tenant, self._released = tenants, tenant, False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self.tenants._release(self.tenant)


@dataclass
class Tenants:
    """The tenants a server knows: ``api_keys`` (key -> tenant; empty: no keys, tenants come
    from ``user``), ``limits`` (tenant -> its ``TenantLimits``), ``default_limits`` (any other
    tenant's), ``max_tenants`` (distinct tenants tracked at once: a bound on memory and on the
    metrics' labels; beyond it a new tenant gets 429)."""

    api_keys: Mapping[str, str] = field(default_factory=dict)
    limits: Mapping[str, TenantLimits] = field(default_factory=dict)
    default_limits: TenantLimits = field(default_factory=TenantLimits)
    max_tenants: int = 1000
    clock: Callable[[], float] = time.monotonic

    def __post_init__(self) -> None:
        for key, tenant in self.api_keys.items():
            if not isinstance(key, str) or not key or not isinstance(tenant, str) or not tenant:
                raise ValueError(f"api_keys debe asociar claves (texto no vacío) a tenants (texto "
                                 f"no vacío); se recibió {key!r} -> {tenant!r}")
        for tenant, lim in self.limits.items():
            if not isinstance(lim, TenantLimits):
                raise ValueError(f"los límites de {tenant!r} deben ser un TenantLimits; se "
                                 f"recibió {type(lim).__name__}")
        _check_rate("max_tenants", self.max_tenants, integer=True)
        self._state: dict[str, _TenantState] = {}
        self._lock = threading.Lock()

    # --- who ---------------------------------------------------------------------------------------
    def identify(self, authorization: str | None, user) -> str:
        """The tenant of a request from its ``Authorization`` header and ``user`` field;
        ``Refused(401)`` for a missing or unknown key when keys are configured, ``Refused(400)``
        for a malformed ``user``."""
        if user is not None and (not isinstance(user, str) or not 1 <= len(user) <= 128):
            raise Refused(400, "'user' debe ser un texto de 1 a 128 caracteres que identifique "
                               f"al usuario final; se recibió {str(user)[:40]!r}", "bad_tenant")
        if self.api_keys:
            key = None
            if authorization and authorization.lower().startswith("bearer "):
                key = authorization[7:].strip()
            if key not in self.api_keys:
                raise Refused(401, "falta la clave de API o no es válida: envía la cabecera "
                                   "'Authorization: Bearer CLAVE' con una clave de este servidor",
                              "bad_key")
            return self.api_keys[key]
        return user if user is not None else ANONYMOUS

    # --- limits ------------------------------------------------------------------------------------
    def admit(self, tenant: str, cost_tokens: int) -> Lease:
        """Take one request and ``cost_tokens`` tokens from ``tenant``'s buckets and a place of
        its concurrency, or raise ``Refused`` (429 with the seconds to wait, or 400) taking
        nothing."""
        with self._lock:
            now = self.clock()
            st = self._state.get(tenant)
            if st is None:
                if len(self._state) >= self.max_tenants:
                    self._forget_idle()
                if len(self._state) >= self.max_tenants:
                    raise Refused(429, f"el servidor ya atiende a {self.max_tenants} tenants "
                                       "distintos; vuelve a intentarlo más tarde",
                                  "too_many_tenants", 1)
                st = self._state[tenant] = self._new_state(tenant, now)
            lim = st.limits
            if lim.max_concurrent is not None and st.in_flight >= lim.max_concurrent:
                raise Refused(429, f"el tenant '{tenant}' ya tiene {st.in_flight} peticiones en "
                                   f"curso y su límite es {lim.max_concurrent}; espera a que "
                                   "termine alguna", "concurrency", 1)
            waits = []
            if st.requests is not None:
                waits.append(("peticiones por segundo", lim.requests_per_s, st.requests.wait_s(1, now)))
            if st.tokens is not None:
                w = st.tokens.wait_s(cost_tokens, now)
                if math.isinf(w):
                    raise Refused(400, f"la petición puede usar {cost_tokens} tokens (prompt + "
                                       f"max_tokens) y la ráfaga máxima del tenant '{tenant}' es "
                                       f"de {st.tokens.capacity:g} tokens: reduce max_tokens o el "
                                       "prompt", "too_large")
                waits.append(("tokens por segundo", lim.tokens_per_s, w))
            what, rate, wait = max(waits, key=lambda x: x[2], default=(None, None, 0.0))
            if wait > 0:
                raise Refused(429, f"el tenant '{tenant}' supera su límite de {rate:g} {what}; "
                                   f"vuelve a intentarlo dentro de {math.ceil(wait)} s",
                              "rate_limited", max(1, math.ceil(wait)))
            if st.requests is not None:
                st.requests.take(1, now)
            if st.tokens is not None:
                st.tokens.take(cost_tokens, now)
            st.in_flight += 1
            return Lease(self, tenant)

    def in_flight(self, tenant: str) -> int:
        with self._lock:
            st = self._state.get(tenant)
            return 0 if st is None else st.in_flight

    def _release(self, tenant: str) -> None:
        with self._lock:
            self._state[tenant].in_flight -= 1

    def _new_state(self, tenant: str, now: float) -> _TenantState:
        lim = self.limits.get(tenant, self.default_limits)
        req = tok = None
        if lim.requests_per_s is not None:
            req = TokenBucket(lim.requests_per_s, lim.burst_requests or max(1.0, lim.requests_per_s), now)
        if lim.tokens_per_s is not None:
            tok = TokenBucket(lim.tokens_per_s, lim.burst_tokens or lim.tokens_per_s, now)
        return _TenantState(lim, req, tok)

    def _forget_idle(self) -> None:
        """Drop tenants with nothing in flight whose buckets are full again (nothing is lost)."""
        now = self.clock()
        for name in [n for n, st in self._state.items() if st.in_flight == 0 and all(
                b is None or b.wait_s(b.capacity, now) == 0 for b in (st.requests, st.tokens))]:
            del self._state[name]


__all__ = ["ANONYMOUS", "Lease", "Refused", "TenantLimits", "Tenants", "TokenBucket"]
