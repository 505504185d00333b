"""Chat messages to prompt ids: the tokenizer's own chat template when it has one (a Hub
checkpoint such as Qwen2.5-Instruct ships a Jinja template in ``tokenizer_config.json``; it is
rendered as ``transformers`` renders it, with the assistant's cue at the end), otherwise the
convention of the shipped models, which have no official one.

``tiny-es`` is a plain language model trained on the course's Spanish text: it was never tuned
on conversations, so any template is a convention. This one is the simplest that a reader can
check by eye: one line per message, ``Rol: texto``, then the cue for the assistant's turn::

    <s>Sistema: Eres un tutor breve.
    Usuario: ¿Qué es la caché KV?
    Asistente:

(``<s>`` is the BOS token, added as an id, not as text.) Roles map to ``Sistema`` (``system``
and ``developer``), ``Usuario`` (``user``) and ``Asistente`` (``assistant``). The model then
continues the text after ``Asistente:``; generation ends at its EOS token (``</s>``) or at
``max_tokens``: the server has no string stops, so it does not cut at a following
``Usuario:`` line (pass that line's token ids in ``stop_token_ids`` if you need to).
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Sequence

ROLE_LABELS = {"system": "Sistema", "developer": "Sistema", "user": "Usuario",
               "assistant": "Asistente"}
ASSISTANT_CUE = "Asistente:"


def render_chat(messages: Sequence[tuple[str, str]]) -> str:
    """The prompt text of ``(role, content)`` messages (without the BOS token)."""
    lines = [f"{ROLE_LABELS[role]}: {content}" for role, content in messages]
    return "\n".join(lines + [ASSISTANT_CUE])


# The roles a Hub template knows: OpenAI's newer "developer" is the system prompt.
TEMPLATE_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


class ChatTemplateError(ValueError):
    """The tokenizer's chat template cannot be rendered (message in Spanish)."""


@lru_cache(maxsize=8)
def _compiled(template: str):
    try:
        from jinja2 import TemplateError
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise ChatTemplateError("la plantilla de chat del tokenizador necesita el paquete jinja2 "
                                "(pip install jinja2)") from None

    def raise_exception(message):
        raise TemplateError(message)

    # As transformers renders chat templates: a sandbox, trimmed blocks, loop controls, tojson.
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = lambda x, indent=None, ensure_ascii=False: json.dumps(
        x, indent=indent, ensure_ascii=ensure_ascii)
    env.globals["raise_exception"] = raise_exception
    try:
        return env.from_string(template)
    except TemplateError as e:
        raise ChatTemplateError(f"la plantilla de chat del tokenizador no es Jinja válido: {e}") from None


def render_template(template: str, messages: Sequence[tuple[str, str]], bos_token: str | None = None,
                    eos_token: str | None = None) -> str:
    """The prompt text of ``(role, content)`` messages through a Hugging Face chat template,
    ending with the cue of the assistant's turn (``add_generation_prompt``)."""
    from jinja2 import TemplateError

    chat = [{"role": TEMPLATE_ROLES[role], "content": content} for role, content in messages]
    try:
        return _compiled(template).render(messages=chat, add_generation_prompt=True,
                                          bos_token=bos_token or "", eos_token=eos_token or "")
    except TemplateError as e:
        raise ChatTemplateError(f"la plantilla de chat del tokenizador falló con estos mensajes: {e}") from None


def apply_chat_template(tokenizer, messages: Sequence[tuple[str, str]]) -> list[int]:
    """Token ids of the rendered chat: through the tokenizer's chat template if it has one (the
    template writes any BOS itself), otherwise ``render_chat`` with the BOS id first."""
    template = getattr(tokenizer, "chat_template", None)
    if template:
        text = render_template(template, messages, getattr(tokenizer, "bos_token", None),
                               getattr(tokenizer, "eos_token", None))
        return tokenizer.encode(text)
    return tokenizer.encode(render_chat(messages), add_bos=True)
