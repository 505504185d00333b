"""The router: one FastAPI process in front of N OpenAI-compatible replicas.

    client ──► router ──(policy: round-robin | least-outstanding | prefix-affinity)──► replica i
                 │  health: GET {replica}/health every ``health_interval_s``
                 └─ /metrics: per replica, requests, in flight, errors, chosen (by reason)

A generation request (``/v1/completions``, ``/v1/chat/completions``, streamed or not) is read
once (bounded by ``max_request_bytes``), its prompt's leading blocks hashed
(``policies.prefix_blocks``: token-id prompts in blocks of ``block_tokens``, text and chat
messages in blocks of ``block_chars`` characters), and sent to the replica the policy picks among
the healthy ones. The body is forwarded untouched: validation is the replica's, and so are its
errors (passed through with their status).

Failures. A replica that refuses the connection or drops it before anything reached the client
is marked unhealthy at once (taken out until a health check answers 200) and the request is sent
to another healthy replica, which is safe because the client has seen nothing yet. A stream cut
after its first bytes cannot be replayed: the client gets an SSE ``error`` event in OpenAI's
error shape, then the end of the stream. No healthy replica left: 503 with a Spanish message in
OpenAI's error shape (``code``: ``no_healthy_replica``). Every replica tried and failed: 502
(``code``: ``replicas_failed``).
"""

from __future__ import annotations

import asyncio
import json
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import (CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge,
                               generate_latest)
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..server.body_limit import BodyLimit
from ..server.protocol import error_body
from .policies import (DEFAULT_BLOCK_CHARS, DEFAULT_MAX_BLOCKS, POLICIES, Choice, PrefixAffinity,
                       make_policy, prefix_blocks)

GENERATION_PATHS = ("/v1/completions", "/v1/chat/completions")
MAX_REQUEST_BYTES = 4 * 2**20
PREFIX = "ai_evolution_router:"
REASONS = ("round_robin", "least_outstanding", "prefix_hit", "prefix_miss", "load_guard")
ERROR_KINDS = ("connect", "stream_cut", "health")
FORWARDED_HEADERS = ("authorization", "content-type", "accept", "x-api-key")


def check_replica_url(url: str) -> str:
    """``url`` as the router keeps it: ``http(s)://host[:port][/path]`` without a trailing ``/``
    or ``/v1`` (the router appends ``/v1/...`` and ``/health``). Spanish ValueError otherwise."""
    text = str(url).strip()
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"URL de réplica no válida {url!r}: se acepta http://HOST:PUERTO o "
                         "https://HOST:PUERTO (con una ruta base opcional)")
    if parts.query or parts.fragment:
        raise ValueError(f"URL de réplica no válida {url!r}: sin '?' ni '#'; se acepta "
                         "http://HOST:PUERTO o https://HOST:PUERTO")
    try:
        parts.port  # noqa: B018  (raises on a port out of range or not a number)
    except ValueError:
        raise ValueError(f"URL de réplica no válida {url!r}: el puerto debe ser un número entre "
                         "1 y 65535") from None
    text = text.rstrip("/")
    return text[:-3] if text.endswith("/v1") else text


@dataclass
class ReplicaState:
    url: str
    healthy: bool = True
    outstanding: int = 0
    last_error: str | None = None
    checked_at: float | None = None


