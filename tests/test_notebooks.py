"""Lab notebooks: the solution runs under `ci` and passes nbval; the student copy is current and
points Colab at the configured repository. The student copy's execution (it stops at its first
exercise with a Spanish hint) runs from the installed wheel, outside the repository: see
tests/test_install.py."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import jupytext
import nbformat
import pytest

from ai_evolution import claims

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import make_student  # noqa: E402

SOLUTIONS = sorted((ROOT / "labs").glob("*/notebook_solution.md"))
IDS = [p.parent.name for p in SOLUTIONS]


def test_every_lab_has_a_solution_notebook():
    assert SOLUTIONS, "no labs/*/notebook_solution.md found"


@pytest.mark.parametrize("solution", SOLUTIONS, ids=IDS)
def test_committed_student_notebook_is_up_to_date(solution):
    proc = subprocess.run([sys.executable, str(ROOT / "scripts/make_student.py"), "--check",
                           str(solution)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("solution", SOLUTIONS, ids=IDS)
def test_paired_ipynb_matches_its_myst_source(solution):
    source = jupytext.read(solution)
    paired = nbformat.read(solution.with_suffix(".ipynb"), as_version=4)
    assert [(c.cell_type, c.source) for c in source.cells] == \
        [(c.cell_type, c.source) for c in paired.cells], "run `make sync`"


@pytest.mark.parametrize("solution", SOLUTIONS, ids=IDS)
def test_notebook_starts_with_colab_install_and_parameters(solution):
    url = make_student.repository_url()
    code = [c for c in jupytext.read(solution).cells if c.cell_type == "code"]
    assert f"git+{url}" in code[0].source and make_student.INSTALL_MARKER in code[0].source
    assert "parameters" in code[1].metadata.get("tags", [])
    assert "seed =" in code[1].source and "profile = None" in code[1].source


def test_strip_solution_keeps_indentation_and_hint():
    src = "def f(x):\n    # BEGIN SOLUTION\n    # PISTA: sume uno.\n    return x + 1\n    # END SOLUTION\n"
    out, found = make_student.strip_solution(src, "prueba")
    assert found
    assert out == 'def f(x):\n    raise NotImplementedError("Ejercicio sin resolver. sume uno.")\n'


@pytest.mark.parametrize("src", ["# BEGIN SOLUTION\n# PISTA: x\nx = 1\n",
                                 "x = 1\n# END SOLUTION\n",
                                 "# BEGIN SOLUTION\nx = 1\n# END SOLUTION\n"])
def test_malformed_solution_markup_is_rejected(src):
    with pytest.raises(make_student.SolutionMarkupError):
        make_student.strip_solution(src, "prueba")


def test_install_line_follows_the_configured_url():
    line = '    %pip install -q "git+https://example.org/old/repo" # colab-install'
    assert make_student.install_source(line, "https://github.com/a/b") == \
        '    %pip install -q "git+https://github.com/a/b" # colab-install'


def _glued_texts(nb) -> dict[str, str]:
    """The strings a notebook glued (myst-nb's ``glue(key, text, display=False)``), by key."""
    found = {}
    for cell in nb.cells:
        for out in cell.get("outputs", []) if cell.cell_type == "code" else []:
            key = out.get("metadata", {}).get("scrapbook", {}).get("name")
            value = out.get("data", {}).get("application/papermill.record/text/plain")
            if key and value and value[:1] in "'\"":
                found[key] = ast.literal_eval(value)
    return found


def _printed_contract(nb) -> dict:
    """The contract the notebook printed with ``print(to_json(contract))``."""
    cell = next(c for c in nb.cells if c.cell_type == "code" and "print(to_json(contract))" in c.source)
    return json.loads("".join(o.get("text", "") for o in cell.outputs if o.get("output_type") == "stream"))


def _glue_file_texts(path: Path) -> dict[str, str]:
    """The glued strings myst-nb stored beside an executed page (``<page>.glue.json``)."""
    data = json.loads(path.read_text(encoding="utf-8"))
    return {key: ast.literal_eval(out["data"]["text/plain"]) for key, out in data.items()
            if out.get("data", {}).get("text/plain", "")[:1] in "'\""}


def assert_page_agrees_with_its_contract(nb, glued: dict[str, str] | None = None) -> None:
    """One run per page: each verdict the page glues (keys ending in ``_verdict``) is a claim
    of the contract printed on the same page, and every claim there is what its own numbers give.
    ``glued``: the page's glued strings when they are not in ``nb``'s outputs (the book build
    moves them to ``<page>.glue.json``)."""
    contract = _printed_contract(nb)
    assert claims.recheck_contract(contract) == [], claims.recheck_contract(contract)
    statements = {item["statement"] for item in claims.claims_of(contract)}
    glued = _glued_texts(nb) if glued is None else glued
    verdicts = {k: v for k, v in glued.items() if k.endswith("_verdict")}
    for key, text in verdicts.items():
        assert text in statements, f"glued {key!r} is not a claim of this page's contract: {text!r}"
    if any(item.get("volatile") for item in claims.claims_of(contract)):
        assert verdicts, "the contract has measured claims but the page glues no `*_verdict`"


def _checked_outputs(nb) -> dict[str, list]:
    """The outputs nbval compares (cells tagged ``nbval-check-output``), by cell source: stream
    text joined per stream, and the text/plain of results and displays."""
    found = {}
    for cell in nb.cells:
        if cell.cell_type != "code" or "nbval-check-output" not in cell.metadata.get("tags", []):
            continue
        streams: dict[str, str] = {}
        data = []
        for out in cell.outputs:
            if out.get("output_type") == "stream":
                streams[out["name"]] = streams.get(out["name"], "") + out["text"]
            elif "data" in out and "text/plain" in out["data"]:
                data.append(out["data"]["text/plain"])
        found[cell.source] = [sorted(streams.items()), data]
    return found


def assert_checked_outputs_agree(reference, other) -> None:
    """nbval's comparison (the cells tagged ``nbval-check-output``) between two executions."""
    ref, got = _checked_outputs(reference), _checked_outputs(other)
    assert ref, "no cell is tagged nbval-check-output"
    for source, outputs in ref.items():
        assert source in got, f"the second execution has no checked cell {source[:80]!r}"
        assert got[source] == outputs, f"checked outputs differ in cell {source[:80]!r}"


def nbval_replay(reference: Path, executed: Path, cwd: Path) -> subprocess.CompletedProcess:
    """nbval (``--nbval-lax``: the cells tagged ``nbval-check-output``) on ``reference``, answered
    by ``executed``'s outputs instead of a kernel (tests/nbval_replay.py)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT / "tests"), *filter(None, [os.environ.get("PYTHONPATH")])]))
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-p", "nbval_replay", "--nbval-lax", "--nbval-current-env",
                           "--nbval-replay", str(executed), "--rootdir", str(cwd), str(reference)],
                          capture_output=True, text=True, cwd=cwd, env=env, timeout=300)


def unstored_checked_cells(paired) -> list[str]:
    """Checked cells of a committed paired notebook with no stored output to compare (nbval
    would skip them silently: it compares only cells with an execution count)."""
    return [c.source[:60] for c in paired.cells if c.cell_type == "code"
            and "nbval-check-output" in c.metadata.get("tags", [])
            and (c.execution_count is None or not c.outputs)]


@pytest.mark.parametrize("solution", SOLUTIONS, ids=IDS)
def test_solution_runs_under_ci_and_its_checked_outputs_are_reproducible(solution, built_book,
                                                                       tmp_path, request):
    # The only execution of the lab in the suite is the book build's (the page the reader sees,
    # `ci` profile, seed 0). nbval compares it with the outputs committed in the paired .ipynb
    # (`make outputs` stores them) without running it again.
    built = built_book["executed"] / solution.relative_to(ROOT).with_suffix(".ipynb")
    assert built.is_file(), (f"the book build left no executed {built.name} for {solution.parent.name} "
                             f"(build exit {built_book['returncode']}):\n{built_book['log'][-3000:]}")
    executed = nbformat.read(built, as_version=4)
    text = "\n".join(o.get("text", "") for c in executed.cells if c.cell_type == "code"
                     for o in c.outputs)
    assert "✘" not in text and text.count("✔") >= 3  # every lab has at least two checks and the challenge
    contract = _printed_contract(executed)
    assert (contract["profile"], contract["seed"]) == ("ci", 0)
    glue_file = built.with_suffix(".glue.json")
    assert glue_file.is_file(), f"the book build stored no glued values for {solution.parent.name}"
    assert_page_agrees_with_its_contract(executed, _glue_file_texts(glue_file))
    paired = solution.with_suffix(".ipynb")
    assert not unstored_checked_cells(nbformat.read(paired, as_version=4)), (
        f"{paired.relative_to(ROOT)}: checked cells without stored outputs "
        f"{unstored_checked_cells(nbformat.read(paired, as_version=4))}; run `make book && make outputs`")
    reference = tmp_path / "reference.ipynb"
    shutil.copyfile(paired, reference)
    proc = nbval_replay(reference, built, tmp_path)
    assert proc.returncode == 0, (f"{solution.parent.name}: checked outputs differ from the committed "
                                  f"ones (if the change is intended: `make book && make outputs`)\n"
                                  + proc.stdout[-4000:])
    if solution.parent == ROOT / "labs" / "02-kv-cache":
        # Lab 2 is also graded as a submission (the solution, seed 0, `ci`): the grader's
        # execution must give the same checked outputs as the book's.
        graded = request.getfixturevalue("graded_kv_cache")["out"] / "executed" / "solucion.ipynb"
        assert_checked_outputs_agree(executed, nbformat.read(graded, as_version=4))


def test_nbval_replay_fails_a_changed_checked_output_and_passes_an_equal_one(tmp_path):
    """The replay is nbval's own comparison: a checked cell whose output changed fails with
    nbval's message, an equal one passes, an unchecked cell is not compared."""
    def notebook(checked_text: str, other_text: str, stored: bool):
        cells = []
        for source, text, tags in (("print(1.5)", checked_text, ["nbval-check-output"]),
                                   ("print('t')", other_text, [])):
            cell = nbformat.v4.new_code_cell(source, execution_count=1 if stored else None)
            cell.metadata["tags"] = tags
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=text)] \
                if stored or tags == [] else []
            cells.append(cell)
        return nbformat.v4.new_notebook(cells=cells)

    reference = tmp_path / "reference.ipynb"
    nbformat.write(notebook("1,5\n", "", stored=True), reference)
    for name, checked_text, other_text, ok in (("same", "1,5\n", "12 s\n", True),
                                               ("changed", "1,6\n", "9 s\n", False)):
        executed = tmp_path / f"{name}.ipynb"
        nbformat.write(notebook(checked_text, other_text, stored=True), executed)
        proc = nbval_replay(reference, executed, tmp_path)
        assert (proc.returncode == 0) == ok, proc.stdout[-2000:]
        if not ok:
            assert "Cell outputs differ" in proc.stdout and "1,6" in proc.stdout
    unstored = notebook("", "", stored=False)
    assert unstored_checked_cells(unstored) == ["print(1.5)"]


