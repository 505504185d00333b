"""The FastAPI application: OpenAI's ``/v1/completions`` and ``/v1/chat/completions`` (with and
without streaming), ``/v1/models``, ``/health`` and ``/metrics``, around one ``EngineLoop``.

A request goes through three gates before it costs the engine anything: the JSON types
(pydantic, answered by ``protocol.validation_error``), the model name (404), and the prompt and
sampling parameters against the engine's limits (400). It then joins the engine's inbox, unless
the waiting queue is full (503 with ``Retry-After``) or its tenant is over a limit (429 with
``Retry-After``; see ``tenants``). With ``stream: true`` the answer is a
server-sent event per generated token (``data: {json}\\n\\n``; the last token's event carries the
``finish_reason``), an optional usage event, and ``data: [DONE]``. A client that disconnects has
its request aborted in the engine, which frees its KV blocks at the next step.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..engine.request import RequestRejected, validate_prompt
from . import protocol as P
from .body_limit import BodyLimit
from .chat_template import ChatTemplateError, apply_chat_template
from .detokenize import IncrementalDetokenizer
from .engine_loop import EngineLoop, EngineStopped, Event, QueueFull, RequestHandle
from .metrics import ServerMetrics
from .tenants import Refused, Tenants

log = logging.getLogger(__name__)

GENERATION_PATHS = ("/v1/completions", "/v1/chat/completions")
RETRY_AFTER_S = 1
CLIENT_CLOSED = 499  # nginx's "client closed request": nobody reads it, the log does


class ServerState:
    """What the handlers share: the engine loop, the tokenizer and the served model's name."""

    def __init__(self, engine, tokenizer, model_name: str, max_waiting: int | None,
                 metrics: ServerMetrics, tenants: Tenants | None = None) -> None:
        self.loop = EngineLoop(engine, metrics, max_waiting=max_waiting)
        self.tenants = tenants if tenants is not None else Tenants()
        self.scheduling_policy = engine.scheduler.scheduling.name  # fixed at construction
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.metrics = metrics
        self.vocab_size = engine.vocab_size        # fixed at construction: safe to read here
        self.max_model_len = engine.max_model_len
        # No text longer than this can fit max_model_len tokens: refused before tokenising.
        self.max_prompt_chars = (None if tokenizer is None or not hasattr(tokenizer, "longest_token_chars")
                                 else self.max_model_len * tokenizer.longest_token_chars)
        self.created = int(time.time())


MAX_REQUEST_BYTES = 4 * 2**20


def create_app(engine, tokenizer=None, *, model_name: str = "tiny-es",
               max_waiting: int | None = 256, max_request_bytes: int = MAX_REQUEST_BYTES,
               tenants: Tenants | None = None) -> FastAPI:
    """An app serving ``engine`` (an ``LLMEngine``) under ``model_name``. ``tokenizer`` turns
    text prompts into ids (without it only token-id prompts work, and responses carry no text).
    The engine thread starts and stops with the app (its lifespan). A body over
    ``max_request_bytes`` is refused (413): at once when its ``Content-Length`` says so, else as
    soon as that many bytes have arrived (``body_limit.BodyLimit``). ``tenants``: who sends
    each request and their limits (default: tenants named by ``user``, no limits)."""
    state = ServerState(engine, tokenizer, model_name, max_waiting, ServerMetrics(), tenants)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        state.loop.start()
        try:
            yield
        finally:
            await asyncio.to_thread(state.loop.stop)

    app = FastAPI(title="ai_evolution: servidor compatible con OpenAI", lifespan=lifespan)
    app.state.server = state
    _install_error_handlers(app, state)

    def rejected(path: str) -> None:
        if path in GENERATION_PATHS:
            state.metrics.outcome("rejected")

    app.add_middleware(BodyLimit, max_bytes=max_request_bytes, on_reject=rejected)

    @app.get("/health")
    async def health():
        if not state.loop.alive:
            raise P.APIError(503, "el motor no está en marcha", type="server_error",
                             code="engine_not_running")
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{
            "id": state.model_name, "object": "model", "created": state.created,
            "owned_by": "ai_evolution", "max_model_len": state.max_model_len}]}

    @app.get("/metrics")
    async def metrics():
        return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/v1/completions")
    async def completions(body: P.CompletionRequest, request: Request):
        received = time.perf_counter()
        _check_model(state, body.model)
        tenant = _tenant(state, request, body)
        prompt = P.completion_prompt(body.prompt, state.tokenizer)
        if isinstance(prompt, str):  # checked first; tokenised off the event loop
            P.check_text(prompt, "prompt", state.max_prompt_chars)
            ids = await asyncio.to_thread(state.tokenizer.encode, prompt, add_bos=True)
        else:
            ids = prompt
        ids = _checked_prompt(state, ids, "prompt")
        params = P.to_sampling_params(body, len(ids), state.max_model_len, state.vocab_size,
                                      default_max_tokens=16)
        return await _generate(state, request, "completion", body, ids, params, received, tenant)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: P.ChatCompletionRequest, request: Request):
        received = time.perf_counter()
        _check_model(state, body.model)
        tenant = _tenant(state, request, body)
        messages = P.chat_messages(body.messages)
        if state.tokenizer is None:
            raise P.APIError(400, "este servidor no tiene tokenizador: el chat necesita uno; usa "
                                  "/v1/completions con ids de token", param="messages")
        for i, (_, text) in enumerate(messages):
            P.check_text(text, f"messages[{i}].content", state.max_prompt_chars)
        if state.max_prompt_chars is not None and sum(len(t) for _, t in messages) > state.max_prompt_chars:
            P.check_text("".join(t for _, t in messages), "messages", state.max_prompt_chars)
        try:
            ids = await asyncio.to_thread(apply_chat_template, state.tokenizer, messages)
        except ChatTemplateError as e:  # e.g. a template that rejects the order of the roles
            raise P.APIError(400, str(e), param="messages") from None
        ids = _checked_prompt(state, ids, "messages")
        params = P.to_sampling_params(body, len(ids), state.max_model_len, state.vocab_size,
                                      default_max_tokens=None)
        return await _generate(state, request, "chat", body, ids, params, received, tenant)

    return app