@dataclass
class RouterConfig:
    """What the router is told: the replicas, the policy and its knobs."""

    replicas: list[str]
    policy: str = "prefix-affinity"
    block_chars: int = DEFAULT_BLOCK_CHARS
    block_tokens: int = 16
    max_blocks: int = DEFAULT_MAX_BLOCKS
    max_imbalance: int = 4
    health_interval_s: float = 2.0
    health_timeout_s: float = 1.0
    connect_timeout_s: float = 2.0
    read_timeout_s: float = 600.0
    max_request_bytes: int = MAX_REQUEST_BYTES
    urls: list[str] = field(init=False)

    def __post_init__(self) -> None:
        if not self.replicas:
            raise ValueError("hace falta al menos una réplica (--replica http://HOST:PUERTO, "
                             "repetible)")
        self.urls = [check_replica_url(u) for u in self.replicas]
        dup = sorted({u for u in self.urls if self.urls.count(u) > 1})
        if dup:
            raise ValueError(f"réplicas repetidas: {', '.join(dup)}; cada URL una sola vez")
        if str(self.policy).strip().lower().replace("_", "-") not in POLICIES:
            raise ValueError(f"política de enrutado desconocida {self.policy!r}; las aceptadas "
                             f"son: {', '.join(POLICIES)}")
        for name in ("block_chars", "block_tokens", "max_blocks"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} debe ser un entero >= 1; se recibió {v!r}")
        for name in ("health_interval_s", "health_timeout_s", "connect_timeout_s", "read_timeout_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise ValueError(f"{name} debe ser un número de segundos > 0; se recibió {v!r}")

    def make_policy(self):
        if self.policy.strip().lower().replace("_", "-") == "prefix-affinity":
            return make_policy(self.policy, max_imbalance=self.max_imbalance)
        return make_policy(self.policy)


class RouterMetrics:
    """Prometheus series of one router (a registry of its own), labelled by replica URL."""

    def __init__(self, urls: list[str]) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter(PREFIX + "requests", "Requests forwarded to a replica (each "
                                "attempt).", ["replica"], registry=r)
        self.in_flight = Gauge(PREFIX + "requests_in_flight", "Requests sent to a replica and "
                               "not yet answered.", ["replica"], registry=r)
        self.errors = Counter(PREFIX + "errors", "Replica failures by kind (connect: refused or "
                              "dropped before the client saw anything; stream_cut: after; "
                              "health: a failed health check).", ["replica", "kind"], registry=r)
        self.chosen = Counter(PREFIX + "chosen", "Times the policy chose a replica, by reason.",
                              ["replica", "reason"], registry=r)
        self.healthy = Gauge(PREFIX + "replica_healthy", "1 if the replica is in rotation.",
                             ["replica"], registry=r)
        self.retries = Counter(PREFIX + "retries", "Requests sent again to another replica.",
                               registry=r)
        self.unavailable = Counter(PREFIX + "unavailable", "Requests answered 502/503 because "
                                   "no replica could serve them.", registry=r)
        for u in urls:  # every series exported from the start, at 0
            self.requests.labels(u)
            self.in_flight.labels(u)
            self.healthy.labels(u).set(1)
            for kind in ERROR_KINDS:
                self.errors.labels(u, kind)
            for reason in REASONS:
                self.chosen.labels(u, reason)


def prompt_for_routing(path: str, body) -> tuple[object, str] | None:
    """What the policy hashes: ``(token ids, "tokens")`` or ``(text, "text")``; None when the
    body has no prompt the router can read (the replica will say what is wrong with it)."""
    if not isinstance(body, dict):
        return None
    if path == "/v1/chat/completions":
        messages = body.get("messages")
        if not isinstance(messages, list):
            return None
        parts = []
        for m in messages:
            if not isinstance(m, dict):
                return None
            content = m.get("content")
            if isinstance(content, list):  # OpenAI's content parts: keep the text ones
                content = "".join(p.get("text", "") for p in content
                                  if isinstance(p, dict) and isinstance(p.get("text"), str))
            parts.append(f"<{m.get('role')}>{content if isinstance(content, str) else ''}\n")
        return "".join(parts), "text"
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch: route by its first prompt
    if isinstance(prompt, str):
        return prompt, "text"
    if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool)
                                        for t in prompt):
        return prompt, "tokens"
    return None


def _error(status: int, message: str, code: str, type: str = "server_error",
           headers: dict | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, type=type, code=code), status_code=status,
                        headers=headers)


