"""The course's frame, generated: level, prerequisites, time and points of every chapter and lab.

Three things are written once and pasted where a reader needs them:

- ``book/course-plan.yml``: the level, the prerequisites, the estimated time of a lab (with its
  basis), the weeks of each chapter in a term and a discussion question per lab;
- ``assessments/NN-name/rubric.json``: the points of each lab, automatic (``criteria``) and read
  by a person (``manual``, whose items ``q_*`` are the written questions);
- the chapters themselves: the reading time is their number of words (code cells left out) at
  the plan's words per minute.

Directives and a role use them:

- ``{ficha-del-capitulo}`` under a chapter's title: level, the chapters it needs and its time;
- ``{plan-del-curso}``: the table of all chapters (introduction and instructor guide);
- ``{calendario-del-curso}``: the term week by week, with the discussion question of each lab;
- ``{curso}`KEY``` in prose: a count over all labs, e.g. ``puntos-automaticos`` gives
  "entre 10 y 14". ``tests/test_course_plan.py`` checks them against the rubrics.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
PLAN = Path("book") / "course-plan.yml"


@dataclass(frozen=True)
class LabPoints:
    automatic: int   # points of the criteria the grader checks
    human: int       # points a person reads and sets
    questions: int   # written questions (manual items ``q_*``)
    exercises: int   # exercises graded by a hidden check (criteria of type ``function``)


def read_plan(root: Path = ROOT) -> dict:
    return yaml.safe_load((Path(root) / PLAN).read_text(encoding="utf-8"))


def lab_points(root: Path = ROOT) -> dict[str, LabPoints]:
    """The points of each lab (``NN-name``), from its rubric."""
    out = {}
    for path in sorted(Path(root).glob("assessments/*/rubric.json")):
        rubric = json.loads(path.read_text(encoding="utf-8"))
        out[path.parent.name] = LabPoints(
            automatic=sum(c["points"] for c in rubric["criteria"]),
            human=sum(m["points"] for m in rubric["manual"]),
            questions=sum(m["id"].startswith("q_") for m in rubric["manual"]),
            exercises=sum(c["type"] == "function" for c in rubric["criteria"]))
    return out


def lab_hours(points: LabPoints, plan: dict) -> tuple[float, float]:
    """The estimated hours of a lab, low and high, to the half hour: the plan's minutes per
    exercise and per question times the rubric's counts, plus the challenge and the notebook."""
    m = plan["lab_minutes"]
    return tuple(round((points.exercises * m["per_exercise"][i] + points.questions
                        * m["per_question"][i] + m["challenge"][i] + m["notebook"][i]) / 30) / 2
                 for i in (0, 1))


def hours_basis(plan: dict) -> str:
    """How a lab's time is estimated, in a sentence."""
    m = plan["lab_minutes"]

    def r(key: str) -> str:
        return f"de {m[key][0]} a {m[key][1]} minutos"

    return (f"{r('per_exercise')} por ejercicio con autocomprobación, {r('per_question')} por "
            f"pregunta escrita, {r('challenge')} para el reto y {r('notebook')} para leer y "
            f"ejecutar el cuaderno; una estimación, no una medida con estudiantes")


def reading_minutes(chapter: Path, words_per_minute: int) -> int:
    """Minutes to read a chapter's prose (fenced blocks and code cells left out), rounded up to
    five."""
    text = re.sub(r"^(`{3,}|:{3,}).*?^\1\s*$", "", chapter.read_text(encoding="utf-8"),
                  flags=re.S | re.M)
    words = len(re.findall(r"\w+", text))
    return 5 * math.ceil(words / words_per_minute / 5)


def es_number(x: float) -> str:
    """2.5 -> '2,5'; 4.0 -> '4'."""
    return f"{x:g}".replace(".", ",")


def span(values) -> str:
    """'entre 10 y 14', or '14' when all are equal."""
    low, high = min(values), max(values)
    return es_number(low) if low == high else f"entre {es_number(low)} y {es_number(high)}"


def course_facts(root: Path = ROOT) -> dict[str, str]:
    """The values of the ``{curso}`` role."""
    plan, points = read_plan(root), lab_points(root)
    hours = [lab_hours(points[c], plan) for c in plan["chapters"]]
    low, high = sum(h[0] for h in hours), sum(h[1] for h in hours)
    labs = len(plan["chapters"])
    reading = sum(reading_minutes(Path(root) / "book" / f"{c}.md", plan["reading_words_per_minute"])
                  for c in plan["chapters"])
    return {
        "nivel": plan["level"].strip(),
        "requisitos": plan["prerequisites"].strip(),
        "base-horas-laboratorio": hours_basis(plan),
        "ejercicios": span([p.exercises for p in points.values()]),
        "laboratorios": str(labs),
        "palabras-por-minuto": str(plan["reading_words_per_minute"]),
        "puntos-automaticos": span([p.automatic for p in points.values()]),
        "puntos-humanos": span([p.human for p in points.values()]),
        "preguntas": span([p.questions for p in points.values()]),
        "horas-laboratorio": f"{es_number(min(h[0] for h in hours))}–"
                             f"{es_number(max(h[1] for h in hours))} h",
        "horas-laboratorios": f"{es_number(low)}–{es_number(high)} h",
        "horas-lectura": f"{es_number(round(reading / 60))} h",
        "horas-curso": f"{es_number(round(low + reading / 60))}–"
                       f"{es_number(round(high + reading / 60))} h",
        "semanas": str(sum(plan["weeks_per_chapter"])),
    }


