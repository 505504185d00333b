"""The server's Prometheus metrics (``GET /metrics``), named after vLLM's.

Each app gets its own ``CollectorRegistry`` (not the process-wide default), so that several
servers can live in one process (tests, a notebook) without sharing counters. The engine thread
updates the gauges after every step and observes the latency histograms as requests progress;
``prometheus_client`` metrics are thread-safe.

=================================================  =========  ========================================
name                                               kind       meaning
=================================================  =========  ========================================
``ai_evolution:num_requests_running``              gauge      requests in the batch, unfinished
``ai_evolution:num_requests_waiting``              gauge      accepted, not yet admitted (queue)
``ai_evolution:kv_cache_blocks_used``              gauge      KV blocks (or contiguous rows) held
``ai_evolution:kv_cache_blocks_total``             gauge      KV blocks (or rows) in the cache
``ai_evolution:kv_cache_usage_perc``               gauge      used / total (0..1)
``ai_evolution:prefix_cache_queries_total``        counter    prompt tokens looked up in the cache
``ai_evolution:prefix_cache_hits_total``           counter    of those, tokens found cached
``ai_evolution:prefix_cache_hit_rate``             gauge      hits / queries since start
``ai_evolution:num_preemptions_total``             counter    preemptions by recompute
``ai_evolution:requests_total{outcome}``           counter    stop, length, abort, rejected,
                                                              overloaded, error
``ai_evolution:prompt_tokens_total``               counter    prompt tokens of admitted requests
``ai_evolution:generation_tokens_total``           counter    tokens generated
``ai_evolution:time_to_first_token_seconds``       histogram  TTFT (arrival at the HTTP layer on)
``ai_evolution:time_per_output_token_seconds``     histogram  TPOT of each finished request
``ai_evolution:e2e_request_latency_seconds``       histogram  arrival -> finish (stop/length)
``ai_evolution:tenant_requests_total{tenant,       counter    per tenant: finished requests by
outcome}``                                                    outcome, and refusals (rate_limited,
                                                              concurrency, too_large...)
``ai_evolution:tenant_prompt_tokens_total{tenant}``counter    per tenant: prompt tokens admitted
``ai_evolution:tenant_generation_tokens_total``    counter    per tenant: tokens generated
``ai_evolution:tenant_time_to_first_token_seconds``histogram  per tenant: TTFT
``ai_evolution:tenant_time_per_output_token_       histogram  per tenant: TPOT
seconds``
=================================================  =========  ========================================

Per-tenant series carry a ``tenant`` label: requests without a tenant count as ``anonymous``.
At most ``max_tenant_labels`` tenants get their own label (the first seen); the rest share
``OTHER_TENANTS``, so a server whose ``user`` values keep changing keeps a bounded ``/metrics``.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

PREFIX = "ai_evolution:"
OTHER_TENANTS = "_otros"
OUTCOMES = ("stop", "length", "abort", "rejected", "overloaded", "error", "rate_limited")

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
                0.75, 1.0, 2.5, 5.0)
E2E_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 60.0, 120.0, 300.0)


class ServerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None, max_tenant_labels: int = 1000) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.max_tenant_labels = max_tenant_labels
        self._tenant_labels: set[str] = set()
        r = self.registry
        self.running = Gauge(PREFIX + "num_requests_running", "Requests in the running batch.",
                             registry=r)
        self.waiting = Gauge(PREFIX + "num_requests_waiting",
                             "Requests accepted and waiting to be admitted.", registry=r)
        self.blocks_used = Gauge(PREFIX + "kv_cache_blocks_used", "KV blocks held.", registry=r)
        self.blocks_total = Gauge(PREFIX + "kv_cache_blocks_total", "KV blocks in the cache.",
                                  registry=r)
        self.usage = Gauge(PREFIX + "kv_cache_usage_perc", "Fraction of KV blocks held (0..1).",
                           registry=r)
        self.prefix_queries = Counter(PREFIX + "prefix_cache_queries",
                                      "Prompt tokens looked up in the prefix cache.", registry=r)
        self.prefix_hits = Counter(PREFIX + "prefix_cache_hits",
                                   "Prompt tokens found in the prefix cache.", registry=r)
        self.hit_rate = Gauge(PREFIX + "prefix_cache_hit_rate",
                              "Prefix-cache hit tokens / queried tokens since start.", registry=r)
        self.preemptions = Counter(PREFIX + "num_preemptions", "Preemptions by recompute.",
                                   registry=r)
        self.requests = Counter(PREFIX + "requests", "Requests by outcome.", ["outcome"],
                                registry=r)
        for outcome in OUTCOMES:
            self.requests.labels(outcome)  # export every outcome from the start, at 0
        self.prompt_tokens = Counter(PREFIX + "prompt_tokens", "Prompt tokens admitted.",
                                     registry=r)
        self.generation_tokens = Counter(PREFIX + "generation_tokens", "Tokens generated.",
                                         registry=r)
        self.ttft = Histogram(PREFIX + "time_to_first_token_seconds", "Time to first token.",
                              buckets=TTFT_BUCKETS, registry=r)
        self.tpot = Histogram(PREFIX + "time_per_output_token_seconds",
                              "Time per output token after the first.", buckets=TPOT_BUCKETS,
                              registry=r)
        self.e2e = Histogram(PREFIX + "e2e_request_latency_seconds", "Arrival to finish.",
                             buckets=E2E_BUCKETS, registry=r)
        # per tenant (chapter 12)
        self.tenant_requests = Counter(PREFIX + "tenant_requests", "Requests by tenant and outcome.",
                                       ["tenant", "outcome"], registry=r)
        self.tenant_prompt_tokens = Counter(PREFIX + "tenant_prompt_tokens",
                                            "Prompt tokens admitted, by tenant.", ["tenant"],
                                            registry=r)
        self.tenant_generation_tokens = Counter(PREFIX + "tenant_generation_tokens",
                                                "Tokens generated, by tenant.", ["tenant"],
                                                registry=r)
        self.tenant_ttft_s = Histogram(PREFIX + "tenant_time_to_first_token_seconds",
                                       "Time to first token, by tenant.", ["tenant"],
                                       buckets=TTFT_BUCKETS, registry=r)
        self.tenant_tpot_s = Histogram(PREFIX + "tenant_time_per_output_token_seconds",
                                       "Time per output token, by tenant.", ["tenant"],
                                       buckets=TPOT_BUCKETS, registry=r)
        self._seen = {"queries": 0, "hits": 0, "preemptions": 0}

    def tenant_label(self, tenant: str) -> str:
        """``tenant`` itself while fewer than ``max_tenant_labels`` tenants have a label, else
        ``OTHER_TENANTS`` (thread-safe enough: a race can only add a label or two)."""
        if tenant in self._tenant_labels:
            return tenant
        if len(self._tenant_labels) < self.max_tenant_labels:
            self._tenant_labels.add(tenant)
            return tenant
        return OTHER_TENANTS

    def outcome(self, name: str, tenant: str | None = None) -> None:
        self.requests.labels(name).inc()
        if tenant is not None:
            self.tenant_requests.labels(self.tenant_label(tenant), name).inc()

    def refusal(self, outcome: str, tenant: str, reason: str) -> None:
        """A request its tenant's limits refused: ``outcome`` overall, ``reason`` per tenant."""
        self.requests.labels(outcome).inc()
        self.tenant_requests.labels(self.tenant_label(tenant), reason).inc()

    def tenant_prompt(self, tenant: str | None, n: int) -> None:
        if tenant is not None:
            self.tenant_prompt_tokens.labels(self.tenant_label(tenant)).inc(n)

    def tenant_generated(self, tenant: str | None, n: int) -> None:
        if tenant is not None and n:
            self.tenant_generation_tokens.labels(self.tenant_label(tenant)).inc(n)

    def tenant_ttft(self, tenant: str | None, seconds: float) -> None:
        if tenant is not None:
            self.tenant_ttft_s.labels(self.tenant_label(tenant)).observe(seconds)

    def tenant_tpot(self, tenant: str | None, seconds: float) -> None:
        if tenant is not None:
            self.tenant_tpot_s.labels(self.tenant_label(tenant)).observe(seconds)

    def update_engine(self, engine, inbox_waiting: int = 0) -> None:
        """Refresh the gauges from the engine (call from the engine's thread)."""
        self.running.set(engine.num_running)
        self.waiting.set(engine.num_waiting + inbox_waiting)
        u = engine.kv_usage()
        self.blocks_used.set(u["blocks_used"])
        self.blocks_total.set(u["blocks_total"])
        self.usage.set(u["blocks_used"] / u["blocks_total"] if u["blocks_total"] else 0.0)
        queries, hits = u.get("prefix_queried_tokens", 0), u.get("prefix_hit_tokens", 0)
        self._advance(self.prefix_queries, "queries", queries)
        self._advance(self.prefix_hits, "hits", hits)
        self._advance(self.preemptions, "preemptions", u["num_preemptions"])
        self.hit_rate.set(hits / queries if queries else 0.0)

    def _advance(self, counter: Counter, key: str, total: int) -> None:
        """Counters only go up: add what the engine's cumulative number grew since last time."""
        delta = total - self._seen[key]
        if delta > 0:
            counter.inc(delta)
        self._seen[key] = max(total, self._seen[key])