class Router:
    """The state the handlers share: replicas, the policy, the HTTP client, the metrics."""

    def __init__(self, config: RouterConfig) -> None:
        self.config = config
        self.replicas = [ReplicaState(u) for u in config.urls]
        self.policy = config.make_policy()
        self.metrics = RouterMetrics(config.urls)
        self.client: httpx.AsyncClient | None = None

    # --- replicas ----------------------------------------------------------------------------
    def loads(self) -> list[int]:
        return [r.outstanding for r in self.replicas]

    def mark(self, i: int, healthy: bool, error: str | None = None) -> None:
        r = self.replicas[i]
        if r.healthy and not healthy and isinstance(self.policy, PrefixAffinity):
            self.policy.forget(i)  # its cache is gone, or will be when it comes back
        r.healthy, r.last_error = healthy, error if not healthy else None
        self.metrics.healthy.labels(r.url).set(1 if healthy else 0)

    async def check_health(self) -> None:
        """One round of ``GET /health`` on every replica, concurrently."""
        async def one(i: int) -> None:
            r = self.replicas[i]
            try:
                resp = await self.client.get(r.url + "/health", timeout=self.config.health_timeout_s)
                ok, why = resp.status_code == 200, f"/health respondió {resp.status_code}"
            except httpx.HTTPError as err:
                ok, why = False, f"/health falló: {type(err).__name__}"
            r.checked_at = time.monotonic()
            if not ok:
                self.metrics.errors.labels(r.url, "health").inc()
            self.mark(i, ok, None if ok else why)
        await asyncio.gather(*(one(i) for i in range(len(self.replicas))))

    async def health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.health_interval_s)
            await self.check_health()

    # --- forwarding --------------------------------------------------------------------------
    def prefix(self, path: str, body) -> list[bytes]:
        found = prompt_for_routing(path, body)
        if found is None:
            return []
        prompt, kind = found
        size = self.config.block_tokens if kind == "tokens" else self.config.block_chars
        return prefix_blocks(prompt, size, self.config.max_blocks)

    def pick(self, prefix: list[bytes], tried: set[int]) -> Choice | None:
        candidates = [i for i, r in enumerate(self.replicas) if r.healthy and i not in tried]
        if not candidates:
            return None
        choice = self.policy.choose(prefix, self.loads(), candidates)
        self.metrics.chosen.labels(self.replicas[choice.index].url, choice.reason).inc()
        return choice

    def _begin(self, i: int) -> None:
        r = self.replicas[i]
        r.outstanding += 1
        self.metrics.requests.labels(r.url).inc()
        self.metrics.in_flight.labels(r.url).inc()

    def _end(self, i: int) -> None:
        r = self.replicas[i]
        r.outstanding -= 1
        self.metrics.in_flight.labels(r.url).dec()

    def _failed(self, i: int, err: BaseException, kind: str = "connect") -> None:
        r = self.replicas[i]
        self.metrics.errors.labels(r.url, kind).inc()
        self.mark(i, False, f"{type(err).__name__} al reenviar")

    def unavailable(self, tried: set[int]) -> JSONResponse:
        self.metrics.unavailable.inc()
        if tried:
            return _error(502, f"ninguna réplica pudo atender la petición: fallaron las "
                               f"{len(tried)} probadas y no queda ninguna sana; reinténtalo en "
                               "unos segundos", "replicas_failed", headers={"Retry-After": "1"})
        return _error(503, f"no hay ninguna réplica sana ({len(self.replicas)} configuradas, "
                           "todas fuera de servicio según /health); reinténtalo en unos segundos",
                      "no_healthy_replica", headers={"Retry-After": "1"})

    def _headers(self, request: Request) -> dict:
        return {k: v for k, v in request.headers.items() if k.lower() in FORWARDED_HEADERS}

    async def forward(self, request: Request, path: str) -> Response:
        raw = await request.body()
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            body = None  # the replica answers the parse error in its own words
        stream = isinstance(body, dict) and body.get("stream") is True
        prefix = self.prefix(path, body)
        headers = self._headers(request)
        tried: set[int] = set()
        while True:
            choice = self.pick(prefix, tried)
            if choice is None:
                return self.unavailable(tried)
            i = choice.index
            if tried:
                self.metrics.retries.inc()
            tried.add(i)
            url = self.replicas[i].url + path
            self._begin(i)
            try:
                if not stream:
                    try:
                        resp = await self.client.post(url, content=raw, headers=headers)
                    except httpx.TransportError as err:
                        self._failed(i, err)
                        continue
                    return Response(resp.content, status_code=resp.status_code,
                                    media_type=resp.headers.get("content-type"))
                started = await self._open_stream(i, url, raw, headers)
                if started is None:
                    continue
                if isinstance(started, Response):
                    return started
                first, upstream, chunks = started
                self._begin(i)  # the stream holds its own count, released when it ends
                return StreamingResponse(self._relay(i, first, upstream, chunks),
                                         media_type="text/event-stream")
            finally:
                self._end(i)

    async def _open_stream(self, i: int, url: str, raw: bytes, headers: dict):
        """The upstream stream and its first bytes; a ``Response`` when the replica answered with
        an error status; None when it failed before anything could reach the client."""
        req = self.client.build_request("POST", url, content=raw, headers=headers)
        try:
            upstream = await self.client.send(req, stream=True)
        except httpx.TransportError as err:
            self._failed(i, err)
            return None
        try:
            if upstream.status_code != 200:
                content = await upstream.aread()
                await upstream.aclose()
                return Response(content, status_code=upstream.status_code,
                                media_type=upstream.headers.get("content-type"))
            chunks = upstream.aiter_raw()
            try:
                first = await chunks.__anext__()
            except StopAsyncIteration:
                first = b""
            return first, upstream, chunks
        except httpx.TransportError as err:
            await upstream.aclose()
            self._failed(i, err)
            return None

    async def _relay(self, i: int, first: bytes, upstream: httpx.Response, chunks):
        try:
            if first:
                yield first
            async for chunk in chunks:
                yield chunk
        except httpx.TransportError as err:
            self._failed(i, err, "stream_cut")
            event = error_body("la réplica que atendía esta petición dejó de responder a mitad "
                               "de la respuesta; el texto recibido está incompleto: reenvía la "
                               "petición", type="server_error", code="replica_failed")
            yield f"data: {json.dumps(event, ensure_ascii=False)}\n\n".encode()
            yield b"data: [DONE]\n\n"
        finally:
            await upstream.aclose()
            self._end(i)

    async def forward_get(self, path: str) -> Response:
        """A GET (``/v1/models``) answered by any healthy replica."""
        tried: set[int] = set()
        while True:
            candidates = [i for i, r in enumerate(self.replicas) if r.healthy and i not in tried]
            if not candidates:
                return self.unavailable(tried)
            i = candidates[0]
            tried.add(i)
            try:
                resp = await self.client.get(self.replicas[i].url + path)
            except httpx.TransportError as err:
                self._failed(i, err)
                continue
            return Response(resp.content, status_code=resp.status_code,
                            media_type=resp.headers.get("content-type"))

    def status(self) -> dict:
        return {"policy": self.policy.name, "replicas": [
            {"url": r.url, "healthy": r.healthy, "outstanding": r.outstanding,
             "last_error": r.last_error} for r in self.replicas]}