def test_checked_output_comparison_finds_a_changed_output_or_a_missing_cell():
    def nb(text: str, tagged: bool = True):
        cell = nbformat.v4.new_code_cell("print(x)")
        cell.metadata["tags"] = ["nbval-check-output"] if tagged else []
        cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=text)]
        return nbformat.v4.new_notebook(cells=[cell])

    assert_checked_outputs_agree(nb("1,5\n"), nb("1,5\n"))
    with pytest.raises(AssertionError, match="differ"):
        assert_checked_outputs_agree(nb("1,5\n"), nb("1,6\n"))
    with pytest.raises(AssertionError, match="no checked cell"):
        assert_checked_outputs_agree(nb("1,5\n"), nb("1,5\n", tagged=False))
    with pytest.raises(AssertionError, match="no cell is tagged"):
        assert_checked_outputs_agree(nb("1,5\n", tagged=False), nb("1,5\n"))


# --- hints: what to compute and why, never the solution's code -----------------------------------

_STUB = re.compile(r'raise NotImplementedError\("((?:[^"\\]|\\.)*)"\)')
_CODE_LIKE = [(re.compile(r"\bself\."), "`self.`"),
              (re.compile(r"\[[^\]\s]*:[^\]]*\]"), "una rebanada `[…:…]`"),
              (re.compile(r"\s=\s"), "una asignación ` = `"),
              (re.compile(r"==|!=|<=|>=|//|\*\*|\+="), "un operador de Python")]
