"""One question set and one challenge per chapter: the chapter's «Evaluación» includes the
questions and the challenge of its lab's ``assessment.md`` (no second copy that can drift), the
lab states the same challenge, and the graded questions are the ones the rubric scores."""

from __future__ import annotations

import re
from pathlib import Path

import jupytext
import pytest

from ai_evolution.grading import find_assessment
from ai_evolution.labs import get_spec, list_labs

ROOT = Path(__file__).resolve().parents[1]
MARKERS = {"preguntas": ("<!-- preguntas: inicio -->", "<!-- preguntas: fin -->"),
           "reto": ("<!-- reto: inicio -->", "<!-- reto: fin -->")}
# Chapters that already share one question set and one challenge with their assessment.md
# (markers there, includes in the chapter). The others are expected to fail until they do: add
# each kind here when its chapter adopts the structure.
ONE_SET = {"roofline", "kv_cache", "continuous_batching", "paged_attention", "scheduler",
           "observability", "flash_attention", "quantization", "speculative", "determinism",
           "hybrid", "operations", "distributed"}
KINDS = [pytest.param(k, marks=() if k in ONE_SET else pytest.mark.xfail(
             reason="capítulo aún sin el conjunto único de preguntas y reto"))
         for k in sorted(list_labs(), key=lambda k: get_spec(k).chapter)]


def squash(text: str) -> str:
    return " ".join(text.split())


def between(text: str, part: str) -> str:
    start, end = MARKERS[part]
    assert text.count(start) == 1 and text.count(end) == 1, f"faltan los marcadores {start}, {end}"
    return text.split(start, 1)[1].split(end, 1)[0]


def evaluation_section(chapter: Path) -> str:
    text = chapter.read_text(encoding="utf-8")
    assert "\n## Evaluación\n" in text, f"{chapter.name} no tiene «## Evaluación»"
    return re.split(r"\n## (?!#)", text.split("\n## Evaluación\n", 1)[1])[0]


@pytest.mark.parametrize("kind", KINDS)
def test_chapter_includes_its_assessment_questions_and_challenge(kind):
    a = find_assessment(kind)
    chapter = ROOT / "book" / f"{a.folder.name}.md"
    section = evaluation_section(chapter)
    target = f"../assessments/{a.folder.name}/assessment.md"
    for part, (start, end) in MARKERS.items():
        include = (f"```{{include}} {target}\n:start-after: \"{start}\"\n"
                   f":end-before: \"{end}\"\n```")
        assert include in section, f"{chapter.name}: «Evaluación» no incluye {part} de {target}"
    own = re.sub(r"```\{include\}.*?```", "", section, flags=re.S)
    assert "**Pregunta" not in own, f"{chapter.name}: preguntas escritas aparte del assessment.md"
    assert "assessments/" in own and "califica" in own, \
        f"{chapter.name}: «Evaluación» debe decir que el instructor califica estas preguntas"


@pytest.mark.parametrize("kind", KINDS)
def test_graded_questions_are_the_ones_the_rubric_scores(kind):
    a = find_assessment(kind)
    text = (a.folder / "assessment.md").read_text(encoding="utf-8")
    asked = [int(n) for n in re.findall(r"\*\*Pregunta (\d+)\b", between(text, "preguntas"))]
    assert asked == list(range(1, len(asked) + 1)) and asked, asked
    scored = sorted(int(m.group(1)) for item in a.manual
                    if (m := re.match(r"Pregunta (\d+)\b", item.title)))
    assert scored == asked, (scored, asked)
    rubric = text.split("## Rúbrica", 1)[1]
    for n in asked:
        assert f"| Pregunta {n} |" in rubric, f"la rúbrica no puntúa la pregunta {n}"


@pytest.mark.parametrize("kind", KINDS)
def test_lab_states_the_assessment_challenge(kind):
    a = find_assessment(kind)
    challenge = squash(between((a.folder / "assessment.md").read_text(encoding="utf-8"), "reto"))
    heading = re.compile(r"^#+ (?:(\d+)\. )?Reto verificable\s*$", re.M)
    found = [(m, c.source) for c in jupytext.read(a.lab_folder / "notebook_solution.md").cells
             if c.cell_type == "markdown" for m in heading.finditer(c.source)]
    assert len(found) == 1, "el cuaderno debe tener una sola sección «Reto verificable»"
    (m, source), = found
    statement = squash(re.split(r"^#", source[m.end():], flags=re.M)[0])  # up to a heading
    assert statement and statement in challenge, \
        f"{a.lab_folder.name}: el enunciado del cuaderno no es el del assessment.md"
    if m.group(1):
        assert f"(sección {m.group(1)} del cuaderno)" in challenge
    ext = next(c for c in a.criteria if c.type == "extension")
    for key in ext.measurement_keys:
        assert f"**`{key}`**" in challenge, f"el reto no pide la clave {key!r}"
