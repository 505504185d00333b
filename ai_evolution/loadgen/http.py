"""An HTTP load generator for any OpenAI-compatible server: ours, vLLM, llama.cpp's llama-server.

``run_http(base_url, workload)`` sends every ``WorkItem`` to ``POST {base_url}/v1/completions``
with ``stream: true`` (the prompt as a list of token ids, which OpenAI's completions API
accepts, with ``max_tokens`` and, when the item asks for it, vLLM's ``ignore_eos``) and times
what comes back, on one clock (``time.perf_counter``, seconds since the run started):

- ``arrival_time``: when the request was sent;
- ``token_times``: one timestamp per server-sent event that carries a choice. vLLM and this
  course's server send one such event per generated token (vLLM's own benchmark counts them the
  same way); a server that groups tokens into fewer events gives fewer timestamps;
- ``first_token_time`` (the first of those), ``finish_time`` (the end of the stream).

Each request gives an ``HTTPRecord`` with the timing attributes that ``metrics.summarize`` and
``metrics.goodput`` read (``ttft``, ``tpot``, ``itls``, ``e2e_latency``, ``output_token_ids``,
``finish_reason``). The API sends text, not token ids, so ``output_token_ids`` holds one
placeholder (``-1``) per generated token: as many as the server's ``usage.completion_tokens``
(asked for with ``stream_options.include_usage``), or as many as token events when the server
sends no usage. A request that fails (an HTTP error status, a broken connection, an error
event in the stream, a timeout) is recorded with ``error`` (and ``status`` when there was an
HTTP answer) and no ``finish_time``; the run goes on, and ``summarize`` leaves it out.

Two ways to send (see ``loadgen.arrivals``):

- open loop (``concurrency=None``): each item is sent at its ``arrival_time`` after the start,
  whatever happens to the others;
- closed loop (``concurrency=N``): N clients, each sending the next item as soon as its
  previous request ends; arrival times are ignored.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import math
import time
from dataclasses import dataclass, field
from typing import Sequence

from ..engine.request import FinishReason, SamplingParams, TimingRecord


@dataclass(eq=False)
class HTTPRecord(TimingRecord):
    """One request of an HTTP run: what was sent, when each token came back, how it ended."""

    index: int                      # position in the workload
    num_prompt_tokens: int
    max_tokens: int
    scheduled_time: float           # open loop: the item's arrival_time; closed loop: NaN
    arrival_time: float | None = None  # when it was actually sent (s since the run started)
    first_token_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    finish_time: float | None = None   # None if it failed
    output_token_ids: list[int] = field(default_factory=list)  # placeholders (-1), one per token
    text: str = ""
    finish_reason: FinishReason | str | None = None
    error: str | None = None
    status: int | None = None       # HTTP status (None if no answer came)
    client: int | None = None       # closed loop: which client sent it

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def ok(self) -> bool:
        return self.error is None and self.finish_time is not None


def completions_url(base_url: str) -> str:
    """``http://host:8000`` or ``http://host:8000/v1`` -> ``http://host:8000/v1/completions``."""
    url = base_url.rstrip("/")
    return url + ("/completions" if url.endswith("/v1") else "/v1/completions")


def request_body(item, model: str, extra_body: dict | None = None) -> dict:
    """The JSON body for one ``WorkItem``: token-id prompt, its sampling parameters, streaming
    with usage; its tenant as OpenAI's ``user`` and its priority as vLLM's ``priority``."""
    prompt, params = item[1], item[2]
    if not isinstance(params, SamplingParams):
        raise TypeError(f"cada elemento de la carga necesita un SamplingParams; se recibió "
                        f"{type(params).__name__}")
    body = {"model": model, "prompt": [int(t) for t in prompt], "max_tokens": params.max_tokens,
            "temperature": params.temperature, "stream": True,
            "stream_options": {"include_usage": True}}
    if params.top_p is not None:
        body["top_p"] = params.top_p
    if params.top_k is not None:
        body["top_k"] = params.top_k
    if params.seed is not None:
        body["seed"] = params.seed
    if params.ignore_eos:
        body["ignore_eos"] = True
    if params.stop_token_ids:
        body["stop_token_ids"] = list(params.stop_token_ids)
    tags = (item[3] if len(item) > 3 else None) or {}
    if tags.get("tenant") is not None:  # the OpenAI field that names the end user
        body["user"] = tags["tenant"]
    if tags.get("priority", 0) != 0:  # vLLM's extra field
        body["priority"] = tags["priority"]
    body.update(extra_body or {})
    return body


def _error_message(raw: bytes) -> str:
    try:
        err = json.loads(raw).get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        if isinstance(err, str):
            return err
    except (ValueError, AttributeError):
        pass
    return raw[:300].decode("utf-8", "replace")


def _finish_reason(value):
    try:
        return FinishReason(value)
    except ValueError:
        return value


async def _stream_one(client, url: str, body: dict, rec: HTTPRecord,
                      clock) -> None:
    async with client.stream("POST", url, json=body) as resp:
        rec.status = resp.status_code
        if resp.status_code != 200:
            rec.error = f"HTTP {resp.status_code}: {_error_message(await resp.aread())}"
            return
        usage_tokens, parts = None, []
        async for line in resp.aiter_lines():
            if not line.startswith("data:"):
                continue  # blank separators, comments, event names
            data = line[5:].strip()
            if data == "[DONE]":
                break
            try:
                msg = json.loads(data)
            except ValueError:
                rec.error = f"evento no JSON en el flujo: {data[:200]!r}"
                return
            if msg.get("error"):
                err = msg["error"]
                rec.error = "error en el flujo: " + (err.get("message", str(err))
                                                     if isinstance(err, dict) else str(err))
                return
            choices = msg.get("choices") or []
            if choices:
                t = clock()
                rec.token_times.append(t)
                if rec.first_token_time is None:
                    rec.first_token_time = t
                choice = choices[0]
                parts.append(choice.get("text") or "")
                if choice.get("finish_reason") is not None:
                    rec.finish_reason = _finish_reason(choice["finish_reason"])
            usage = msg.get("usage")
            if usage and usage.get("completion_tokens") is not None:
                usage_tokens = int(usage["completion_tokens"])
        rec.finish_time = clock()
        n = usage_tokens if usage_tokens is not None else len(rec.token_times)
        rec.output_token_ids = [-1] * n
        rec.text = "".join(parts)


