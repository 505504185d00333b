"""Delegation forensics: does a student's graded object, rebuilt from the submission, use the
library's reference instead of its own code?

A static walk, no execution: from the object (a function, a class, a ``functools.partial``...)
through the globals, closures and defaults its code names, up to modules and library classes a
few levels deep, looking for the reference of its criterion and the equivalents ``rubric.json``
lists as ``delegates`` (:func:`forbidden_for`), or for the grader's own modules. It runs in the
function worker, on the stripped library (:mod:`.stripped`): a flag for a human, not the defence
(the references are not in that library).
"""

from __future__ import annotations

import functools
import inspect
import types
from typing import Any

from .rebuild import CELL_FILENAME, DENIED_LIBRARY

_SUBMISSION_PREFIX = CELL_FILENAME.split("{")[0]  # "<celda "


def _from_submission(obj: Any) -> bool:
    code = getattr(obj, "__code__", None)
    return code is not None and code.co_filename.startswith(_SUBMISSION_PREFIX)


def _library(obj: Any) -> bool:
    module = getattr(obj, "__module__", None)
    if isinstance(obj, types.ModuleType):
        module = obj.__name__
    return isinstance(module, str) and (module == "ai_evolution" or
                                        module.startswith("ai_evolution."))


def _grader(obj: Any) -> bool:
    module = obj.__name__ if isinstance(obj, types.ModuleType) else getattr(obj, "__module__", None)
    return isinstance(module, str) and any(module == d or module.startswith(d + ".")
                                           for d in DENIED_LIBRARY)


def _unwrap(obj: Any) -> Any:
    for _ in range(10):
        if isinstance(obj, functools.partial):
            obj = obj.func
        elif isinstance(obj, (staticmethod, classmethod)):
            obj = obj.__func__
        elif inspect.ismethod(obj):
            obj = obj.__func__
        elif hasattr(obj, "__wrapped__") and not isinstance(obj, type):
            obj = obj.__wrapped__
        else:
            break
    return obj


def _codes(code: types.CodeType):
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)


def _bound(obj: Any) -> list:
    """The values a wrapper carries besides its function (``functools.partial`` arguments)."""
    out = []
    for _ in range(10):
        if isinstance(obj, functools.partial):
            out += list(obj.args) + list(obj.keywords.values())
            obj = obj.func
        else:
            break
    return out


class _Walk:
    """Everything a student's function or class can reach by name, statically."""

    def __init__(self, forbidden: dict[int, str], methods: tuple[str, ...] = ()):
        self.forbidden = forbidden
        self.methods = methods
        self.seen: set[int] = set()

    def object(self, obj: Any, names: set[str], depth: int = 0) -> str | None:
        for value in _bound(obj):
            if (why := self.object(value, names, depth)):
                return why
        obj = _unwrap(obj)
        if id(obj) in self.forbidden:
            return f"usa `{self.forbidden[id(obj)]}`, la implementación de referencia"
        if _grader(obj):
            name = obj.__name__ if isinstance(obj, types.ModuleType) else \
                getattr(obj, "__qualname__", "?")
            return f"usa `{name}`, que es parte del corrector"
        if id(obj) in self.seen:
            return None
        self.seen.add(id(obj))
        if _from_submission(obj):
            return self.function(obj)
        if isinstance(obj, type) and not _library(obj):
            return self.klass(obj)
        if depth < 3 and (isinstance(obj, types.ModuleType) or
                          (isinstance(obj, type) and _library(obj))):
            for attr in names:
                try:
                    value = inspect.getattr_static(obj, attr)
                except AttributeError:
                    continue
                except Exception:  # noqa: BLE001
                    continue
                if (why := self.object(value, names, depth + 1)):
                    return why
        return None

    def function(self, fn: Any, method: str | None = None) -> str | None:
        names: set[str] = set()
        for code in _codes(fn.__code__):
            names.update(code.co_names)
        if method and "super" in names and method in names:
            return f"su `{method}` llama al `{method}` de la clase de la biblioteca (super())"
        globals_ = getattr(fn, "__globals__", {})
        for name in sorted(names):
            if name in globals_ and (why := self.object(globals_[name], names)):
                return why
        for cell in getattr(fn, "__closure__", None) or ():
            try:
                value = cell.cell_contents
            except ValueError:
                continue
            if (why := self.object(value, names)):
                return why
        for value in list(getattr(fn, "__defaults__", None) or ()) + \
                list((getattr(fn, "__kwdefaults__", None) or {}).values()):
            if (why := self.object(value, names)):
                return why
        return None

    def klass(self, cls: type) -> str | None:
        for base in cls.__mro__[1:]:
            if _grader(base):
                return f"hereda de `{base.__qualname__}`, que es parte del corrector"
        for name, value in vars(cls).items():
            target = _unwrap(value)
            if isinstance(value, property):
                target = value.fget
            if _from_submission(target):
                why = self.function(target, name if name in self.methods else None)
                if why:
                    return why
            elif id(target) in self.forbidden:
                return f"`{name}` es `{self.forbidden[id(target)]}`, la implementación de referencia"
        return None


