"""``python -m ai_evolution.server --model tiny-es --port 8000``: the OpenAI-compatible server.

Flags name the engine's knobs (``--max-num-seqs``, ``--kv-layout``, ``--num-blocks``,
``--block-size``, ``--max-model-len``, ``--speculative-model``...; they make the engine's
``EngineConfig``) and the admission bound ``--max-waiting``. Point any
OpenAI client at ``http://HOST:PORT/v1``.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
import uvicorn

from ..engine.config import KV_LAYOUTS, EngineConfig, SpeculativeConfig
from ..engine.scheduling_policy import SCHEDULING_POLICIES
from ..engine.llm import LLM
from ..model.hub import looks_like_hub_id
from ..model.tokenizer import shipped_names
from .app import create_app
from .tenants import TenantLimits, Tenants


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m ai_evolution.server",
        description="Servidor HTTP compatible con la API de OpenAI alrededor del motor de "
                    "ai_evolution (/v1/completions, /v1/chat/completions, /v1/models, /health, "
                    "/metrics).")
    p.add_argument("--model", default="tiny-es",
                   help=f"modelo incluido ({', '.join(shipped_names()) or 'ninguno'}), id del Hub "
                        "de Hugging Face (p. ej. Qwen/Qwen2.5-0.5B-Instruct; se descarga una vez) o "
                        "carpeta de un checkpoint (por defecto: tiny-es)")
    p.add_argument("--tokenizer", default=None,
                   help="tokenizador (nombre incluido o carpeta); por defecto, el del modelo")
    p.add_argument("--served-model-name", default=None,
                   help="nombre que los clientes ponen en 'model' (por defecto: el de --model)")
    p.add_argument("--host", default="127.0.0.1", help="dirección de escucha (por defecto 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="puerto (por defecto 8000)")
    p.add_argument("--max-num-seqs", type=int, default=16,
                   help="peticiones máximas en el lote (por defecto 16)")
    p.add_argument("--max-model-len", type=int, default=None,
                   help="tokens máximos por petición, prompt + salida (por defecto: los del modelo)")
    p.add_argument("--kv-layout", choices=KV_LAYOUTS, default="paged",
                   help="disposición de la caché KV (por defecto paged)")
    p.add_argument("--num-blocks", type=int, default=None,
                   help="bloques de la caché paginada (por defecto: la memoria de max-num-seqs filas)")
    p.add_argument("--block-size", type=int, default=16, help="tokens por bloque (por defecto 16)")
    p.add_argument("--no-prefix-caching", action="store_true", help="desactiva la caché de prefijos")
    p.add_argument("--state-checkpoint-interval", type=int, default=None,
                   help="modelo híbrido: tokens entre puntos de control del estado, un múltiplo "
                        "de --block-size (por defecto, el tamaño de bloque)")
    p.add_argument("--num-state-checkpoints", type=int, default=None,
                   help="modelo híbrido: puntos de control del estado que se guardan (por "
                        "defecto, uno por intervalo que caben en los bloques de KV)")
    p.add_argument("--max-num-batched-tokens", type=int, default=None,
                   help="presupuesto de tokens por paso (por defecto: sin límite)")
    p.add_argument("--enable-chunked-prefill", action="store_true", help="prefill troceado")
    p.add_argument("--max-waiting", type=int, default=256,
                   help="peticiones en cola como máximo; más allá se responde 503 (por defecto 256)")
    p.add_argument("--scheduling-policy", choices=SCHEDULING_POLICIES, default="fcfs",
                   help="quién entra antes en el lote: fcfs (por llegada), priority (campo "
                        "'priority', menor antes) o vtc (reparto justo entre tenants); por "
                        "defecto fcfs")
    p.add_argument("--api-key", action="append", default=[], metavar="CLAVE=TENANT",
                   help="una clave de API y el tenant al que pertenece (repetible); con alguna, "
                        "las peticiones sin clave válida reciben 401")
    p.add_argument("--tenant-requests-per-s", type=float, default=None,
                   help="límite de peticiones por segundo de cada tenant (por defecto, sin límite)")
    p.add_argument("--tenant-tokens-per-s", type=float, default=None,
                   help="límite de tokens (prompt + max_tokens) por segundo de cada tenant")
    p.add_argument("--tenant-max-concurrent", type=int, default=None,
                   help="peticiones en curso a la vez de cada tenant como máximo")
    p.add_argument("--device", default=None, help="cpu o cuda (por defecto cpu)")
    p.add_argument("--enforce-eager", action="store_true",
                   help="sin grafos CUDA en los pasos de decodificación (en GPU van con ellos)")
    p.add_argument("--batch-invariant", action="store_true",
                   default=os.environ.get("VLLM_BATCH_INVARIANT") == "1",
                   help="núcleos invariantes al lote: la misma respuesta sea cual sea el lote, "
                        "más lento (capítulo 10; también VLLM_BATCH_INVARIANT=1, como en vLLM)")
    p.add_argument("--speculative-config", type=_json_dict, default=None,
                   help="decodificación especulativa como en vLLM, un JSON: p. ej. "
                        "'{\"method\": \"ngram\", \"num_speculative_tokens\": 4, "
                        "\"prompt_lookup_max\": 4}' o '{\"model\": \"tiny-es-draft\"}'")
    p.add_argument("--speculative-model", default=None,
                   help="modelo borrador de la decodificación especulativa (p. ej. tiny-es-draft; "
                        "por defecto, sin ella); mismo tokenizador que --model")
    p.add_argument("--num-speculative-tokens", type=int, default=4,
                   help="tokens borrador por paso con --speculative-model (por defecto 4)")
    p.add_argument("--tensor-parallel-size", type=int, default=1,
                   help="procesos entre los que se reparte el modelo (paralelismo de tensores; "
                        "por defecto 1)")
    p.add_argument("--threads", type=int, default=None,
                   help="hilos de PyTorch en CPU (torch.set_num_threads)")
    p.add_argument("--log-level", default="info",
                   choices=("critical", "error", "warning", "info", "debug"))
    return p


def _json_dict(text: str) -> dict:
    """A flag's JSON object (argparse reports the ``ArgumentTypeError`` in its usage line)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise argparse.ArgumentTypeError(f"no es JSON válido ({err}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"debe ser un objeto JSON {{...}}; se recibió {text!r}")
    return value


