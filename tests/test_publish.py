"""Publishing a term (book/instructor-guide.md, "Publicar el curso para un cuatrimestre").

- One place: ``repository.url`` and ``repository.version`` of ``_config.yml`` (``_ext/course.py``)
  make every install cell (``make student``) and every Colab button and GitHub link; bad values
  stop ``make student`` and the build with Spanish messages. A new instructor's values, put in a
  copy of the config, reach every notebook and every lab-page link, without building the book.
- ``make release VERSION=...``, run in a throwaway git repository: it refuses a dirty tree, a
  failing test command, a bad version and an existing tag; otherwise it writes the version
  everywhere, commits and tags.
- The Pages workflow calls the README's ``make book`` and deploys ``_build/html``; the citation
  file, the licences and the footer of every built page agree with the package version.
"""

from __future__ import annotations

import datetime
import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import nbformat
import pytest
import yaml
from docutils import nodes

import ai_evolution

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import make_student  # noqa: E402
import release  # noqa: E402
import course as course_ext  # noqa: E402  (_ext/course.py, on the path make_student sets)
from course import CourseSettingError, check_repository_url, check_version, read_course  # noqa: E402

SOLUTIONS = sorted((ROOT / "labs").glob("*/notebook_solution.md"))
NEW_URL, NEW_VERSION = "https://github.com/profe-ejemplo/llm-2027", "v2027.2"


def _module(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _set_course(config_text: str, url: str, version: str) -> str:
    """``_config.yml`` with its two values changed, as an instructor edits them by hand."""
    text, n_url = re.subn(r"(?m)^(  url: &repo_url ).*$", lambda m: m.group(1) + url, config_text)
    text, n_version = re.subn(r"(?m)^(  version: &course_version ).*$",
                              lambda m: m.group(1) + version, text)
    assert n_url == n_version == 1, "_config.yml no longer has the two lines the guide names"
    return text


def _copy(files, dest: Path) -> None:
    for rel in files:
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, target)


def _install_lines(text: str) -> list[str]:
    return [ln for ln in text.split("\n") if make_student.INSTALL_MARKER in ln]


# --- one place, checked -------------------------------------------------------------------------
def test_the_repository_settings_are_valid_and_the_theme_reads_the_same_version():
    course = read_course(ROOT)
    repo = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))["repository"]
    assert repo["branch"] == repo["version"] == course.version
    assert make_student.install_requirement() == f"{course.repository_url}@{course.version}"


@pytest.mark.parametrize("url", [
    "https://gitlab.com/profe/curso", "github.com/profe/curso", "http://github.com/profe/curso",
    "https://github.com/profe/curso.git", "https://github.com/profe/curso/tree/main",
    "https://github.com/profe", "", None])
def test_a_url_that_is_not_a_github_repository_is_refused_in_spanish(url):
    with pytest.raises(CourseSettingError, match="repositorio de GitHub") as err:
        check_repository_url(url)
    assert repr(url) in str(err.value) and "https://github.com/USUARIO/REPOSITORIO" in str(err.value)


@pytest.mark.parametrize("version", ["", "v 2027", "../main", "v2027..1", "v2027.lock", "-rc",
                                     "v2027.1/", "ramas;rm", 2027.1, None, "x" * 101])
def test_a_version_that_is_not_a_tag_or_commit_is_refused_in_spanish(version):
    with pytest.raises(CourseSettingError, match="etiqueta de git") as err:
        check_version(version)
    assert repr(version)[:60] in str(err.value)


@pytest.mark.parametrize("version", ["v2027.1", "2027.1-primavera", "main", "cursos/2027",
                                     "0123abc", "0123456789abcdef0123456789abcdef01234567"])
def test_tags_branches_and_commits_are_accepted(version):
    assert check_version(version) == version


