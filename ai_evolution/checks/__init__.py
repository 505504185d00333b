"""Self-checks: a student's function against the library's reference, case by case.

Every check runs seeded cases and stops at the first one that fails, naming it with the
expected and the obtained value, in Spanish (students read these). The same checks serve the
student notebooks (``raise_on_fail=True``: the notebook stops there) and the autograder
(``raise_on_fail=False``: the result is recorded).
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass


class CheckFailed(AssertionError):
    """A self-check found a case where the student's function disagrees with the reference."""


@dataclass(frozen=True)
class CheckResult:
    name: str
    passed: bool
    cases: int
    message: str

    def __str__(self) -> str:
        return self.message


def passed(name: str, cases: int, detail: str = "") -> CheckResult:
    msg = f"✔ {name}: correcto en {cases} casos." + (f" {detail}" if detail else "")
    return CheckResult(name, True, cases, msg)


def failed(name: str, case_index: int, case: str, problem: str, hint: str = "") -> CheckResult:
    msg = f"✘ {name}: falla el caso {case_index + 1} ({case}). {problem}"
    if hint:
        msg += f" Pista: {hint}"
    return CheckResult(name, False, case_index + 1, msg)


def finish(result: CheckResult, raise_on_fail: bool) -> CheckResult:
    """Print the verdict; raise CheckFailed on failure when asked (notebooks stop there)."""
    if not result.passed and raise_on_fail:
        raise CheckFailed(result.message)
    print(result.message)
    return result


def self_check(check):
    """A self-check's body returns its ``CheckResult`` (``passed(...)`` or ``failed(...)``); this
    prints it and, with ``raise_on_fail`` (default: the body's own), raises ``CheckFailed`` on a
    failure, so that every check reports the same way. The body still receives
    ``raise_on_fail`` (a check may pass it on to another one)."""
    default = inspect.signature(check).parameters["raise_on_fail"].default

    @functools.wraps(check)
    def run(*args, raise_on_fail: bool = default, **kwargs) -> CheckResult:
        return finish(check(*args, raise_on_fail=raise_on_fail, **kwargs), raise_on_fail)

    return run


def call_student(name: str, fn, *args, **kwargs):
    """Call the student's function; turn a crash into a failed check that names the exception.

    NotImplementedError passes through untouched: its message is the exercise's hint. In the
    autograder ``fn`` is a proxy to the student's code in another process
    (``ai_evolution.grading.proxy``); its errors carry their own description (``feedback``:
    the exception's type name and a cleaned message, or a result that cannot cross).
    """
    try:
        return fn(*args, **kwargs), None
    except NotImplementedError:
        raise
    except Exception as err:  # noqa: BLE001 - any crash of student code is a finding
        return None, getattr(err, "feedback", None) or \
            f"su función lanzó {type(err).__name__}: {err}"


@self_check
def check_student_extension(ext: dict, raise_on_fail: bool = True) -> CheckResult:
    """The challenge's ``student_extension``: four keys, a measurement that holds numbers."""
    name = "extensión del estudiante"
    keys = ("assumption", "measurement", "conclusion", "limitation")
    if not isinstance(ext, dict):
        return failed(name, 0, "estructura", f"se espera un dict, se obtuvo "
                      f"{type(ext).__name__}.")
    for i, key in enumerate(keys):
        value = ext.get(key)
        if value in (None, "", {}):
            return failed(name, i, f"clave {key!r}", "falta o está vacía.",
                          f"complete las cuatro claves: {', '.join(keys)}.")
        if key != "measurement" and (not isinstance(value, str) or len(value.strip()) < 10):
            return failed(name, i, f"clave {key!r}", "debe ser una frase (texto de al "
                          "menos 10 caracteres).")
    measurement = ext["measurement"]
    numbers = [v for v in (measurement.values() if isinstance(measurement, dict) else [measurement])
               if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if not numbers:
        return failed(name, len(keys), "clave 'measurement'", "no contiene ningún número "
                      "medido.", "guarde los valores que midió, con su unidad en el "
                      "nombre de la clave (por ejemplo 'cache_bytes').")
    return passed(name, len(keys) + 1)