# --- helpers -----------------------------------------------------------------------------------
def _check_model(state: ServerState, model: str) -> None:
    if model != state.model_name:
        raise P.APIError(404, f"el modelo '{model}' no existe en este servidor; modelos "
                              f"disponibles: {state.model_name}", param="model",
                         code="model_not_found")


def _checked_prompt(state: ServerState, ids: list[int], param: str) -> list[int]:
    try:
        return validate_prompt(ids, state.vocab_size, state.max_model_len)
    except RequestRejected as err:
        raise P.APIError(400, str(err), param=param) from None


def _tenant(state: ServerState, request: Request, body) -> str:
    """The request's tenant (API key or ``user``), or a 401/400 ``APIError``; a ``priority``
    other than 0 needs the ``priority`` scheduling policy (400 otherwise, as vLLM)."""
    try:
        tenant = state.tenants.identify(request.headers.get("authorization"), body.user)
    except Refused as err:
        raise P.APIError(err.status, err.message, param="user" if err.status == 400 else None,
                         code="invalid_api_key" if err.status == 401 else None) from None
    if body.priority != 0 and state.scheduling_policy != "priority":
        raise P.APIError(400, f"se recibió priority={body.priority}, pero este servidor planifica "
                              f"con la política '{state.scheduling_policy}': priority solo se "
                              "acepta con --scheduling-policy priority (o déjalo en 0)",
                         param="priority")
    return tenant


def _admit(state: ServerState, tenant: str, cost_tokens: int):
    """The tenant's lease for one request of ``cost_tokens`` tokens, or a 429/400 ``APIError``."""
    try:
        return state.tenants.admit(tenant, cost_tokens)
    except Refused as err:
        state.metrics.refusal("rate_limited" if err.status == 429 else "rejected", tenant, err.reason)
        headers = None if err.retry_after_s is None else {"Retry-After": str(err.retry_after_s)}
        raise P.APIError(err.status, err.message,
                         type="rate_limit_error" if err.status == 429 else "invalid_request_error",
                         code=err.reason, headers=headers, counted=True) from None


