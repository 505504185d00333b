"""Plain data between the trusted checker and the untrusted function worker (no pickle).

A value crosses as JSON built only from: ``None``, ``bool``, ``int``, ``float``, ``str``, lists,
and tagged records for the rest:

``{"$tuple": [...]}``, ``{"$dict": [[k, v], ...]}`` (also ``$odict``, ``$set``,
``$frozenset``), ``{"$bytes": b64}``, numpy scalars ``{"$np": dtype, "b": b64}``, arrays
``{"$array": dtype, "shape", "b": b64}`` and tensors ``{"$tensor": dtype, "shape", "b": b64}``
(raw bytes, rebuilt on the receiving side), ``{"$torch_dtype": name}``, ``{"$np_dtype": str}``,
members of allow-listed enums ``{"$enum": "mod:Class", "name"}`` and instances of allow-listed
library value types ``{"$obj": "mod:Class", "id": k, "f": {field: value}}`` (rebuilt without
running ``__init__``; an object seen twice in one message is ``{"$ref": k}``).

Only the exact types above cross: a subclass of ``int`` or ``dict``, an object of a type the
student wrote, a function, a module... raise :class:`CodecError` with a Spanish message, on
either side. Every message is bounded in size (:data:`MAX_MESSAGE_BYTES`) and depth.

Identity (``Encoder.ids``): objects, arrays and tensors sent to the worker carry an id; the
worker answers a call with the result and, for each of them that the call changed in place (a
KV cache written by an attention step, a block's reference count), its new value, which the
trusted side copies into the original (:func:`apply_updates`). A result that *is* one of the
objects it received (a scheduling policy choosing a request) comes back as ``{"$ref": k}`` and
the trusted side maps it to its own object.
"""

from __future__ import annotations

import base64
import enum
import importlib
import json
from collections import OrderedDict
from typing import Any

MAX_MESSAGE_BYTES = 64 * 2**20
MAX_DEPTH = 40

# Library value types that may cross (in both directions), by "module:qualname". Exact types
# only: a student's subclass of one of them is refused.
ALLOWED_TYPES = frozenset({
    "ai_evolution.model.config:ModelConfig",
    "ai_evolution.engine.request:SamplingParams",
    "ai_evolution.engine.request:Request",
    "ai_evolution.engine.request:RequestOutput",
    "ai_evolution.engine.scheduler:BatchPlan",
    "ai_evolution.engine.step:ScheduledRequest",
    "ai_evolution.engine.block_pool:KVBlock",
    "ai_evolution.engine.block_pool:BlockPool",
    "ai_evolution.metrics:RequestMetrics",
})
ALLOWED_ENUMS = frozenset({
    "ai_evolution.engine.request:RequestStatus",
    "ai_evolution.engine.request:FinishReason",
})
_SCALARS = (type(None), bool, int, float, str)
_SCALAR_TYPES = frozenset(_SCALARS)


def _flat(items: list) -> bool:
    """Every item is a plain scalar (exact type): the list crosses as it is. Most data does (a
    sample, a list of token ids), and a callback to a reference can carry one thousands of times
    in a check, so this is tested in C, not item by item."""
    return set(map(type, items)) <= _SCALAR_TYPES


class CodecError(ValueError):
    """A value that may not cross between the checker and the worker (Spanish message)."""


def type_name(obj: Any) -> str:
    t = type(obj)
    return f"{t.__module__}:{t.__qualname__}"


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: Any) -> bytes:
    if not isinstance(text, str):
        raise CodecError("bytes mal codificados")
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (ValueError, UnicodeEncodeError) as err:
        raise CodecError(f"bytes mal codificados ({err})") from None


def _resolve(name: str, allowed: frozenset) -> type:
    if not isinstance(name, str) or name not in allowed:
        raise CodecError(f"el tipo {str(name)[:80]!r} no puede cruzar entre el corrector y su "
                         "código (solo números, textos, listas, diccionarios, arrays, tensores "
                         "y algunos tipos de la biblioteca)")
    module, _, qual = name.partition(":")
    obj: Any = importlib.import_module(module)
    for part in qual.split("."):
        obj = getattr(obj, part)
    return obj


