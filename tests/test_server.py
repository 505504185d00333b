"""The OpenAI-compatible server (``ai_evolution.server``) and the HTTP load generator.

The server must speak OpenAI's protocol well enough for the official ``openai`` client, give
exactly the offline engine's greedy tokens, batch concurrent HTTP clients together, refuse bad
input with OpenAI-shaped errors (and keep serving), abort the requests of clients that leave
(freeing their KV blocks), shed load with 503 when its queue is full, and, after hundreds of
requests with random disconnects, end with every KV block back in the pool and no request left
anywhere. No test asserts a duration: the machine is shared.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import random
import select
import signal
import socket
import subprocess
import sys
import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ai_evolution.engine import LLM, RequestRejected, SamplingParams
from ai_evolution.loadgen import WorkItem, open_loop_workload, run_http
from ai_evolution.metrics import goodput, summarize
from ai_evolution.model.tokenizer import load_tokenizer
from ai_evolution.server import apply_chat_template, render_chat, serve_in_thread
from ai_evolution.server.detokenize import IncrementalDetokenizer
from engine_helpers import PoisonedExecutor

pytestmark = pytest.mark.usefixtures("one_thread")

MODEL = "tiny-es"
PROMPTS = ["La caché KV", "El planificador decide"]


# --- fixtures and helpers -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(MODEL)


@pytest.fixture(scope="module")
def ref(tiny):
    """The offline engine: what the server must reproduce."""
    return LLM(tiny, tokenizer=MODEL)


@pytest.fixture(scope="module")
def server():
    """One server for the module (its own model copy: the engine thread owns it)."""
    with serve_in_thread(LLM(MODEL, max_num_seqs=8, kv_layout="paged"), max_waiting=64) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0)


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.base_url, timeout=60) as c:
        yield c


def engine_state(engine) -> dict:
    """Runs in the engine thread (``engine_loop.call``)."""
    sched, kv = engine.scheduler, engine.scheduler.kv
    kv.check_invariants()
    return {"waiting": len(sched.waiting), "running": len(sched.running),
            "requests": len(engine.requests), "free": kv.pool.num_free, "total": kv.num_blocks,
            "tables": len(kv.tables), "unfinished": engine.has_unfinished_requests(),
            "steps": len(engine.history)}


def wait_idle(srv, timeout_s: float = 30.0) -> dict:
    """Poll the engine until nothing is left in it; return its state."""
    deadline = time.monotonic() + timeout_s
    while True:
        state = srv.engine_loop.call(engine_state).result(timeout=timeout_s)
        if (not state["unfinished"] and state["running"] == 0 and state["requests"] == 0
                and state["free"] == state["total"]):
            return state
        if time.monotonic() > deadline:
            raise AssertionError(f"the engine did not drain: {state}")
        time.sleep(0.02)


def metric_samples(text: str) -> dict:
    """``{(sample name, frozenset(labels)): value}`` from a Prometheus text page."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def metric(samples: dict, name: str, **labels) -> float:
    return samples[("ai_evolution:" + name, frozenset(labels.items()))]


def assert_openai_error(resp: httpx.Response, status: int, param=None, code=None) -> dict:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    err = body["error"]
    assert isinstance(err["message"], str) and err["message"]
    for english in ("Field required", "Input should", "Not Found", "Expecting value"):
        assert english not in err["message"]
    if param is not None:
        assert err["param"] == param, err
    if code is not None:
        assert err["code"] == code, err
    return err


# --- the engine's release and the pieces -----------------------------------------------------------
def test_engine_release_forgets_finished_requests_only(tiny):
    engine = LLM(tiny, tokenizer=MODEL, kv_layout="paged").engine
    req = engine.add_request([5, 6, 7], SamplingParams(max_tokens=3, ignore_eos=True))
    with pytest.raises(ValueError, match="no ha terminado"):
        engine.release(req.request_id)
    with pytest.raises(KeyError):
        engine.release("no-such-id")
    # a longer request keeps the engine busy: it does not run dry when ``req`` finishes
    longer = engine.add_request([8, 9], SamplingParams(max_tokens=8, ignore_eos=True))
    while not req.is_finished:
        engine.step()
    assert engine.release(req.request_id) is req and req.request_id not in engine.requests
    # Still held by the scheduler until it is retired: its id cannot be reused meanwhile.
    with pytest.raises(RequestRejected, match="ya existe"):
        engine.add_request([5], SamplingParams(max_tokens=1), request_id=req.request_id)
    while engine.has_unfinished_requests():
        engine.step()  # the next plan retires it; running dry, the engine retires ``longer``
    assert longer.is_finished
    assert engine.kv_usage()["blocks_used"] == 0 and not engine.scheduler.running
    engine.scheduler.kv.check_invariants()
    assert engine.add_request([5], SamplingParams(max_tokens=1)).request_id != req.request_id


