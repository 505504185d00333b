"""An assessment folder: the machine-readable rubric and the hidden checks of one lab.

``assessments/NN-name/`` (``NN-name`` is the lab's folder name, ``labs/NN-name``) holds

- ``assessment.md``: the questions, the rubric, the acceptance criteria and the challenge, in
  Spanish, for students and instructors;
- ``rubric.json``: the automatic criteria (id, points, type, Spanish title) and the items that
  need a human reading (id, points, title);
- ``hidden_checks.py``: for every criterion of type ``function``, a function with the
  criterion's id, ``fn(student_object, ctx) -> iterable of Stage``; optionally
  ``extension(ext, contract, ctx)`` for the challenge. It is loaded by path by the autograder
  and never imported by a notebook.

Criterion types (``rubric.json``):

``runs``       the notebook ran from the first cell to the last without an error;
``function``   a student's function or class, by its name in the notebook (``name``), checked by
               the public self-check (the one the notebook runs) and then by hidden ones; while it
               is checked, the other graded names are bound to the library's reference
               (``reference``, ``"module:attribute"``), so one wrong exercise costs only its own
               points;
``contract``   the evidence contract: valid against the schema, with the lab's kind, the seed
               the grader injected, the ``ci`` profile and the lab's own parameters;
``extension``  ``contract["student_extension"]``: ``check_student_extension``, the measurement
               keys the challenge asks for (``measurement_keys``), numbers, and the optional
               ``extension`` hidden check.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Iterable

from ..checks import CheckResult

TYPES = ("runs", "function", "contract", "extension")
# How many hidden seeds a check gets (a hidden_checks module may set its own HIDDEN_SEED_COUNT);
# their values are drawn from the grading secret (Context.draw).
HIDDEN_SEED_COUNT = 2


def default_assessments_dir() -> Path:
    """``assessments/`` of the repository this package lives in."""
    return Path(__file__).resolve().parents[2] / "assessments"


class AssessmentError(ValueError):
    """An assessment folder that is missing or malformed (a maintainer's error, not a student's)."""


@dataclass(frozen=True)
class Criterion:
    id: str
    points: float
    type: str
    title: str
    name: str | None = None
    reference: str | None = None
    measurement_keys: tuple[str, ...] = ()
    delegates: tuple[str, ...] = ()   # other library objects that do the exercise's work
    methods: tuple[str, ...] = ()     # for a class exercise: the methods the student writes


@dataclass(frozen=True)
class ManualItem:
    id: str
    points: float
    title: str


@dataclass(frozen=True)
class Stage:
    """One check run on a student's object: ``visibility`` is ``public`` (the notebook's own
    self-check) or ``hidden`` (only the autograder runs it)."""

    visibility: str
    run: Callable[[], CheckResult]


def public(check: Callable[..., CheckResult], *args: Any, **kwargs: Any) -> Stage:
    """The notebook's self-check, with ``raise_on_fail=False``."""
    return Stage("public", lambda: check(*args, raise_on_fail=False, **kwargs))


def hidden(check: Callable[..., CheckResult], *args: Any, **kwargs: Any) -> Stage:
    """A check the student never saw, with ``raise_on_fail=False``."""
    return Stage("hidden", lambda: check(*args, raise_on_fail=False, **kwargs))


@dataclass
class Context:
    """What a hidden check may use besides the student's object. ``hidden_seeds`` and
    :meth:`rng` are drawn from the instructor's secret and the run's nonce (see
    :func:`derive`): a student who knows every public case still cannot know these."""

    kind: str
    seed: int
    hidden_seeds: tuple[int, ...]
    secret: bytes = field(default=b"", repr=False)
    nonce: str = ""
    _model: Any = field(default=None, repr=False)

    def draw(self, label: str) -> int:
        """A 64-bit integer for ``label``, from the secret, the lab, the nonce and the seed."""
        return derive(self.secret, self.kind, self.nonce, self.seed, label)

    def rng(self, label: str):
        """A numpy generator for the hidden cases of ``label`` (an edge-case family)."""
        import numpy as np

        return np.random.default_rng(self.draw(label))

    @property
    def params(self) -> dict:
        """The lab's parameters under the ``ci`` profile (what the graded notebook ran with)."""
        from ..labs import get_spec

        return get_spec(self.kind).resolve_params("ci", {})

    def model(self):
        """The shipped ``tiny-es`` model (loaded once; the engine checks serve it)."""
        if self._model is None:
            from ..model.checkpoint import load_pretrained

            self._model = load_pretrained("tiny-es")
        return self._model