class Encoder:
    """Encodes values for one message. ``ids`` maps ``id(obj)`` to the message id of an object
    already known to both sides (encoded as ``{"$ref": k}``); new objects get fresh ids from
    ``next_id``."""

    def __init__(self, ids: dict[int, int] | None = None, next_id: int = 1):
        self.ids = dict(ids or {})
        self.next_id = next_id
        self.keep: list = []  # keeps encoded objects alive, so their id() stays unique

    def _new_id(self, obj: Any) -> int:
        k = self.next_id
        self.next_id += 1
        self.ids[id(obj)] = k
        self.keep.append(obj)
        return k

    def encode(self, obj: Any, depth: int = 0) -> Any:
        if depth > MAX_DEPTH:
            raise CodecError(f"el valor está anidado más de {MAX_DEPTH} niveles")
        t = type(obj)
        if t in _SCALARS:
            return obj
        if id(obj) in self.ids:
            return {"$ref": self.ids[id(obj)]}
        if t is list:
            if depth < MAX_DEPTH and _flat(obj):
                return list(obj)
            return [self.encode(x, depth + 1) for x in obj]
        if t is tuple:
            return {"$tuple": [self.encode(x, depth + 1) for x in obj]}
        if t in (dict, OrderedDict):
            tag = "$dict" if t is dict else "$odict"
            return {tag: [[self.encode(k, depth + 1), self.encode(v, depth + 1)]
                          for k, v in obj.items()]}
        if t in (set, frozenset):
            return {"$" + t.__name__: [self.encode(x, depth + 1) for x in obj]}
        if t is bytes:
            return {"$bytes": _b64(obj)}
        mod = t.__module__
        if mod == "numpy" or mod.startswith("numpy."):
            import numpy as np

            if t is np.ndarray:
                if obj.dtype.hasobject:
                    raise CodecError("un array de objetos de Python no puede cruzar")
                data = np.ascontiguousarray(obj)
                return {"$array": data.dtype.str, "shape": list(data.shape),
                        "b": _b64(data.tobytes()), "id": self._new_id(obj)}
            if isinstance(obj, np.generic) and not obj.dtype.hasobject:
                return {"$np": obj.dtype.str, "b": _b64(obj.tobytes())}
            if isinstance(obj, np.dtype):
                return {"$np_dtype": obj.str}
        if mod.startswith("torch"):
            import torch

            if t in (torch.Tensor, torch.nn.Parameter):
                data = obj.detach().to("cpu").contiguous()
                raw = data.reshape(-1).view(torch.uint8).numpy().tobytes() if data.numel() else b""
                return {"$tensor": str(data.dtype).removeprefix("torch."),
                        "shape": list(data.shape), "b": _b64(raw), "id": self._new_id(obj)}
            if t is torch.dtype:
                return {"$torch_dtype": str(obj).removeprefix("torch.")}
        name = type_name(obj)
        if isinstance(obj, enum.Enum) and name in ALLOWED_ENUMS:
            return {"$enum": name, "name": obj.name}
        if name in ALLOWED_TYPES:
            k = self._new_id(obj)
            return {"$obj": name, "id": k, "f": self.fields(obj, depth)}
        raise CodecError(f"un valor de tipo {t.__qualname__} no puede cruzar entre el corrector "
                         "y su código (solo números, textos, listas, tuplas, diccionarios, "
                         "arrays, tensores y algunos tipos de la biblioteca)")

    def fields(self, obj: Any, depth: int = 0) -> dict:
        try:
            items = vars(obj).items()
        except TypeError:
            raise CodecError(f"{type(obj).__qualname__} no tiene campos que enviar") from None
        return {str(k): self.encode(v, depth + 1) for k, v in items}


