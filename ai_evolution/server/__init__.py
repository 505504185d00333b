"""An OpenAI-compatible HTTP server around the engine (chapter 6: observability and load tests).

``python -m ai_evolution.server --model tiny-es --port 8000`` serves ``/v1/completions`` and
``/v1/chat/completions`` (with streaming), ``/v1/models``, ``/health`` and ``/metrics``
(Prometheus). ``serve_in_thread`` runs the same server inside a notebook or a test.

Modules: ``protocol`` (the OpenAI wire format and its checks), ``chat_template`` (how chat
messages become a prompt), ``detokenize`` (streamed text), ``engine_loop`` (the one thread that
owns the engine), ``metrics`` (Prometheus), ``app`` (FastAPI routes), ``launch`` (run it).
"""

from .app import create_app
from .chat_template import apply_chat_template, render_chat
from .engine_loop import EngineLoop, EngineStopped, QueueFull
from .launch import ServerHandle, serve_in_thread
from .metrics import ServerMetrics

__all__ = ["create_app", "apply_chat_template", "render_chat", "EngineLoop", "EngineStopped",
           "QueueFull", "ServerHandle", "serve_in_thread", "ServerMetrics"]
