"""Run the server: in a background thread (tests, notebooks, labs) or as a process (the CLI).

``serve_in_thread(LLM("tiny-es", kv_layout="paged"))`` binds a free port on 127.0.0.1, starts
uvicorn in a daemon thread, waits until it accepts connections and returns a ``ServerHandle``
(``base_url``, ``close()``; also a context manager)::

    with serve_in_thread(LLM("tiny-es", kv_layout="paged")) as server:
        run_http(server.base_url, workload)
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import uvicorn

from .app import create_app


def _engine_and_tokenizer(llm_or_engine, tokenizer):
    engine = getattr(llm_or_engine, "engine", llm_or_engine)
    if tokenizer is None:
        tokenizer = getattr(llm_or_engine, "tokenizer", None)
    if not hasattr(engine, "step") or not hasattr(engine, "add_request"):
        raise TypeError(f"se esperaba un LLM o un LLMEngine; se recibió {type(llm_or_engine).__name__}")
    return engine, tokenizer


def default_model_name(tokenizer) -> str:
    """The served name: the tokenizer's name (its Hub id, or its folder: ``tiny-es`` for the
    shipped model)."""
    name = getattr(tokenizer, "name", None)
    if name:
        return name
    path = getattr(tokenizer, "path", None)
    return Path(path).parent.name if path is not None else "ai-evolution"


class ServerHandle:
    """A server running in a thread of this process."""

    def __init__(self, server: uvicorn.Server, thread: threading.Thread, app, base_url: str) -> None:
        self.server, self.thread, self.app, self.base_url = server, thread, app, base_url

    @property
    def engine_loop(self):
        """The ``EngineLoop``: ``engine_loop.call(fn).result()`` runs ``fn(engine)`` safely."""
        return self.app.state.server.loop

    @property
    def model_name(self) -> str:
        return self.app.state.server.model_name

    def close(self, timeout: float = 30.0) -> None:
        """Stop accepting connections, finish (or cut, after a few seconds) the open ones, stop
        the engine thread, and wait for all of it."""
        self.server.should_exit = True
        self.thread.join(timeout)

    def __enter__(self) -> "ServerHandle":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ServerHandle(base_url={self.base_url!r})"


def serve_in_thread(llm_or_engine, *, tokenizer=None, model_name: str | None = None,
                    host: str = "127.0.0.1", port: int = 0, max_waiting: int | None = 256,
                    log_level: str = "warning", startup_timeout_s: float = 60.0,
                    tenants=None) -> ServerHandle:
    """Serve an ``LLM`` (or an ``LLMEngine`` plus ``tokenizer``) from a background thread.

    ``port=0`` lets the OS pick a free port; ``base_url`` says which. The engine must not be
    used by anyone else while the server runs (the server's engine thread owns it); inspect it
    through ``handle.engine_loop.call(fn)``. ``tenants``: a ``tenants.Tenants`` (keys, limits).
    """
    engine, tokenizer = _engine_and_tokenizer(llm_or_engine, tokenizer)
    app = create_app(engine, tokenizer, model_name=model_name or default_model_name(tokenizer),
                     max_waiting=max_waiting, tenants=tenants)
    return serve_app_in_thread(app, host=host, port=port, log_level=log_level,
                               startup_timeout_s=startup_timeout_s)


def serve_app_in_thread(app, *, host: str = "127.0.0.1", port: int = 0,
                        log_level: str = "warning", startup_timeout_s: float = 60.0) -> ServerHandle:
    """Serve any ASGI ``app`` (this server's, or the router's) from a background thread."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    actual_port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level=log_level, lifespan="on", access_log=False,
                            timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True,
                              name=f"ai-evolution-http-{actual_port}")
    thread.start()
    deadline = time.monotonic() + startup_timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            sock.close()
            raise RuntimeError("el servidor no arrancó (mira el registro de uvicorn)")
        time.sleep(0.01)
    return ServerHandle(server, thread, app, f"http://{host}:{actual_port}")
