"""Routing policies side by side on two real replicas: prefix-cache hit rate, TTFT p50/p99 and
throughput, on a workload of shared system prompts and two-turn conversations.

    python benchmarks/router.py [--reps 5] [--sessions 16] [--rate 4 | --concurrency 8]
                                [--system-len 192]
                                [--policies round-robin,least-outstanding,prefix-affinity]

Two ``python -m ai_evolution.server --model tiny-es --threads 1`` processes, each pinned to one
core with ``taskset`` when the machine has two cores or more (otherwise unpinned, and the script
says so), behind the router (in this process, a fresh one per run). Every rep sends the same
kind of workload (``loadgen.prefix_sharing_workload``, seed = the rep) through each policy, in
an order that rotates from rep to rep; each run's prompts start with a token of their own, so
no run finds another's blocks in the replicas' caches. The hit rate is read from the replicas'
``/metrics`` (prefix-cache hit tokens / looked-up tokens, the run's difference). The first rep
warms up and is not counted. Each policy is compared with round-robin by ``claims.compare``,
paired by rep.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import httpx

from ai_evolution import claims
from ai_evolution.fmt import es
from ai_evolution.loadgen import run_http
from ai_evolution.loadgen.shared_prefix import prefix_sharing_workload
from ai_evolution.loadgen.workload import WorkItem
from ai_evolution.metrics import summarize
from ai_evolution.router import POLICIES, serve_router_in_thread


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_replicas(n: int, max_num_seqs: int) -> tuple[list[subprocess.Popen], list[str], bool]:
    pin = shutil.which("taskset") is not None and (os.cpu_count() or 1) >= n
    procs, urls = [], []
    for i in range(n):
        port = free_port()
        cmd = [sys.executable, "-m", "ai_evolution.server", "--model", "tiny-es", "--port",
               str(port), "--threads", "1", "--max-num-seqs", str(max_num_seqs),
               "--log-level", "warning"]
        procs.append(subprocess.Popen((["taskset", "-c", str(i)] if pin else []) + cmd,
                                      env={**os.environ, "OMP_NUM_THREADS": "1"}))
        urls.append(f"http://127.0.0.1:{port}")
    deadline = time.monotonic() + 180
    for p, url in zip(procs, urls):
        while True:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if p.poll() is not None or time.monotonic() > deadline:
                stop(procs)
                raise SystemExit(f"la réplica {url} no arrancó")
            time.sleep(0.2)
    return procs, urls, pin


def stop(procs) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(15)
        except subprocess.TimeoutExpired:
            p.kill()


def prefix_counters(urls: list[str]) -> tuple[float, float]:
    hits = queries = 0.0
    for url in urls:
        for line in httpx.get(url + "/metrics").text.splitlines():
            if line.startswith("ai_evolution:prefix_cache_hits_total "):
                hits += float(line.split()[1])
            elif line.startswith("ai_evolution:prefix_cache_queries_total "):
                queries += float(line.split()[1])
    return hits, queries


def one_run(urls, policy: str, workload, marker: int, concurrency: int | None = None) -> dict:
    items = [WorkItem(w.arrival_time, [marker] + w.prompt_token_ids, w.params) for w in workload]
    before = prefix_counters(urls)
    with serve_router_in_thread(urls, policy) as router:
        records = run_http(router.base_url, items, concurrency=concurrency, progress=False)
    after = prefix_counters(urls)
    failed = [r.error for r in records if r.error is not None]
    if failed:
        raise SystemExit(f"{len(failed)} peticiones fallaron con {policy}: {failed[:3]}")
    s = summarize(records)
    return {"hit_rate": (after[0] - before[0]) / max(1.0, after[1] - before[1]),
            "ttft_p50_s": s["ttft_p50_s"], "ttft_p99_s": s["ttft_p99_s"],
            "throughput_tok_s": s["throughput_tok_s"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--sessions", type=int, default=16)
    ap.add_argument("--rate", type=float, default=4.0, help="peticiones/s (Poisson)")
    ap.add_argument("--system-prompts", type=int, default=4)
    ap.add_argument("--system-len", type=int, default=192)
    ap.add_argument("--turn-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=8)
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--concurrency", type=int, default=None,
                    help="clientes de un bucle cerrado (por defecto, bucle abierto a --rate: el "
                         "caudal lo fija la llegada; con un bucle cerrado, lo fijan las réplicas)")
    args = ap.parse_args()
    policies = args.policies.split(",")
    procs, urls, pinned = start_replicas(2, 8)
    try:
        print(f"2 réplicas de tiny-es, {'cada una fijada a un núcleo (taskset)' if pinned else 'SIN fijar a núcleos'}; "
              f"{args.sessions} conversaciones de 2 turnos sobre {args.system_prompts} prompts de "
              f"sistema de {args.system_len} tokens, "
              f"{f'{args.concurrency} clientes en bucle cerrado' if args.concurrency else f'{es(args.rate, 1)} peticiones/s'}, "
              f"{args.reps} rondas (más una de calentamiento)")
        runs = {p: [] for p in policies}
        marker = 1
        for rep in range(args.reps + 1):
            workload = prefix_sharing_workload(args.sessions, args.rate, 4000, seed=rep,
                                               num_system_prompts=args.system_prompts,
                                               system_len=args.system_len, turns=2,
                                               turn_len=args.turn_len, output_len=args.output_len)
            order = policies[rep % len(policies):] + policies[:rep % len(policies)]
            for policy in order:
                result = one_run(urls, policy, workload, marker, args.concurrency)
                marker += 1
                if rep:
                    runs[policy].append(result)
        for policy in policies:
            rows = runs[policy]

            def med(key):
                return sorted(r[key] for r in rows)[len(rows) // 2]
            print(f"\n{policy}: acierto de la caché de prefijos {es(100 * med('hit_rate'), 1)} %, "
                  f"TTFT p50 {es(1e3 * med('ttft_p50_s'), 1)} ms, p99 {es(1e3 * med('ttft_p99_s'), 1)} ms, "
                  f"{es(med('throughput_tok_s'), 1)} tokens/s (medianas de {len(rows)} rondas)")
            if policy != "round-robin" and "round-robin" in runs:
                base = runs["round-robin"]
                pairs = "pares de rondas con la misma carga"
                print("  ", claims.compare([r["hit_rate"] for r in rows], [r["hit_rate"] for r in base],
                                           what=f"acierto de caché {policy} / round-robin",
                                           higher="acierta más", lower="acierta menos", pairs=pairs))
                print("  ", claims.compare([r["ttft_p50_s"] for r in rows], [r["ttft_p50_s"] for r in base],
                                           what=f"TTFT p50 {policy} / round-robin",
                                           higher="responde más tarde", lower="responde antes",
                                           pairs=pairs))
                print("  ", claims.compare([r["throughput_tok_s"] for r in rows],
                                           [r["throughput_tok_s"] for r in base],
                                           what=f"tokens/s {policy} / round-robin",
                                           higher="sirve más", lower="sirve menos", pairs=pairs))
    finally:
        stop(procs)


if __name__ == "__main__":
    main()
