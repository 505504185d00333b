"""The router (chapter 13): policies on values, prefix-affinity's hit rate above round-robin's on
two real tiny-es replicas, a replica killed mid-run, no healthy replica, bad input."""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from ai_evolution.router import (POLICIES, LeastOutstanding, PrefixAffinity, RoundRobin,
                                 RouterConfig, check_replica_url, make_policy, prefix_blocks,
                                 prompt_for_routing, serve_router_in_thread)
from ai_evolution.router.__main__ import main as router_main

HERE = Path(__file__).resolve().parent


# --- policies on values ----------------------------------------------------------------------------
def test_prefix_blocks_chain_full_blocks_only():
    a = prefix_blocks(list(range(40)), 16)
    b = prefix_blocks(list(range(32)) + [99] * 8, 16)
    c = prefix_blocks(list(range(16)) + [7] * 16, 16)
    assert len(a) == 2 and len(b) == 2          # 40 tokens: two full blocks, the rest no hash
    assert a == b                                # same first 32 tokens
    assert c[0] == a[0] and c[1] != a[1]         # share the first block only
    assert prefix_blocks(list(range(15)), 16) == []
    assert len(prefix_blocks("x" * 1000, 64, max_blocks=3)) == 3
    text = prefix_blocks("hola " * 40, 64)
    assert text == prefix_blocks("hola " * 40 + "y algo más", 64)[:len(text)]
    with pytest.raises(ValueError, match="block_size"):
        prefix_blocks([1, 2], 0)


def test_round_robin_cycles_over_candidates_only():
    rr = RoundRobin()
    loads = [0, 0, 0]
    assert [rr.choose([], loads, [0, 1, 2]).index for _ in range(4)] == [0, 1, 2, 0]
    assert [rr.choose([], loads, [0, 2]).index for _ in range(3)] == [2, 0, 2]
    with pytest.raises(ValueError, match="candidatas"):
        rr.choose([], loads, [])


def test_least_outstanding_picks_fewest_lowest_index_on_ties():
    lo = LeastOutstanding()
    assert lo.choose([], [3, 1, 1], [0, 1, 2]).index == 1
    assert lo.choose([], [3, 1, 0], [0, 1]).index == 1
    assert lo.choose([], [3, 1, 0], [0, 1]).reason == "least_outstanding"


def test_prefix_affinity_longest_match_load_guard_and_forget():
    pa = PrefixAffinity(max_imbalance=2)
    A = prefix_blocks(list(range(48)), 16)                      # 3 blocks
    B = prefix_blocks(list(range(16)) + [5] * 32, 16)           # shares A's first block
    C = prefix_blocks(list(range(32)) + [9] * 16, 16)           # shares A's first two blocks
    first = pa.choose(A, [1, 0], [0, 1])
    assert (first.index, first.reason) == (1, "prefix_miss")    # no match: least loaded
    assert pa.choose(A, [0, 0], [0, 1]) .index == 1              # stays where A was served
    pa.record(B, 0)                                              # B's (and block 0's) last server: 0
    hit = pa.choose(C, [0, 2], [0, 1])                           # longest match is A's block 1
    assert (hit.index, hit.reason) == (1, "prefix_hit")          # 2 - 0 = 2 <= max_imbalance
    guard = pa.choose(A, [0, 3], [0, 1])                         # 3 - 0 > 2: the guard diverts
    assert (guard.index, guard.reason) == (0, "load_guard")
    assert pa.match(A, [0, 1]) == 0                              # and 0 is A's server now
    assert pa.match(A, [1]) is None or pa.match(A, [1]) == 1
    pa.forget(0)
    assert pa.match(A, [0, 1]) != 0                              # a dead replica's map is gone
    with pytest.raises(ValueError, match="max_imbalance"):
        PrefixAffinity(max_imbalance=-1)


def test_prefix_affinity_map_is_bounded():
    pa = PrefixAffinity(max_entries=10)
    for k in range(20):
        pa.choose(prefix_blocks([k] * 64, 16), [0, 0], [0, 1])
    assert len(pa._owner) == 10


def test_make_policy_names_and_bad_name():
    assert [make_policy(p).name for p in POLICIES] == list(POLICIES)
    assert make_policy("Prefix_Affinity", max_imbalance=1).max_imbalance == 1
    with pytest.raises(ValueError, match="round-robin, least-outstanding, prefix-affinity"):
        make_policy("random")
    with pytest.raises(ValueError, match="no acepta opciones"):
        make_policy("round-robin", max_imbalance=1)


