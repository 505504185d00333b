"""The chat template of the shipped models (they have no official one).

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

from typing import Sequence

ROLE_LABELS = {"system": "Sistema", "developer": "Sistema", "user": "Usuario",
               "assistant": "Asistente"}
ASSISTANT_CUE = "Asistente:"


def render_chat(messages: Sequence[tuple[str, str]]) -> str:
    """The prompt text of ``(role, content)`` messages (without the BOS token)."""
    lines = [f"{ROLE_LABELS[role]}: {content}" for role, content in messages]
    return "\n".join(lines + [ASSISTANT_CUE])


def apply_chat_template(tokenizer, messages: Sequence[tuple[str, str]]) -> list[int]:
    """Token ids of the rendered chat, BOS first."""
    return tokenizer.encode(render_chat(messages), add_bos=True)
