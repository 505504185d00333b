"""Replicas behind a router (chapter 13): a small FastAPI process in front of N
OpenAI-compatible servers, with round-robin, least-outstanding and prefix-affinity policies,
health checks, retries before the first byte, and Prometheus ``/metrics`` per replica.

``python -m ai_evolution.router --replica http://127.0.0.1:8001 --replica http://127.0.0.1:8002
--policy prefix-affinity --port 8000``; ``serve_router_in_thread([...])`` runs it in-process.
Modules: ``policies`` (the rules, on plain values; the simulator uses them too), ``app`` (HTTP).
"""

from .app import (RouterConfig, check_replica_url, create_router_app, prompt_for_routing)
from .policies import (POLICIES, Choice, LeastOutstanding, PrefixAffinity, RoundRobin,
                       make_policy, prefix_blocks)


def serve_router_in_thread(replicas, policy: str = "prefix-affinity", *, host: str = "127.0.0.1",
                           port: int = 0, log_level: str = "warning", **options):
    """The router in a background thread of this process (``ServerHandle``: ``base_url``,
    ``close()``, ``app.state.router``). ``options``: ``RouterConfig``'s fields."""
    from ..server.launch import serve_app_in_thread
    app = create_router_app(RouterConfig(list(replicas), policy, **options))
    return serve_app_in_thread(app, host=host, port=port, log_level=log_level)


__all__ = ["POLICIES", "Choice", "LeastOutstanding", "PrefixAffinity", "RoundRobin",
           "RouterConfig", "check_replica_url", "create_router_app", "make_policy",
           "prefix_blocks", "prompt_for_routing", "serve_router_in_thread"]
