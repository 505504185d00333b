"""The one thread that owns the engine, and the queues that connect it to the HTTP handlers.

::

    HTTP handlers (asyncio, uvicorn's thread)          engine thread (owns LLMEngine)
    ------------------------------------------         ------------------------------------
    submit(prompt, params) -> handle ──── inbox ──────► add_request / abort_request / call
           ▲                              (queue.Queue)      │
           │                                                 ▼
    await handle.queue.get()  ◄── call_soon_threadsafe ── step() -> new tokens per request

Every engine call happens in the engine thread: the scheduler, the KV cache and the model are
never touched by two threads at once, and no lock is held around a forward pass. Between two
steps the thread takes *every* command waiting in the inbox, so requests from many HTTP clients
join the running batch at the next step: the HTTP clients are continuously batched together,
exactly like ``LLMEngine.run``'s online arrivals. When no request is unfinished the thread
retires the finished ones (their KV blocks go back to the pool) and blocks on the inbox: an idle
server does not spin.

A finished or aborted request is reported to its handle once and then released from
``engine.requests`` (``LLMEngine.release``), so a server that runs for days keeps a bounded
amount of state; ``engine.history`` is trimmed to its last ``max_history`` steps for the same
reason.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ..engine.request import FinishReason, RequestRejected, SamplingParams
from .metrics import ServerMetrics

log = logging.getLogger(__name__)


class QueueFull(Exception):
    """The waiting queue holds ``max_waiting`` requests: come back later."""


class EngineStopped(Exception):
    """The engine thread is not running (not started yet, shut down, or crashed)."""


@dataclass(frozen=True)
class Event:
    """What the engine thread tells a request's handle.

    ``kind`` is ``"accepted"`` (the engine queued it), ``"tokens"`` (new token ids, with the
    ``finish_reason`` on the last event of the request) or ``"error"`` (``status`` and Spanish
    ``message``; the request is over).
    """

    kind: str
    token_ids: tuple[int, ...] = ()
    finish_reason: str | None = None
    status: int = 500
    message: str | None = None


class RequestHandle:
    """One HTTP request's link to the engine thread: its events arrive on ``queue`` (an
    ``asyncio.Queue`` of the event loop that submitted it)."""

    def __init__(self, prompt_token_ids: list[int], params: SamplingParams,
                 loop: asyncio.AbstractEventLoop, received: float, priority: int = 0,
                 tenant: str | None = None) -> None:
        self.prompt_token_ids = prompt_token_ids
        self.params = params
        self.priority, self.tenant = priority, tenant  # scheduling tags (chapter 12)
        self.queue: asyncio.Queue[Event] = asyncio.Queue()
        self.received = received          # time.perf_counter() when the HTTP request came in
        self.request_id: str | None = None  # the engine's id, set by the engine thread
        self.request = None                 # the engine's Request (engine thread only)
        self._loop = loop
        self._num_sent = 0
        self._done = False

    def _deliver(self, event: Event) -> None:
        """Called from the engine thread."""
        try:
            self._loop.call_soon_threadsafe(self.queue.put_nowait, event)
        except RuntimeError:  # the event loop has closed: nobody is listening any more
            pass


_STOP = object()


class EngineLoop:
    """Runs ``engine`` in a background thread and serves ``submit``/``abort`` from any thread.

    ``max_waiting`` bounds the requests accepted but not yet admitted to the batch (queued in the
    scheduler or still in the inbox); ``submit`` raises ``QueueFull`` beyond it (``None``: no
    bound). ``metrics`` (a ``ServerMetrics``) is updated after every step.
    """

    def __init__(self, engine, metrics: ServerMetrics | None = None, max_waiting: int | None = None,
                 max_history: int = 10_000) -> None:
        if max_waiting is not None and (isinstance(max_waiting, bool)
                                        or not isinstance(max_waiting, int) or max_waiting < 1):
            raise ValueError(f"max_waiting debe ser un entero >= 1 o None; se recibió {max_waiting!r}")
        self.engine = engine
        self.metrics = metrics if metrics is not None else ServerMetrics()
        self.max_waiting = max_waiting
        self.max_history = max_history
        self._inbox: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._inbox_adds = 0   # submitted, not yet taken by the engine thread
        self._queued = 0       # in the scheduler's waiting queue (as of the last step)
        self._active: dict[str, RequestHandle] = {}  # engine request id -> handle (engine thread)
        self._thread: threading.Thread | None = None
        self._clock_offset = 0.0
        self.error: BaseException | None = None  # what stopped the thread, if it crashed

    # --- lifecycle -------------------------------------------------------------------------------
    def start(self) -> "EngineLoop":
        if self._thread is not None:
            raise RuntimeError("EngineLoop already started")
        self._thread = threading.Thread(target=self._run, name="ai-evolution-engine", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float | None = 30.0) -> None:
        """Stop the thread: in-flight requests are aborted and their handles get an error."""
        if self._thread is None:
            return
        self._inbox.put(_STOP)
        self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # --- called from the HTTP side ---------------------------------------------------------------
    def submit(self, prompt_token_ids: Sequence[int], params: SamplingParams,
               received: float | None = None, priority: int = 0,
               tenant: str | None = None) -> RequestHandle:
        """Queue a request for the engine (call it inside the event loop that will read the
        handle's queue), with its scheduling tags. Raises ``QueueFull`` or ``EngineStopped``
        without queuing anything."""
        if not self.alive:
            raise EngineStopped("el motor no está en marcha")
        loop = asyncio.get_running_loop()
        with self._lock:
            if self.max_waiting is not None and self._inbox_adds + self._queued >= self.max_waiting:
                raise QueueFull(f"la cola de espera está llena ({self.max_waiting} peticiones "
                                "esperando a entrar en el lote); vuelve a intentarlo en unos "
                                "segundos")
            self._inbox_adds += 1
        handle = RequestHandle(list(prompt_token_ids), params, loop,
                               time.perf_counter() if received is None else received,
                               priority, tenant)
        self._inbox.put(("add", handle))
        return handle

    def abort(self, handle: RequestHandle) -> None:
        """Abort the request (its client went away); a finished one is left alone."""
        self._inbox.put(("abort", handle))

    def call(self, fn: Callable[[Any], Any]) -> concurrent.futures.Future:
        """Run ``fn(engine)`` in the engine thread between two steps; a ``Future`` of its result.
        The safe way to inspect the engine (KV usage, pool invariants) while the server runs."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        if not self.alive:
            future.set_exception(EngineStopped("el motor no está en marcha"))
            return future
        self._inbox.put(("call", fn, future))
        return future

    @property
    def num_waiting(self) -> int:
        with self._lock:
            return self._inbox_adds + self._queued

    # --- the engine thread -----------------------------------------------------------------------
    def _run(self) -> None:
        engine = self.engine
        # The engine's clock (the runner's perf_counter, shifted): HTTP arrival times convert to it.
        self._clock_offset = time.perf_counter() - engine.now()
        try:
            while True:
                commands = []
                if not engine.has_unfinished_requests():
                    self._retire()
                    self._publish()
                    commands.append(self._inbox.get())  # idle: sleep until something arrives
                while True:
                    try:
                        commands.append(self._inbox.get_nowait())
                    except queue.Empty:
                        break
                for cmd in commands:
                    if cmd is _STOP:
                        self._shutdown("el servidor se está apagando", 503)
                        return
                    self._apply(cmd)
                if engine.has_unfinished_requests():
                    try:
                        outputs = engine.step()
                    except Exception as err:  # a bug: fail what is in flight, keep serving
                        log.exception("engine step failed")
                        self._fail_all(f"error interno del motor: {type(err).__name__}: {err}")
                        continue
                    with self._lock:  # before anyone hears of this step: admissions count now
                        self._queued = engine.num_waiting
                    self._deliver(outputs)
                self._publish()
        except BaseException as err:  # never die silently
            self.error = err
            log.exception("engine thread crashed")
            self._shutdown(f"error interno del motor: {type(err).__name__}: {err}", 500)

    def _apply(self, cmd: tuple) -> None:
        kind = cmd[0]
        if kind == "add":
            self._add(cmd[1])
        elif kind == "abort":
            handle = cmd[1]
            if handle.request_id is not None and not handle._done:
                self.engine.abort_request(handle.request_id)
                self._finish(handle, "abort")
        elif kind == "call":
            _, fn, future = cmd
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(self.engine))
                except BaseException as err:
                    future.set_exception(err)

    def _add(self, handle: RequestHandle) -> None:
        with self._lock:
            self._inbox_adds -= 1
        engine = self.engine
        arrival = min(engine.now(), handle.received - self._clock_offset)
        try:
            req = engine.add_request(handle.prompt_token_ids, handle.params, arrival_time=arrival,
                                     priority=handle.priority, tenant=handle.tenant)
        except RequestRejected as err:  # (the HTTP layer counts it, with its other 4xx)
            handle._done = True
            handle._deliver(Event("error", status=400, message=str(err)))
            return
        with self._lock:
            self._queued += 1
        handle.request_id, handle.request = req.request_id, req
        self._active[req.request_id] = handle
        self.metrics.prompt_tokens.inc(req.num_prompt_tokens)
        self.metrics.tenant_prompt(handle.tenant, req.num_prompt_tokens)
        handle._deliver(Event("accepted"))

    def _deliver(self, outputs) -> None:
        for out in outputs:
            handle = self._active.get(out.request_id)
            if handle is None:
                continue
            req = handle.request
            if req.finish_reason is FinishReason.ERROR:  # its part of the step failed: only it
                self._finish(handle, "error", message=req.error, status=500)
                continue
            new = req.output_token_ids[handle._num_sent:]
            if handle._num_sent == 0 and new and req.ttft is not None:
                self.metrics.ttft.observe(max(0.0, req.ttft))
                self.metrics.tenant_ttft(handle.tenant, max(0.0, req.ttft))
            handle._num_sent += len(new)
            self.metrics.generation_tokens.inc(len(new))
            self.metrics.tenant_generated(handle.tenant, len(new))
            reason = req.finish_reason.value if req.is_finished else None
            handle._deliver(Event("tokens", tuple(new), reason))
            if req.is_finished:
                if req.tpot is not None:
                    self.metrics.tpot.observe(req.tpot)
                    self.metrics.tenant_tpot(handle.tenant, req.tpot)
                if req.e2e_latency is not None:
                    self.metrics.e2e.observe(max(0.0, req.e2e_latency))
                self._finish(handle, reason, notify=False)

    def _finish(self, handle: RequestHandle, outcome: str, notify: bool = True,
                message: str | None = None, status: int = 500) -> None:
        """Report (if ``notify``) and forget a finished request."""
        handle._done = True
        self._active.pop(handle.request_id, None)
        try:
            self.engine.release(handle.request_id)
        except (KeyError, ValueError):
            pass
        self.metrics.outcome(outcome, handle.tenant)
        if notify:
            if message is None:
                handle._deliver(Event("tokens", (), outcome))
            else:
                handle._deliver(Event("error", status=status, message=message))

    def _fail_all(self, message: str, status: int = 500, outcome: str = "error") -> None:
        for handle in list(self._active.values()):
            try:
                self.engine.abort_request(handle.request_id)
            except Exception:  # the engine may be in a bad state; the handle still hears back
                log.exception("abort failed")
            self._finish(handle, outcome, message=message, status=status)

    def _shutdown(self, message: str, status: int) -> None:
        while True:  # requests still in the inbox never reached the engine
            try:
                cmd = self._inbox.get_nowait()
            except queue.Empty:
                break
            if cmd is not _STOP and cmd[0] == "add":
                with self._lock:
                    self._inbox_adds -= 1
                cmd[1]._done = True
                cmd[1]._deliver(Event("error", status=status, message=message))
            elif cmd is not _STOP and cmd[0] == "call":
                cmd[2].set_exception(EngineStopped(message))
        self._fail_all(message, status, outcome="abort" if status == 503 else "error")
        try:
            self._retire()
        except Exception:
            log.exception("retiring finished requests failed")

    def _retire(self) -> None:
        """Retire finished requests, so that their KV goes back to the pool."""
        self.engine.retire_finished()

    def _publish(self) -> None:
        engine = self.engine
        with self._lock:
            self._queued = engine.num_waiting
            inbox = self._inbox_adds
        if len(engine.history) > self.max_history:
            del engine.history[:len(engine.history) - self.max_history]
        self.metrics.update_engine(engine, inbox)
