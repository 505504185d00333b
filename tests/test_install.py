"""The install path a Colab student takes, on the CPU and offline.

A Colab runtime already has torch (and an IPython kernel); the student opens
``labs/NN-name/notebook_student.ipynb`` alone, and its first cell runs
``%pip install -q "git+<repository>"`` when ``ai_evolution`` is not importable. Here, once per
module: the files a clone of the working tree holds are copied outside the repository, pip builds
the wheel from that copy (what ``pip install git+…`` does after cloning), a fresh venv gets torch
first and then ipykernel (Colab's pre-installed state), and the students' install cell runs in a
kernel of that venv with the wheel in place of the ``git+`` URL. Each lab's student notebook then
runs with papermill in that kernel, from an empty folder outside the repository.

The kernel logs every file it opens under the repository and under the installed package (audit
event ``open``): a lab must open nothing from the repository, and every package file it tries to
open must be one the wheel ships (a swallowed ``FileNotFoundError`` would otherwise go unseen).
The hook sees Python's opens only: files read by native code (safetensors weights, tokenizers'
``tokenizer.json``) are covered by the first test, which compares the wheel with every file of
the package in the tree.
"""

from __future__ import annotations

import email.parser
import json
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import nbformat
import papermill
import pytest
import torch
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import make_student  # noqa: E402


SOLUTIONS = sorted((ROOT / "labs").glob("*/notebook_solution.md"))
IDS = [p.parent.name for p in SOLUTIONS]
CONSTRAINTS = ROOT / "constraints.txt"
KERNEL = "colab-wheel"
# torch builds Colab runtimes have shipped (torch.__version__ on a GPU runtime), and Colab's Pythons.
COLAB_TORCH = ("2.5.1+cu121", "2.6.0+cu124", "2.8.0+cu126", "2.9.0+cu126")
COLAB_PYTHON = ("3.10.12", "3.11.13", "3.12.11")
# The `git+<url>` requirement of the install line (its URL comes from _config.yml).
_GIT_REQUIREMENT = re.compile(r'"git\+[^"]*"')

# An IPython kernel that appends to $AI_EVOLUTION_OPEN_LOG each distinct path it opens (or tries
# to open) under the folders in $AI_EVOLUTION_OPEN_WATCH. The log is opened before the hook is
# installed and written line-buffered, so logging opens nothing.
_LAUNCHER = '''\
import os
import sys

sys.path[:] = [p for p in sys.path if p not in ("", os.path.dirname(os.path.abspath(__file__)))]
_log = open(os.environ["AI_EVOLUTION_OPEN_LOG"], "a", encoding="utf-8", buffering=1)
_watched = tuple(os.environ["AI_EVOLUTION_OPEN_WATCH"].split(os.pathsep))
_seen = set()


def _hook(event, args):
    if event != "open" or not isinstance(args[0], (str, bytes, os.PathLike)):
        return
    path = os.path.abspath(os.fsdecode(args[0]))
    if path not in _seen and path.startswith(_watched):
        _seen.add(path)
        _log.write(path + "\\n")


sys.addaudithook(_hook)
from ipykernel import kernelapp  # noqa: E402

kernelapp.launch_new_instance()
'''


def tree_files(root: Path = ROOT) -> list[str]:
    """The files a clone of the working tree would hold: tracked and untracked-but-not-ignored
    (work not yet committed is part of the tree under test), minus deleted ones."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         cwd=root, capture_output=True, check=True).stdout.decode()
    return sorted(p for p in out.split("\0") if p and (root / p).is_file())


def _run(cmd: list, **kwargs) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kwargs)
    assert proc.returncode == 0, f"{cmd} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def preinstall(names: list[str], site: Path) -> list[str]:
    """Put the installed distributions ``names`` and everything they require (markers evaluated
    here, extras left out) into the site-packages folder ``site`` of another environment, as pip
    left them in this one: every file their RECORD lists under site-packages, hard-linked (copied
    across file systems), byte-compiled files included. It is the state of a runtime where they
    came preinstalled (Colab's torch and kernel), in seconds instead of pip unpacking a 750 MB
    wheel and every kernel compiling torch's modules again. Scripts outside site-packages (e.g.
    ``bin/torchrun``) are left out: their first line names this environment's interpreter.
    Returns the distributions linked."""
    from importlib import metadata

    from packaging.utils import canonicalize_name

    done: list[str] = []
    todo = list(names)
    while todo:
        name = canonicalize_name(Requirement(todo.pop()).name)
        if name in done:
            continue
        done.append(name)
        dist = metadata.distribution(name)
        for old in metadata.distributions(name=name, path=[str(site)]):
            # what the new environment came with (e.g. venv's setuptools), replaced as pip would
            for entry in old.files or []:
                Path(entry.locate()).unlink(missing_ok=True)
            shutil.rmtree(Path(old._path), ignore_errors=True)
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
        here = str(dist.locate_file(""))
        made: set[str] = set()
        for entry in dist.files or []:
            rel = str(entry)
            source = os.path.join(here, rel)
            if rel.startswith("..") or not os.path.isfile(source):
                continue
            target = os.path.join(site, rel)
            folder = os.path.dirname(target)
            if folder not in made:
                os.makedirs(folder, exist_ok=True)
                made.add(folder)
            try:
                os.link(source, target)
            except OSError:
                shutil.copy2(source, target)
    return done


_TORCH_STATE = '''\
import hashlib, importlib.metadata as md, os
d = md.distribution("torch")
rows = sorted((str(f), os.stat(f.locate()).st_ino, os.stat(f.locate()).st_mtime_ns)
              for f in d.files if os.path.isfile(f.locate()))
print(d.version, len(rows), hashlib.sha256(repr(rows).encode()).hexdigest())
'''


def torch_state(python: Path) -> dict:
    """The venv's torch: version, and the inode and mtime of every file its RECORD lists (a
    reinstall, even of the same version, writes new files)."""
    version, count, digest = _run([python, "-c", _TORCH_STATE]).stdout.split()
    return {"version": version, "files": int(count), "digest": digest}


def student_install_cell() -> str:
    """The students' first code cell (one text in every lab; test_notebooks checks its URL)."""
    cells = {next(c for c in nbformat.read(make_student.student_path(s), as_version=4).cells
                  if c.cell_type == "code").source for s in SOLUTIONS}
    assert len(cells) == 1, f"the labs' install cells differ: {cells}"
    return cells.pop()