async def _send(client, url, body, rec: HTTPRecord, clock, timeout_s: float) -> None:
    rec.arrival_time = clock()
    try:
        await asyncio.wait_for(_stream_one(client, url, body, rec, clock), timeout_s)
    except asyncio.TimeoutError:
        rec.error = f"tiempo agotado: la petición tardó más de {timeout_s} s"
    except Exception as err:  # connection errors and the like: one bad request must not stop the run
        rec.error = f"{type(err).__name__}: {err}"
    if rec.error is not None:
        rec.finish_time = None


def _check(workload, concurrency, timeout_s) -> list:
    items = list(workload)
    if not items:
        raise ValueError("la carga está vacía: hace falta al menos una petición")
    for i, item in enumerate(items):
        if len(item) not in (3, 4) or (len(item) == 4 and not isinstance(item[3], (dict, type(None)))):
            raise ValueError(f"elemento {i}: se esperaba (arrival_time, prompt_token_ids, params) "
                             "o un WorkItem con sus etiquetas {'priority': p, 'tenant': nombre}")
        t = item[0]
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not t >= 0 \
                or not math.isfinite(t):
            raise ValueError(f"elemento {i}: arrival_time debe ser un número >= 0; se recibió {t!r}")
    if concurrency is not None and (isinstance(concurrency, bool) or not isinstance(concurrency, int)
                                    or concurrency < 1):
        raise ValueError(f"concurrency debe ser None (lazo abierto) o un entero >= 1; se recibió "
                         f"{concurrency!r}")
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
        raise ValueError(f"timeout_s debe ser un número > 0; se recibió {timeout_s!r}")
    return items


async def arun_http(base_url: str, workload: Sequence, *, model: str = "tiny-es",
                    concurrency: int | None = None, timeout_s: float = 120.0,
                    progress: bool = True, api_key: str | None = None,
                    extra_body: dict | None = None) -> list[HTTPRecord]:
    """``run_http`` as a coroutine (``await arun_http(...)`` inside a running event loop)."""
    import httpx  # imported here: the rest of loadgen does not need an HTTP client

    items = _check(workload, concurrency, timeout_s)
    url = completions_url(base_url)
    bodies = [request_body(item, model, extra_body) for item in items]
    records = [HTTPRecord(i, len(item[1]), item[2].max_tokens,
                          float(item[0]) if concurrency is None else math.nan)
               for i, item in enumerate(items)]
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    # No pool limit: an open loop must not queue requests in the client, or the client, not the
    # server, would decide when they arrive.
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=concurrency or 100)
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=len(items), desc="peticiones HTTP", unit="pet", leave=False)
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout_s), limits=limits,
                                 headers=headers) as client:
        t0 = time.perf_counter()

        def clock() -> float:
            return time.perf_counter() - t0

        async def one(i: int) -> None:
            await _send(client, url, bodies[i], records[i], clock, timeout_s)
            if bar is not None:
                bar.update(1)

        if concurrency is None:
            async def at_arrival(i: int) -> None:
                delay = t0 + float(items[i][0]) - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                await one(i)
            await asyncio.gather(*(at_arrival(i) for i in range(len(items))))
        else:
            pending = iter(range(len(items)))  # shared by the clients (one event loop: no race)

            async def client_loop(c: int) -> None:
                for i in pending:
                    records[i].client = c
                    await one(i)
            await asyncio.gather(*(client_loop(c) for c in range(min(concurrency, len(items)))))
    if bar is not None:
        bar.close()
    return records


def run_http(base_url: str, workload: Sequence, *, model: str = "tiny-es",
             concurrency: int | None = None, timeout_s: float = 120.0, progress: bool = True,
             api_key: str | None = None, extra_body: dict | None = None) -> list[HTTPRecord]:
    """Send ``workload`` (``WorkItem``s: arrival time, prompt token ids, ``SamplingParams``) to the
    OpenAI-compatible server at ``base_url`` and return one ``HTTPRecord`` per item, in workload
    order.

    ``concurrency=None`` is an open loop (each item leaves at its ``arrival_time``); an integer is
    a closed loop of that many clients. ``timeout_s`` bounds each request, start to end.
    ``extra_body`` adds fields to every request (for example ``{"top_k": 1}``). A request that
    fails is recorded with ``error``; nothing is raised for it.

    Inside a running event loop (a Jupyter notebook), the run goes to a worker thread with its
    own loop; ``await arun_http(...)`` is the direct way there.
    """
    kw = dict(model=model, concurrency=concurrency, timeout_s=timeout_s, progress=progress,
              api_key=api_key, extra_body=extra_body)
    workload = _check(workload, concurrency, timeout_s)
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(arun_http(base_url, workload, **kw))
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(lambda: asyncio.run(arun_http(base_url, workload, **kw))).result()


__all__ = ["HTTPRecord", "arun_http", "completions_url", "request_body", "run_http"]