async def _generate(state: ServerState, request: Request, kind: str, body, ids: list[int],
                    params, received: float, tenant: str):
    lease = _admit(state, tenant, len(ids) + params.max_tokens)
    try:
        handle = state.loop.submit(ids, params, received, body.priority, tenant)
    except QueueFull as err:
        lease.release()
        state.metrics.outcome("overloaded", tenant)
        raise P.APIError(503, str(err), type="server_error", code="server_overloaded",
                         headers={"Retry-After": str(RETRY_AFTER_S)}) from None
    except EngineStopped as err:
        lease.release()
        raise P.APIError(503, str(err), type="server_error", code="engine_not_running") from None
    try:
        first = await handle.queue.get()
        if first.kind == "error":
            _raise_event_error(first, "prompt" if kind == "completion" else "messages")
    except BaseException:
        lease.release()
        state.loop.abort(handle)
        raise
    rid = P.new_id("cmpl" if kind == "completion" else "chatcmpl")
    created = P.now_s()
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        progress = {"finished": False}

        def on_close() -> None:
            lease.release()
            progress["finished"] or state.loop.abort(handle)

        return _EngineStream(
            _stream(state, handle, kind, rid, created, body.model, include_usage, progress),
            on_close=on_close, media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    try:
        return await _complete(state, request, handle, kind, rid, created, body.model)
    finally:
        lease.release()


def _raise_event_error(event: Event, param: str | None) -> None:
    if event.status == 400:
        raise P.APIError(400, event.message or "petición rechazada", param=param)
    raise P.APIError(event.status, event.message or "error interno", type="server_error")


async def _wait_disconnect(request: Request) -> None:
    """Returns when the client closes its connection (the body has already been read)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def _complete(state: ServerState, request: Request, handle: RequestHandle, kind: str,
                    rid: str, created: int, model: str):
    """Non-streaming: collect every token, watching for the client to leave meanwhile."""
    watcher = asyncio.ensure_future(_wait_disconnect(request))
    tokens: list[int] = []
    finish_reason = None
    try:
        while finish_reason is None:
            getter = asyncio.ensure_future(handle.queue.get())
            done, _ = await asyncio.wait({getter, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if getter not in done:
                getter.cancel()
                state.loop.abort(handle)
                return Response(status_code=CLIENT_CLOSED)
            event = getter.result()
            if event.kind == "error":
                _raise_event_error(event, None)
            tokens.extend(event.token_ids)
            finish_reason = event.finish_reason
    except BaseException:
        state.loop.abort(handle)
        raise
    finally:
        watcher.cancel()
    text = state.tokenizer.decode(tokens) if state.tokenizer is not None else ""
    build = P.completion_response if kind == "completion" else P.chat_response
    return JSONResponse(build(rid, created, model, text, finish_reason,
                              len(handle.prompt_token_ids), len(tokens)))


class _EngineStream(StreamingResponse):
    """A streaming response that calls ``on_close`` however it ends: normally, on a client
    disconnect (Starlette cancels the body), or before the body even started."""

    def __init__(self, content, *, on_close, **kw) -> None:
        super().__init__(content, **kw)
        self._on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()


def _sse(payload) -> str:
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return f"data: {data}\n\n"


async def _stream(state: ServerState, handle: RequestHandle, kind: str, rid: str, created: int,
                  model: str, include_usage: bool, progress: dict):
    """The SSE body. Starlette cancels it when the client disconnects; ``_EngineStream`` then
    aborts the request unless ``progress["finished"]`` says the engine is done with it."""
    detok = IncrementalDetokenizer(state.tokenizer) if state.tokenizer is not None else None
    n_out, finished = 0, False

    def chunk(text: str, reason: str | None) -> dict:
        if kind == "completion":
            return P.completion_chunk(rid, created, model, text, reason, include_usage)
        return P.chat_chunk(rid, created, model, {"content": text} if text or reason is None
                            else {}, reason, include_usage)

    if kind == "chat":
        yield _sse(P.chat_chunk(rid, created, model, {"role": "assistant", "content": ""},
                                None, include_usage))
    while not finished:
        event = await handle.queue.get()
        if event.kind == "error":  # the engine has already dropped the request
            progress["finished"] = True
            yield _sse(P.error_body(event.message or "error interno", "server_error"))
            return
        reason = event.finish_reason
        finished = progress["finished"] = reason is not None
        if not event.token_ids and reason is not None:
            yield _sse(chunk(detok.flush() if detok else "", reason))
        for i, token in enumerate(event.token_ids):
            last = reason is not None and i == len(event.token_ids) - 1
            text = detok.push(token) if detok else ""
            if last and detok:
                text += detok.flush()
            n_out += 1
            yield _sse(chunk(text, reason if last else None))
    if include_usage:
        obj = "text_completion" if kind == "completion" else "chat.completion.chunk"
        yield _sse(P.usage_chunk(rid, created, model, obj, len(handle.prompt_token_ids), n_out))
    yield _sse("[DONE]")


def _install_error_handlers(app: FastAPI, state: ServerState) -> None:
    def reply(request: Request, err: P.APIError) -> JSONResponse:
        if request.url.path in GENERATION_PATHS and 400 <= err.status < 500 and not err.counted:
            state.metrics.outcome("rejected")
        return JSONResponse(err.body(), status_code=err.status, headers=err.headers)

    @app.exception_handler(P.APIError)
    async def api_error(request: Request, err: P.APIError):
        return reply(request, err)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, err: RequestValidationError):
        return reply(request, P.validation_error(list(err.errors())))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, err: StarletteHTTPException):
        headers = getattr(err, "headers", None)
        if err.status_code == 404:
            message = f"no existe la ruta {request.url.path}; rutas: /v1/completions, " \
                      "/v1/chat/completions, /v1/models, /health, /metrics"
        elif err.status_code == 405:
            message = f"el método {request.method} no está permitido en {request.url.path}"
        elif err.status_code == 400 and err.__cause__ is not None:
            # FastAPI's "There was an error parsing the body": the cause says what went wrong
            return reply(request, P.body_error(err.__cause__))
        elif err.status_code == 413:
            return reply(request, P.APIError(413, str(err.detail), headers=headers))
        else:
            message = str(err.detail)
        return JSONResponse(P.error_body(message, "invalid_request_error"),
                            status_code=err.status_code, headers=headers)

    @app.exception_handler(Exception)
    async def internal(request: Request, err: Exception):
        log.exception("unhandled error")
        return JSONResponse(P.error_body(f"error interno del servidor: {type(err).__name__}",
                                         "server_error"), status_code=500)