class ColabKernel:
    """Papermill runs in a kernel of the fresh venv whose opens are logged (see ``_LAUNCHER``)."""

    def __init__(self, base: Path, python: Path, watched: list[Path]):
        self.python, self.jupyter = python, base / "jupyter"
        self.watched = os.pathsep.join(str(p) + os.sep for p in watched)
        spec = self.jupyter / "kernels" / KERNEL
        spec.mkdir(parents=True)
        launcher = base / "kernel_launcher.py"
        launcher.write_text(_LAUNCHER, encoding="utf-8")
        (spec / "kernel.json").write_text(json.dumps({
            "argv": [str(python), str(launcher), "-f", "{connection_file}"],
            "display_name": "Colab (ai_evolution wheel)", "language": "python"}), encoding="utf-8")

    def execute(self, nb_path: Path, out: Path, log: Path, **parameters) -> None:
        """Execute ``nb_path`` in its own folder; the kernel logs what it opens into ``log``."""
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("JUPYTER_PATH", str(self.jupyter))
            mp.setenv("AI_EVOLUTION_OPEN_LOG", str(log))
            mp.setenv("AI_EVOLUTION_OPEN_WATCH", self.watched)
            mp.setenv("PIP_CONSTRAINT", str(CONSTRAINTS))  # what a `%pip` in the kernel installs
            mp.delenv("PYTHONPATH", raising=False)
            papermill.execute_notebook(str(nb_path), str(out), parameters=parameters,
                                       cwd=str(nb_path.parent), kernel_name=KERNEL,
                                       progress_bar=False)


@pytest.fixture(scope="module")
def colab(tmp_path_factory):
    """The wheel of the working tree installed the way a Colab student installs it."""
    start = time.perf_counter()
    base = tmp_path_factory.mktemp("colab")
    assert not base.resolve().is_relative_to(ROOT)
    clone = base / "clone"
    for name in tree_files():
        (clone / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / name, clone / name)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    venv = base / "venv"
    _run([sys.executable, "-m", "venv", venv], env=env)
    python = venv / "bin" / "python"
    purelib = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                        env=env).stdout.strip())
    # Colab's torch (and kernel) are there before the student's first cell; ours are the test
    # process's, their installed files linked in (`preinstall`); the students' own install cell
    # below runs as written, with pip.
    preinstall(["torch", "ipykernel"], purelib)
    # `pip install git+<url>` clones and builds a wheel in an isolated build environment.
    wheels = base / "wheels"
    _run([python, "-m", "pip", "wheel", "-q", "--no-deps", "-w", wheels, clone], env=env)
    (wheel,) = wheels.glob("ai_evolution-*.whl")
    package = purelib / "ai_evolution"
    kernel = ColabKernel(base, python, [ROOT, package])
    torch_before = torch_state(python)
    cell, n = _GIT_REQUIREMENT.subn(f'"{wheel}"', student_install_cell())
    assert n == 1, cell
    install = base / "install"
    install.mkdir()
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(cell)]),
                   install / "install.ipynb")
    kernel.execute(install / "install.ipynb", install / "executed.ipynb", install / "opened.txt")
    setup_s = time.perf_counter() - start
    yield {"base": base, "python": python, "package": package, "wheel": wheel, "kernel": kernel,
           "torch_before": torch_before, "torch_after": torch_state(python), "env": env,
           "install_cell": cell, "installed": nbformat.read(install / "executed.ipynb", as_version=4),
           "setup_s": setup_s}