def test_chat_messages_sharing_a_system_prompt_share_leading_blocks():
    system = {"role": "system", "content": "Eres un asistente que responde en español. " * 6}
    a = prompt_for_routing("/v1/chat/completions", {"messages": [system, {"role": "user", "content": "hola"}]})
    b = prompt_for_routing("/v1/chat/completions", {"messages": [system, {"role": "user", "content": "adiós"}]})
    ha, hb = prefix_blocks(a[0], 64), prefix_blocks(b[0], 64)
    assert a[1] == "text" and len(ha) >= 3 and ha[:3] == hb[:3]
    assert prompt_for_routing("/v1/completions", {"prompt": [1, 2, 3]}) == ([1, 2, 3], "tokens")
    assert prompt_for_routing("/v1/completions", {"prompt": ["uno", "dos"]}) == ("uno", "text")
    assert prompt_for_routing("/v1/completions", {"prompt": 3}) is None
    assert prompt_for_routing("/v1/completions", None) is None


@pytest.mark.parametrize("kwargs, match", [
    (dict(replicas=[]), "al menos una réplica"),
    (dict(replicas=["ftp://h:1"]), "http://HOST:PUERTO"),
    (dict(replicas=["localhost:8000"]), "http://HOST:PUERTO"),
    (dict(replicas=["http://h:99999"]), "puerto"),
    (dict(replicas=["http://h:1", "http://h:1/"]), "repetidas"),
    (dict(replicas=["http://h:1"], policy="random"), "las aceptadas son: round-robin"),
    (dict(replicas=["http://h:1"], health_interval_s=0), "health_interval_s"),
])
def test_router_config_refuses_bad_input_in_spanish(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RouterConfig(**kwargs)


def test_replica_url_normalised():
    assert check_replica_url(" http://127.0.0.1:8001/v1/ ") == "http://127.0.0.1:8001"
    assert check_replica_url("https://host/base") == "https://host/base"


def test_cli_bad_policy_names_accepted_values(capsys):
    with pytest.raises(SystemExit) as exc:
        router_main(["--replica", "http://127.0.0.1:1", "--policy", "aleatoria"])
    assert exc.value.code == 2
    assert "las aceptadas son: round-robin, least-outstanding, prefix-affinity" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        router_main([])
    assert "al menos una réplica" in capsys.readouterr().err


# --- fake replicas in subprocesses (no model): failures --------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FakeReplica:
    def __init__(self, name: str, token_delay_s: float = 0.0, tokens: int = 3,
                 port: int | None = None) -> None:
        self.port = _free_port() if port is None else port
        self.url = f"http://127.0.0.1:{self.port}"
        self.name = name
        self.proc = subprocess.Popen([sys.executable, str(HERE / "fake_replica.py"), str(self.port),
                                      "--name", name, "--token-delay", str(token_delay_s),
                                      "--tokens", str(tokens)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"la réplica falsa {name} no arrancó")
            time.sleep(0.1)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


@pytest.fixture
def fakes():
    made = []

    def start(*args, **kw):
        r = FakeReplica(*args, **kw)
        made.append(r)
        return r
    yield start
    for r in made:
        r.kill()


def _metric(text: str, name: str, **labels) -> float:
    """The value of the series ``name`` whose labels are exactly ``labels`` (0 if absent)."""
    from prometheus_client.parser import text_string_to_metric_families
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    return 0.0


def _wait_outstanding(base_url: str, want: list[int], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while [r["outstanding"] for r in httpx.get(base_url + "/replicas").json()["replicas"]] != want:
        assert time.monotonic() < deadline, f"las peticiones no llegaron a {want} en curso"
        time.sleep(0.02)


def test_replica_killed_mid_run_is_taken_out_and_requests_keep_succeeding(fakes):
    a, b = fakes("A", token_delay_s=0.5, tokens=4), fakes("B", token_delay_s=0.5, tokens=4)
    with serve_router_in_thread([a.url, b.url], "round-robin", health_interval_s=0.5) as router:
        results = []

        def one(k: int) -> None:
            r = httpx.post(router.base_url + "/v1/completions",
                           json={"model": "fake", "prompt": f"pregunta {k}"}, timeout=30)
            results.append((r.status_code, r.json()))

        threads = [threading.Thread(target=one, args=(k,)) for k in range(6)]
        for t in threads:
            t.start()
        _wait_outstanding(router.base_url, [3, 3])   # every request in flight, half on B
        b.kill()
        for t in threads:
            t.join(30)
        assert len(results) == 6 and all(status == 200 for status, _ in results), results
        # B's three were sent again to A, which answered every request
        assert all(body["choices"][0]["text"].startswith("A ") for _, body in results)
        state = httpx.get(router.base_url + "/replicas").json()
        assert [r["healthy"] for r in state["replicas"]] == [True, False]
        after = [httpx.post(router.base_url + "/v1/completions",
                            json={"model": "fake", "prompt": "otra"}, timeout=30)]
        assert all(r.status_code == 200 and r.json()["choices"][0]["text"].startswith("A ")
                   for r in after)
        metrics = httpx.get(router.base_url + "/metrics").text
        assert _metric(metrics, "ai_evolution_router:errors_total", replica=b.url, kind="connect") >= 1
        assert _metric(metrics, "ai_evolution_router:retries_total") >= 1
        assert _metric(metrics, "ai_evolution_router:replica_healthy", replica=b.url) == 0
        assert _metric(metrics, "ai_evolution_router:requests_in_flight", replica=a.url) == 0


def test_stream_cut_after_first_bytes_ends_with_an_error_event(fakes):
    a, b = fakes("A", token_delay_s=0.2, tokens=8), fakes("B", token_delay_s=0.2, tokens=8)
    with serve_router_in_thread([a.url, b.url], "round-robin", health_interval_s=5) as router:
        bodies, started = {}, [threading.Event(), threading.Event()]

        def stream(k: int) -> None:
            with httpx.stream("POST", router.base_url + "/v1/completions",
                              json={"model": "fake", "prompt": "x", "stream": True},
                              timeout=30) as r:
                chunks = []
                for chunk in r.iter_bytes():
                    chunks.append(chunk)
                    started[k].set()
                bodies[k] = (r.status_code, b"".join(chunks).decode())

        threads = [threading.Thread(target=stream, args=(k,)) for k in range(2)]
        for t in threads:
            t.start()
        assert all(e.wait(20) for e in started)   # both clients have read their first token
        b.kill()
        for t in threads:
            t.join(30)
        events = {k: [e[len("data: "):] for e in body.split("\n\n") if e.startswith("data: ")]
                  for k, (_, body) in bodies.items()}
        whole = [k for k, ev in events.items() if ev[-1] == "[DONE]" and "error" not in ev[-2]]
        cut = [k for k in events if k not in whole]
        assert len(whole) == 1 and len(cut) == 1, bodies
        error = json.loads(events[cut[0]][-2])["error"]
        assert error["code"] == "replica_failed" and "dejó de responder" in error["message"]
        assert json.loads(events[cut[0]][0])["choices"][0]["text"] == "B "
        metrics = httpx.get(router.base_url + "/metrics").text
        assert _metric(metrics, "ai_evolution_router:errors_total", replica=b.url, kind="stream_cut") == 1


def test_no_healthy_replica_is_503_in_openai_shape(fakes):
    dead = f"http://127.0.0.1:{_free_port()}"   # nothing listens there
    with serve_router_in_thread([dead], "least-outstanding", health_interval_s=5) as router:
        r = httpx.post(router.base_url + "/v1/completions", json={"model": "x", "prompt": "hola"})
        assert r.status_code == 503 and r.headers.get("retry-after") == "1"
        err = r.json()["error"]
        assert err["code"] == "no_healthy_replica" and "ninguna réplica sana" in err["message"]
        assert httpx.get(router.base_url + "/health").status_code == 503
        assert httpx.post(router.base_url + "/v1/chat/completions",
                          json={"messages": [], "stream": True}).status_code == 503


def test_a_replica_that_comes_back_is_put_back_by_the_health_check(fakes):
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    with serve_router_in_thread([url], "round-robin", health_interval_s=0.2) as router:
        assert httpx.post(router.base_url + "/v1/completions", json={"prompt": "x"}).status_code == 503
        fakes("A", port=port)
        deadline = time.monotonic() + 10
        while not httpx.get(router.base_url + "/replicas").json()["replicas"][0]["healthy"]:
            assert time.monotonic() < deadline, "la réplica no volvió a la rotación"
            time.sleep(0.1)
        r = httpx.post(router.base_url + "/v1/completions", json={"prompt": "x"})
        assert r.status_code == 200 and r.json()["choices"][0]["text"].startswith("A ")
        assert httpx.get(router.base_url + "/health").json()["healthy_replicas"] == 1


def test_every_replica_failing_is_502(fakes):
    a = fakes("A", token_delay_s=0.3, tokens=4)
    with serve_router_in_thread([a.url], "round-robin", health_interval_s=5) as router:
        box = {}
        t = threading.Thread(target=lambda: box.setdefault("r", httpx.post(
            router.base_url + "/v1/completions", json={"prompt": "x"}, timeout=30)))
        t.start()
        time.sleep(0.4)
        a.kill()
        t.join(30)
        assert box["r"].status_code == 502
        assert box["r"].json()["error"]["code"] == "replicas_failed"


def test_body_over_the_cap_is_413_in_spanish(fakes):
    a = fakes("A")
    with serve_router_in_thread([a.url], "round-robin", max_request_bytes=100) as router:
        r = httpx.post(router.base_url + "/v1/completions", json={"prompt": "x" * 200})
        assert r.status_code == 413 and "el máximo es 100" in r.json()["error"]["message"]


# --- two real tiny-es replicas: prefix-affinity vs round-robin ----------------------------------
@pytest.fixture(scope="module")
def tiny_replicas():
    import torch
    from ai_evolution.engine.llm import LLM
    from ai_evolution.server import serve_in_thread
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    servers = [serve_in_thread(LLM("tiny-es", kv_layout="paged", max_num_seqs=4)) for _ in range(2)]
    yield servers
    for s in servers:
        s.close()
    torch.set_num_threads(before)


def _prefix_counters(servers) -> tuple[float, float]:
    hits = queries = 0.0
    for s in servers:
        text = httpx.get(s.base_url + "/metrics").text
        hits += _metric(text, "ai_evolution:prefix_cache_hits_total")
        queries += _metric(text, "ai_evolution:prefix_cache_queries_total")
    return hits, queries


def test_prefix_affinity_hit_rate_above_round_robin_on_shared_system_prompts(tiny_replicas):
    from ai_evolution.loadgen import run_http
    from ai_evolution.loadgen.shared_prefix import prefix_sharing_workload
    from ai_evolution.loadgen.workload import WorkItem
    base = prefix_sharing_workload(12, 10.0, 4054, seed=0, num_system_prompts=3, system_len=64,
                                   turns=1, turn_len=16, output_len=2)
    rates = {}
    for k, policy in enumerate(("round-robin", "prefix-affinity")):
        # the same workload, its every prompt starting with a token of this run: no run can hit
        # the other's cached blocks, and both have the same structure of shared prefixes
        workload = [WorkItem(w.arrival_time, [1 + k] + w.prompt_token_ids, w.params) for w in base]
        before = _prefix_counters(tiny_replicas)
        with serve_router_in_thread([s.base_url for s in tiny_replicas], policy) as router:
            records = run_http(router.base_url, workload, concurrency=1, progress=False)
            chosen = httpx.get(router.base_url + "/metrics").text
        assert all(r.error is None for r in records), [r.error for r in records]
        after = _prefix_counters(tiny_replicas)
        rates[policy] = (after[0] - before[0]) / (after[1] - before[1])
        if policy == "prefix-affinity":
            hits = sum(_metric(chosen, "ai_evolution_router:chosen_total", replica=s.base_url,
                               reason="prefix_hit") for s in tiny_replicas)
            assert hits == len(workload) - 3   # every request but each system prompt's first
    assert rates["prefix-affinity"] > rates["round-robin"], rates


def test_router_answers_exactly_what_the_replica_answers(tiny_replicas):
    direct = tiny_replicas[0].base_url
    with serve_router_in_thread([direct], "least-outstanding") as router:
        for path, body in (("/v1/completions", {"model": "tiny-es", "prompt": "Había una vez",
                                                "max_tokens": 6, "temperature": 0}),
                           ("/v1/chat/completions", {"model": "tiny-es", "max_tokens": 6,
                                                     "temperature": 0, "messages": [
                                                         {"role": "user", "content": "Hola"}]})):
            a = httpx.post(direct + path, json=body, timeout=60).json()
            b = httpx.post(router.base_url + path, json=body, timeout=60).json()
            key = "text" if path == "/v1/completions" else "message"
            assert a["choices"][0][key] == b["choices"][0][key]
        bad = httpx.post(router.base_url + "/v1/completions", json={"model": "tiny-es",
                                                                    "prompt": "x", "top_p": 7})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "top_p"   # the replica's
        models = httpx.get(router.base_url + "/v1/models").json()
        assert models["data"][0]["id"] == "tiny-es"
