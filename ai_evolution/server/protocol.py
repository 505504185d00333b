"""The OpenAI wire format: request models, sampling-parameter mapping, response shapes, errors.

Requests are validated in two layers. Pydantic checks the JSON types (a strict ``int`` is an
integer, never ``true`` or ``"3"``), and ``validation_error`` turns its first complaint into an
OpenAI-style error with a Spanish message. Then ``to_sampling_params`` maps the OpenAI fields
onto the engine's ``SamplingParams`` and reuses its own checks (``SamplingParams.problems``), so
the server and the offline ``LLM`` reject the same values with the same words.

Supported fields (anything else is ignored, like OpenAI does with unknown fields):

- ``max_tokens`` (chat: also ``max_completion_tokens``), ``temperature`` (default 1, as OpenAI;
  0 is greedy), ``top_p``, ``seed``, ``stream``, ``stream_options.include_usage``;
- extensions, as in vLLM: ``top_k`` (``0`` or ``-1`` mean "off"), ``ignore_eos`` and
  ``stop_token_ids`` (token-level stops);
- ``user`` names the request's tenant (unless API keys do, see ``tenants``) and ``priority``
  (an integer, lower first; vLLM's extension) is accepted when the engine's scheduling policy is
  ``priority`` (any other non-zero value is refused with 400, as vLLM does);
- ``n`` must be 1, and ``stop`` must be empty: this server stops on token ids, not strings
  (``stop_token_ids``); the error says so. Fields the engine cannot honour (``logprobs``,
  ``echo``, ``best_of``, ``suffix``, penalties, ``logit_bias``, ``tools``, a
  non-text ``response_format``) are refused with 400 when set to anything but their default.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Strict

from ..engine.request import RequestRejected, SamplingParams

StrictInt = Annotated[int, Strict()]
StrictFloat = Annotated[float, Strict()]  # strict float still accepts JSON integers
StrictBool = Annotated[bool, Strict()]
StrictStr = Annotated[str, Strict()]


# --- errors ------------------------------------------------------------------------------------
class APIError(Exception):
    """An error answered in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None, counted: bool = False) -> None:
        super().__init__(message)
        self.status, self.message, self.type = status, message, type
        self.param, self.code, self.headers = param, code, headers
        self.counted = counted  # already in the metrics (the handler counts the rest)

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)


MAX_ERROR_CHARS = 1000  # an error body stays small whatever the request carried