class Decoder:
    """Decodes one message. ``known`` maps message ids to objects this side already holds (the
    worker's answer refers to them with ``{"$ref": k}``)."""

    def __init__(self, known: dict[int, Any] | None = None):
        self.known = dict(known or {})

    def decode(self, data: Any, depth: int = 0) -> Any:
        if depth > MAX_DEPTH:
            raise CodecError(f"el valor está anidado más de {MAX_DEPTH} niveles")
        t = type(data)
        if t in _SCALARS:
            return data
        if t is list:
            if depth < MAX_DEPTH and _flat(data):
                return list(data)
            return [self.decode(x, depth + 1) for x in data]
        if t is not dict or len(data) == 0:
            raise CodecError(f"valor mal codificado ({t.__name__})")
        tag = next(iter(data))
        body = data[tag]
        if tag == "$ref":
            if body not in self.known:
                raise CodecError("referencia a un objeto desconocido")
            return self.known[body]
        if tag == "$tuple":
            return tuple(self.decode(x, depth + 1) for x in self._list(body))
        if tag in ("$dict", "$odict"):
            out = {} if tag == "$dict" else OrderedDict()
            for pair in self._list(body):
                if type(pair) is not list or len(pair) != 2:
                    raise CodecError("diccionario mal codificado")
                key = self.decode(pair[0], depth + 1)
                try:
                    out[key] = self.decode(pair[1], depth + 1)
                except TypeError:
                    raise CodecError(f"clave de diccionario no válida ({type(key).__name__})") \
                        from None
            return out
        if tag in ("$set", "$frozenset"):
            try:
                items = [self.decode(x, depth + 1) for x in self._list(body)]
                return set(items) if tag == "$set" else frozenset(items)
            except TypeError:
                raise CodecError("conjunto con elementos no válidos") from None
        if tag == "$bytes":
            return _unb64(body)
        if tag == "$np":
            import numpy as np

            dtype = self._np_dtype(body)
            raw = _unb64(data.get("b"))
            if len(raw) != dtype.itemsize:
                raise CodecError("escalar de numpy mal codificado")
            return np.frombuffer(raw, dtype=dtype)[0]
        if tag == "$np_dtype":
            return self._np_dtype(body)
        if tag == "$array":
            import numpy as np

            dtype, shape = self._np_dtype(body), self._shape(data.get("shape"))
            raw = _unb64(data.get("b"))
            if len(raw) != dtype.itemsize * _prod(shape):
                raise CodecError("array mal codificado: los bytes no cuadran con la forma")
            out = np.frombuffer(raw, dtype=dtype).reshape(shape).copy()
            return self._remember(data, out)
        if tag == "$tensor":
            import torch

            dtype, shape = self._torch_dtype(body), self._shape(data.get("shape"))
            raw = _unb64(data.get("b"))
            size = torch.empty((), dtype=dtype).element_size()
            if len(raw) != size * _prod(shape):
                raise CodecError("tensor mal codificado: los bytes no cuadran con la forma")
            if not raw:
                out = torch.empty(shape, dtype=dtype)
            else:
                out = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype) \
                    .reshape(shape).clone()
            return self._remember(data, out)
        if tag == "$torch_dtype":
            return self._torch_dtype(body)
        if tag == "$enum":
            cls = _resolve(body, ALLOWED_ENUMS)
            try:
                return cls[data.get("name")]
            except (KeyError, TypeError):
                raise CodecError(f"{body} no tiene el miembro {data.get('name')!r}") from None
        if tag == "$obj":
            cls = _resolve(body, ALLOWED_TYPES)
            obj = cls.__new__(cls)
            self._remember(data, obj)
            obj.__dict__.update(self.fields(data.get("f")))
            return obj
        raise CodecError(f"etiqueta desconocida {str(tag)[:40]!r}")

    def fields(self, data: Any) -> dict:
        if type(data) is not dict:
            raise CodecError("campos mal codificados")
        out = {}
        for key, value in data.items():
            if not (isinstance(key, str) and key.isidentifier()) or key.startswith("__"):
                raise CodecError("nombre de campo no válido")
            out[key] = self.decode(value, 1)
        return out

    def _remember(self, data: dict, obj: Any) -> Any:
        k = data.get("id")
        if k is not None:
            if type(k) is not int or k in self.known:
                raise CodecError("identificador de objeto repetido o no válido")
            self.known[k] = obj
        return obj

    @staticmethod
    def _list(body: Any) -> list:
        if type(body) is not list:
            raise CodecError("lista mal codificada")
        return body

    @staticmethod
    def _shape(shape: Any) -> tuple[int, ...]:
        if type(shape) is not list or not all(type(n) is int and n >= 0 for n in shape):
            raise CodecError("forma de array o tensor no válida")
        return tuple(shape)

    @staticmethod
    def _np_dtype(name: Any):
        import numpy as np

        try:
            dtype = np.dtype(str(name))
        except TypeError:
            raise CodecError(f"dtype de numpy desconocido {str(name)[:20]!r}") from None
        if dtype.hasobject or dtype.fields is not None:
            raise CodecError("dtype de numpy no permitido")
        return dtype

    @staticmethod
    def _torch_dtype(name: Any):
        import torch

        dtype = getattr(torch, str(name), None) if str(name).isidentifier() else None
        if not isinstance(dtype, torch.dtype):
            raise CodecError(f"dtype de torch desconocido {str(name)[:20]!r}")
        return dtype