@dataclass(frozen=True)
class Assessment:
    kind: str
    folder: Path
    lab_folder: Path
    criteria: tuple[Criterion, ...]
    manual: tuple[ManualItem, ...]

    @property
    def max_points(self) -> float:
        return sum(c.points for c in self.criteria)

    @property
    def manual_points(self) -> float:
        return sum(m.points for m in self.manual)

    @property
    def functions(self) -> list[Criterion]:
        return [c for c in self.criteria if c.type == "function"]

    @cached_property
    def hidden_module(self) -> ModuleType:
        path = self.folder / "hidden_checks.py"
        spec = importlib.util.spec_from_file_location(
            f"_ai_evolution_hidden_{self.folder.name.replace('-', '_')}", path)
        if spec is None or spec.loader is None:
            raise AssessmentError(f"no se puede cargar {path}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    def context(self, seed: int, secret: bytes | None = None, nonce: str = "") -> Context:
        """The checks' context. Without ``secret`` (the in-process tests) the hidden seeds are
        drawn from an empty key: fixed for a seed, as reproducible as the tests need."""
        count = int(getattr(self.hidden_module, "HIDDEN_SEED_COUNT", HIDDEN_SEED_COUNT))
        key = secret or b""
        seeds = tuple(derive(key, self.kind, nonce, seed, f"hidden-{i}") % 2**31
                      for i in range(count))
        return Context(self.kind, seed, seeds, key, nonce)

    def stages(self, criterion: Criterion, obj: Any, ctx: Context) -> Iterable[Stage]:
        return getattr(self.hidden_module, criterion.id)(obj, ctx)


def derive(secret: bytes, kind: str, nonce: str, seed: int, label: str) -> int:
    """HMAC-SHA256(secret, lab + nonce + seed + label) as a 64-bit integer."""
    import hashlib
    import hmac

    message = "\x00".join((kind, nonce, str(seed), label)).encode("utf-8")
    return int.from_bytes(hmac.new(secret, message, hashlib.sha256).digest()[:8], "big")


def resolve_reference(ref: str) -> Any:
    """``"package.module:attr"`` -> the object."""
    module, _, attr = ref.partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def load_assessment(folder: str | Path) -> Assessment:
    """Read ``folder/rubric.json`` and check it (ids unique, types known, hidden checks present)."""
    folder = Path(folder).resolve()
    path = folder / "rubric.json"
    if not path.is_file():
        raise AssessmentError(f"falta {path}")
    raw = json.loads(path.read_text(encoding="utf-8"))
    from ..labs import get_spec

    kind = raw["kind"]
    lab_folder = default_assessments_dir().parent / get_spec(kind).folder
    criteria = tuple(Criterion(id=c["id"], points=c["points"], type=c["type"], title=c["title"],
                               name=c.get("name"), reference=c.get("reference"),
                               measurement_keys=tuple(c.get("measurement_keys", ())),
                               delegates=tuple(c.get("delegates", ())),
                               methods=tuple(c.get("methods", ())))
                     for c in raw["criteria"])
    manual = tuple(ManualItem(m["id"], m["points"], m["title"]) for m in raw.get("manual", []))
    ids = [c.id for c in criteria] + [m.id for m in manual]
    if len(set(ids)) != len(ids):
        raise AssessmentError(f"{path}: ids repetidos")
    assessment = Assessment(kind, folder, lab_folder, criteria, manual)
    for c in criteria:
        if c.type not in TYPES:
            raise AssessmentError(f"{path}: tipo desconocido {c.type!r} en {c.id!r}")
        if c.type == "function":
            if not (c.name and c.reference):
                raise AssessmentError(f"{path}: el criterio {c.id!r} necesita name y reference")
            if not callable(getattr(assessment.hidden_module, c.id, None)):
                raise AssessmentError(f"{folder / 'hidden_checks.py'} no define {c.id}()")
            for ref in (c.reference, *c.delegates):
                resolve_reference(ref)
            if isinstance(resolve_reference(c.reference), type) and not c.methods:
                raise AssessmentError(f"{path}: el criterio {c.id!r} es una clase y necesita "
                                      "methods (los métodos que escribe el estudiante)")
    return assessment


def find_assessment(kind: str, assessments_dir: str | Path | None = None) -> Assessment:
    """The assessment of lab ``kind``: ``assessments/<the lab's folder name>/``."""
    from ..labs import get_spec

    root = Path(assessments_dir) if assessments_dir else default_assessments_dir()
    folder = root / Path(get_spec(kind).folder).name
    if not folder.is_dir():
        raise AssessmentError(f"el laboratorio {kind!r} no tiene evaluación en {folder}")
    assessment = load_assessment(folder)
    if assessment.kind != kind:
        raise AssessmentError(f"{folder / 'rubric.json'} es del laboratorio {assessment.kind!r}, "
                              f"no de {kind!r}")
    return assessment


def available_kinds(assessments_dir: str | Path | None = None) -> list[str]:
    root = Path(assessments_dir) if assessments_dir else default_assessments_dir()
    kinds = []
    for path in sorted(root.glob("*/rubric.json")):
        kinds.append(json.loads(path.read_text(encoding="utf-8"))["kind"])
    return kinds
