"""What a term publishes: the repository students install from and the version they install.

Both are written once, in ``_config.yml``::

    repository:
      url: &repo_url https://github.com/OWNER/REPO
      version: &course_version v2027.1   # a tag (`make release VERSION=...`) or a commit
      branch: *course_version            # the theme's buttons read `branch`: the same value

Everything else is generated from them: each lab's install cell,
``%pip install -q "git+URL@VERSION"`` (``scripts/make_student.py``), and every Colab button and
GitHub link of the built book, which open the notebooks of that version (``_ext/lab_pages.py``
and the theme, through ``repository.branch``). A bad value stops ``make student``, the build and
``make release`` with a Spanish message naming the key, the value and what is accepted.

As a Sphinx extension this module checks the two values when the build starts and writes the
footer of every page (the theme's own author and copyright lines are turned off in
``_config.yml``): the version, the date of the build (``SOURCE_DATE_EPOCH`` when set, for
reproducible builds), the licences of code and prose, the repository, and how to cite the course
(from ``CITATION.cff``) with its copyright line.
"""

from __future__ import annotations

import datetime
import html
import os
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

CONFIG = "_config.yml"
CITATION = "CITATION.cff"
# Colab opens notebooks straight from GitHub (colab.research.google.com/github/OWNER/REPO/...).
_REPO_URL = re.compile(r"https://github\.com/([A-Za-z0-9](?:[A-Za-z0-9-]{0,38}))/([A-Za-z0-9._-]{1,100})")
_COMMIT = re.compile(r"[0-9a-f]{7,40}")
# A tag or branch name as `git check-ref-format` accepts it, restricted to characters that need no
# quoting in a URL or a shell: letters, digits, '.', '_', '-' and '/' between components.
_REF = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*(?:/[A-Za-z0-9_][A-Za-z0-9._-]*)*")
LICENCES = {"code": ("MIT", "LICENSE"), "prose": ("CC BY-SA 4.0", "LICENSE-CONTENT")}


class CourseSettingError(ValueError):
    """A value of ``_config.yml`` that cannot be published (message in Spanish)."""


@dataclass(frozen=True)
class Course:
    repository_url: str
    version: str

    @property
    def install_requirement(self) -> str:
        """What the install cell passes to pip: ``git+URL@VERSION``."""
        return f"git+{self.repository_url}@{self.version}"

    @property
    def slug(self) -> str:
        """``OWNER/REPO``."""
        return self.repository_url.split("github.com/", 1)[1]


def check_repository_url(url, key: str = "repository.url") -> str:
    """``url`` without a trailing slash, or ``CourseSettingError``."""
    text = url.rstrip("/") if isinstance(url, str) else url
    if not isinstance(text, str) or not _REPO_URL.fullmatch(text) or text.endswith(".git"):
        raise CourseSettingError(
            f"{key} en {CONFIG} debe ser la URL de un repositorio de GitHub, "
            f"https://github.com/USUARIO/REPOSITORIO (sin .git ni rutas detrás: Colab abre los "
            f"cuadernos desde GitHub y pip instala desde esa URL); se recibió {url!r}")
    return text


def check_version(version, key: str = "repository.version") -> str:
    """``version`` if it names a tag or a commit that pip and Colab can use, or
    ``CourseSettingError``."""
    ok = isinstance(version, str) and len(version) <= 100 and (
        _COMMIT.fullmatch(version) or (_REF.fullmatch(version) and ".." not in version
                                       and not version.endswith((".", ".lock"))))
    if not ok:
        raise CourseSettingError(
            f"{key} en {CONFIG} debe ser la versión que instalan los estudiantes: una etiqueta de "
            f"git (por ejemplo v2027.1, la que escribe `make release VERSION=2027.1`) o un commit "
            f"(de 7 a 40 cifras hexadecimales en minúscula); solo letras, cifras, '.', '_', '-' y "
            f"'/', sin '..' ni espacios; se recibió {version!r}")
    return version


def course_settings(config: dict) -> Course:
    """The checked repository URL and version of a parsed ``_config.yml``."""
    repo = config.get("repository") if isinstance(config, dict) else None
    if not isinstance(repo, dict):
        raise CourseSettingError(f"{CONFIG} no tiene la sección 'repository' (url, version, "
                                 "branch): ver book/instructor-guide.md")
    course = Course(check_repository_url(repo.get("url")), check_version(repo.get("version")))
    if repo.get("branch") != course.version:
        raise CourseSettingError(
            f"repository.branch en {CONFIG} debe ser la misma versión que repository.version "
            f"({course.version!r}; escriba `branch: *course_version`): los botones de Colab abren "
            f"los cuadernos de esa versión; se recibió {repo.get('branch')!r}")
    return course


def read_course(root: Path) -> Course:
    """The course settings of the repository at ``root``."""
    path = Path(root) / CONFIG
    return course_settings(yaml.safe_load(path.read_text(encoding="utf-8")))


def build_date() -> datetime.date:
    """Today (UTC), or the date of ``SOURCE_DATE_EPOCH`` when set."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    now = (datetime.datetime.fromtimestamp(int(epoch), datetime.timezone.utc) if epoch
           else datetime.datetime.now(datetime.timezone.utc))
    return now.date()


@dataclass(frozen=True)
class Citation:
    """What the footer's "Cómo citar" line needs from ``CITATION.cff``."""
    authors: str
    title: str


def read_citation(root: Path) -> Citation:
    """The authors and title of the course, as ``CITATION.cff`` at ``root`` gives them."""
    cff = yaml.safe_load((Path(root) / CITATION).read_text(encoding="utf-8"))
    names = [a.get("name") or " ".join(filter(None, (a.get("given-names"), a.get("family-names"))))
             for a in cff["authors"]]
    return Citation(authors=", ".join(names), title=cff["title"])


def footer_html(course: Course, built: datetime.date, citation: Citation | None = None,
                copyright_line: str = "") -> str:
    """The footer of every page: version, build date and licences, linking the repository;
    with ``citation``, a second line saying how to cite this version of the course, and the
    copyright."""
    url = html.escape(course.repository_url, quote=True)
    version = html.escape(course.version)

    def licence(kind: str) -> str:
        name, file = LICENCES[kind]
        return (f'<a href="{url}/blob/{version}/{file}">{name}</a>')

    edition = (f'<p class="course-edition">Versión <a href="{url}/tree/{version}">'
               f'<code>{version}</code></a> del curso · libro construido el {built.isoformat()} · '
               f'código bajo licencia {licence("code")}, texto e imágenes bajo licencia '
               f'{licence("prose")} · repositorio: <a href="{url}">{html.escape(course.slug)}</a>'
               f'</p>')
    if citation is None:
        return edition
    cite = (f'<p class="course-citation">Cómo citar: {html.escape(citation.authors)}, '
            f'<em>{html.escape(citation.title)}</em>, versión {version}, {built.year}, '
            f'{url} (datos completos en <a href="{url}/blob/{version}/{CITATION}">{CITATION}</a>)'
            + (f' · © {html.escape(copyright_line)}' if copyright_line else "") + '</p>')
    return edition + cite


def _config_inited(app, config) -> None:
    from sphinx.errors import ConfigError

    try:
        course = read_course(Path(app.srcdir))
    except CourseSettingError as err:
        raise ConfigError(str(err)) from None
    options = config.html_theme_options
    holder = " ".join(str(part) for part in (config.copyright, config.author) if part)
    options["extra_footer"] = footer_html(course, build_date(), read_citation(Path(app.srcdir)),
                                          holder)


def setup(app):
    app.connect("config-inited", _config_inited)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