def error_body(message: str, type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    if len(message) > MAX_ERROR_CHARS:
        message = message[:MAX_ERROR_CHARS] + "… (mensaje recortado)"
    if param is not None and len(param) > 200:
        param = param[:200] + "…"
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def check_text(text: str, param: str, max_chars: int | None) -> str:
    """A prompt text before it reaches the tokenizer: valid Unicode (no lone UTF-16 surrogate,
    which JSON can carry and UTF-8 cannot) and not so long that it cannot fit the model."""
    if max_chars is not None and len(text) > max_chars:
        raise APIError(400, f"el texto tiene {len(text)} caracteres y no cabe en el contexto del "
                            f"modelo: como mucho {max_chars} (max_model_len por los caracteres del "
                            "token más largo del vocabulario)", param=param)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise APIError(400, f"el texto contiene un sustituto UTF-16 suelto en la posición "
                            f"{err.start}: no es Unicode válido", param=param) from None
    return text


_TYPE_WORDS = {
    "int": "un entero", "float": "un número", "bool": "true o false", "string": "una cadena",
    "list": "una lista", "dict": "un objeto JSON", "model": "un objeto JSON",
}


def _param_path(loc: tuple) -> str | None:
    """``("body", "messages", 0, "role")`` -> ``"messages[0].role"``."""
    out = ""
    for part in loc[1:] if loc and loc[0] == "body" else loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or None


SEND_JSON = "envía un objeto JSON en UTF-8 con Content-Type: application/json"

# The messages of Python's json module (what FastAPI passes on), in Spanish.
_JSON_SYNTAX = {
    "Expecting value": "se esperaba un valor",
    "Expecting property name enclosed in double quotes":
        "se esperaba un nombre de campo entre comillas dobles",
    "Expecting ',' delimiter": "se esperaba una coma",
    "Expecting ':' delimiter": "se esperaban dos puntos",
    "Extra data": "sobra texto después del JSON",
    "Unterminated string starting at": "una cadena sin cerrar",
    "Invalid control character at": "un carácter de control dentro de una cadena",
    "Invalid \\escape": "una secuencia de escape no válida",
    "Invalid \\uXXXX escape": "un escape \\uXXXX no válido",
    "Illegal trailing comma before end of object": "una coma sobrante antes de '}'",
    "Illegal trailing comma before end of array": "una coma sobrante antes de ']'",
}


def _json_syntax_es(message: str) -> str:
    for english, spanish in _JSON_SYNTAX.items():
        if message.startswith(english):
            return spanish
    return "error de sintaxis"


def body_error(cause: BaseException) -> APIError:
    """A body the JSON parser could not even read (FastAPI answers these in English): nested
    deeper than the parser's recursion limit, or bytes that are not UTF-8."""
    if isinstance(cause, RecursionError):
        return APIError(400, "el cuerpo de la petición anida demasiados niveles de listas u "
                             f"objetos para leerlo; {SEND_JSON} sin tanto anidamiento")
    if isinstance(cause, UnicodeDecodeError):
        byte = cause.object[cause.start:cause.start + 1].hex() if cause.object else "?"
        return APIError(400, f"el cuerpo de la petición no es UTF-8 válido (byte 0x{byte} en la "
                             f"posición {cause.start}); {SEND_JSON}")
    return APIError(400, f"no se pudo leer el cuerpo de la petición ({type(cause).__name__}); "
                         f"{SEND_JSON}")


def validation_error(errors: list[dict]) -> APIError:
    """The first of pydantic's (or FastAPI's) validation errors, as a Spanish 400."""
    if not errors:
        return APIError(400, "la petición no es válida")
    err = errors[0]
    kind, loc = err.get("type", ""), tuple(err.get("loc", ()))
    param = _param_path(loc)
    got = err.get("input")
    if kind == "json_invalid":
        detail = _json_syntax_es((err.get("ctx") or {}).get("error", ""))
        where = f" en la posición {loc[1]}" if len(loc) > 1 and isinstance(loc[1], int) else ""
        return APIError(400, f"el cuerpo de la petición no es JSON válido ({detail}{where}); "
                             f"{SEND_JSON}")
    if param is None:
        return APIError(400, "el cuerpo de la petición debe ser un objeto JSON (por ejemplo "
                             '{"model": "...", "prompt": "..."}); se recibió '
                             f"{type(got).__name__}")
    if kind == "missing":
        return APIError(400, f"falta el campo obligatorio '{param}'", param=param)
    if kind == "literal_error":
        expected = str((err.get("ctx") or {}).get("expected", "")).replace(" or ", " o ")
        return APIError(400, f"'{param}' debe ser uno de: {expected}; se recibió {got!r}",
                        param=param)
    base = kind.split("_")[0]
    if base in _TYPE_WORDS and (kind.endswith("_type") or kind.endswith("_parsing")
                                or kind.startswith("int_from")):
        return APIError(400, f"'{param}' debe ser {_TYPE_WORDS[base]}; se recibió {got!r}",
                        param=param)
    return APIError(400, f"'{param}' no es válido: {err.get('msg', kind)}; se recibió {got!r}",
                    param=param)


# --- request models ----------------------------------------------------------------------------
class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: StrictBool = False


class _GenerationRequest(BaseModel):
    """Fields shared by ``/v1/completions`` and ``/v1/chat/completions``."""

    model_config = ConfigDict(extra="allow")

    model: StrictStr
    max_tokens: StrictInt | None = None
    temperature: StrictFloat | None = None
    top_p: StrictFloat | None = None
    top_k: StrictInt | None = None          # extension (vLLM)
    seed: StrictInt | None = None
    stop: Any = None                        # strings: refused (see module docstring)
    stop_token_ids: list[StrictInt] | None = None  # extension (vLLM)
    ignore_eos: StrictBool = False          # extension (vLLM)
    n: StrictInt = 1
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    # Accepted only at their defaults: the engine cannot honour anything else.
    logprobs: Any = None
    presence_penalty: Any = None
    frequency_penalty: Any = None
    logit_bias: Any = None
    user: Any = None                        # names the tenant (see server.tenants)
    priority: StrictInt = 0                 # extension (vLLM): lower is served first


class CompletionRequest(_GenerationRequest):
    prompt: Any  # a string or a list of token ids (checked by completion_prompt)
    echo: Any = None
    best_of: Any = None
    suffix: Any = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant"]
    content: Any = None  # a string or a list of {"type": "text", "text": ...} parts


class ChatCompletionRequest(_GenerationRequest):
    messages: list[ChatMessage]
    max_completion_tokens: StrictInt | None = None
    tools: Any = None
    response_format: Any = None


# --- mapping onto the engine -------------------------------------------------------------------
_AT_DEFAULT = {  # field -> values that mean "not used"
    "logprobs": (None, False, 0), "echo": (None, False), "best_of": (None, 1),
    "suffix": (None, ""), "presence_penalty": (None, 0), "frequency_penalty": (None, 0),
    "logit_bias": (None, {}), "tools": (None, []),
}


def _is_default(value, defaults: tuple) -> bool:
    """``value`` is one of ``defaults``, comparing numbers as numbers (``0.0`` is ``0``) but never
    a boolean as a number (``true`` is not ``1``)."""
    if value is None:
        return True
    for d in defaults:
        if d is None:
            continue
        if isinstance(value, bool) or isinstance(d, bool):
            if isinstance(value, bool) and isinstance(d, bool) and value == d:
                return True
        elif isinstance(value, (int, float)) and isinstance(d, (int, float)):
            if value == d:
                return True
        elif type(value) is type(d) and value == d:
            return True
    return False


def check_unsupported(req: _GenerationRequest) -> None:
    """Refuse what this server cannot do, saying what it can."""
    if req.n != 1:
        raise APIError(400, f"n debe ser 1: este servidor genera una sola respuesta por petición; "
                            f"se recibió n={req.n} (envía varias peticiones)", param="n")
    if req.stop not in (None, [], ""):
        raise APIError(400, "stop con cadenas no está soportado: este servidor para en ids de "
                            "token; usa stop_token_ids (lista de enteros, extensión de vLLM) o "
                            "deja stop vacío", param="stop")
    for name, defaults in _AT_DEFAULT.items():
        value = getattr(req, name, None)
        if not _is_default(value, defaults):
            accepted = ", ".join(json.dumps(d) for d in defaults)
            raise APIError(400, f"'{name}' no está soportado por este servidor; valores "
                                f"aceptados: {accepted}; se recibió {value!r}", param=name)
    fmt = getattr(req, "response_format", None)
    if fmt is not None and fmt != {"type": "text"}:
        raise APIError(400, "response_format no está soportado; valores aceptados: null o "
                            f'{{"type": "text"}}; se recibió {fmt!r}', param="response_format")


_SAMPLING_FIELDS = ("max_tokens", "temperature", "top_k", "top_p", "seed", "stop_token_ids")


def to_sampling_params(req: _GenerationRequest, prompt_len: int, max_model_len: int,
                       vocab_size: int, default_max_tokens: int | None) -> SamplingParams:
    """The engine's ``SamplingParams`` for an OpenAI request, or ``APIError(400)``.

    ``default_max_tokens=None`` means "as many as fit": ``max_model_len - prompt_len`` (the chat
    default). A request whose prompt plus ``max_tokens`` exceeds ``max_model_len`` is refused,
    as OpenAI and vLLM do, rather than silently cut. ``stop_token_ids`` is capped at the
    vocabulary size (its length checked before any scan) and deduplicated once, by
    ``SamplingParams``, into the set the engine consults for every token.
    """
    check_unsupported(req)
    max_tokens = req.max_tokens
    if isinstance(req, ChatCompletionRequest) and req.max_completion_tokens is not None:
        max_tokens = req.max_completion_tokens
    if max_tokens is None:
        max_tokens = default_max_tokens if default_max_tokens is not None else \
            max(1, max_model_len - prompt_len)
    top_p = None if req.top_p is None or req.top_p == 1.0 else req.top_p
    top_k = None if req.top_k in (None, 0, -1) else req.top_k
    temperature = 1.0 if req.temperature is None else req.temperature
    stops = req.stop_token_ids or ()
    if len(stops) > vocab_size:  # checked before any scan of the list
        raise APIError(400, f"stop_token_ids tiene {len(stops)} elementos y admite como mucho "
                            f"{vocab_size} (el tamaño del vocabulario: más serían repetidos)",
                       param="stop_token_ids")
    try:
        params = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_k=top_k,
                                top_p=top_p, seed=req.seed, stop_token_ids=stops,
                                ignore_eos=req.ignore_eos)
        problems = params.problems(vocab_size)
        if problems:
            raise RequestRejected("; ".join(problems))
    except RequestRejected as err:
        message = str(err)
        first = message.split(" ", 1)[0]
        raise APIError(400, message, param=first if first in _SAMPLING_FIELDS else None) from None
    if prompt_len + max_tokens > max_model_len:
        raise APIError(400, f"el contexto máximo del modelo es de {max_model_len} tokens y esta "
                            f"petición pide {prompt_len + max_tokens} ({prompt_len} de prompt + "
                            f"{max_tokens} de max_tokens); reduce el prompt o max_tokens",
                       param="max_tokens")
    return params