def test_incremental_detokenizer_reassembles_exact_text(tok):
    rng = random.Random(0)
    texts = ["ñandú, ¿qué tal? ¡Olé! 😀 café", "La caché KV guarda claves y valores."]
    cases = [tok.encode(t) for t in texts]
    cases += [[rng.randrange(tok.vocab_size) for _ in range(rng.randint(1, 40))] for _ in range(50)]
    for ids in cases:
        detok = IncrementalDetokenizer(tok)
        pieces = [detok.push(t) for t in ids]
        pieces.append(detok.flush())
        assert "".join(pieces) == tok.decode(ids)
    # A multi-byte character split over tokens is held back until complete.
    ids = tok.encode("😀")
    if len(ids) > 1:
        detok = IncrementalDetokenizer(tok)
        assert [detok.push(t) for t in ids][:-1] == [""] * (len(ids) - 1)


def test_chat_template_is_documented_shape(tok):
    msgs = [("system", "Eres breve."), ("user", "¿Qué es la caché KV?")]
    assert render_chat(msgs) == "Sistema: Eres breve.\nUsuario: ¿Qué es la caché KV?\nAsistente:"
    ids = apply_chat_template(tok, msgs)
    assert ids[0] == tok.bos_token_id and tok.decode(ids) == render_chat(msgs)


# --- OpenAI protocol, with the official client ---------------------------------------------------
def test_models_and_health(http, client):
    assert http.get("/health").json() == {"status": "ok"}
    assert [m.id for m in client.models.list().data] == [MODEL]


@pytest.mark.parametrize("prompt", PROMPTS)
def test_completion_greedy_equals_offline_engine(client, ref, tok, prompt):
    want = ref.generate(prompt, SamplingParams(max_tokens=12))[0]
    got = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0)
    assert got.object == "text_completion" and got.id.startswith("cmpl-")
    choice = got.choices[0]
    assert choice.text == want.text and choice.finish_reason == want.finish_reason.value
    n_prompt = len(tok.encode(prompt, add_bos=True))
    assert (got.usage.prompt_tokens, got.usage.completion_tokens, got.usage.total_tokens) == \
        (n_prompt, len(want.token_ids), n_prompt + len(want.token_ids))
    # The same prompt as token ids (what the load generator sends).
    ids = tok.encode(prompt, add_bos=True)
    by_ids = client.completions.create(model=MODEL, prompt=ids, max_tokens=12, temperature=0)
    assert by_ids.choices[0].text == want.text


def test_completion_stream_one_event_per_token(client, ref):
    want = ref.generate(PROMPTS[0], SamplingParams(max_tokens=10, ignore_eos=True))[0]
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=10,
                                            temperature=0, stream=True, extra_body={"ignore_eos": True},
                                            stream_options={"include_usage": True}))
    token_chunks = [c for c in chunks if c.choices]
    assert len(token_chunks) == 10 == len(want.token_ids)
    assert "".join(c.choices[0].text for c in token_chunks) == want.text
    assert [c.choices[0].finish_reason for c in token_chunks] == [None] * 9 + ["length"]
    assert not chunks[-1].choices and chunks[-1].usage.completion_tokens == 10
    assert len({c.id for c in chunks}) == 1
    plain = list(client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=3,
                                           temperature=0, stream=True))
    assert len(plain) == 3 and all(c.usage is None for c in plain)


