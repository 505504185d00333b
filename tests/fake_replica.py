"""A fake OpenAI-compatible replica for the router's failure tests (no model, no torch): run as
``python tests/fake_replica.py PORT [--name NAME] [--token-delay S] [--tokens N]``.

``/health`` answers 200; ``/v1/completions`` and ``/v1/chat/completions`` answer ``N`` tokens,
each ``"<NAME> "``, after ``S`` seconds apiece, streamed (one SSE event per token) or not. A test
kills the process with SIGKILL to play a replica that dies mid-request.
"""

import argparse
import asyncio
import json

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse


def make_app(name: str, token_delay_s: float, tokens: int) -> FastAPI:
    app = FastAPI()

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": "fake", "object": "model"}]}

    async def answer(request: Request):
        body = await request.json()
        if body.get("stream"):
            async def events():
                for _ in range(tokens):
                    await asyncio.sleep(token_delay_s)
                    chunk = {"object": "text_completion",
                             "choices": [{"index": 0, "text": f"{name} ", "finish_reason": None}]}
                    yield f"data: {json.dumps(chunk)}\n\n".encode()
                yield b"data: [DONE]\n\n"
            return StreamingResponse(events(), media_type="text/event-stream")
        await asyncio.sleep(token_delay_s * tokens)
        return {"object": "text_completion",
                "choices": [{"index": 0, "text": f"{name} " * tokens, "finish_reason": "length"}]}

    app.post("/v1/completions")(answer)
    app.post("/v1/chat/completions")(answer)
    return app


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("port", type=int)
    p.add_argument("--name", default="fake")
    p.add_argument("--token-delay", type=float, default=0.0)
    p.add_argument("--tokens", type=int, default=3)
    a = p.parse_args()
    uvicorn.run(make_app(a.name, a.token_delay, a.tokens), host="127.0.0.1", port=a.port,
                log_level="warning")
