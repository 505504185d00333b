"""The trusted side of the function worker: start it, jailed, and call the student's code in it.

:class:`FunctionWorker` starts ``python -m ai_evolution.grading.worker functions`` (bubblewrap
where it works, with the stripped library of :mod:`.stripped` bound read-only and first on
``sys.path``, the real library and the assessments folder not bound at all) and exchanges JSON
lines with it (:mod:`.codec`). :func:`proxies` gives the checks one callable per graded name:

- :class:`RemoteFunction`: ``fn(*args, **kwargs)`` sends the call and returns the decoded
  result; tensors, arrays and library objects the call changed in place are copied back into
  the caller's own objects (an attention step writing its KV cache);
- :class:`RemoteClass`: ``cls(*args)`` builds the student's instance in the worker and returns a
  *mirror*: an instance, on this side, of a subclass of the library's class whose methods
  written by the student are sent to the worker with the mirror's fields; every other method
  is the library's, run here.

Errors: an exception in the student's code comes back as its type name and a short, cleaned
message (:class:`StudentError`, or ``NotImplementedError`` with the exercise's hint); a worker
that dies, hangs past ``call_limit_s``, grows past ``memory_mb`` or answers more than
:data:`.codec.MAX_MESSAGE_BYTES` raises :class:`WorkerLost` (a ``BaseException``: the checks'
``except Exception`` does not swallow it): the criterion being checked fails, and the worker is
started again (at most ``max_starts`` times) for the next one.
"""

from __future__ import annotations

import collections
import functools
import json
import os
import re
import secrets
import select
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

from .codec import CodecError, Decoder, Encoder, apply_updates, dumps, loads, MAX_MESSAGE_BYTES

STARTUP_LIMIT_S = 120.0
CALL_LIMIT_S = 60.0
MAX_STARTS = 6
STDERR_KEEP = 64 * 1024


class StudentError(Exception):
    """The student's code raised ``type_name`` (or returned what cannot cross)."""

    def __init__(self, type_name: str, message: str, feedback: str):
        super().__init__(message)
        self.type_name = type_name
        self.feedback = feedback


_BUILTIN_ERRORS: dict[str, type] = {}


def student_error(type_name: str, message: str, feedback: str) -> StudentError:
    """A :class:`StudentError` that is also an instance of the built-in exception of that name
    (``ValueError``, ``KeyError``...), so that a check expecting the student's code to raise it
    sees it; any other name (a class the student wrote) is a plain StudentError."""
    import builtins

    base = getattr(builtins, type_name, None)
    if not (isinstance(base, type) and issubclass(base, Exception)) or \
            issubclass(base, (StudentError, NotImplementedError)):
        return StudentError(type_name, message, feedback)
    if type_name not in _BUILTIN_ERRORS:
        try:
            _BUILTIN_ERRORS[type_name] = type(type_name, (StudentError, base), {})
        except TypeError:  # a built-in whose layout cannot be mixed
            return StudentError(type_name, message, feedback)
    err = _BUILTIN_ERRORS[type_name].__new__(_BUILTIN_ERRORS[type_name])
    StudentError.__init__(err, type_name, message, feedback)
    return err


class WorkerLost(BaseException):
    """The worker died, hung, grew past its memory or flooded the channel (Spanish message)."""


REDACT_WINDOW = 20
_PUBLIC_SUFFIXES = (".py", ".md", ".ipynb", ".json")


def _flat(path: Path) -> str:
    try:
        return " ".join(path.read_text(encoding="utf-8").split())
    except (OSError, UnicodeDecodeError):
        return ""


@functools.lru_cache(maxsize=16)
def _secret_windows(folder: str, public: tuple[str, ...]) -> frozenset[str]:
    """The :data:`REDACT_WINDOW`-character runs of the Python files of ``folder`` that appear in
    none of the ``public`` files or folders (the lab's notebooks, ``assessment.md``, the public
    checks): what only the hidden checks say."""
    windows: set[str] = set()
    for path in sorted(Path(folder).glob("*.py")):
        text = _flat(path)
        windows.update(text[i:i + REDACT_WINDOW] for i in range(len(text) - REDACT_WINDOW + 1))
    for item in map(Path, public):
        paths = [item] if item.is_file() else sorted(
            p for p in item.rglob("*") if p.suffix in _PUBLIC_SUFFIXES and p.is_file())
        for path in paths:
            if path.parent == Path(folder) and path.suffix == ".py":
                continue
            text = _flat(path)
            for i in range(len(text) - REDACT_WINDOW + 1):
                windows.discard(text[i:i + REDACT_WINDOW])
    return frozenset(windows)