def test_bad_values_stop_make_student_and_the_build_with_the_message(tmp_path, capsys):
    config = (ROOT / "_config.yml").read_text(encoding="utf-8")
    (tmp_path / "_config.yml").write_text(_set_course(config, "https://gitlab.com/profe/curso",
                                                      "v2027.1"), encoding="utf-8")
    assert make_student.main(["--root", str(tmp_path)]) == 2
    assert "repository.url en _config.yml debe ser la URL de un repositorio de GitHub" in \
        capsys.readouterr().err
    # the same value stops the build when it starts (Sphinx's ConfigError, before any page)
    from sphinx.errors import ConfigError

    app = SimpleNamespace(srcdir=str(tmp_path))
    with pytest.raises(ConfigError, match="repositorio de GitHub"):
        course_ext._config_inited(app, SimpleNamespace(html_theme_options={}))
    # a branch that is not the version (the theme's buttons would open other notebooks)
    (tmp_path / "_config.yml").write_text(config.replace("  branch: *course_version",
                                                         "  branch: main-antiguo"), encoding="utf-8")
    with pytest.raises(ConfigError, match="repository.branch"):
        course_ext._config_inited(app, SimpleNamespace(html_theme_options={}))


def test_a_new_instructor_changes_one_value_and_every_install_cell_and_link_follows(tmp_path):
    """The instructor's two values, in a copy of the config: ``make student`` rewrites every
    install cell (solution source, its paired .ipynb, the student notebook) and the lab pages'
    links and the theme's Colab buttons all open that repository at that version."""
    labs = [p.relative_to(ROOT) for md in SOLUTIONS
            for p in (md, md.with_suffix(".ipynb"), make_student.student_path(md))]
    _copy(labs + [Path("jupytext.toml")], tmp_path)
    config = _set_course((ROOT / "_config.yml").read_text(encoding="utf-8"), NEW_URL, NEW_VERSION)
    (tmp_path / "_config.yml").write_text(config, encoding="utf-8")

    assert make_student.main(["--root", str(tmp_path)]) == 0
    assert make_student.main(["--check", "--root", str(tmp_path)]) == 0
    want = f'"git+{NEW_URL}@{NEW_VERSION}"'
    for rel in labs:
        path = tmp_path / rel
        if path.suffix == ".md":
            sources = [path.read_text(encoding="utf-8")]
        else:
            sources = [c.source for c in nbformat.read(path, as_version=4).cells]
        lines = [ln for s in sources for ln in _install_lines(s)]
        assert len(lines) == 1 and want in lines[0], (rel, lines)
        assert "ai-evolution/servir-un-llm" not in "\n".join(sources), rel

    # the links, from html_theme_options as Jupyter Book derives them from this config
    from jupyter_book.config import yaml_to_sphinx

    options = yaml_to_sphinx(yaml.safe_load(config))[0]["html_theme_options"]
    assert options["repository_url"] == NEW_URL and options["repository_branch"] == NEW_VERSION
    pages = _module("lab_pages", ROOT / "_ext" / "lab_pages.py")
    for md in SOLUTIONS:
        student = pages.student_path(tmp_path / md.relative_to(ROOT), tmp_path)
        refs = [r["refuri"] for r in pages.student_box(options, student).findall(nodes.reference)]
        assert refs == [f"{NEW_URL}/blob/{NEW_VERSION}/{student}",
                        f"https://colab.research.google.com/github/profe-ejemplo/llm-2027/blob/"
                        f"{NEW_VERSION}/{student}"]
    footer = course_ext.footer_html(read_course(tmp_path), datetime.date(2027, 3, 1))
    assert f"{NEW_URL}/tree/{NEW_VERSION}" in footer and "2027-03-01" in footer


# --- make release -------------------------------------------------------------------------------
def _throwaway_repository(tmp_path: Path) -> Path:
    """What the release touches, committed in a fresh git repository of its own."""
    repo = tmp_path / "curso"
    files = [Path(p) for p in ("Makefile", ".gitignore", "_config.yml", "jupytext.toml",
                               "pyproject.toml", "CITATION.cff", "ai_evolution/__init__.py", "scripts/release.py",
                               "scripts/make_student.py", "_ext/course.py")]
    files += [p.relative_to(ROOT) for md in SOLUTIONS
              for p in (md, md.with_suffix(".ipynb"), make_student.student_path(md))]
    _copy(files, repo)
    for args in (["init", "-q", "-b", "main"], ["config", "user.email", "profe@example.org"],
                 ["config", "user.name", "Profe"], ["add", "-A"], ["commit", "-q", "-m", "base"]):
        subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)
    return repo


