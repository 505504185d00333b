"""Rebuild a student's exercise functions from the submitted notebook, outside its kernel.

The grader never trusts the kernel that ran the notebook. It reads the submitted ``.ipynb``
itself and keeps, from every code cell (in order), the statements that *define* something:
imports, ``def``, ``class`` and assignments whose value is a plain expression (no calls beyond
a few pure built-ins). Experiments, prints and self-checks are left out. The function worker
(:mod:`.worker`, jailed) executes those statements, one by one, on top of the lab's trusted setup
(the import lines of the solution's first cell after ``parameters``, plus ``seed``, ``profile
= "ci"`` and ``params``); the checker (:mod:`.checker`) grades them from another process.

Before anything runs, each kept statement is screened (:func:`screen`): code that imports
modules outside :data:`ALLOWED_IMPORTS`, reaches into interpreter internals (frames, dunder
attributes, ``globals``, ``eval``...), writes files, or assigns attributes of imported modules
or library classes is not executed, and a graded name defined by such a statement scores 0.
The screen keeps exercise code to what an exercise needs; it is not the defence (whatever passes
it runs in the jailed worker, which holds nothing to attack).

Also here, all static (no execution):

- :func:`parameter_rebinds`: cells that rebind ``seed`` or ``profile`` after the injected
  parameters (the contract would not be the run the grader asked for);
- :func:`kernel_tampering`: cells that change how the kernel reports errors (``runs`` would
  not mean "ran without errors").

Whether a rebuilt object delegates to the library's reference is :mod:`.delegation`'s question.
"""

from __future__ import annotations

import ast
import functools
import re
import types
from dataclasses import dataclass, field
from typing import Any

from .notebook import GRADING_TAG

CELL_FILENAME = "<celda {n}>"  # co_filename of everything the checker compiles from a submission

ALLOWED_IMPORTS = frozenset({
    "__future__", "abc", "ai_evolution", "bisect", "cmath", "collections", "contextlib", "copy",
    "dataclasses", "decimal", "enum", "fractions", "functools", "heapq", "itertools", "math",
    "numbers", "numpy", "operator", "random", "re", "statistics", "string", "time", "torch",
    "typing", "warnings"})
# The grader, its checks and the reference answers: never imported by a submission.
DENIED_LIBRARY = ("ai_evolution.grading", "ai_evolution.checks", "ai_evolution.reference")
DENIED_NAMES = frozenset({
    "__import__", "__builtins__", "__loader__", "__spec__", "breakpoint", "compile", "delattr",
    "eval", "exec", "exit", "globals", "help", "input", "locals", "memoryview", "open", "quit",
    "setattr", "vars"})
ALLOWED_DUNDERS = frozenset({
    "__init__", "__name__", "__doc__", "__len__", "__iter__", "__next__", "__getitem__",
    "__setitem__", "__contains__", "__eq__", "__hash__", "__repr__", "__str__", "__lt__",
    "__le__", "__gt__", "__ge__", "__post_init__"})
DENIED_ATTRIBUTES = frozenset({
    "f_back", "f_locals", "f_globals", "f_builtins", "f_code", "tb_frame", "tb_next", "gi_frame",
    "gi_code", "cr_frame", "ag_frame", "co_code", "ctypes", "ctypeslib", "cpp_extension",
    "load_inline", "save", "savetxt", "savez", "savez_compressed", "tofile", "load", "loadtxt",
    "fromfile", "memmap", "open_memmap", "genfromtxt", "system", "popen"})
PURE_CALLS = frozenset({"int", "float", "str", "bool", "tuple", "list", "dict", "set",
                        "frozenset", "range", "len", "abs", "min", "max", "round", "sum", "sorted"})
# Top-level bindings of the injected parameters that a lab's own notebook makes.
ALLOWED_REBINDS = {"profile = resolve_profile(profile)"}
KERNEL_HOOKS = re.compile(r"\b(get_ipython|set_custom_exc|showtraceback|_showtraceback|excepthook|"
                          r"InteractiveShell|register_magic|IPKernelApp|ipykernel)\b")


@dataclass
class Statement:
    cell: int            # 1-based index among the submission's code cells
    source: str          # what the checker executes (ast.unparse of the statement)
    defines: list[str]   # names it binds at top level


@dataclass
class Rejected:
    cell: int
    defines: list[str]
    reason: str          # Spanish, for the feedback


@dataclass
class Extract:
    statements: list[Statement] = field(default_factory=list)
    rejected: list[Rejected] = field(default_factory=list)
    unparsable: list[int] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"statements": [vars(s) for s in self.statements],
                "rejected": [vars(r) for r in self.rejected], "unparsable": self.unparsable}