def completion_prompt(prompt: Any, tokenizer) -> list[int] | str:
    """A completions ``prompt``: a string (returned as is, to be encoded) or a list of token ids;
    a batch of one is unwrapped; anything else is ``APIError(400)``."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        if tokenizer is None:
            raise APIError(400, "este servidor no tiene tokenizador: envía el prompt como lista "
                                "de ids de token", param="prompt")
        return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        raise APIError(400, f"este servidor atiende un solo prompt por petición y se recibieron "
                            f"{len(prompt)}; envía una petición por prompt", param="prompt")
    if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool)
                                        for t in prompt):
        return list(prompt)
    raise APIError(400, "prompt debe ser una cadena o una lista de ids de token (enteros); se "
                        f"recibió {type(prompt).__name__}", param="prompt")


def chat_messages(messages: list[ChatMessage]) -> list[tuple[str, str]]:
    """``(role, text)`` pairs: content is a string, or a list of ``{"type": "text"}`` parts."""
    if not messages:
        raise APIError(400, "messages está vacía: hace falta al menos un mensaje",
                       param="messages")
    out = []
    for i, m in enumerate(messages):
        content = m.content
        if content is None:
            content = ""
        elif isinstance(content, list):
            texts = []
            for j, part in enumerate(content):
                if not isinstance(part, dict) or part.get("type") != "text" \
                        or not isinstance(part.get("text"), str):
                    raise APIError(400, "solo se admiten partes de contenido de tipo 'text' "
                                        '({"type": "text", "text": "..."})',
                                   param=f"messages[{i}].content[{j}]")
                texts.append(part["text"])
            content = "".join(texts)
        elif not isinstance(content, str):
            raise APIError(400, "content debe ser una cadena o una lista de partes de tipo "
                                f"'text'; se recibió {type(content).__name__}",
                           param=f"messages[{i}].content")
        out.append((m.role, content))
    return out


# --- responses ---------------------------------------------------------------------------------
def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def now_s() -> int:
    return int(time.time())


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def completion_response(rid: str, created: int, model: str, text: str, finish_reason: str | None,
                        prompt_tokens: int, completion_tokens: int) -> dict:
    return {"id": rid, "object": "text_completion", "created": created, "model": model,
            "choices": [{"index": 0, "text": text, "logprobs": None,
                         "finish_reason": finish_reason}],
            "usage": usage(prompt_tokens, completion_tokens)}


def chat_response(rid: str, created: int, model: str, text: str, finish_reason: str | None,
                  prompt_tokens: int, completion_tokens: int) -> dict:
    return {"id": rid, "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "logprobs": None, "finish_reason": finish_reason}],
            "usage": usage(prompt_tokens, completion_tokens)}


def completion_chunk(rid: str, created: int, model: str, text: str, finish_reason: str | None,
                     with_usage_field: bool) -> dict:
    chunk = {"id": rid, "object": "text_completion", "created": created, "model": model,
             "choices": [{"index": 0, "text": text, "logprobs": None,
                          "finish_reason": finish_reason}]}
    if with_usage_field:
        chunk["usage"] = None
    return chunk


def chat_chunk(rid: str, created: int, model: str, delta: dict, finish_reason: str | None,
               with_usage_field: bool) -> dict:
    chunk = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
             "choices": [{"index": 0, "delta": delta, "logprobs": None,
                          "finish_reason": finish_reason}]}
    if with_usage_field:
        chunk["usage"] = None
    return chunk


def usage_chunk(rid: str, created: int, model: str, object_: str, prompt_tokens: int,
                completion_tokens: int) -> dict:
    """The last chunk of a stream with ``stream_options.include_usage``: no choices, usage."""
    return {"id": rid, "object": object_, "created": created, "model": model, "choices": [],
            "usage": usage(prompt_tokens, completion_tokens)}
