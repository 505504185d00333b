"""Similarity flags: a submission's own code against the published solution and against the other
submissions of the same run, with ``copydetect`` (winnowed fingerprints of the token stream,
names and literals normalised, so renaming variables does not hide a copy).

What is compared is the code the student wrote: the code cells of the submission that are not,
verbatim, a cell of the lab's student notebook (the template everyone starts from), so the
shared scaffolding never counts. The template's fingerprints are boilerplate in every
comparison; between two submissions the published solution's are boilerplate too, so two
students who both copied the solution are flagged once each against the solution, not against
each other for the same lines.

The result is a flag for a person to read (a column of the gradebook and a section of the
feedback), never points: short exercises have few ways to be written, and an honest solution
can look like the reference. With ``--shard``, submissions are compared within their shard.
"""

from __future__ import annotations

import io
from functools import lru_cache
from pathlib import Path

# Fingerprints: k-grams of NOISE_TOKENS tokens, every one kept (window 1). A submission is
# flagged when at least FLAG_SHARE of its own code (by tokens) is in the other one and it has
# at least MIN_TOKENS tokens of its own (an almost empty submission is like anything).
NOISE_TOKENS = 20
WINDOW = 1
FLAG_SHARE = 0.8
MIN_TOKENS = 60
SOLUTION = "la solución publicada"


def _cells(nb) -> list[str]:
    from .rebuild import code_cells

    return [str(cell.source).strip() for _, cell in code_cells(nb)]


@lru_cache(maxsize=None)
def _lab_code(lab_folder: Path) -> tuple[tuple[str, ...], str]:
    """The student template's code cells, and the solution's code that the template lacks."""
    import nbformat

    template = _cells(nbformat.read(str(lab_folder / "notebook_student.ipynb"), as_version=4))
    solution = _cells(nbformat.read(str(lab_folder / "notebook_solution.ipynb"), as_version=4))
    known = set(template)
    return tuple(template), "\n\n".join(c for c in solution if c not in known)


def own_code(nb, template: tuple[str, ...]) -> str:
    """The code cells of a submission that are not verbatim cells of the template."""
    known = set(template)
    return "\n\n".join(c for c in _cells(nb) if c and c not in known)


def _fingerprint(code: str, boilerplate=None):
    import copydetect

    return copydetect.CodeFingerprint("entrega.py", NOISE_TOKENS, WINDOW, boilerplate=boilerplate,
                                      language="python", fp=io.StringIO(code))


def _share(a, b) -> tuple[float, float]:
    import copydetect

    if len(a.hashes) == 0 or len(b.hashes) == 0:
        return 0.0, 0.0
    _, (share_a, share_b), _ = copydetect.compare_files(a, b)
    return float(share_a), float(share_b)


def _tokens(fp) -> int:
    return int(fp.token_coverage)


def similarity_flags(notebooks: dict[str, object],
                     lab_folder: Path) -> dict[str, list[tuple[float, str | None]]]:
    """For each student id (whose parsed notebook is given), the flags ``(share, other)``: the
    share of their own code found in the published solution (``other`` None) or in another
    submission (``other`` its id), when at least ``FLAG_SHARE``. Deterministic: ids in order."""
    import numpy as np

    template, solution = _lab_code(Path(lab_folder))
    boiler = np.array(sorted(_fingerprint("\n\n".join(template)).hashes), dtype=np.int64)
    ref = _fingerprint(solution, boiler)
    both = np.array(sorted(set(boiler.tolist()) | ref.hashes), dtype=np.int64)
    mine, apart = {}, {}
    for sid in sorted(notebooks):
        code = own_code(notebooks[sid], template)
        mine[sid] = _fingerprint(code, boiler)
        apart[sid] = _fingerprint(code, both)
    flags: dict[str, list[tuple[float, str | None]]] = {sid: [] for sid in mine}
    for sid, fp in mine.items():
        if _tokens(fp) >= MIN_TOKENS and (share := _share(fp, ref)[0]) >= FLAG_SHARE:
            flags[sid].append((share, None))
    ids = sorted(apart)
    for i, a in enumerate(ids):
        for b in ids[i + 1:]:
            share_a, share_b = _share(apart[a], apart[b])
            if _tokens(apart[a]) >= MIN_TOKENS and share_a >= FLAG_SHARE:
                flags[a].append((share_a, b))
            if _tokens(apart[b]) >= MIN_TOKENS and share_b >= FLAG_SHARE:
                flags[b].append((share_b, a))
    return flags


def percent(share: float) -> str:
    return f"{round(100 * min(share, 1.0))} %"


def for_instructor(flags: list[tuple[float, str | None]]) -> str:
    """The gradebook cell: every match with the other student's id."""
    return "; ".join(f"{SOLUTION if other is None else 'entrega ' + other}: {percent(share)}"
                     for share, other in flags)


def for_student(flags: list[tuple[float, str | None]]) -> list[str]:
    """The feedback lines: no other student's id."""
    return [f"el {percent(share)} del código que usted escribió está en "
            f"{SOLUTION if other is None else 'otra entrega de este grupo'}."
            for share, other in flags]