def code_cells(nb) -> list[tuple[int, Any]]:
    """(1-based code cell index, cell) of the submission's own code cells (not the grader's)."""
    out, n = [], 0
    for cell in nb.cells:
        if cell.cell_type != "code" or GRADING_TAG in cell.get("metadata", {}).get("tags", []):
            continue
        n += 1
        out.append((n, cell))
    return out


def python_source(source: str) -> str:
    """A cell's source as plain Python (IPython magics become calls, as in the kernel)."""
    try:
        from IPython.core.inputtransformer2 import TransformerManager

        return TransformerManager().transform_cell(source)
    except Exception:  # noqa: BLE001 - IPython missing or a cell it cannot transform
        return source


def _targets(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, (ast.Tuple, ast.List)):
        return [n for elt in node.elts for n in _targets(elt)]
    if isinstance(node, ast.Starred):
        return _targets(node.value)
    return []


def defines(stmt: ast.stmt) -> list[str]:
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [stmt.name]
    if isinstance(stmt, ast.Import):
        return [a.asname or a.name.split(".")[0] for a in stmt.names]
    if isinstance(stmt, ast.ImportFrom):
        return [a.asname or a.name for a in stmt.names if a.name != "*"]
    if isinstance(stmt, ast.Assign):
        return [n for t in stmt.targets for n in _targets(t)]
    if isinstance(stmt, ast.AnnAssign):
        return _targets(stmt.target)
    return []


def _plain_value(node: ast.AST | None) -> bool:
    """An assignment's value the checker may evaluate: no call beyond pure built-ins."""
    if node is None:
        return True
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call):
            if not (isinstance(sub.func, ast.Name) and sub.func.id in PURE_CALLS):
                return False
        if isinstance(sub, (ast.Await, ast.Yield, ast.YieldFrom, ast.NamedExpr)):
            return False
    return True


def _is_definition(stmt: ast.stmt) -> bool:
    if isinstance(stmt, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef,
                         ast.ClassDef)):
        return True
    if isinstance(stmt, ast.Assign):
        return bool(defines(stmt)) and all(_targets(t) for t in stmt.targets) and \
            _plain_value(stmt.value)
    if isinstance(stmt, ast.AnnAssign):
        return isinstance(stmt.target, ast.Name) and _plain_value(stmt.value)
    return False


def _module_of_import(stmt: ast.stmt) -> list[str]:
    if isinstance(stmt, ast.Import):
        return [a.name for a in stmt.names]
    if isinstance(stmt, ast.ImportFrom):
        if stmt.level:
            return ["." * stmt.level + (stmt.module or "")]
        return [stmt.module or ""] + [f"{stmt.module}.{a.name}" for a in stmt.names]
    return []


def import_problem(module: str) -> str | None:
    root = module.split(".")[0]
    if module.startswith("."):
        return f"importa `{module}` (un import relativo)"
    if root not in ALLOWED_IMPORTS:
        return f"importa `{module}`"
    if any(module == d or module.startswith(d + ".") for d in DENIED_LIBRARY):
        return f"importa `{module}`, que es parte del corrector"
    return None


class _Screen(ast.NodeVisitor):
    def __init__(self, imported: set[str]):
        self.imported = imported  # names bound by imports (modules and library objects)
        self.problems: list[str] = []

    def add(self, text: str) -> None:
        if text not in self.problems:
            self.problems.append(text)

    def visit_Import(self, node):
        for module in _module_of_import(node):
            if (p := import_problem(module)):
                self.add(p)

    def visit_ImportFrom(self, node):
        if any(a.name == "*" for a in node.names):
            self.add(f"importa todo (`*`) de `{node.module}`")
        modules = _module_of_import(node)
        if (p := import_problem(modules[0])):
            self.add(p)
        for module in modules[1:]:  # `from ai_evolution import grading`
            if any(module == d for d in DENIED_LIBRARY):
                self.add(f"importa `{module}`, que es parte del corrector")

    def visit_Name(self, node):
        if node.id in DENIED_NAMES:
            self.add(f"usa `{node.id}`")
        self.generic_visit(node)

    def visit_Attribute(self, node):
        attr = node.attr
        if attr.startswith("__") and attr.endswith("__") and attr not in ALLOWED_DUNDERS:
            self.add(f"accede a `{attr}`")
        elif attr in DENIED_ATTRIBUTES:
            self.add(f"usa `.{attr}`")
        elif attr.startswith("_") and _root(node) in self.imported:
            self.add(f"accede a `{_dotted(node)}`, interno de un módulo")
        if isinstance(node.ctx, (ast.Store, ast.Del)) and _root(node) in self.imported:
            self.add(f"modifica `{_dotted(node)}`")
        self.generic_visit(node)

    def visit_Call(self, node):
        func = node.func
        if isinstance(func, ast.Name) and func.id == "getattr":
            if len(node.args) < 2 or not isinstance(node.args[1], ast.Constant) or \
                    not isinstance(node.args[1].value, str) or node.args[1].value.startswith("_"):
                self.add("usa `getattr` con un nombre calculado o interno")
        if isinstance(func, ast.Name) and func.id == "type" and len(node.args) == 3:
            self.add("crea una clase con `type(nombre, bases, dict)`")
        self.generic_visit(node)

    def visit_Global(self, node):
        for name in node.names:
            if name in ("seed", "profile"):
                self.add(f"declara `global {name}`")

    def visit_Constant(self, node):
        if isinstance(node.value, str) and "/proc/" in node.value:
            self.add("nombra una ruta de `/proc`")