def redactor(folder: Path | None, public: tuple = ()) -> Callable[[str], str]:
    """A function that replaces, in a message, every run of :data:`REDACT_WINDOW` or more
    characters copied from the Python files of ``folder`` (the assessment's hidden checks) and
    from no ``public`` file, however the run was cut, by ``[texto oculto]``: in case a
    submission read them (possible only in the session fallback) and put them in an exception's
    text or a cell's error."""
    windows = _secret_windows(str(folder), tuple(map(str, public))) \
        if folder is not None and Path(folder).is_dir() else frozenset()

    def redact(text: str) -> str:
        flat = " ".join(str(text).split())
        hidden = [False] * len(flat)
        for i in range(len(flat) - REDACT_WINDOW + 1):
            if flat[i:i + REDACT_WINDOW] in windows:
                hidden[i:i + REDACT_WINDOW] = [True] * REDACT_WINDOW
        if not any(hidden):
            return flat
        out, i = [], 0
        while i < len(flat):
            if hidden[i]:
                while i < len(flat) and hidden[i]:
                    i += 1
                out.append("[texto oculto]")
            else:
                out.append(flat[i])
                i += 1
        return "".join(out)

    return redact


def assessment_redactor(assessment) -> Callable[[str], str]:
    """:func:`redactor` of an assessment: its hidden checks, minus what the lab's folder, its
    ``assessment.md`` and ``rubric.json`` and the public checks already say."""
    from .stripped import PACKAGE_DIR

    folder = Path(assessment.folder)
    return redactor(folder, (assessment.lab_folder, folder / "assessment.md",
                             folder / "rubric.json", PACKAGE_DIR / "checks"))


def clean_message(text: Any, redact: Callable[[str], str], limit: int = 300) -> str:
    text = redact(re.sub(r" at 0x[0-9a-fA-F]+", "", str(text)))
    text = re.sub(r"(/[\w.\-]+){2,}", "[ruta]", text)  # no paths of the grading machine
    return text if len(text) <= limit else text[: limit - 1] + "…"


