"""The function worker: the student's exercise functions, in a jailed process of their own.

``python -m ai_evolution.grading.worker functions`` (started by :mod:`.proxy`, inside
bubblewrap where it works) imports the *stripped* library (:mod:`.stripped`: the lab's graded
references are not in it), executes the lab's setup imports and the submission's definition
statements (:func:`.rebuild.extract`), then answers requests, one JSON line each way
(:mod:`.codec`: plain data only):

``{"op": "begin", "name"}``
    a criterion starts: every *other* graded name is bound to a stub that asks the trusted
    side to run the library's reference (one wrong exercise costs only its own points); the
    trusted side refuses a callback for the name being graded;
``{"op": "call", "name", "args", "kwargs"}`` (``"method"`` and ``"self"`` for a class)
    answered ``{"result", "updates"}`` or ``{"error": {"type", "message"}}``;
``{"op": "new", "name", "args", "kwargs"}``
    an instance of the student's class, answered with its fields and its own methods.

The worker holds no key, no check, no expected value and no path to the gradebook or the
assessments folder. Without the argument ``functions`` it runs a notebook
(:func:`.notebook.worker_main`).
"""

from __future__ import annotations

import builtins
import json
import os
import signal
import sys

STATEMENT_LIMIT_S = 10.0
MESSAGE_LIMIT = 4000  # the checker redacts, then cuts to 300


def _clean(text, limit: int = MESSAGE_LIMIT) -> str:
    import re

    text = re.sub(r" at 0x[0-9a-fA-F]+", "", str(text))
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


class _Timeout(BaseException):
    pass


def _alarm(signum, frame):
    raise _Timeout()