def _make_release(repo: Path, version: str, test: str) -> subprocess.CompletedProcess:
    """`make release` with this interpreter's venv; `-o` keeps make from ever reinstalling it."""
    venv = Path(sys.prefix)
    return subprocess.run(["make", "-o", f"{venv}/.installed", "release", f"VERSION={version}",
                           f"VENV={venv}", f"RELEASE_TEST={test}"],
                          cwd=repo, capture_output=True, text=True, timeout=600)


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True,
                          check=True).stdout.strip()


@pytest.mark.slow
def test_make_release_refuses_what_it_must_then_pins_and_tags(tmp_path):
    repo = _throwaway_repository(tmp_path)
    base = _git(repo, "rev-parse", "HEAD")

    proc = _make_release(repo, "otoño", "true")
    assert proc.returncode != 0 and "VERSION debe ser un número de versión" in proc.stderr
    (repo / "notas.txt").write_text("sin commit\n", encoding="utf-8")
    proc = _make_release(repo, "2027.1", "true")
    assert proc.returncode != 0 and "no está limpio" in proc.stderr and "notas.txt" in proc.stderr
    (repo / "notas.txt").unlink()
    proc = _make_release(repo, "2027.1", "false")
    assert proc.returncode != 0 and "las pruebas fallaron (false)" in proc.stderr
    assert _git(repo, "rev-parse", "HEAD") == base and not _git(repo, "tag", "--list")
    assert not _git(repo, "status", "--porcelain")  # refused before writing anything

    stamp = tmp_path / "tested"
    proc = _make_release(repo, "2027.1", f"touch {stamp}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert stamp.exists()  # the test command ran
    assert _git(repo, "tag", "--list") == "v2027.1"
    assert _git(repo, "rev-parse", "v2027.1^{commit}") == _git(repo, "rev-parse", "HEAD")
    assert _git(repo, "log", "-1", "--format=%s") == "Release v2027.1"
    assert not _git(repo, "status", "--porcelain")
    # what the tag holds
    init = _git(repo, "show", "v2027.1:ai_evolution/__init__.py")
    assert '__version__ = "2027.1"' in init
    assert yaml.safe_load(_git(repo, "show", "v2027.1:CITATION.cff"))["version"] == "2027.1"
    course = read_course(repo)
    assert course.version == "v2027.1"
    want = f'"git+{course.repository_url}@v2027.1"'
    for md in SOLUTIONS:
        lab = md.parent.relative_to(ROOT).as_posix()
        for name in ("notebook_solution.md", "notebook_solution.ipynb", "notebook_student.ipynb"):
            lines = _install_lines(_git(repo, "show", f"v2027.1:{lab}/{name}"))
            assert len(lines) == 1 and want.replace('"', '\\"' if name.endswith("ipynb") else '"') \
                in lines[0], (lab, name, lines)
    version = subprocess.run([sys.executable, "-c",
                              "import ai_evolution; print(ai_evolution.library_version())"],
                             cwd=repo, capture_output=True, text=True, check=True,
                             env={"PYTHONPATH": str(repo), "PATH": "/usr/bin:/bin"})
    assert version.stdout.strip() == "2027.1"
    # a published version never moves
    proc = _make_release(repo, "v2027.1", "true")
    assert proc.returncode != 0 and "ya existe" in proc.stderr


def test_release_versions_are_numbers_and_tags_get_a_v():
    assert release.parse_version("2027.1") == ("2027.1", "v2027.1")
    assert release.parse_version("v2027.1.0") == ("2027.1.0", "v2027.1.0")
    for bad in ("", "2027", "primavera", "2027.1-rc", "v", None):
        with pytest.raises(release.ReleaseError, match="VERSION debe ser"):
            release.parse_version(bad)


# --- publishing, citing, licences ---------------------------------------------------------------
def test_the_pages_workflow_runs_make_book_and_deploys_build_html():
    workflow = yaml.safe_load((ROOT / ".github/workflows/book.yml").read_text(encoding="utf-8"))
    triggers = workflow.get("on", workflow.get(True))  # YAML 1.1 reads a bare `on` as true
    assert "workflow_dispatch" in triggers and triggers["push"]["tags"] == ["v*"]
    assert workflow["permissions"] == {"contents": "read", "pages": "write", "id-token": "write"}
    steps = workflow["jobs"]["build"]["steps"]
    uses = [s.get("uses", "") for s in steps]
    assert uses[0].startswith("actions/checkout@") and uses[1].startswith("actions/setup-python@")
    runs = [s["run"].strip() for s in steps if "run" in s]
    assert "make book" in runs  # the README's command, unchanged
    assert "make book" in (ROOT / "README.md").read_text(encoding="utf-8")
    upload = next(s for s in steps if s.get("uses", "").startswith("actions/upload-pages-artifact@"))
    assert upload["with"]["path"] == "_build/html"
    book = next(s for s in steps if s.get("run", "").strip() == "make book")
    assert steps.index(book) < steps.index(upload)
    deploy = workflow["jobs"]["deploy"]
    assert deploy["needs"] == "build"
    assert deploy["steps"][0]["uses"].startswith("actions/deploy-pages@")


def test_citation_licences_and_version_agree():
    from setuptools.config.pyprojecttoml import read_configuration

    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text(encoding="utf-8"))
    # Citation File Format 1.2.0: its required keys and the types of the ones used here
    assert cff["cff-version"] == "1.2.0"
    assert isinstance(cff["message"], str) and isinstance(cff["title"], str)
    assert cff["authors"] and all(isinstance(a, dict) and (a.get("name") or a.get("family-names"))
                                  for a in cff["authors"])
    assert cff["type"] in ("software", "dataset")
    assert set(cff) <= {"cff-version", "message", "title", "authors", "type", "abstract",
                        "version", "license", "repository-code", "keywords", "date-released",
                        "doi", "url", "references", "preferred-citation"}
    assert isinstance(cff["version"], str) and cff["version"] == ai_evolution.__version__
    assert ai_evolution.library_version() == ai_evolution.__version__
    assert read_configuration(ROOT / "pyproject.toml")["project"]["version"] == ai_evolution.__version__
    assert cff["license"] == ["MIT", "CC-BY-SA-4.0"]
    assert (ROOT / "LICENSE").read_text(encoding="utf-8").startswith("MIT License")
    assert "Attribution-ShareAlike 4.0 International" in \
        (ROOT / "LICENSE-CONTENT").read_text(encoding="utf-8")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "MIT" in readme and "CC BY-SA 4.0" in readme and "LICENSE-CONTENT" in readme
    assert "book/instructor-guide.md" in readme and "make release" in readme