class FunctionWorker:
    def __init__(self, job: dict, library: Path, isolation: str, memory_mb: int,
                 log_path: Path, references: dict[str, Callable], redact=lambda s: s,
                 call_limit_s: float = CALL_LIMIT_S, max_starts: int = MAX_STARTS):
        self.job, self.library, self.isolation = job, Path(library), isolation
        self.memory_mb, self.log_path = memory_mb, Path(log_path)
        self.references, self.redact = references, redact
        self.call_limit_s, self.max_starts = call_limit_s, max_starts
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        self.ready: dict = {}
        self.current: str | None = None
        self.scratch: Path | None = None
        self._buffer = b""
        self._stderr: collections.deque = collections.deque()
        self._stderr_size = 0

    # --- process ----------------------------------------------------------------------------
    def _command(self, scratch: Path) -> list[str]:
        from .sandbox import _bwrap_base

        inner = [sys.executable, "-P", "-m", "ai_evolution.grading.worker", "functions"]
        if self.isolation != "bwrap":
            return inner
        return _bwrap_base([scratch], [], library=self.library) + \
            ["--chdir", str(scratch / "work"), "--"] + inner

    def start(self) -> dict:
        from .sandbox import TOKEN_ENV, _base_env, new_scratch

        self.stop()
        if self.starts >= self.max_starts:
            raise WorkerLost(f"el proceso de sus funciones se reinició {self.max_starts} veces; "
                             "no se corrige más.")
        self.starts += 1
        self.scratch = new_scratch()
        # The checker's run token: whatever the worker leaves behind is swept with the checker's
        # processes by the grader (sandbox.run_untrusted).
        env = _base_env(self.scratch, os.environ.get(TOKEN_ENV) or secrets.token_hex(16))
        env["PYTHONPATH"] = str(self.library)
        self.proc = subprocess.Popen(self._command(self.scratch), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     cwd=self.scratch / "work", env=env, start_new_session=True)
        self._buffer = b""
        threading.Thread(target=self._drain, args=(self.proc,), daemon=True).start()
        self._write(json.dumps(self.job).encode("utf-8") + b"\n")
        ready = self._read(STARTUP_LIMIT_S + 10 * len(self.job.get("statements", ())))
        # What the worker says it defined: untrusted, kept only as strings.
        self.ready = {key: {str(k)[:100]: str(v)[:4000] for k, v in ready.get(key).items()}
                      if isinstance(ready.get(key), dict) else {}
                      for key in ("kinds", "failures", "delegation")}
        if self.current is not None:
            self.request({"op": "begin", "name": self.current})
        return self.ready

    def _drain(self, proc: subprocess.Popen) -> None:
        """Keep the last :data:`STDERR_KEEP` bytes of the worker's stderr (prints, tracebacks):
        flooding it costs memory of neither side."""
        with open(self.log_path, "ab") as log:
            written = 0
            for chunk in iter(lambda: proc.stderr.read1(65536), b""):
                if written < 2**20:
                    log.write(chunk[: 2**20 - written])
                    written += len(chunk)

    def stop(self) -> None:
        import shutil

        from .sandbox import _tree, kill_all

        if self.proc is not None:
            kill_all(_tree(self.proc.pid) + [])
            try:
                self.proc.kill()
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                pass
            for stream in (self.proc.stdin, self.proc.stdout):
                try:
                    stream.close()
                except OSError:
                    pass
            self.proc = None
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)
            self.scratch = None

    def _lost(self, why: str) -> WorkerLost:
        self.stop()
        return WorkerLost(why)

    def _write(self, data: bytes) -> None:
        try:
            self.proc.stdin.write(data)
            self.proc.stdin.flush()
        except (OSError, ValueError):
            raise self._lost("el proceso de sus funciones terminó (¿su código termina el "
                             "proceso o agota la memoria?).") from None

    def _read(self, limit_s: float) -> dict:
        from .sandbox import _any_stopped, _rss, _tree

        deadline = time.monotonic() + limit_s
        fd = self.proc.stdout.fileno()
        stopped_since = None
        checked = time.monotonic()
        while b"\n" not in self._buffer:
            now = time.monotonic()
            if now > deadline:
                raise self._lost(f"una llamada a su código superó {limit_s:g} s (¿un bucle que "
                                 "no termina?).")
            if now - checked > 0.5:  # the process tree, sampled (a call takes microseconds)
                checked = now
                tree = _tree(self.proc.pid)
                if self.memory_mb and _rss(tree) > self.memory_mb * 2**20:
                    raise self._lost(f"su código superó {self.memory_mb} MiB de memoria.")
                stopped_since = (stopped_since or now) if _any_stopped(tree) else None
                if stopped_since is not None and now - stopped_since > 3:
                    raise self._lost("su código detuvo el proceso que lo ejecuta (SIGSTOP).")
            ready, _, _ = select.select([fd], [], [], 0.2)
            if not ready:
                continue
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                raise self._lost("el proceso de sus funciones terminó (¿su código termina el "
                                 "proceso o agota la memoria?).")
            self._buffer += chunk
            if len(self._buffer) > MAX_MESSAGE_BYTES + 1 and b"\n" not in self._buffer:
                raise self._lost(f"la respuesta de su código ocupa más de "
                                 f"{MAX_MESSAGE_BYTES // 2**20} MiB.")
        line, _, self._buffer = self._buffer.partition(b"\n")
        try:
            return loads(line)
        except CodecError as err:
            raise self._lost(f"el proceso de sus funciones respondió algo ilegible ({err}).") \
                from None

    # --- requests ---------------------------------------------------------------------------
    def ensure(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            self.start()

    def begin(self, name: str) -> None:
        self.current = name
        self.ensure()
        self.request({"op": "begin", "name": name})

    def request(self, message: dict) -> dict:
        """Send ``message``, answer the worker's callbacks to the references of the *other*
        graded names, and return the answer. A call interrupted here (a stage's time limit)
        leaves the worker in an unknown state: it is stopped and started again on next use."""
        self.ensure()
        done = False
        try:
            self._write(dumps(message))
            while True:
                answer = self._read(self.call_limit_s)
                if "callback" not in answer:
                    done = True
                    return answer
                self._write(dumps(self._callback(answer)))
        finally:
            if not done and self.proc is not None:
                self.stop()

    def _callback(self, message: dict) -> dict:
        name = message.get("callback")
        if name == self.current or name not in self.references:
            return {"error": f"`{str(name)[:60]}` no está disponible en el corrector"}
        try:
            dec = Decoder()
            args = [dec.decode(a) for a in message.get("args", [])]
            kwargs = {str(k): dec.decode(v) for k, v in dict(message.get("kwargs", {})).items()}
            return {"result": Encoder().encode(self.references[name](*args, **kwargs))}
        except Exception as err:  # noqa: BLE001 - told to the student's code, as a message
            return {"error": f"{type(err).__name__}: {str(err)[:200]}"}

    def raise_error(self, error: Any) -> None:
        error = error if isinstance(error, dict) else {}
        kind = str(error.get("type", "Exception"))[:60]
        if kind == "NotImplementedError":  # its message is the exercise's hint
            raise NotImplementedError(clean_message(error.get("message", ""), self.redact, 600))
        message = clean_message(error.get("message", ""), self.redact)
        if error.get("codec"):
            raise StudentError(kind, message, "su código devolvió o recibió un valor que no "
                                              f"puede cruzar entre procesos: {message}")
        raise student_error(kind, message, f"su función lanzó {kind}: {message}")

    def call(self, name: str, args: tuple, kwargs: dict, mirror: Any = None,
             method: str | None = None) -> Any:
        enc = Encoder()
        message: dict = {"op": "call", "name": name}
        if mirror is not None:
            enc.ids[id(mirror)] = 0
            enc.keep.append(mirror)
            message["self"], message["method"] = enc.fields(mirror), method
        message["args"] = [enc.encode(a) for a in args]
        message["kwargs"] = {str(k): enc.encode(v) for k, v in kwargs.items()}
        known = {k: _object_of(enc, i) for i, k in enc.ids.items()}
        answer = self.request(message)
        if "error" in answer:
            self.raise_error(answer["error"])
        dec = Decoder(known)
        try:
            result = dec.decode(answer.get("result"))
            updates = answer.get("updates", [])
            if mirror is not None:
                mine = [u for u in updates if type(u) is list and u and u[0] == 0]
                updates = [u for u in updates if u not in mine]
                for _, value in mine:
                    if type(value) is not dict:
                        raise CodecError("actualización mal formada")
                    mirror.__dict__.update(dec.fields(value.get("f")))
            apply_updates(updates, dec)
        except CodecError as err:
            message_es = clean_message(err, self.redact)
            raise StudentError("CodecError", message_es, "su código devolvió un valor que no "
                               f"puede cruzar entre procesos: {message_es}") from None
        return result

    def new(self, name: str, args: tuple, kwargs: dict) -> tuple[dict, list[str]]:
        enc = Encoder()
        answer = self.request({"op": "new", "name": name,
                               "args": [enc.encode(a) for a in args],
                               "kwargs": {str(k): enc.encode(v) for k, v in kwargs.items()}})
        if "error" in answer:
            self.raise_error(answer["error"])
        try:
            fields = Decoder().fields(answer.get("self"))
        except CodecError as err:
            message_es = clean_message(err, self.redact)
            raise StudentError("CodecError", message_es, "su clase guarda un valor que no "
                               f"puede cruzar entre procesos: {message_es}") from None
        methods = [m for m in answer.get("methods", []) if isinstance(m, str) and
                   m.isidentifier() and not m.startswith("__")]
        return fields, methods


def _object_of(enc: Encoder, ident: int) -> Any:
    for obj in enc.keep:
        if id(obj) == ident:
            return obj
    raise KeyError(ident)


class RemoteFunction:
    """The student's function ``name``, called in the worker."""

    def __init__(self, worker: FunctionWorker, name: str):
        self._worker, self.__name__ = worker, name
        self.__qualname__ = name

    def __call__(self, *args, **kwargs):
        return self._worker.call(self.__name__, args, kwargs)

    def __repr__(self) -> str:
        return f"<función {self.__name__} del cuaderno>"


class RemoteClass:
    """The student's class ``name``: ``cls(*args)`` returns a mirror (see the module)."""

    def __init__(self, worker: FunctionWorker, name: str, base: type):
        self._worker, self._base, self.__name__ = worker, base, name
        self.__qualname__ = name
        self._mirror_cls: type | None = None

    def _mirror_class(self, methods: list[str]) -> type:
        worker, name = self._worker, self.__name__

        def remote(method: str):
            def call(self, *args, **kwargs):
                return worker.call(name, args, kwargs, mirror=self, method=method)

            call.__name__ = method
            return call

        body = {m: remote(m) for m in methods}
        body["__module__"] = "entrega"
        return type(name, (self._base,), body)

    def __call__(self, *args, **kwargs):
        fields, methods = self._worker.new(self.__name__, args, kwargs)
        cls = self._mirror_class(methods)
        mirror = cls.__new__(cls)
        mirror.__dict__.update(fields)
        return mirror

    def __repr__(self) -> str:
        return f"<clase {self.__name__} del cuaderno>"


def proxies(worker: FunctionWorker, assessment) -> dict[str, Any]:
    """One callable per graded name the worker defines."""
    from .assessment import resolve_reference

    out: dict[str, Any] = {}
    for c in assessment.functions:
        kind = worker.ready.get("kinds", {}).get(c.name)
        if kind == "class":
            base = resolve_reference(c.reference)
            out[c.name] = RemoteClass(worker, c.name, base if isinstance(base, type) else object)
        elif kind == "function":
            out[c.name] = RemoteFunction(worker, c.name)
        elif kind is not None:
            out[c.name] = None
    return out