def delegation(obj: Any, forbidden: dict[int, str], methods: tuple[str, ...] = ()) -> str | None:
    """Why ``obj`` (a graded name's value) delegates to the library's reference, or None.

    ``forbidden`` maps ``id()`` of the reference (and equivalent library objects) to its name;
    ``methods``, for a class exercise, are the methods the student must write (a subclass of
    the library's class may inherit everything else)."""
    target = _unwrap(obj)
    if id(target) in forbidden:
        return f"es `{forbidden[id(target)]}`, la implementación de referencia de la biblioteca"
    for value in _bound(obj):
        if (why := _Walk(forbidden, methods).object(value, set())):
            return why
    code = getattr(target, "__code__", None)
    if code is not None and any(getattr(f, "__code__", None) is code for f in _objects(forbidden)):
        return "reutiliza el código de la implementación de referencia"
    if _library(target) and not (isinstance(target, type) and methods):
        return f"es `{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', '?')}`, " \
               "un objeto de la biblioteca, no código del cuaderno"
    walk = _Walk(forbidden, methods)
    if isinstance(target, type):
        if _library(target):
            return f"es la clase `{target.__qualname__}` de la biblioteca, no código del cuaderno"
        for method in methods:
            owner = next((k for k in target.__mro__ if method in vars(k)), None)
            if owner is None or _library(owner):
                return f"no define `{method}`: usa el de la clase de la biblioteca"
        walk.seen.add(id(target))
        return walk.klass(target)
    if _from_submission(target):
        walk.seen.add(id(target))
        return walk.function(target)
    if callable(target) and not isinstance(target, type):
        return f"es un {type(target).__name__} que no está definido en el cuaderno"
    return None


_FORBIDDEN_OBJECTS: dict[int, Any] = {}


def _objects(forbidden: dict[int, str]):
    return [_FORBIDDEN_OBJECTS[i] for i in forbidden if i in _FORBIDDEN_OBJECTS]


def forbidden_for(criterion, resolve) -> dict[int, str]:
    """``id -> "module:attr"`` of the reference of ``criterion`` and its listed equivalents
    (``delegates`` in rubric.json); for a class, its graded methods instead of the class."""
    out: dict[int, str] = {}
    for ref in (criterion.reference, *criterion.delegates):
        obj = resolve(ref)
        targets = [(obj, ref)]
        if isinstance(obj, type):
            targets = [(vars(obj)[m], f"{ref}.{m}") for m in criterion.methods if m in vars(obj)]
        for value, name in targets:
            value = _unwrap(value)
            out.setdefault(id(value), name)
            _FORBIDDEN_OBJECTS[id(value)] = value
    return out