def _root(node: ast.AST) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.value if not isinstance(node, ast.Call) else node.func
    return node.id if isinstance(node, ast.Name) else None


def _dotted(node: ast.AST) -> str:
    try:
        return ast.unparse(node)
    except Exception:  # noqa: BLE001
        return getattr(node, "attr", "?")


def screen(stmt: ast.stmt, imported: set[str]) -> list[str]:
    """Why ``stmt`` may not run in the checker (empty list: it may)."""
    visitor = _Screen(imported)
    visitor.visit(stmt)
    return visitor.problems


def setup_imports(setup_source: str) -> list[str]:
    """The import statements of the lab's trusted setup cell, minus the grader's own modules."""
    out = []
    for stmt in ast.parse(python_source(setup_source)).body:
        if isinstance(stmt, (ast.Import, ast.ImportFrom)) and not any(
                import_problem(m) for m in _module_of_import(stmt)[:1]):
            out.append(ast.unparse(stmt))
    return out


def extract(nb, setup_names: set[str] = frozenset()) -> Extract:
    """The definition statements of every code cell (except the parameters cells), screened."""
    found = Extract()
    cells = code_cells(nb)
    imported = set(setup_names)
    parsed = []
    for n, cell in cells:
        tags = cell.get("metadata", {}).get("tags", [])
        if "parameters" in tags or "injected-parameters" in tags:
            continue
        try:
            tree = ast.parse(python_source(cell.source))
        except (SyntaxError, ValueError):
            found.unparsable.append(n)
            continue
        body = [s for s in tree.body if _is_definition(s)]
        for stmt in body:
            if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                imported.update(defines(stmt))
        parsed.append((n, body))
    for n, body in parsed:
        for stmt in body:
            problems = screen(stmt, imported)
            if problems:
                found.rejected.append(Rejected(n, defines(stmt), "; ".join(problems[:3])))
            else:
                found.statements.append(Statement(n, ast.unparse(stmt), defines(stmt)))
    return found


def _binds(stmt: ast.AST) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(stmt):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            out.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            out.update(a.asname or a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.Global):
            out.update(node.names)
    return out


def parameter_rebinds(nb) -> list[str]:
    """Cells after the parameters that rebind ``seed`` or ``profile`` (Spanish, one per cell)."""
    out = []
    for n, cell in code_cells(nb):
        tags = cell.get("metadata", {}).get("tags", [])
        if "parameters" in tags or "injected-parameters" in tags:
            continue
        source = python_source(cell.source)
        if re.search(r"\b(globals|locals|vars)\s*\(\s*\)\s*\[\s*['\"](seed|profile)['\"]", source):
            out.append(f"celda de código {n}: cambia `seed` o `profile` con globals()")
            continue
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError):
            continue
        for stmt in tree.body:
            if ast.unparse(stmt) in ALLOWED_REBINDS:
                continue
            hit = _binds(stmt) & {"seed", "profile"}
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                # Inside a function only `global seed` rebinds the notebook's parameter.
                hit = {name for node in ast.walk(stmt) if isinstance(node, ast.Global)
                       for name in node.names} & {"seed", "profile"}
                hit |= {stmt.name} & {"seed", "profile"}
            if hit:
                out.append(f"celda de código {n}: vuelve a asignar "
                           f"{' y '.join(f'`{h}`' for h in sorted(hit))}")
                break
    return out


def kernel_tampering(nb) -> list[str]:
    """Cells that touch the kernel's error reporting or its machinery (Spanish)."""
    out = []
    for n, cell in code_cells(nb):
        for line in cell.source.splitlines():
            m = KERNEL_HOOKS.search(line)
            if m:
                out.append(f"celda de código {n}: usa `{m.group(1)}` (toca el kernel de Jupyter)")
                break
    return out