def _chapter_number(name: str) -> int:
    return int(name.split("-", 1)[0])


def _doc(chapter: str, from_doc: str, text: str = "") -> str:
    """A ``{doc}`` link to ``book/<chapter>`` written in the page ``from_doc``."""
    target = chapter if from_doc.startswith("book/") else f"book/{chapter}"
    return f"{{doc}}`{text} <{target}>`" if text else f"{{doc}}`{target}`"


def chapter_box(chapter: str, docname: str, root: Path = ROOT) -> str:
    """The box under a chapter's title, as MyST."""
    plan = read_plan(root)
    entry = plan["chapters"][chapter]
    minutes = reading_minutes(Path(root) / "book" / f"{chapter}.md",
                              plan["reading_words_per_minute"])
    needs = entry["requires"]
    links = [_doc(c, docname) for c in needs]
    intro = _doc("intro", docname, "introducción")
    needs_text = (f"los generales del curso ({intro}); es el primer capítulo" if not links else
                  f"el capítulo {links[0]}" if len(links) == 1 else
                  f"los capítulos {', '.join(links[:-1])} y {links[-1]}")
    if links:
        needs_text += f", además de los generales del curso ({intro})"
    points = lab_points(root)[chapter]
    low, high = lab_hours(points, plan)
    guide = _doc("instructor-guide", docname, "guía para docentes")
    lab = (f"laboratorio de {es_number(low)} a {es_number(high)} h ({points.exercises} ejercicios, "
           f"{points.questions} preguntas y un reto; una estimación, con su base en la {guide})")
    grading = (f"; su evaluación da {points.automatic} puntos automáticos y {points.human} de "
               f"lectura humana")
    return "\n".join([
        ":::{admonition} Ficha del capítulo",
        ":class: course-frame",
        f"- **Nivel**: {plan['level_short'].strip()}.",
        f"- **Requisitos previos**: {needs_text}.",
        f"- **Tiempo estimado**: lectura de unos {minutes} minutos; {lab}{grading}.",
        ":::",
    ])


def plan_table(docname: str, root: Path = ROOT) -> str:
    """Every chapter with its requisites, reading time, lab time and points, as a MyST list (a
    table of five columns does not fit a phone)."""
    plan = read_plan(root)
    points = lab_points(root)
    rows = []
    for chapter, entry in plan["chapters"].items():
        needs = [str(_chapter_number(c)) for c in entry["requires"]]
        needs_text = ("sin requisitos del curso" if not needs else
                      f"después del {needs[0]}" if len(needs) == 1 else
                      f"después de los {', '.join(needs[:-1])} y {needs[-1]}")
        minutes = reading_minutes(Path(root) / "book" / f"{chapter}.md",
                                  plan["reading_words_per_minute"])
        p = points[chapter]
        low, high = lab_hours(p, plan)
        rows.append(f"{_chapter_number(chapter)}. **{_doc(chapter, docname)}**, {needs_text}: "
                    f"lectura de {minutes} min, laboratorio de {es_number(low)} a "
                    f"{es_number(high)} h; {p.automatic} puntos automáticos y {p.human} de "
                    f"lectura humana.")
    return "\n".join(rows)


def schedule(docname: str, root: Path = ROOT) -> str:
    """The term, week by week, with each lab's discussion question, as MyST."""
    plan = read_plan(root)
    lines, week = [], 1
    for (chapter, entry), weeks in zip(plan["chapters"].items(), plan["weeks_per_chapter"]):
        when = f"Semana {week}" if weeks == 1 else f"Semanas {week} y {week + weeks - 1}"
        lines.append(f"- **{when}**: capítulo {_chapter_number(chapter)}, "
                     f"{_doc(chapter, docname)}, y su laboratorio. Para discutir en clase: "
                     f"{entry['discussion'].strip()}")
        week += weeks
    return "\n".join(lines)


def setup(app):
    from docutils import nodes
    from docutils.statemachine import StringList
    from sphinx.util.docutils import SphinxDirective, SphinxRole

    class _Generated(SphinxDirective):
        has_content = False

        def markdown(self) -> str:
            raise NotImplementedError

        def run(self):
            self.env.note_dependency(str(ROOT / PLAN))
            for rubric in sorted(ROOT.glob("assessments/*/rubric.json")):
                self.env.note_dependency(str(rubric))
            box = nodes.container()
            self.state.nested_parse(StringList(self.markdown().splitlines(), source=PLAN.name),
                                    self.content_offset, box)
            return box.children

    class ChapterBox(_Generated):
        def markdown(self) -> str:
            return chapter_box(Path(self.env.docname).name, self.env.docname)

    class PlanTable(_Generated):
        def markdown(self) -> str:
            return plan_table(self.env.docname)

    class Schedule(_Generated):
        def markdown(self) -> str:
            return schedule(self.env.docname)

    class CourseFact(SphinxRole):
        def run(self):
            facts = course_facts()
            if self.text not in facts:
                msg = self.inliner.reporter.error(
                    f"{{curso}}`{self.text}` no existe; los valores son: {', '.join(facts)}",
                    line=self.lineno)
                return [self.inliner.problematic(self.rawtext, self.rawtext, msg)], [msg]
            return [nodes.Text(facts[self.text])], []

    app.add_directive("ficha-del-capitulo", ChapterBox)
    app.add_directive("plan-del-curso", PlanTable)
    app.add_directive("calendario-del-curso", Schedule)
    app.add_role("curso", CourseFact())
    return {"parallel_read_safe": True, "parallel_write_safe": True}
