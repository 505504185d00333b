"""``python -m ai_evolution.router --replica URL --replica URL --policy prefix-affinity --port P``.

Every flag's problem is answered in Spanish with the accepted values (argparse's usage line, then
the message), before anything starts.
"""

from __future__ import annotations

import argparse

import uvicorn

from .app import RouterConfig, create_router_app
from .policies import POLICIES


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m ai_evolution.router",
        description="Enrutador HTTP delante de N servidores compatibles con OpenAI (los de "
                    "python -m ai_evolution.server, vLLM...): /v1/completions y "
                    "/v1/chat/completions (también en streaming), /v1/models, /health, "
                    "/replicas y /metrics.")
    p.add_argument("--replica", action="append", default=[], metavar="URL",
                   help="URL base de una réplica, p. ej. http://127.0.0.1:8001 (repetible; al "
                        "menos una)")
    p.add_argument("--policy", default="prefix-affinity",
                   help=f"política de enrutado: {', '.join(POLICIES)} (por defecto "
                        "prefix-affinity)")
    p.add_argument("--max-imbalance", type=int, default=4,
                   help="prefix-affinity: peticiones pendientes de más que la réplica afín puede "
                        "tener sobre la menos cargada antes de desviar la petición (por defecto 4)")
    p.add_argument("--block-chars", type=int, default=64,
                   help="caracteres por bloque al trocear un prompt de texto (por defecto 64)")
    p.add_argument("--block-tokens", type=int, default=16,
                   help="tokens por bloque al trocear un prompt de ids (por defecto 16)")
    p.add_argument("--health-interval", type=float, default=2.0,
                   help="segundos entre comprobaciones GET /health (por defecto 2)")
    p.add_argument("--host", default="127.0.0.1", help="dirección de escucha (por defecto 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="puerto (por defecto 8000)")
    p.add_argument("--log-level", default="info",
                   choices=("critical", "error", "warning", "info", "debug"))
    return p


def config_from_args(args: argparse.Namespace) -> RouterConfig:
    """The router's settings; ValueError (Spanish) names the bad flag's accepted values."""
    return RouterConfig(args.replica, args.policy, block_chars=args.block_chars,
                        block_tokens=args.block_tokens, max_imbalance=args.max_imbalance,
                        health_interval_s=args.health_interval)


def main(argv: list[str] | None = None) -> None:
    p = parser()
    args = p.parse_args(argv)
    try:
        config = config_from_args(args)
    except ValueError as err:
        p.error(str(err))
    uvicorn.run(create_router_app(config), host=args.host, port=args.port,
                log_level=args.log_level)


if __name__ == "__main__":
    main()
