"""Tenants in the server (chapter 12): API key or ``user`` -> tenant, per-tenant token buckets and
concurrency caps answered with 429 + ``Retry-After``, vLLM's ``priority`` field, per-tenant
Prometheus metrics, clear 400/401s; a flooding tenant never starves another's admitted streams.
No test asserts a duration: the machine is shared."""

from __future__ import annotations

import concurrent.futures

import httpx
import pytest

from ai_evolution.engine import LLM, SamplingParams
from ai_evolution.server import serve_in_thread
from ai_evolution.server.tenants import Refused, TenantLimits, Tenants, TokenBucket
from test_server import MODEL, assert_openai_error, metric, metric_samples, wait_idle

pytestmark = pytest.mark.usefixtures("one_thread")

C = "/v1/completions"


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


# --- the pieces -----------------------------------------------------------------------------------
def test_token_bucket_starts_full_refills_at_its_rate_and_says_how_long_to_wait():
    b = TokenBucket(rate=2.0, capacity=4.0, now=0.0)
    assert b.wait_s(4, 0.0) == 0
    b.take(4, 0.0)
    assert b.wait_s(1, 0.0) == pytest.approx(0.5)
    assert b.wait_s(1, 0.5) == 0
    assert b.wait_s(5, 10.0) == float("inf")  # more than it can ever hold
    b.take(1, 0.5)
    assert b.wait_s(4, 100.0) == 0 and b.level == 4.0  # never above capacity


def test_limits_refuse_with_429_and_the_wait_taking_nothing():
    clock = Clock()
    tenants = Tenants(limits={"a": TenantLimits(requests_per_s=2, tokens_per_s=100,
                                                max_concurrent=3)}, clock=clock)
    leases = [tenants.admit("a", 10), tenants.admit("a", 10)]
    with pytest.raises(Refused) as info:  # the request bucket (burst 2) is empty
        tenants.admit("a", 10)
    err = info.value
    assert (err.status, err.reason, err.retry_after_s) == (429, "rate_limited", 1)
    assert "2 peticiones por segundo" in err.message
    clock.t += 0.5
    leases.append(tenants.admit("a", 10))  # refilled one
    clock.t += 10
    with pytest.raises(Refused) as info:
        tenants.admit("a", 10)
    assert (info.value.status, info.value.reason) == (429, "concurrency")
    leases[0].release()
    leases[0].release()  # idempotent
    assert tenants.in_flight("a") == 2
    with pytest.raises(Refused) as info:
        tenants.admit("a", 101)
    assert info.value.status == 400 and "ráfaga máxima" in info.value.message
    assert tenants.in_flight("a") == 2  # a refusal took nothing
    tenants.admit("a", 100)
    with pytest.raises(Refused) as info:
        tenants.admit("b" * 3, 1) and tenants.admit("a", 1)
    assert info.value.reason == "concurrency"
    assert tenants.admit("zzz", 10**9).tenant == "zzz"  # other tenants: no limits by default


def test_tokens_per_second_refusal_names_the_seconds_to_wait():
    clock = Clock()
    tenants = Tenants(default_limits=TenantLimits(tokens_per_s=10, burst_tokens=30), clock=clock)
    tenants.admit("x", 30)
    with pytest.raises(Refused) as info:
        tenants.admit("x", 25)
    assert info.value.retry_after_s == 3 and "10 tokens por segundo" in info.value.message


def test_identify_by_key_or_user_and_refuse_bad_ones():
    keyed = Tenants(api_keys={"k1": "acme"})
    assert keyed.identify("Bearer k1", "whoever") == "acme"
    for auth in (None, "Bearer nope", "k1"):
        with pytest.raises(Refused) as info:
            keyed.identify(auth, None)
        assert info.value.status == 401
    open_ = Tenants()
    assert open_.identify("Bearer anything", "ana") == "ana"
    assert open_.identify(None, None) == "anonymous"
    for bad in (7, "", "x" * 129, ["a"]):
        with pytest.raises(Refused, match="'user' debe ser un texto"):
            open_.identify(None, bad)


@pytest.mark.parametrize("kw, words", [
    ({"requests_per_s": 0}, "requests_per_s debe ser un número > 0"),
    ({"tokens_per_s": float("nan")}, "tokens_per_s debe ser"),
    ({"max_concurrent": 1.5}, "max_concurrent debe ser un entero >= 1"),
])
def test_bad_limits_are_refused_in_spanish(kw, words):
    with pytest.raises(ValueError, match=words):
        TenantLimits(**kw)


def test_too_many_tenants_get_429_until_idle_ones_are_forgotten():
    clock = Clock()
    tenants = Tenants(max_tenants=2, clock=clock)
    held = tenants.admit("a", 1)
    tenants.admit("b", 1).release()
    tenants.admit("c", 1)  # b was idle: forgotten
    with pytest.raises(Refused) as info:
        tenants.admit("d", 1)
    assert (info.value.status, info.value.reason) == (429, "too_many_tenants")
    held.release()
    tenants.admit("d", 1)


# --- the server -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ref(tiny):
    return LLM(tiny, tokenizer=MODEL)