def create_router_app(config: RouterConfig) -> FastAPI:
    """The router's app (its health loop and HTTP client start and stop with it)."""
    router = Router(config)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        timeout = httpx.Timeout(config.read_timeout_s, connect=config.connect_timeout_s)
        limits = httpx.Limits(max_connections=1024, max_keepalive_connections=256)
        async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
            router.client = client
            await router.check_health()  # dead replicas are out from the first request
            task = asyncio.create_task(router.health_loop())
            try:
                yield
            finally:
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    pass

    app = FastAPI(title="ai_evolution: enrutador de réplicas compatibles con OpenAI",
                  lifespan=lifespan)
    app.state.router = router
    app.add_middleware(BodyLimit, max_bytes=config.max_request_bytes)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        return _error(exc.status_code, str(exc.detail), code=None, type="invalid_request_error",
                      headers=getattr(exc, "headers", None))

    @app.get("/health")
    async def health():
        healthy = sum(r.healthy for r in router.replicas)
        if not healthy:
            return _error(503, "no hay ninguna réplica sana", "no_healthy_replica")
        return {"status": "ok", "healthy_replicas": healthy, "replicas": len(router.replicas)}

    @app.get("/replicas")
    async def replicas():
        return router.status()

    @app.get("/metrics")
    async def metrics():
        return Response(generate_latest(router.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models():
        return await router.forward_get("/v1/models")

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await router.forward(request, "/v1/completions")

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        return await router.forward(request, "/v1/chat/completions")

    return app