def test_chat_greedy_equals_offline_engine_stream_and_not(client, ref, tok):
    messages = [{"role": "system", "content": "Eres un tutor breve."},
                {"role": "user", "content": [{"type": "text", "text": "¿Qué es la caché KV?"}]}]
    ids = apply_chat_template(tok, [("system", "Eres un tutor breve."),
                                    ("user", "¿Qué es la caché KV?")])
    want = ref.generate(ids, SamplingParams(max_tokens=8))[0]
    want_text = tok.decode(want.token_ids)
    got = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8,
                                         temperature=0)
    assert got.object == "chat.completion"
    assert got.choices[0].message.role == "assistant"
    assert got.choices[0].message.content == want_text
    assert got.choices[0].finish_reason == want.finish_reason.value
    assert (got.usage.prompt_tokens, got.usage.completion_tokens) == (len(ids), len(want.token_ids))
    stream = list(client.chat.completions.create(model=MODEL, messages=messages,
                                                 max_completion_tokens=8, temperature=0,
                                                 stream=True,
                                                 stream_options={"include_usage": True}))
    assert stream[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == want_text
    assert [c.choices[0].finish_reason for c in stream if c.choices][-1] == want.finish_reason.value
    assert stream[-1].usage.prompt_tokens == len(ids)
    assert stream[-1].usage.completion_tokens == len(want.token_ids)


def test_seeded_sampling_is_reproducible(client):
    kw = dict(model=MODEL, prompt=PROMPTS[1], max_tokens=8, temperature=0.9, top_p=0.95, seed=7,
              extra_body={"top_k": 20})
    a, b = (client.completions.create(**kw).choices[0].text for _ in range(2))
    assert a == b


def test_concurrent_clients_are_batched_together(server, client, ref):
    before = server.engine_loop.call(lambda e: len(e.history)).result()
    prompts = [f"{p} {i}" for i, p in enumerate(PROMPTS * 2)]

    def one(prompt):
        stream = client.completions.create(model=MODEL, prompt=prompt, max_tokens=24,
                                           temperature=0, stream=True,
                                           extra_body={"ignore_eos": True})
        return "".join(c.choices[0].text for c in stream if c.choices)

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        texts = list(pool.map(one, prompts))
    widths = server.engine_loop.call(
        lambda e: [h.batch_size for h in e.history[before:]]).result()
    assert max(widths) >= 2, widths
    wants = ref.generate(prompts, SamplingParams(max_tokens=24, ignore_eos=True))
    assert texts == [w.text for w in wants]  # batching never changes greedy tokens


# --- bad input ------------------------------------------------------------------------------------
C, CHAT = "/v1/completions", "/v1/chat/completions"
OK = {"model": MODEL, "prompt": "Hola", "max_tokens": 2}
OK_CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hola"}], "max_tokens": 2}
BAD = [  # (path, body, status, param, code, words in the message)
    (C, "{no es json", 400, None, None, "JSON"),
    (C, "[1, 2]", 400, None, None, "objeto JSON"),
    (C, {"model": MODEL}, 400, "prompt", None, "falta"),
    (C, {"prompt": "Hola"}, 400, "model", None, "falta"),
    (C, {**OK, "max_tokens": "3"}, 400, "max_tokens", None, "entero"),
    (C, {**OK, "max_tokens": True}, 400, "max_tokens", None, "entero"),
    (C, {**OK, "max_tokens": 0}, 400, "max_tokens", None, ">= 1"),
    (C, {**OK, "temperature": -1}, 400, "temperature", None, ">= 0"),
    (C, {**OK, "temperature": "hot"}, 400, "temperature", None, "número"),
    (C, {**OK, "top_p": 1.5}, 400, "top_p", None, "(0, 1]"),
    (C, {**OK, "top_k": -5}, 400, "top_k", None, ">= 1"),
    (C, {**OK, "seed": 1.5}, 400, "seed", None, "entero"),
    (C, {**OK, "stream": "yes"}, 400, "stream", None, "true o false"),
    (C, {**OK, "n": 2}, 400, "n", None, "n debe ser 1"),
    (C, {**OK, "stop": ["\n"]}, 400, "stop", None, "stop_token_ids"),
    (C, {**OK, "stop_token_ids": [99999]}, 400, "stop_token_ids", None, "vocabulario"),
    (C, {**OK, "logprobs": 3}, 400, "logprobs", None, "no está soportado"),
    (C, {**OK, "model": "gpt-4o"}, 404, "model", "model_not_found", MODEL),
    (C, {**OK, "prompt": list(range(3, 603))}, 400, "prompt", None, "max_model_len"),
    (C, {**OK, "prompt": [5] * 500, "max_tokens": 100}, 400, "max_tokens", None, "contexto"),
    (C, {**OK, "prompt": [5, 99999]}, 400, "prompt", None, "vocabulario"),
    (C, {**OK, "prompt": []}, 400, "prompt", None, "vacío"),
    (C, {**OK, "prompt": ["a", "b"]}, 400, "prompt", None, "un solo prompt"),
    (C, {**OK, "prompt": {"text": "a"}}, 400, "prompt", None, "cadena o una lista"),
    (CHAT, {**OK_CHAT, "messages": []}, 400, "messages", None, "vacía"),
    (CHAT, {"model": MODEL}, 400, "messages", None, "falta"),
    (CHAT, {**OK_CHAT, "messages": [{"role": "bot", "content": "a"}]}, 400, "messages[0].role",
     None, "'user'"),
    (CHAT, {**OK_CHAT, "messages": [{"role": "user", "content": 5}]}, 400,
     "messages[0].content", None, "cadena"),
    (CHAT, {**OK_CHAT, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400,
     "messages[0].content[0]", None, "text"),
    (CHAT, {**OK_CHAT, "model": "nope"}, 404, "model", "model_not_found", "no existe"),
    (CHAT, {**OK_CHAT, "n": 3, "stream": True}, 400, "n", None, "n debe ser 1"),
    (C, {**OK, "seed": 2**64}, 400, "seed", None, "2**64 - 1"),
    (C, {**OK, "seed": -(2**63) - 1}, 400, "seed", None, "-2**63"),
    (C, '{"model": "tiny-es", "prompt": "a\\ud800b", "max_tokens": 2}', 400, "prompt", None,
     "sustituto"),
    (CHAT, '{"model": "tiny-es", "messages": [{"role": "user", "content": "ab\\udfff"}]}', 400,
     "messages[0].content", None, "sustituto"),
    (C, {**OK, "prompt": "x" * 2_000_000}, 400, "prompt", None, "caracteres"),
    (CHAT, {**OK_CHAT, "messages": [{"role": "user", "content": "y" * 2_000_000}]}, 400,
     "messages[0].content", None, "caracteres"),
]


@pytest.mark.parametrize("path,body,status,param,code,words", BAD,
                         ids=[f"{i}-{b[3] or 'body'}" for i, b in enumerate(BAD)])
def test_bad_input_gets_openai_error_and_server_keeps_serving(http, path, body, status, param,
                                                              code, words):
    kw = {"content": body, "headers": {"content-type": "application/json"}} \
        if isinstance(body, str) else {"json": body}
    err = assert_openai_error(http.post(path, **kw), status, param, code)
    assert words in err["message"], err["message"]
    assert err["type"] == "invalid_request_error"
    good = http.post(path, json=OK if path == C else OK_CHAT)
    assert good.status_code == 200 and good.json()["usage"]["completion_tokens"] >= 1


def test_error_bodies_stay_small_and_huge_bodies_are_refused_unread(http, tok):
    resp = http.post(C, json={**OK, "stop_token_ids": list(range(100_000, 104_000))})
    err = assert_openai_error(resp, 400, "stop_token_ids")
    assert "4000 valor" in err["message"] and len(resp.content) < 2000
    resp = http.post(C, json={**OK, "stop_token_ids": list(range(100_000, 200_000))})
    err = assert_openai_error(resp, 400, "stop_token_ids")
    assert "100000 elementos" in err["message"] and len(resp.content) < 2000
    resp = http.post(C, json={**OK, "prompt": "z" * 5_000_000})
    assert resp.status_code == 413 and "máximo" in resp.json()["error"]["message"]
    assert http.post(C, json=OK).status_code == 200


def test_stop_token_ids_are_capped_at_the_vocabulary_and_deduplicated(server, http, tok):
    vocab_size = server.app.state.server.vocab_size
    assert vocab_size == tok.vocab_size
    err = assert_openai_error(http.post(C, json={**OK, "stop_token_ids": [5] * (vocab_size + 1)}),
                              400, "stop_token_ids")
    assert f"{vocab_size + 1} elementos" in err["message"] and str(vocab_size) in err["message"]
    # at the cap, repeated ids are one stop token: the answer is the one a single id gets
    one = http.post(C, json={**OK, "max_tokens": 6, "temperature": 0, "stop_token_ids": [3]})
    many = http.post(C, json={**OK, "max_tokens": 6, "temperature": 0,
                              "stop_token_ids": [3] * vocab_size})
    assert one.status_code == many.status_code == 200, many.text
    assert many.json()["choices"] == one.json()["choices"]


def _raw_post(base_url: str, head: str, chunks, timeout_s: float = 20.0):
    """Send ``head`` and then each of ``chunks`` on one socket, stopping as soon as the server
    answers. Returns ``(status, json body, body bytes sent, response head)``."""
    host, port = base_url.removeprefix("http://").split(":")
    sent, answer = 0, b""
    with socket.create_connection((host, int(port)), timeout=timeout_s) as sock:
        sock.sendall(head.encode())
        deadline = time.monotonic() + timeout_s
        for chunk in chunks:
            assert time.monotonic() < deadline, f"sin respuesta tras enviar {sent} bytes"
            if select.select([sock], [], [], 0)[0]:
                break
            try:
                sock.sendall(chunk)
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += len(chunk)
        while b"\r\n\r\n" not in answer or len(answer) < answer.index(b"\r\n\r\n") + 4 + \
                int(answer.lower().split(b"content-length: ")[1].split(b"\r\n")[0]):
            data = sock.recv(65536)
            if not data:
                break
            answer += data
    head_bytes, _, body = answer.partition(b"\r\n\r\n")
    return int(head_bytes.split()[1]), json.loads(body), sent, head_bytes.decode()


def test_chunked_body_over_the_cap_is_refused_as_it_arrives(server, http):
    cap = 4 * 2**20
    piece = b"[" + b"1," * 32_000 + b"1]"  # ~64 KiB of data per chunk
    chunk = f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
    head = (f"POST {C} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            "Transfer-Encoding: chunked\r\n\r\n")
    start = time.monotonic()
    status, body, sent, head_text = _raw_post(server.base_url, head,
                                              (chunk for _ in range(48 * 2**20 // len(chunk))))
    assert status == 413 and "máximo es 4194304" in body["error"]["message"], body
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert "connection: close" in head_text.lower()
    # refused once the cap was crossed, not after reading all 48 MiB: what the client got out
    # beyond the cap is what the socket buffers held (megabytes on loopback, more while the
    # machine is busy and the answer is late), far below the 44 MiB a server reading the whole
    # body would have let through
    assert cap < sent < cap + 16 * 2**20 and time.monotonic() - start < 20
    # a declared Content-Length over the cap is refused before a byte of body is read
    status, body, _, _ = _raw_post(server.base_url, head.replace(
        "Transfer-Encoding: chunked", f"Content-Length: {cap + 1}"), [])
    assert status == 413 and "máximo" in body["error"]["message"]
    assert http.post(C, json=OK).status_code == 200


@pytest.mark.parametrize("body,words", [
    (b'{"model": "tiny-es", "prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "anida"),
    (b'{"model": "tiny-es", "prompt": "caf\xe9", "max_tokens": 2}', "no es UTF-8 válido (byte 0xe9"),
    (b'{"model": "tiny-es", "prompt": "a",}', "se esperaba un nombre de campo"),
    (b'{"model": "tiny-es"} x', "sobra texto"),
], ids=["deep-nesting", "invalid-utf8", "trailing-comma", "extra-data"])
def test_body_parsing_errors_are_spanish_in_the_servers_error_shape(http, body, words):
    resp = http.post(C, content=body, headers={"content-type": "application/json"})
    err = assert_openai_error(resp, 400)
    assert words in err["message"] and "application/json" in err["message"], err["message"]
    assert "There was an error" not in resp.text and err["type"] == "invalid_request_error"
    assert http.post(C, json=OK).status_code == 200


def test_poison_requests_fail_alone_while_eight_streams_run(server, client, http, ref):
    marker = 7
    prompts = [f"{p} {i}" for i, p in enumerate(PROMPTS * 4)]  # 8 streams
    wants = [w.text for w in ref.generate(prompts, SamplingParams(max_tokens=24, ignore_eos=True))]
    poison = [  # (body, status)
        ({**OK, "seed": 2**64}, 400),
        ({**OK, "prompt": "x" * 2_000_000}, 400),
        ({**OK, "stop_token_ids": list(range(100_000, 200_000))}, 400),
        ({**OK, "stop_token_ids": list(range(100_000, 104_000))}, 400),
        ({**OK, "temperature": 1e-39, "max_tokens": 8}, 200),
        ({**OK, "temperature": 0.7, "top_p": 1e-46, "seed": 1, "max_tokens": 8}, 200),
        ({**OK, "prompt": [marker, 20, 30, 40], "max_tokens": 8}, 500),  # fails inside a step
    ]
    raw_poison = ('{"model": "tiny-es", "prompt": "a\\ud800b", "max_tokens": 2}', 400)
    server.engine_loop.call(
        lambda e: setattr(e, "executor", PoisonedExecutor(e.executor, marker))).result(timeout=30)
    try:
        def one(prompt):
            stream = client.completions.create(model=MODEL, prompt=prompt, max_tokens=24,
                                               temperature=0, stream=True,
                                               extra_body={"ignore_eos": True})
            return "".join(c.choices[0].text for c in stream if c.choices)

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            streams = [pool.submit(one, p) for p in prompts]
            statuses = [http.post(C, json=body).status_code for body, _ in poison]
            statuses.append(http.post(C, content=raw_poison[0],
                                      headers={"content-type": "application/json"}).status_code)
            texts = [f.result(timeout=120) for f in streams]
    finally:
        server.engine_loop.call(
            lambda e: setattr(e, "executor", e.executor.inner)).result(timeout=30)
    assert statuses == [status for _, status in poison] + [raw_poison[1]]
    assert texts == wants  # the eight streams never noticed
    wait_idle(server)


def test_unknown_route_and_method_get_openai_errors(http):
    assert_openai_error(http.get("/v1/nothing"), 404)
    assert_openai_error(http.get("/v1/completions"), 405)


def test_openai_client_sees_typed_errors(client):
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="nope", prompt="a")
    assert e.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError, match="n debe ser 1"):
        client.completions.create(model=MODEL, prompt="a", n=2)


# --- disconnects and load shedding ----------------------------------------------------------------
def test_disconnect_mid_stream_aborts_and_frees_blocks(server, http):
    aborts = metric(metric_samples(http.get("/metrics").text), "requests_total", outcome="abort")
    body = {"model": MODEL, "prompt": "La caché KV", "max_tokens": 400, "ignore_eos": True,
            "temperature": 0, "stream": True}
    with http.stream("POST", C, json=body) as resp:
        assert resp.status_code == 200
        lines = resp.iter_lines()
        got = [line for line, _ in zip(lines, range(6)) if line.startswith("data:")]
        assert len(got) == 3
        held = server.engine_loop.call(engine_state).result()
        assert held["running"] == 1 and held["free"] < held["total"]
    state = wait_idle(server)  # blocks free, invariants hold, nothing left, nothing remembered
    assert state["tables"] == 0
    after = metric(metric_samples(http.get("/metrics").text), "requests_total", outcome="abort")
    assert after == aborts + 1


def test_disconnect_while_waiting_for_a_full_answer_aborts(server, http):
    body = {"model": MODEL, "prompt": "La caché KV", "max_tokens": 400, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        http.post(C, json=body, timeout=0.3)  # the client gives up and closes the connection
    wait_idle(server)
    assert http.get("/health").status_code == 200


def test_full_queue_answers_503_with_retry_after():
    with serve_in_thread(LLM(MODEL, max_num_seqs=1, kv_layout="paged"), max_waiting=1) as srv, \
            httpx.Client(base_url=srv.base_url, timeout=60) as http:
        long = {"model": MODEL, "prompt": "Hola", "max_tokens": 400, "ignore_eos": True,
                "stream": True}
        with http.stream("POST", C, json=long) as running:
            lines = running.iter_lines()  # keep a reference: a dropped iterator hangs up
            next(line for line in lines if line.startswith("data:"))
            with http.stream("POST", C, json=long) as queued:  # accepted: it waits in the queue
                assert queued.status_code == 200
                full = http.post(C, json={**long, "stream": False})
                err = assert_openai_error(full, 503, code="server_overloaded")
                assert full.headers["retry-after"] == "1" and "cola" in err["message"]
                deadline = time.monotonic() + 30  # the gauges refresh after the next step
                while metric(samples := metric_samples(http.get("/metrics").text),
                             "num_requests_waiting") != 1:
                    assert time.monotonic() < deadline, {k: v for k, v in samples.items()
                                                         if "created" not in k[0]}
                    time.sleep(0.02)
                assert metric(samples, "num_requests_running") == 1
                assert metric(samples, "requests_total", outcome="overloaded") == 1
        wait_idle(srv)
        ok = http.post(C, json={**long, "stream": False, "max_tokens": 2})
        assert ok.status_code == 200
        loop = srv.engine_loop
    assert not loop.alive  # closing the server stopped the engine thread


# --- metrics --------------------------------------------------------------------------------------
def test_metrics_parse_and_move(server, http):
    before = metric_samples(http.get("/metrics").text)
    prompt = list(range(10, 60))  # 50 tokens: 3 full blocks of 16 to share the second time
    for _ in range(2):
        r = http.post(C, json={"model": MODEL, "prompt": prompt, "max_tokens": 5,
                               "ignore_eos": True})
        assert r.status_code == 200
    http.post(C, json={"model": MODEL, "prompt": "a", "max_tokens": -1})  # rejected
    resp = http.get("/metrics")
    assert resp.headers["content-type"].startswith("text/plain")
    after = metric_samples(resp.text)

    def grew(name, **labels):
        return metric(after, name, **labels) - metric(before, name, **labels)

    assert grew("requests_total", outcome="length") == 2
    assert grew("requests_total", outcome="rejected") == 1
    assert grew("generation_tokens_total") == 10 and grew("prompt_tokens_total") == 100
    assert grew("time_to_first_token_seconds_count") == 2
    assert grew("time_per_output_token_seconds_count") == 2
    assert grew("e2e_request_latency_seconds_count") == 2
    assert grew("prefix_cache_queries_total") == 100 and grew("prefix_cache_hits_total") == 48
    assert 0 < metric(after, "prefix_cache_hit_rate") <= 1
    total = server.engine_loop.call(lambda e: e.scheduler.kv.num_blocks).result()
    assert metric(after, "kv_cache_blocks_total") == total
    assert metric(after, "num_preemptions_total") >= 0
    assert metric(after, "num_requests_running") == 0


# --- soak ---------------------------------------------------------------------------------------
@pytest.mark.slow  # a whole lab, a long soak or a sampling statistic: `make test` only
def test_soak_hundreds_of_requests_with_random_disconnects(tok):
    """300 requests from 24 concurrent clients over a small paged cache (12 blocks: preemptions),
    shared prefixes (prefix hits happen), a fifth of them disconnecting at a random point."""
    llm = LLM(MODEL, max_num_seqs=8, kv_layout="paged", num_blocks=12, block_size=16,
              max_model_len=256)  # 12 blocks hold 192 tokens: less than one full-length request
    rng = random.Random(11)
    prefixes = [rng.choices(range(3, tok.vocab_size), k=n) for n in (16, 32, 40)]
    plan = []
    for i in range(300):
        prompt = rng.choice(prefixes) + rng.choices(range(3, tok.vocab_size), k=rng.randint(1, 20))
        leave = rng.choice([None, None, None, None, 0, 1, 2])  # events read before leaving
        plan.append((prompt, rng.randint(1, 16), rng.random() < 0.8, leave))

    async def one(client, prompt, max_tokens, stream, leave):
        body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True,
                "stream": stream}
        if not stream:
            if leave is not None:  # give up (almost) at once: the server sees a disconnect
                try:
                    await client.post(C, json=body, timeout=0.01 * (leave + 1))
                except httpx.TimeoutException:
                    pass
                return None
            r = await client.post(C, json=body)
            assert r.status_code == 200, r.text
            return r.json()["usage"]["completion_tokens"] == max_tokens
        async with client.stream("POST", C, json=body) as resp:
            assert resp.status_code == 200
            if leave == 0:
                return None  # leaves before the first token (maybe while still queued)
            n = 0
            async for line in resp.aiter_lines():
                if leave is not None and n >= leave:
                    return None  # leaving the block closes the connection mid-stream
                if line.startswith("data: {"):
                    n += 1
            return n == max_tokens

    async def main(base_url):
        pending = iter(plan)
        results = []

        async def worker():
            async with httpx.AsyncClient(base_url=base_url, timeout=60) as client:
                for item in pending:
                    results.append(await one(client, *item))
        await asyncio.gather(*(worker() for _ in range(24)))
        return results

    with serve_in_thread(llm, max_waiting=300) as srv:
        results = asyncio.run(main(srv.base_url))
        state = wait_idle(srv)
        stats = srv.engine_loop.call(lambda e: e.kv_usage()).result()
        assert state["waiting"] == state["running"] == state["requests"] == state["tables"] == 0
        assert state["free"] == state["total"] == 12
        completed = [r for r in results if r is not None]
        assert len(results) == 300 and all(completed)
        # a stream that would leave after more events than it has tokens reads to the end
        assert len(completed) == sum(1 for _, m, stream, leave in plan
                                     if leave is None or (stream and leave > m))
        assert stats["num_preemptions"] > 0 and stats["prefix_hit_tokens"] > 0
        with httpx.Client(base_url=srv.base_url) as http:
            assert http.get("/health").json() == {"status": "ok"}
            samples = metric_samples(http.get("/metrics").text)
            done = sum(metric(samples, "requests_total", outcome=o) for o in ("length", "abort"))
            # a client that gives up within 10 ms may leave before its request is even read
            quick = sum(1 for _, _, stream, leave in plan if not stream and leave is not None)
            assert 300 - quick <= done <= 300
            for outcome in ("error", "rejected", "overloaded", "stop"):
                assert metric(samples, "requests_total", outcome=outcome) == 0
            assert http.post(C, json={"model": MODEL, "prompt": "Hola",
                                      "max_tokens": 3}).status_code == 200
            # Fits max_model_len but not the whole KV cache: the engine itself refuses it.
            err = assert_openai_error(http.post(C, json={"model": MODEL, "prompt": [5] * 180,
                                                         "max_tokens": 20}), 400, "prompt")
            assert "caché KV" in err["message"]
        wait_idle(srv)


# --- the HTTP load generator ----------------------------------------------------------------------
def test_run_http_open_and_closed_loop_feed_the_metrics(server, tok):
    workload = open_loop_workload(12, rate=40.0, prompt_len_sampler=8, output_len_sampler=5,
                                  vocab_size=tok.vocab_size, seed=0)
    for concurrency in (None, 3):
        records = run_http(server.base_url, workload, model=MODEL, concurrency=concurrency,
                           progress=False)
        assert [r.index for r in records] == list(range(12))
        for r in records:
            assert r.error is None and r.status == 200 and r.ok
            assert r.num_output_tokens == 5 == len(r.token_times) == len(r.output_token_ids)
            assert r.finish_reason == "length"
            assert 0 <= r.arrival_time < r.first_token_time <= r.token_times[-1] <= r.finish_time
            assert r.ttft > 0 and r.tpot >= 0 and len(r.itls) == 4 and r.e2e_latency >= r.ttft
        s = summarize(records)
        assert s["requests"] == 12 and s["output_tokens"] == 60
        assert goodput(records) > 0
        if concurrency is None:
            assert [r.scheduled_time for r in records] == [w.arrival_time for w in workload]
        else:
            assert {r.client for r in records} == {0, 1, 2}
    wait_idle(server)


def test_run_http_records_failures_instead_of_raising(server):
    items = [WorkItem(0.0, [5, 6, 7], SamplingParams(max_tokens=3, ignore_eos=True)),
             WorkItem(0.0, [5, 99999], SamplingParams(max_tokens=3)),
             WorkItem(0.01, [8, 9], SamplingParams(max_tokens=2, ignore_eos=True))]
    records = run_http(server.base_url + "/v1", items, model=MODEL, progress=False)
    assert [r.ok for r in records] == [True, False, True]
    bad = records[1]
    assert bad.status == 400 and "vocabulario" in bad.error and bad.finish_time is None
    assert summarize(records)["requests"] == 2  # the failed one is left out
    wrong_model = run_http(server.base_url, items[:1], model="nope", progress=False)
    assert wrong_model[0].status == 404 and "no existe" in wrong_model[0].error
    nobody = run_http("http://127.0.0.1:9", items[:1], model=MODEL, progress=False, timeout_s=5)
    assert nobody[0].error and nobody[0].status is None
    with pytest.raises(ValueError, match="concurrency"):
        run_http(server.base_url, items, concurrency=0, progress=False)
    wait_idle(server)


# --- the command line -----------------------------------------------------------------------------
def test_command_line_server_starts_answers_and_stops():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "ai_evolution.server", "--model", MODEL,
                             "--port", str(port), "--max-num-seqs", "2", "--threads", "1",
                             "--log-level", "warning"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 90
        while True:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, proc.stdout.read().decode()
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.2)
        r = httpx.post(url + "/v1/completions", json={"model": MODEL, "prompt": "Hola",
                                                      "max_tokens": 3}, timeout=30)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
    finally:
        proc.terminate()
        out = proc.communicate(timeout=30)[0].decode()
    # uvicorn shuts down gracefully, then re-raises the signal it caught (exit status -SIGTERM)
    assert proc.returncode in (0, -signal.SIGTERM) and "Traceback" not in out, out


def test_cli_serves_a_hub_id_under_its_full_name_and_can_turn_graphs_off():
    from ai_evolution.server.__main__ import parser, served_name

    assert served_name("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"
    assert served_name("tiny-es") == "tiny-es"
    assert served_name("/tmp/checkpoints/mi-modelo") == "mi-modelo"
    assert served_name("Qwen/Qwen2.5-0.5B-Instruct", "qwen") == "qwen"
    assert parser().parse_args(["--enforce-eager"]).enforce_eager
    assert not parser().parse_args([]).enforce_eager