def _prod(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def dumps(message: dict) -> bytes:
    """One message as a line of JSON; CodecError past :data:`MAX_MESSAGE_BYTES`."""
    data = json.dumps(message, ensure_ascii=True, allow_nan=True, separators=(",", ":"))
    if len(data) > MAX_MESSAGE_BYTES:
        raise CodecError(f"el mensaje ocupa más de {MAX_MESSAGE_BYTES // 2**20} MiB")
    return data.encode("ascii") + b"\n"


def loads(line: bytes) -> dict:
    if len(line) > MAX_MESSAGE_BYTES + 1:
        raise CodecError(f"el mensaje ocupa más de {MAX_MESSAGE_BYTES // 2**20} MiB")
    try:
        message = json.loads(line)
    except (ValueError, RecursionError) as err:
        raise CodecError(f"mensaje que no es JSON ({str(err)[:80]})") from None
    if type(message) is not dict:
        raise CodecError("mensaje mal formado")
    return message


def apply_updates(updates: Any, decoder: Decoder) -> None:
    """Copy, into the trusted side's own objects, what the worker's call changed in place:
    ``updates`` is ``[[k, value], ...]`` for ids the trusted side sent (``decoder.known``)."""
    import numpy as np
    import torch

    if type(updates) is not list:
        raise CodecError("actualizaciones mal codificadas")
    for item in updates:
        if type(item) is not list or len(item) != 2 or item[0] not in decoder.known:
            raise CodecError("actualización de un objeto desconocido")
        k, value = item
        target = decoder.known[k]
        if isinstance(target, torch.Tensor):
            new = Decoder().decode(value)
            if type(new) is not torch.Tensor or new.shape != target.shape or \
                    new.dtype != target.dtype:
                raise CodecError("su código cambió la forma o el tipo de un tensor que recibió")
            with torch.no_grad():
                target.copy_(new)
        elif isinstance(target, np.ndarray):
            new = Decoder().decode(value)
            if type(new) is not np.ndarray or new.shape != target.shape or \
                    new.dtype != target.dtype:
                raise CodecError("su código cambió la forma o el tipo de un array que recibió")
            np.copyto(target, new)
        else:
            if type(value) is not dict or type_name(target) != value.get("$obj"):
                raise CodecError("actualización mal formada")
            fields = decoder.fields(value.get("f"))
            target.__dict__.update(fields)