class Worker:
    def __init__(self, job: dict, out: int):
        self.job, self.out = job, out
        self.graded = {g["name"]: g for g in job["graded"]}
        self.ns: dict = {}
        self.own: dict = {}  # graded name -> the student's definition

    # --- channel ----------------------------------------------------------------------------
    def send(self, message: dict) -> None:
        from .codec import CodecError, dumps
        from .sandbox import write_all

        try:
            data = dumps(message)
        except (CodecError, ValueError, TypeError) as err:
            data = dumps({"error": {"type": "CodecError", "message": _clean(err, 300),
                                    "codec": True}})
        write_all(self.out, data)

    def receive(self) -> dict:
        line = sys.stdin.buffer.readline()
        if not line:
            raise SystemExit(0)
        return json.loads(line)

    # --- setup ------------------------------------------------------------------------------
    def load(self) -> dict:
        ns = {"__name__": "entrega", "__builtins__": builtins, "seed": self.job["seed"],
              "profile": "ci", "params": self.job["params"]}
        for line in self.job["setup"]:
            exec(compile(line, "<preparación del laboratorio>", "exec"), ns)  # noqa: S102
        failures: dict[str, str] = {}
        signal.signal(signal.SIGALRM, _alarm)
        for stmt in self.job["statements"]:
            code = compile(stmt["source"], f"<celda {stmt['cell']}>", "exec")
            try:
                signal.setitimer(signal.ITIMER_REAL, STATEMENT_LIMIT_S)
                try:
                    exec(code, ns)  # noqa: S102 - the submission's code, in this jail
                finally:
                    signal.setitimer(signal.ITIMER_REAL, 0)
                for name in stmt["defines"]:
                    failures.pop(name, None)
            except BaseException as err:  # noqa: BLE001 - SystemExit too: the worker goes on
                kind = "superó el límite de tiempo" if isinstance(err, _Timeout) else \
                    f"{type(err).__name__}: {_clean(err, 200)}"
                for name in stmt["defines"]:
                    failures[name] = f"la definición de la celda {stmt['cell']} falló ({kind})"
        self.ns = ns
        kinds, flags = {}, {}
        for name, g in self.graded.items():
            if name not in ns:
                continue
            obj = ns[name]
            self.own[name] = obj
            kinds[name] = "class" if isinstance(obj, type) else \
                "function" if callable(obj) else type(obj).__name__
            why = self._delegation(obj, g)
            if why:
                flags[name] = _clean(why, 300)
        return {"ready": True, "failures": failures, "kinds": kinds, "delegation": flags}

    @staticmethod
    def _delegation(obj, g: dict) -> str | None:
        """The static delegation walk, as a flag for a human (not the defence: the references
        are not in this library)."""
        try:
            from .assessment import resolve_reference
            from .delegation import delegation, forbidden_for

            class _C:  # the criterion's fields forbidden_for reads
                reference, delegates, methods = g["reference"], tuple(g["delegates"]), \
                    tuple(g["methods"])

            return delegation(obj, forbidden_for(_C, resolve_reference), tuple(g["methods"]))
        except Exception:  # noqa: BLE001 - a flag, never a failure
            return None

    # --- requests ---------------------------------------------------------------------------
    def begin(self, name: str) -> dict:
        for other in self.graded:
            if other == name:
                if other in self.own:
                    self.ns[other] = self.own[other]
                continue
            self.ns[other] = self._reference_stub(other)
        return {"ok": True}

    def _reference_stub(self, name: str):
        worker = self

        def reference(*args, **kwargs):
            from .codec import Decoder, Encoder

            enc = Encoder()
            worker.send({"callback": name, "args": [enc.encode(a) for a in args],
                         "kwargs": {k: enc.encode(v) for k, v in kwargs.items()}})
            answer = worker.receive()
            if "error" in answer:
                raise RuntimeError(str(answer["error"])[:300])
            return Decoder().decode(answer.get("result"))

        reference.__name__ = reference.__qualname__ = name
        return reference

    def _student(self, name: str):
        if name not in self.own:
            raise NameError(f"`{name}` no está definido")
        return self.own[name]

    def call(self, msg: dict) -> dict:
        from .codec import Decoder, Encoder

        dec = Decoder()
        target = self._student(msg["name"])
        if msg.get("self") is not None:  # a method of the student's class, on its fields
            instance = object.__new__(target)  # decoded first: the arguments refer to it
            dec.known[0] = instance
            instance.__dict__.update(dec.fields(msg["self"]))
            target = getattr(instance, str(msg["method"]))
        args = [dec.decode(a) for a in msg.get("args", [])]
        kwargs = {str(k): dec.decode(v) for k, v in msg.get("kwargs", {}).items()}
        known = dict(dec.known)
        start = max(known, default=0) + 1
        before = {k: self._record(o, known, start) for k, o in known.items()}
        result = target(*args, **kwargs)
        enc = Encoder({id(o): k for k, o in known.items()}, start)
        answer = {"result": enc.encode(result), "updates": []}
        for k, o in known.items():
            if self._record(o, known, start) != before[k]:
                answer["updates"].append([k, self._encode_record(o, enc)])
        return answer

    def new(self, msg: dict) -> dict:
        from .codec import Decoder, Encoder

        dec = Decoder()
        cls = self._student(msg["name"])
        if not isinstance(cls, type):
            raise TypeError(f"`{msg['name']}` no es una clase")
        args = [dec.decode(a) for a in msg.get("args", [])]
        kwargs = {str(k): dec.decode(v) for k, v in msg.get("kwargs", {}).items()}
        instance = cls(*args, **kwargs)
        enc = Encoder({id(instance): 0}, max(dec.known, default=0) + 1)
        methods = sorted({m for klass in type(instance).__mro__
                          if not str(getattr(klass, "__module__", "")).startswith("ai_evolution")
                          and klass is not object
                          for m, v in vars(klass).items()
                          if callable(v) and not (m.startswith("__") and m.endswith("__"))})
        return {"self": enc.fields(instance), "methods": methods}

    @staticmethod
    def _encode_record(obj, enc) -> dict:
        import numpy as np
        import torch

        from .codec import Encoder, type_name

        if isinstance(obj, (torch.Tensor, np.ndarray)):
            record = Encoder().encode(obj)
            record.pop("id", None)
            return record
        return {"$obj": type_name(obj), "f": enc.fields(obj)}

    def _record(self, obj, known: dict, start: int) -> str:
        from .codec import Encoder

        enc = Encoder({id(o): k for k, o in known.items()}, start)
        return json.dumps(self._encode_record(obj, enc), sort_keys=True)

    def serve(self) -> None:
        self.send(self.load())
        while True:
            msg = self.receive()
            op = msg.get("op")
            try:
                if op == "begin":
                    answer = self.begin(str(msg["name"]))
                elif op == "call":
                    answer = self.call(msg)
                elif op == "new":
                    answer = self.new(msg)
                else:
                    answer = {"error": {"type": "ValueError", "message": f"operación {op!r}"}}
            except BaseException as err:  # noqa: BLE001 - SystemExit too: reported, not obeyed
                from .codec import CodecError

                answer = {"error": {"type": type(err).__name__, "message": _clean(err),
                                    "codec": isinstance(err, CodecError)}}
            self.send(answer)


def functions_main() -> int:
    job = json.loads(sys.stdin.buffer.readline().decode("utf-8"))
    from pathlib import Path

    import ai_evolution

    library = Path(os.environ.get("PYTHONPATH", "/nonexistent")).resolve()
    if not Path(ai_evolution.__file__).resolve().is_relative_to(library):
        raise SystemExit(f"el proceso de funciones importó {ai_evolution.__file__}, no la copia "
                         "de la biblioteca sin referencias")
    from .sandbox import private_stdout, set_limits

    out = private_stdout()
    if job.get("memory_mb"):
        set_limits(int(job["memory_mb"]))
    import torch

    torch.set_num_threads(1)
    Worker(job, out).serve()
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["functions"]:
        sys.exit(functions_main())
    from .notebook import worker_main

    sys.exit(worker_main())