@pytest.fixture(scope="module")
def fair_server():
    """VTC between tenants named by API keys; the flooder may hold 2 requests at once."""
    tenants = Tenants(api_keys={"k-flood": "flood", "k-polite": "polite"},
                      limits={"flood": TenantLimits(max_concurrent=2, requests_per_s=50)})
    with serve_in_thread(LLM(MODEL, max_num_seqs=4, kv_layout="paged", scheduling_policy="vtc"),
                         max_waiting=64, tenants=tenants) as srv:
        yield srv


def body(prompt, max_tokens, **kw):
    return {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, **kw}


def stream_text(base_url: str, key: str, prompt: str, max_tokens: int) -> tuple[str, int]:
    """A streamed completion's text and number of token events."""
    import json
    text, n = [], 0
    with httpx.Client(base_url=base_url, timeout=120) as c, c.stream(
            "POST", C, json=body(prompt, max_tokens, stream=True),
            headers={"Authorization": f"Bearer {key}"}) as resp:
        assert resp.status_code == 200, resp.read()
        for line in resp.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line[6:])
                if chunk.get("choices"):
                    text.append(chunk["choices"][0]["text"])
                    n += 1
    return "".join(text), n


def test_a_flooder_gets_429s_while_another_tenants_streams_finish_exactly(fair_server, ref):
    url = fair_server.base_url
    prompts = ["La caché KV", "El planificador decide", "Un tenant educado"]
    want = [ref.generate(p, SamplingParams(max_tokens=12, ignore_eos=True))[0].text for p in prompts]
    long = body("Inundación", 150, stream=True)
    with httpx.Client(base_url=url, timeout=120) as http, \
            concurrent.futures.ThreadPoolExecutor(3) as pool:
        flood = {"Authorization": "Bearer k-flood"}
        with http.stream("POST", C, json=long, headers=flood) as a, \
                http.stream("POST", C, json=long, headers=flood) as b:
            lines = [a.iter_lines(), b.iter_lines()]  # both admitted: their first token came
            for it in lines:
                next(line for line in it if line.startswith("data:"))
            polite = [pool.submit(stream_text, url, "k-polite", p, 12) for p in prompts]
            refused = [http.post(C, json=body("Más", 4), headers=flood) for _ in range(5)]
            got = [f.result(timeout=120) for f in polite]
        for r in refused:
            err = assert_openai_error(r, 429, code="concurrency")
            assert r.headers["retry-after"] == "1" and "flood" in err["message"]
        assert [t for t, _ in got] == want and all(n == 12 for _, n in got)
        wait_idle(fair_server)
        samples = metric_samples(http.get("/metrics").text)
        assert metric(samples, "tenant_requests_total", tenant="flood", outcome="concurrency") == 5
        assert metric(samples, "tenant_requests_total", tenant="polite", outcome="length") == 3
        assert metric(samples, "tenant_generation_tokens_total", tenant="polite") == 36
        assert metric(samples, "tenant_time_to_first_token_seconds_count", tenant="polite") == 3
        assert metric(samples, "requests_total", outcome="rate_limited") == 5
        ok = http.post(C, json=body("Ya", 2), headers=flood)  # its streams ended: room again
        assert ok.status_code == 200


def test_keys_are_required_when_configured_and_priority_needs_the_priority_policy(fair_server):
    with httpx.Client(base_url=fair_server.base_url, timeout=60) as http:
        err = assert_openai_error(http.post(C, json=body("Hola", 2)), 401, code="invalid_api_key")
        assert "Authorization: Bearer" in err["message"]
        r = http.post(C, json=body("Hola", 2, priority=3), headers={"Authorization": "Bearer k-polite"})
        err = assert_openai_error(r, 400, param="priority")
        assert "vtc" in err["message"] and "--scheduling-policy priority" in err["message"]


def test_priority_server_accepts_priority_and_user_names_the_tenant(ref):
    with serve_in_thread(LLM(MODEL, max_num_seqs=2, kv_layout="paged", scheduling_policy="priority"),
                         max_waiting=8) as srv, httpx.Client(base_url=srv.base_url, timeout=60) as http:
        r = http.post(C, json=body("Hola", 5, priority=-2, user="ana"))
        assert r.status_code == 200, r.text
        want = ref.generate("Hola", SamplingParams(max_tokens=5, ignore_eos=True))[0].text
        assert r.json()["choices"][0]["text"] == want
        for bad, param in (({"priority": 1.5}, "priority"), ({"priority": "alta"}, "priority"),
                           ({"user": 42}, "user"), ({"user": ""}, "user")):
            assert_openai_error(http.post(C, json=body("Hola", 2, **bad)), 400, param=param)
        samples = metric_samples(http.get("/metrics").text)
        assert metric(samples, "tenant_requests_total", tenant="ana", outcome="length") == 1
        assert metric(samples, "tenant_prompt_tokens_total", tenant="ana") > 0


def test_metrics_give_at_most_max_tenant_labels_their_own_series():
    from prometheus_client import generate_latest

    from ai_evolution.server.metrics import OTHER_TENANTS, ServerMetrics
    m = ServerMetrics(max_tenant_labels=2)
    for t in ("a", "b", "c", "d", "a"):
        m.tenant_prompt(t, 10)
    samples = metric_samples(generate_latest(m.registry).decode())
    assert metric(samples, "tenant_prompt_tokens_total", tenant="a") == 20
    assert metric(samples, "tenant_prompt_tokens_total", tenant=OTHER_TENANTS) == 20
    assert ("ai_evolution:tenant_prompt_tokens_total", frozenset({("tenant", "c")})) not in samples
