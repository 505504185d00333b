"""Grading logic on a namespace: the public and hidden checks of each function criterion.

It runs in the trusted checker process (:mod:`.checker`), on a namespace of proxies to the
student's functions in the function worker (:mod:`.proxy`). The tests call
:func:`grade_namespace` directly with a plain dict of functions.

For each criterion of type ``function``: the name is looked up in the namespace (missing: zero,
with the reason), the other graded names are bound to the library's references while it is
checked, and its stages (the public self-check, then the hidden ones) run in order, each under a
time limit (``SIGALRM``), stopping at the first failure.
"""

from __future__ import annotations

import json
import re
import signal
import threading
from contextlib import contextmanager
from typing import Any, Callable

from .assessment import Assessment, Criterion, resolve_reference

RESULT_VERSION = 1
DEFAULT_STAGE_LIMIT_S = 120.0
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def clean(text: Any, limit: int = 600) -> str:
    """One line, without memory addresses (they change between runs), at most ``limit`` chars."""
    text = _ADDRESS.sub("", str(text))
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


class StageTimeout(BaseException):
    """A check ran past its time limit (BaseException: a student's ``except Exception`` inside
    the checked function cannot swallow it)."""


@contextmanager
def _time_limit(seconds: float | None):
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return

    def alarm(signum, frame):
        raise StageTimeout()

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@contextmanager
def _references_for_others(ns: dict, assessment: Assessment, graded: Criterion):
    """Bind every other graded name to the library's reference while ``graded`` is checked
    (also when the notebook does not define it: a missing exercise costs only its own points)."""
    missing = object()
    saved = {}
    for c in assessment.functions:
        if c.name != graded.name:
            saved[c.name] = ns.get(c.name, missing)
            ns[c.name] = resolve_reference(c.reference)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is missing:
                ns.pop(name, None)
            else:
                ns[name] = value


def _outcome(passed: bool, message: str, stage: str | None = None, cases: int = 0) -> dict:
    return {"passed": passed, "message": clean(message, 1200), "stage": stage, "cases": cases}


def grade_function(ns: dict, assessment: Assessment, criterion: Criterion, ctx,
                   stage_limit_s: float | None = DEFAULT_STAGE_LIMIT_S) -> dict:
    """Public then hidden checks of one student's object; the first failure decides."""
    name = criterion.name
    if name not in ns:
        return _outcome(False, f"no se encontró `{name}` en el cuaderno: la celda que lo define "
                               "no se ejecutó, falló o cambió de nombre.")
    obj = ns[name]
    if obj is None or not callable(obj):
        return _outcome(False, f"`{name}` no es una función ni una clase (es "
                               f"{type(obj).__name__}).")
    cases = hidden_stages = 0
    with _references_for_others(ns, assessment, criterion):
        try:
            stages = list(assessment.stages(criterion, obj, ctx))
        except Exception as err:  # noqa: BLE001 - a broken hidden_checks module is reported
            return _outcome(False, f"error interno del corrector al preparar las comprobaciones: "
                                   f"{type(err).__name__}: {err}")
        for stage in stages:
            label = "comprobación pública" if stage.visibility == "public" else "comprobación oculta"
            try:
                with _time_limit(stage_limit_s):
                    result = stage.run()
            except NotImplementedError as err:
                hint = str(err).removeprefix("Ejercicio sin resolver.").strip()
                return _outcome(False, "ejercicio sin resolver (NotImplementedError)"
                                + (f"; la pista era: {hint}" if hint else "."),
                                stage.visibility, cases)
            except StageTimeout:
                return _outcome(False, f"{label}: superó el límite de {stage_limit_s:g} s "
                                       "(¿un bucle que no termina?).", stage.visibility, cases)
            except KeyboardInterrupt:
                return _outcome(False, f"{label}: se interrumpió al agotarse el tiempo de la "
                                       "celda (¿un bucle que no termina?).", stage.visibility, cases)
            except MemoryError:
                return _outcome(False, f"{label}: se quedó sin memoria.", stage.visibility, cases)
            except RecursionError:
                return _outcome(False, f"{label}: recursión infinita.", stage.visibility, cases)
            except Exception as err:  # noqa: BLE001 - e.g. a return value the check cannot read
                return _outcome(False, f"{label}: la comprobación no pudo leer el resultado de su "
                                       f"código ({type(err).__name__}: {err}).", stage.visibility,
                                cases)
            if not result.passed:
                return _outcome(False, f"{label}: {result.message}", stage.visibility, cases)
            cases += result.cases
            hidden_stages += stage.visibility == "hidden"
    publics = len(stages) - hidden_stages
    parts = [f"{publics} comprobación pública" if publics == 1 else
             f"{publics} comprobaciones públicas",
             "1 oculta" if hidden_stages == 1 else f"{hidden_stages} ocultas"]
    return _outcome(True, f"correcto en {cases} casos ({' y '.join(parts)}).", None, cases)


def export_contract(ns: dict) -> tuple[Any, str | None]:
    """The notebook's ``contract`` as plain JSON data, or None and the reason."""
    if "contract" not in ns:
        return None, "el cuaderno no definió la variable `contract` (la celda del contrato no se " \
                     "ejecutó o falló antes de crearla)."
    contract = ns["contract"]
    if not isinstance(contract, dict):
        return None, f"`contract` debe ser un dict y es {type(contract).__name__}."

    def reject(obj):
        raise TypeError(f"{type(obj).__name__} no es serializable en JSON")

    try:
        text = json.dumps(contract, default=reject, allow_nan=True)
    except (TypeError, ValueError, RecursionError) as err:
        return None, f"el contrato no se puede escribir como JSON: {err}."
    data = json.loads(text)
    # NaN / inf survive the round trip as floats; validate_contract rejects them by path.
    return data, None


def grade_namespace(ns: dict, assessment: Assessment, seed: int,
                    stage_limit_s: float | None = DEFAULT_STAGE_LIMIT_S,
                    on_progress: Callable[[dict], None] | None = None,
                    only: set[str] | None = None) -> dict:
    """Grade every function criterion on ``ns`` and export the contract."""
    ctx = assessment.context(seed)
    result: dict[str, Any] = {"version": RESULT_VERSION, "kind": assessment.kind, "seed": seed,
                              "functions": {}, "contract": None, "contract_error": None,
                              "complete": False}
    for criterion in assessment.functions:
        if only is not None and criterion.id not in only:
            continue
        result["functions"][criterion.id] = grade_function(ns, assessment, criterion, ctx,
                                                           stage_limit_s)
        if on_progress:
            on_progress(result)
    result["contract"], result["contract_error"] = export_contract(ns)
    result["complete"] = True
    if on_progress:
        on_progress(result)
    return result