_TRIVIAL = {"else:", "try:", "returnNone", "continue", "break", "pass", "returnTrue",
            "returnFalse"}


def _solution_regions(solution: Path) -> list[list[str]]:
    """The code lines between the solution markers of every code cell, in notebook order."""
    regions = []
    for cell in jupytext.read(solution).cells:
        if cell.cell_type != "code":
            continue
        inside = None
        for line in cell.source.split("\n"):
            if line.strip() == make_student.BEGIN:
                inside = []
            elif line.strip() == make_student.END:
                regions.append(inside)
                inside = None
            elif inside is not None:
                inside.append(line)
    return regions


def _student_hints(solution: Path) -> list[str]:
    nb = nbformat.read(make_student.student_path(solution), as_version=4)
    return [m.group(1).replace('\\"', '"') for c in nb.cells if c.cell_type == "code"
            for m in _STUB.finditer(c.source)]


def _code_names(lines: list[str]) -> tuple[set[str], set[str]]:
    """Names the solution calls (``max``, ``np.percentile``) and dotted names it reads
    (``r.is_finished``, ``config.num_kv_heads``)."""
    source = textwrap.dedent("\n".join(ln for ln in lines if not ln.strip().startswith("#")))
    try:
        tree = ast.parse(source)
    except SyntaxError:  # a fragment that only parses in its cell: fall back to a regex
        return set(re.findall(r"([A-Za-z_][\w.]*)\(", source)), \
            set(re.findall(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+", source))

    def dotted(node) -> str | None:
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if isinstance(node, ast.Name):
            return ".".join([node.id, *reversed(parts)])
        return None

    calls = {d for n in ast.walk(tree) if isinstance(n, ast.Call) if (d := dotted(n.func))}
    attrs = {d for n in ast.walk(tree) if isinstance(n, ast.Attribute) if (d := dotted(n))}
    return calls, attrs


def hint_problems(hint: str, region: list[str], all_code: set[str]) -> list[str]:
    """Why a student hint hands over code: a solution line, a call of a name the solution
    calls, a dotted name it reads, or code-like syntax; and a hint that starts in lowercase."""
    problems = []
    text = hint.removeprefix("Ejercicio sin resolver.").strip()
    if text[:1] and not text[:1].isupper():
        problems.append(f"empieza en minúscula: {text[:40]!r}")
    squashed = re.sub(r"\s+", "", text)
    for line in sorted(all_code):
        if line in squashed:
            problems.append(f"contiene la línea de la solución {line!r}")
    calls, attrs = _code_names(region)
    for name in sorted(calls):
        if re.search(rf"(?<![\w.]){re.escape(name)}\(", text):
            problems.append(f"llama a {name}(…)")
    for name in sorted(a for a in attrs if a not in calls):
        if re.search(rf"(?<![\w.]){re.escape(name)}\b", text):
            problems.append(f"nombra el atributo {name}")
    for pattern, what in _CODE_LIKE:
        if pattern.search(text):
            problems.append(f"tiene {what}: {pattern.search(text).group(0)!r}")
    return problems


@pytest.mark.parametrize("solution", SOLUTIONS, ids=IDS)
def test_student_hints_say_what_to_compute_not_the_solution_code(solution):
    regions, hints = _solution_regions(solution), _student_hints(solution)
    assert len(regions) == len(hints) > 0, (len(regions), len(hints))
    all_code = {squashed for region in regions for line in region
                if not line.strip().startswith("#")
                and len(squashed := re.sub(r"\s+", "", line)) >= 12 and squashed not in _TRIVIAL}
    found = {i + 1: p for i, (hint, region) in enumerate(zip(hints, regions))
             if (p := hint_problems(hint, region, all_code))}
    assert not found, f"{solution.parent.name}: pistas con código (ejercicio: problemas): {found}"


def test_hint_scan_flags_code_and_accepts_words():
    region = ["    retire = [r for r in running if r.is_finished]",
              "    return BatchPlan(retire=retire, admit=list(waiting[:free]))"]
    code = {re.sub(r"\s+", "", ln) for ln in region}
    assert hint_problems("Ejercicio sin resolver. Libere la fila de cada petición que terminó "
                         "y llene las libres con las primeras de la cola.", region, code) == []
    for bad in ("Ejercicio sin resolver. Retire las de running con r.is_finished.",
                "Ejercicio sin resolver. Admita waiting[:libres].",
                "Ejercicio sin resolver. Use BatchPlan(retire, admit).",
                "Ejercicio sin resolver. retire las terminadas.",
                "Ejercicio sin resolver. Haga retire = [r for r in running if r.is_finished]",
                "Ejercicio sin resolver. Saque con self._free.popitem(last=False)."):
        assert hint_problems(bad, region, code), bad
