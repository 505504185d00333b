"""The request body cap, counted as the bytes arrive.

``Content-Length`` alone cannot bound a body: a ``Transfer-Encoding: chunked`` request has none,
and the framework would read it whole before parsing it. ``BodyLimit`` is a plain ASGI
middleware that wraps ``receive``:

- a declared ``Content-Length`` over the cap is answered 413 at once, before the app runs; the
  connection stays open and uvicorn discards the declared (finite) rest as it arrives, so an
  ordinary client that is still sending its body reads the 413 instead of a reset;
- otherwise every ``http.request`` message adds its bytes to a counter, and the first one past the
  cap raises ``BodyTooLarge`` (a 413 ``HTTPException``, which FastAPI passes through its body
  reading to the app's error handlers). That can only be a body without a declared length, which
  could go on for ever: its answer says ``Connection: close`` and the server stops reading it.

Either way at most the cap plus one chunk is ever held in memory.
"""

from __future__ import annotations

from typing import Callable

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .protocol import error_body

CLOSE = {"Connection": "close"}


def too_large_message(max_bytes: int, seen: int | str) -> str:
    return (f"la petición ocupa {seen} bytes; el máximo es {max_bytes} (también con "
            "Transfer-Encoding: chunked): envía un cuerpo más pequeño")


class BodyTooLarge(HTTPException):
    """Raised by the counting ``receive`` once a body passes the cap."""

    def __init__(self, max_bytes: int, seen: int) -> None:
        super().__init__(413, detail=too_large_message(max_bytes, f"al menos {seen}"),
                         headers=dict(CLOSE))


class BodyLimit:
    """ASGI middleware: refuse (413) any HTTP request body larger than ``max_bytes``.

    ``on_reject(path)`` is called when a declared ``Content-Length`` is refused here; a body
    refused while it arrives reaches the app's handler for ``HTTPException`` instead.
    """

    def __init__(self, app: ASGIApp, max_bytes: int,
                 on_reject: Callable[[str], None] | None = None) -> None:
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
            raise ValueError(f"max_bytes debe ser un entero >= 0; se recibió {max_bytes!r}")
        self.app, self.max_bytes, self.on_reject = app, max_bytes, on_reject

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = Headers(scope=scope).get("content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            if self.on_reject is not None:
                self.on_reject(scope.get("path", ""))
            response = JSONResponse(error_body(too_large_message(self.max_bytes, length)),
                                    status_code=413)
            await response(scope, receive, send)
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes, seen)
            return message

        await self.app(scope, counted, send)
