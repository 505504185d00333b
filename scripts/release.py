"""Pin a term: ``make release VERSION=2027.1`` (book/instructor-guide.md).

In order, stopping with a Spanish message at the first problem:

1. ``VERSION`` is a release number (``2027.1``, ``2027.1.0``; a leading ``v`` is accepted) and
   its tag, ``v2027.1``, does not exist yet;
2. the working tree is clean (no modified, staged or untracked file): what is tagged is exactly
   what was tested;
3. the tests pass at this commit: ``--test`` runs a shell command (``make release`` passes
   ``RELEASE_TEST``, by default ``make test``, the whole suite) and a non-zero exit stops here;
4. the version is written where it is read: ``ai_evolution/__init__.py`` (``__version__``, which
   pyproject.toml reads), ``CITATION.cff`` (``version``) and ``_config.yml``
   (``repository.version``: the tag, which the book's footer and Colab buttons show); then
   ``scripts/make_student.py`` rewrites every lab's install cell to ``git+URL@v2027.1``
   (solution source, its paired .ipynb and the student notebook);
5. those files are committed ("Release v2027.1") and the commit is tagged ``v2027.1``.

Nothing is pushed: ``git push origin main v2027.1`` publishes it (the guide says when).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "_ext"))
import make_student  # noqa: E402
from course import CONFIG, CourseSettingError, read_course  # noqa: E402

PACKAGE_INIT = "ai_evolution/__init__.py"
_RELEASE = re.compile(r"v?(\d+(?:\.\d+){1,3})")
_VERSION_LINE = re.compile(r'^__version__ = "[^"]*"$', re.M)
_CONFIG_LINE = re.compile(r"^(  version: &course_version ).*$", re.M)
_CITATION_LINE = re.compile(r'^version: "[^"]*"$', re.M)


class ReleaseError(RuntimeError):
    """Why the release did not happen (Spanish)."""


def parse_version(text: str) -> tuple[str, str]:
    """``(package version, tag)``: ``"2027.1"`` -> ``("2027.1", "v2027.1")``."""
    match = _RELEASE.fullmatch(text.strip()) if isinstance(text, str) else None
    if match is None:
        raise ReleaseError(f"VERSION debe ser un número de versión como 2027.1 o 2027.1.0 (con o "
                           f"sin 'v' delante; la etiqueta será v2027.1); se recibió {text!r}. "
                           "Uso: make release VERSION=2027.1")
    return match.group(1), f"v{match.group(1)}"


def _git(root: Path, *args: str) -> str:
    proc = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ReleaseError(f"git {' '.join(args)} falló: {proc.stderr.strip()}")
    return proc.stdout


def _replace_once(path: Path, pattern: re.Pattern, replacement: str, what: str) -> None:
    text = path.read_text(encoding="utf-8")
    new, count = pattern.subn(replacement, text)
    if count != 1:
        raise ReleaseError(f"{path.name}: se esperaba exactamente una línea {what} y hay {count}")
    path.write_text(new, encoding="utf-8")


def write_version(root: Path, package_version: str, tag: str) -> None:
    """The version into the package metadata, the course settings and every install cell."""
    _replace_once(root / PACKAGE_INIT, _VERSION_LINE, f'__version__ = "{package_version}"',
                  '__version__ = "..."')
    _replace_once(root / "CITATION.cff", _CITATION_LINE, f'version: "{package_version}"',
                  'version: "..."')
    _replace_once(root / CONFIG, _CONFIG_LINE, rf"\g<1>{tag}",
                  "'  version: &course_version ...' (sección repository)")
    try:
        read_course(root)
    except CourseSettingError as err:
        raise ReleaseError(str(err)) from None
    if make_student.main(["--root", str(root)]) != 0 or \
            make_student.main(["--check", "--root", str(root)]) != 0:
        raise ReleaseError("make student no dejó los cuadernos al día (ver los mensajes de arriba)")


def release(root: Path, version: str, test_command: str) -> str:
    """Check, test, write, commit and tag; returns the tag."""
    package_version, tag = parse_version(version)
    if _git(root, "tag", "--list", tag).strip():
        raise ReleaseError(f"la etiqueta {tag} ya existe: elija otra VERSION (las versiones "
                           "publicadas no se mueven)")
    dirty = _git(root, "status", "--porcelain", "--untracked-files=all").splitlines()
    if dirty:
        listed = "; ".join(line.strip() for line in dirty[:5])
        more = f" y {len(dirty) - 5} más" if len(dirty) > 5 else ""
        raise ReleaseError(f"el árbol de trabajo no está limpio ({listed}{more}): haga commit o "
                           "descarte los cambios; se publica exactamente lo que se probó")
    print(f"release: pruebas ({test_command})", flush=True)
    if subprocess.run(test_command, shell=True, cwd=root).returncode != 0:
        raise ReleaseError(f"las pruebas fallaron ({test_command}): no se publica {tag}")
    write_version(root, package_version, tag)
    _git(root, "add", "-u")
    _git(root, "commit", "-q", "-m", f"Release {tag}")
    _git(root, "tag", "-a", tag, "-m", f"Servir un LLM {tag}")
    return tag


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("version", help="release number, e.g. 2027.1 (tag v2027.1)")
    parser.add_argument("--test", default="make test",
                        help="shell command that must pass before anything is written")
    parser.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        tag = release(args.root.resolve(), args.version, args.test)
    except ReleaseError as err:
        print(f"make release: {err}", file=sys.stderr)
        return 1
    print(f"release: {tag} creado (commit y etiqueta). Publíquelo con: git push origin HEAD {tag}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
