"""Scoring, in the grader's own process: the rubric's automatic part.

Function criteria come from the checker (:mod:`.checker`), which grades the functions rebuilt
from the submitted file; ``runs``, ``contract`` and ``extension`` are decided here, from what
the grader saw of the run (cell errors, the contract the export cell printed) and from the
submitted file itself (cells that rebind the injected parameters or touch the kernel).
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import math
import re
from dataclasses import dataclass, field

from ..checks import check_student_extension
from .assessment import Assessment, Criterion, ManualItem
from .namespace import DEFAULT_STAGE_LIMIT_S, _time_limit, clean
from .notebook import RunInfo

# Lines of a submission worth a human look: code that reaches into the grader or the library.
SUSPICIOUS = [
    (re.compile(r"ai_evolution\.grading|_ai_evolution_|result\.json|job\.json|run\.json|"
                r"gradebook"), "menciona el corrector"),
    (re.compile(r"\bsys\.modules\b|__builtins__|\bimport builtins\b"), "toca módulos del intérprete"),
    (re.compile(r"^\s*(checks|ai_evolution)(\.\w+)+\s*=(?!=)"), "reasigna algo de la biblioteca"),
    (re.compile(r"\bsetattr\(\s*(checks|ai_evolution)\b"), "reasigna algo de la biblioteca"),
    (re.compile(r"\bos\._exit\b|\bsignal\.(signal|alarm|setitimer)\b|\bos\.(kill|killpg|"
                r"setsid|fork|getppid)\b|\batexit\b"), "controla el proceso o sus señales"),
    (re.compile(r"\b(get_ipython|set_custom_exc|showtraceback|excepthook)\b"),
     "toca el kernel de Jupyter"),
]


# Statuses of a submission whose code never ran: every criterion carries the reason.
NOT_RUN = ("invalid", "refused", "grader_error")


def version_notes(contract: dict | None) -> list[str]:
    """A Spanish warning when the contract was produced by another version of the library than
    the grader's (``environment.versions.ai_evolution``); nothing when it matches or is absent
    (a missing contract has its own reason)."""
    from .. import __version__

    if not isinstance(contract, dict):
        return []
    env = contract.get("environment")
    versions = env.get("versions") if isinstance(env, dict) else None
    theirs = versions.get("ai_evolution") if isinstance(versions, dict) else None
    if theirs is None:
        return ["el contrato no dice con qué versión de ai_evolution se produjo; el corrector "
                f"usa la {__version__}."]
    if str(theirs) != __version__:
        return [f"el contrato se produjo con ai_evolution {clean(theirs, 40)} y el corrector usa "
                f"la {__version__}: si las dos versiones difieren en el laboratorio, las "
                "mediciones y las comprobaciones pueden no coincidir con las de su ejecución."]
    return []


@dataclass
class CriterionScore:
    id: str
    title: str
    points: float
    earned: float
    message: str

    @property
    def passed(self) -> bool:
        return self.earned == self.points


@dataclass
class Grade:
    student_id: str
    source: str
    status: str
    reason: str
    scores: list[CriterionScore]
    manual: tuple[ManualItem, ...]
    flags: list[str] = field(default_factory=list)
    isolation: str = "session"
    notes: list[str] = field(default_factory=list)       # warnings for student and instructor
    # (share of the student's own code, other student id or None for the published solution):
    # for human review, never points (see ``similarity``)
    similarity: list[tuple[float, str | None]] = field(default_factory=list)

    @property
    def total(self) -> float:
        return sum(s.earned for s in self.scores)

    @property
    def max_total(self) -> float:
        return sum(s.points for s in self.scores)


def _json_roundtrip(value):
    return json.loads(json.dumps(value))


def check_contract(contract: dict | None, missing_reason: str | None, assessment: Assessment,
                   seed: int) -> tuple[bool, str]:
    """The contract criterion: schema, kind, seed, profile, the lab's own parameters, and the
    student's part (``student_extension``: without it the contract is the library's alone)."""
    from ..labs import ContractError, get_spec, validate_contract

    if contract is None:
        return False, f"no hay contrato: {missing_reason or 'el cuaderno no lo produjo.'}"
    try:
        validate_contract(copy.deepcopy(contract))
    except ContractError as err:
        return False, str(err)
    if contract["kind"] != assessment.kind:
        return False, f"el contrato es del laboratorio {contract['kind']!r}, no de {assessment.kind!r}."
    if contract["seed"] != seed:
        return False, f"el contrato lleva la semilla {contract['seed']} y el corrector inyectó {seed}."
    if contract["profile"] != "ci":
        return False, f"el contrato se generó con el perfil {contract['profile']!r}, no con 'ci'."
    expected = _json_roundtrip(get_spec(assessment.kind).resolve_params("ci", {}))
    if contract["params"] != expected:
        changed = sorted(k for k in set(expected) | set(contract["params"])
                         if expected.get(k) != contract["params"].get(k))
        return False, (f"los parámetros del contrato no son los del laboratorio con el perfil "
                       f"'ci' (difieren: {', '.join(changed)}); la extensión no debe cambiar el "
                       "comportamiento del laboratorio.")
    if "student_extension" not in contract:
        return False, ("el contrato es el del laboratorio sin student_extension: la celda del reto "
                       "no llegó a completarlo.")
    return True, (f"contrato válido: tipo {assessment.kind!r}, semilla {seed}, perfil 'ci', "
                  "con evidencias, limitaciones y student_extension.")


def check_extension(contract: dict | None, criterion: Criterion, assessment: Assessment,
                    seed: int) -> tuple[bool, str]:
    """The challenge: the four keys, the measurement keys the challenge names, the hidden check."""
    if contract is None or not isinstance(contract, dict):
        return False, "no hay contrato, así que tampoco student_extension."
    if "student_extension" not in contract:
        return False, "el contrato no lleva student_extension (¿falló la celda del reto?)."
    ext = contract["student_extension"]
    with contextlib.redirect_stdout(io.StringIO()):
        result = check_student_extension(ext, raise_on_fail=False)
    if not result.passed:
        return False, result.message
    measurement = ext["measurement"]
    for key in criterion.measurement_keys:
        value = measurement.get(key) if isinstance(measurement, dict) else None
        if value is None:
            return False, (f"measurement no tiene la clave {key!r} que pide el reto "
                           f"(claves pedidas: {', '.join(criterion.measurement_keys)}).")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                not math.isfinite(value):
            return False, f"measurement[{key!r}] debe ser un número finito y es {value!r}."
    hidden = getattr(assessment.hidden_module, "extension", None)
    if hidden is not None:
        ctx = assessment.context(seed)
        try:
            with _time_limit(DEFAULT_STAGE_LIMIT_S), contextlib.redirect_stdout(io.StringIO()):
                for stage in hidden(ext, contract, ctx):
                    r = stage.run()
                    if not r.passed:
                        return False, f"comprobación oculta del reto: {r.message}"
        except Exception as err:  # noqa: BLE001 - e.g. a measurement of an unexpected type
            return False, (f"comprobación oculta del reto: no se pudo leer "
                           f"({type(err).__name__}: {err}).")
    return True, "student_extension completa, con las mediciones que pide el reto."


def flags_for(nb, info: RunInfo | None = None) -> list[str]:
    """Lines of the submission that a human should look at (deterministic, in cell order): every
    code cell of the submitted file, whatever its tags."""
    if nb is None:
        return []
    from .rebuild import code_cells

    out = []
    for n, cell in code_cells(nb):
        tags = cell.get("metadata", {}).get("tags", [])
        if "injected-parameters" in tags:
            out.append(f"celda de código {n}: etiquetada `injected-parameters`; el corrector la "
                       "quitó antes de ejecutar (los parámetros los inyecta él)")
        for line in cell.source.splitlines():
            for pattern, why in SUSPICIOUS:
                if pattern.search(line):
                    code = clean(line.strip(), 120)
                    out.append(f"celda de código {n}: `{code}` ({why})")
                    break
    return out


def score(student_id: str, source: str, info: RunInfo, assessment: Assessment, seed: int,
          functions: dict | None = None, flags: list[str] | None = None,
          rebinds: list[str] = (), tampering: list[str] = ()) -> Grade:
    """The automatic part of the rubric. ``functions``: the checker's outcome per function
    criterion; ``rebinds``/``tampering``: cells that rebind the injected parameters or touch the
    kernel (``rebuild.parameter_rebinds``/``kernel_tampering``)."""
    functions = functions or {}
    contract = info.contract
    status, reason = info.status, info.reason
    not_run = f"no se pudo corregir: {reason or 'el cuaderno no llegó al final.'}"
    scores = []
    for c in assessment.criteria:
        if c.type == "runs":
            ok = status == "ok" and not info.errors and info.exported and contract is not None \
                and not tampering
            if ok:
                msg = "el cuaderno se ejecutó de principio a fin sin errores con el perfil 'ci'."
            elif tampering and status == "ok":
                msg = ("el cuaderno toca el kernel de Jupyter (" + "; ".join(tampering[:2]) +
                       "): que se ejecutara sin errores no se puede comprobar.")
            elif status == "ok" and contract is None and info.exported:
                msg = "se ejecutó sin errores pero no llegó a producir `contract`, su última salida."
            else:
                msg = reason or "la corrección no se completó."
        elif c.type == "function":
            r = functions.get(c.id)
            ok, msg = (bool(r["passed"]), r["message"]) if r else \
                (False, not_run if status in NOT_RUN else "la corrección no llegó a este ejercicio.")
        elif c.type == "contract":
            if contract is None:
                ok, msg = False, (f"no hay contrato: {info.contract_error}" if info.contract_error
                                  else not_run)
            else:
                ok, msg = check_contract(contract, None, assessment, seed)
                if ok:
                    ok, msg = check_injected(info, rebinds, seed)
        else:  # extension
            if contract is None:
                ok, msg = False, "no hay contrato, así que tampoco student_extension."
            else:
                ok, msg = check_extension(contract, c, assessment, seed)
                if ok and rebinds:
                    ok, msg = False, ("el cuaderno cambió los parámetros inyectados ("
                                      + "; ".join(rebinds[:2]) + "): las mediciones no son de la "
                                      "ejecución que pidió el corrector.")
        scores.append(CriterionScore(c.id, c.title, c.points, c.points if ok else 0, clean(msg, 1500)))
    if status == "ok" and info.exported and contract is None:
        status = "no_contract"
        reason = clean(info.contract_error or "el cuaderno no produjo el contrato.", 300)
    return Grade(student_id, source, status, reason, scores, assessment.manual, flags or [],
                 info.isolation)


def check_injected(info: RunInfo, rebinds: list[str], seed: int) -> tuple[bool, str]:
    """The run used the injected parameters: no cell rebinds them, and the kernel ended with
    them (the export cell reports ``seed`` and ``profile`` as the kernel had them)."""
    if rebinds:
        return False, ("el cuaderno vuelve a asignar la semilla o el perfil después de los "
                       "parámetros inyectados (" + "; ".join(rebinds[:2]) + "): el contrato no "
                       "es el de la ejecución que pidió el corrector.")
    if info.kernel_seed is not None and info.kernel_seed != repr(seed):
        return False, (f"al terminar, el cuaderno tenía seed = {clean(info.kernel_seed, 40)}, no "
                       f"la semilla inyectada ({seed}).")
    if info.kernel_profile is not None and info.kernel_profile != repr("ci"):
        return False, (f"al terminar, el cuaderno tenía profile = "
                       f"{clean(info.kernel_profile, 40)}, no 'ci'.")
    return True, (f"contrato válido: semilla {seed} y perfil 'ci' inyectados, con evidencias, "
                  "limitaciones y student_extension.")