def served_name(model: str, explicit: str | None = None) -> str:
    """The name clients ask for: ``--served-model-name``, else a Hub id as given (as vLLM
    serves it), else the folder's or shipped model's name."""
    if explicit:
        return explicit
    if looks_like_hub_id(model) and not Path(model).exists():
        return model
    return Path(model).name


def engine_config(args: argparse.Namespace) -> EngineConfig:
    """The engine's settings that the flags name."""
    spec = args.speculative_config
    if args.speculative_model is not None:
        if spec is not None:
            raise SystemExit("use --speculative-config o --speculative-model, no los dos")
        spec = SpeculativeConfig(args.speculative_model, args.num_speculative_tokens)
    try:
        spec = SpeculativeConfig.of(spec)
    except (TypeError, ValueError) as err:
        raise SystemExit(f"--speculative-config no es válido: {err}") from None
    return EngineConfig(max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len,
                        kv_layout=args.kv_layout, block_size=args.block_size,
                        num_blocks=args.num_blocks, enable_prefix_caching=not args.no_prefix_caching,
                        max_num_batched_tokens=args.max_num_batched_tokens,
                        enable_chunked_prefill=args.enable_chunked_prefill, speculative_config=spec,
                        decode_graphs=None if args.enforce_eager else "auto",
                        batch_invariant=args.batch_invariant,
                        scheduling_policy=args.scheduling_policy,
                        tensor_parallel_size=args.tensor_parallel_size,
                        state_checkpoint_interval=args.state_checkpoint_interval,
                        num_state_checkpoints=args.num_state_checkpoints)


def tenants_config(args: argparse.Namespace) -> Tenants:
    """The tenants the flags describe (``--api-key CLAVE=TENANT``, per-tenant limits)."""
    keys = {}
    for item in args.api_key:
        key, sep, tenant = item.partition("=")
        if not sep or not key or not tenant:
            raise SystemExit(f"--api-key debe tener la forma CLAVE=TENANT; se recibió {item!r}")
        keys[key] = tenant
    try:
        limits = TenantLimits(args.tenant_requests_per_s, args.tenant_tokens_per_s,
                              args.tenant_max_concurrent)
    except ValueError as err:
        raise SystemExit(f"límites de tenant no válidos: {err}") from None
    return Tenants(api_keys=keys, default_limits=limits)


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    tokenizer = args.tokenizer
    if tokenizer is None and args.model not in shipped_names():
        folder = Path(args.model)
        tokenizer = folder if (folder / "tokenizer.json").is_file() else None
    llm = LLM(args.model, tokenizer=tokenizer, device=args.device, config=engine_config(args))
    name = served_name(args.model, args.served_model_name)
    app = create_app(llm.engine, llm.tokenizer, model_name=name, max_waiting=args.max_waiting,
                     tenants=tenants_config(args))
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level,
                    timeout_graceful_shutdown=5)
    finally:
        llm.close()


if __name__ == "__main__":
    main()