def _wheel_metadata(wheel: Path):
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        return email.parser.Parser().parsestr(z.read(name).decode())


def test_wheel_ships_every_file_of_the_package_and_nothing_else(colab):
    with zipfile.ZipFile(colab["wheel"]) as z:
        shipped = {n for n in z.namelist() if not n.split("/")[0].endswith(".dist-info")}
    in_tree = {n for n in tree_files() if n.startswith("ai_evolution/")}
    assert any(n.endswith(".safetensors") for n in in_tree)  # the shipped models are in the tree
    assert in_tree - shipped == set(), "package files the wheel leaves out (pyproject package-data)"
    assert shipped - in_tree == set(), "wheel files that are not the package's files in the tree"


def test_wheel_requirements_accept_the_torch_and_python_colab_has(colab):
    meta = _wheel_metadata(colab["wheel"])
    (torch_req,) = [r for r in map(Requirement, meta.get_all("Requires-Dist")) if r.name == "torch"]
    assert torch_req.marker is None
    for version in (*COLAB_TORCH, torch.__version__):
        assert torch_req.specifier.contains(version), f"{torch_req} rejects Colab's torch {version}"
    python = SpecifierSet(meta["Requires-Python"])
    for version in COLAB_PYTHON:
        assert python.contains(version), f"Requires-Python {python} rejects Colab's {version}"


def test_install_cell_installs_the_wheel_and_keeps_the_preinstalled_torch(colab):
    assert "%pip install" in colab["install_cell"] and str(colab["wheel"]) in colab["install_cell"]
    before, after = colab["torch_before"], colab["torch_after"]
    assert before["version"] == torch.__version__ and before["files"] > 1000
    assert after == before, "the install cell replaced or reinstalled torch"
    (cell,) = colab["installed"].cells
    printed = "".join(o.get("text", "") for o in cell.outputs)
    assert "ERROR" not in printed and not [o for o in cell.outputs if o.output_type == "error"]
    outside = colab["base"] / "install"
    found = _run([colab["python"], "-c", "import ai_evolution; print(ai_evolution.__file__)"],
                 cwd=outside, env=colab["env"]).stdout.strip()
    assert Path(found) == colab["package"] / "__init__.py"
    _run([colab["python"], "-m", "pip", "check"], env=colab["env"])


@pytest.mark.parametrize("solution", SOLUTIONS, ids=IDS)
def test_student_notebook_stops_at_first_exercise_with_spanish_hint(solution, colab, tmp_path):
    """The student notebook, alone in an empty folder outside the repository, run by papermill in
    the fresh venv's kernel: it stops at the check of its first exercise with the Spanish hint."""
    folder = tmp_path / solution.parent.name
    folder.mkdir()
    student = folder / "notebook_student.ipynb"
    shutil.copyfile(make_student.student_path(solution), student)
    nb = nbformat.read(student, as_version=4)
    first_exercise = next(i for i, c in enumerate(nb.cells)
                          if "exercise" in c.metadata.get("tags", []))
    with pytest.raises(papermill.PapermillExecutionError) as err:
        colab["kernel"].execute(student, tmp_path / "student.ipynb", tmp_path / "opened.txt",
                                seed=0, profile="ci")
    assert err.value.ename == "NotImplementedError"
    assert "Ejercicio sin resolver" in err.value.evalue and "PISTA" not in err.value.evalue
    executed = nbformat.read(tmp_path / "student.ipynb", as_version=4)
    failed = next(c for c in executed.cells
                  if any(o.get("output_type") == "error" for o in c.get("outputs", [])))
    # The first exercise only defines its function, so the error comes from the next code cell,
    # the one that checks it (papermill adds cells, so match by source, not by index).
    check_cell = next(c for c in nb.cells[first_exercise + 1:] if c.cell_type == "code")
    assert failed.source == check_cell.source
    stub = nb.cells[first_exercise].source
    hint = stub.split('raise NotImplementedError("')[1].split('")')[0]
    assert hint == err.value.evalue
    # The install cell found the installed package and ran no pip (no network under papermill):
    # a `%pip install git+…` would print, and fail, offline.
    install = next(c for c in executed.cells if c.cell_type == "code"
                   and make_student.INSTALL_MARKER in c.source)
    assert install.outputs == []
    opened = (tmp_path / "opened.txt").read_text(encoding="utf-8").split()
    package = str(colab["package"]) + os.sep
    assert not [p for p in opened if p.startswith(str(ROOT) + os.sep)], "opened from the repository"
    assert any(p.startswith(package) for p in opened), "ai_evolution was not imported from the wheel"
    with zipfile.ZipFile(colab["wheel"]) as z:
        shipped = set(z.namelist())
    wanted = {"ai_evolution/" + p[len(package):] for p in opened
              if p.startswith(package) and "__pycache__" not in p and not p.endswith(".py")}
    assert wanted <= shipped, f"package files the lab tried to open that the wheel lacks: {wanted - shipped}"
