"""The library the function worker imports: a copy of ``ai_evolution`` without the answers.

:func:`build` copies the package and, in the copy, replaces by ``raise NotImplementedError(...)``,
at the AST level, where it is *defined*, the body of

- every function and class of :mod:`ai_evolution.reference`, the package of reference answers
  (every lab's: none of them is the library a student's code may use), and
- every graded reference of the lab that lives elsewhere in the library (``reference`` and
  ``delegates`` of each function criterion of ``rubric.json``, such as the engine's
  ``BlockPool``; for a class exercise, its graded ``methods``).

Every re-export and alias (``from .memory import kv_bytes_per_token``, ``getattr(module,
"name")``, ``torch.sys.modules[...]``, ``functools.reduce(getattr, ...)``) then reaches the
stub: there is nothing to delegate to. The modules stay importable (the labs import their
references).

The copy is written before any untrusted process starts and bound read-only in bubblewrap.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import shutil
from pathlib import Path

from .assessment import Assessment, AssessmentError

PACKAGE_DIR = Path(__file__).resolve().parents[1]
REFERENCE_PACKAGE = "ai_evolution.reference"


def _stub_body(name: str) -> list[ast.stmt]:
    text = (f"`{name}` no está disponible en el corrector: un ejercicio se puntúa por el "
            "código que usted escribe.")
    return [ast.Raise(exc=ast.Call(func=ast.Name("NotImplementedError", ast.Load()),
                                   args=[ast.Constant(text)], keywords=[]), cause=None)]


def targets(assessment: Assessment) -> dict[str, set[str]]:
    """``{defining module: {qualified names to strip}}`` for the lab's graded references."""
    out: dict[str, set[str]] = {}
    for c in assessment.functions:
        for ref in (c.reference, *c.delegates):
            module, _, attr = ref.partition(":")
            obj = importlib.import_module(module)
            for part in attr.split("."):
                obj = getattr(obj, part)
            if isinstance(obj, type):
                names = [f"{obj.__qualname__}.{m}" for m in c.methods if m in vars(obj)]
                owner = obj.__module__
            else:
                obj = inspect.unwrap(obj)
                names = [getattr(obj, "__qualname__", attr.split(".")[-1])]
                owner = getattr(obj, "__module__", module)
            out.setdefault(owner, set()).update(names)
    return out


def reference_targets() -> dict[str, set[str]]:
    """``{module: {names}}``: every top-level function and class of the reference package."""
    out: dict[str, set[str]] = {}
    for path in sorted((PACKAGE_DIR / "reference").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = {n.name for n in tree.body
                 if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
        if names:
            module = REFERENCE_PACKAGE if path.stem == "__init__" else \
                f"{REFERENCE_PACKAGE}.{path.stem}"
            out[module] = names
    return out


def _merge(*parts: dict[str, set[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for part in parts:
        for module, names in part.items():
            out.setdefault(module, set()).update(names)
    return out


class _Strip(ast.NodeTransformer):
    def __init__(self, names: set[str]):
        self.names = names
        self.found: set[str] = set()
        self.scope: list[str] = []

    def _qual(self, name: str) -> str:
        return ".".join([*self.scope, name])

    def visit_ClassDef(self, node: ast.ClassDef):
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()
        qual = self._qual(node.name)
        if qual in self.names:
            self.found.add(qual)
            node.body = [ast.FunctionDef(
                name="__init__", args=ast.arguments(posonlyargs=[], args=[ast.arg("self")],
                                                    vararg=ast.arg("args"), kwonlyargs=[],
                                                    kw_defaults=[], kwarg=ast.arg("kwargs"),
                                                    defaults=[]),
                body=_stub_body(qual), decorator_list=[], returns=None)]
        return node

    def _function(self, node):
        qual = self._qual(node.name)
        if qual in self.names:
            self.found.add(qual)
            node.body = _stub_body(qual)
            return node
        self.scope.append(node.name)
        self.scope.append("<locals>")
        self.generic_visit(node)
        self.scope.pop()
        self.scope.pop()
        return node

    visit_FunctionDef = _function
    visit_AsyncFunctionDef = _function


def strip_source(source: str, names: set[str], where: str = "?") -> str:
    """``source`` with the bodies of ``names`` (qualified names) replaced by the stub."""
    tree = ast.parse(source)
    strip = _Strip(names)
    tree = strip.visit(tree)
    missing = names - strip.found
    if missing:
        raise AssessmentError(f"{where}: no se encontró la definición de "
                              f"{', '.join(sorted(missing))} para quitarla de la copia del "
                              "corrector")
    return ast.unparse(ast.fix_missing_locations(tree)) + "\n"


def build(assessment: Assessment, dest: Path) -> Path:
    """Write the stripped copy of the package under ``dest`` (``dest/ai_evolution``); return
    ``dest``, the folder to put first on the worker's ``sys.path``."""
    dest = Path(dest)
    root = dest / "ai_evolution"
    shutil.copytree(PACKAGE_DIR, root, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for module, names in sorted(_merge(targets(assessment), reference_targets()).items()):
        if not (module == "ai_evolution" or module.startswith("ai_evolution.")):
            raise AssessmentError(f"la referencia {module} no es parte de la biblioteca")
        rel = Path(*module.split(".")[1:])
        path = root / rel / "__init__.py" if (root / rel).is_dir() else \
            root / rel.with_suffix(".py")
        path.write_text(strip_source(path.read_text(encoding="utf-8"), names, str(path)),
                        encoding="utf-8")
    return dest