def test_the_instructor_guide_opens_with_publishing_a_term():
    guide = (ROOT / "book/instructor-guide.md").read_text(encoding="utf-8")
    first = next(ln for ln in guide.split("\n") if ln.startswith("## "))
    assert first == "## Publicar el curso para un cuatrimestre"
    section = guide.split(first, 1)[1].split("\n## ", 1)[0]
    for needed in ("repository.url", "repository.version", "make student", "make release",
                   "make book", ".github/workflows/book.yml", "Colab", "ai_evolution.__version__"):
        assert needed in section, needed


def test_every_built_page_shows_version_build_date_and_licences(built_book):
    assert built_book["returncode"] == 0, built_book["log"]
    course = read_course(ROOT)
    today = course_ext.build_date()
    html = built_book["html"]
    pages = [p for p in sorted(html.rglob("*.html"))
             if not p.relative_to(html).parts[0].startswith("_")]
    assert len(pages) > 20
    date = re.compile(r"libro construido el (\d{4}-\d{2}-\d{2})")
    for page in pages:
        text = page.read_text(encoding="utf-8")
        if "<body" not in text:  # Jupyter Book's index.html: a bare redirect to the first page
            assert 'http-equiv="Refresh"' in text, page.name
            continue
        footer = text.split('class="course-edition"', 1)
        assert len(footer) == 2, f"{page.name}: no footer with the version"
        line = footer[1].split("</p>", 1)[0]
        assert f"<code>{course.version}</code>" in line, page.name
        built = date.search(line)
        assert built and abs((today - datetime.date.fromisoformat(built[1])).days) <= 1, line
        assert ">MIT</a>" in line and ">CC BY-SA 4.0</a>" in line
