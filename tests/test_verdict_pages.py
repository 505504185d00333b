"""How the chapters paste their labs' verdicts (issue 28): each verdict is one sentence with its
number in bold, pasted with the ``{glue}`` role (``claim.pasted()``: HTML in the book, the
contract's statement as plain text), never as a plain string with ``{glue:text}``; it follows a
full stop, a question or a list marker, not a colon inside a sentence; and a chapter that pastes
a lab's verdicts ends its "Lo que se mide" section with that lab's "Cómo se decidió" table
(``<prefix>_decisions``, glued from ``claims.contract_table(contract)``). Static: no book build."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "book").glob("[0-9][0-9]-*.md"))
SOLUTIONS = sorted(ROOT.glob("labs/*/notebook_solution.md"))

VERDICT_AS_TEXT = re.compile(r"\{glue:text\}`[^`]*_verdict(?::s)?`")
LAB_VERDICT = re.compile(r"\{glue\}`\.\./(labs/[^`/]+)/notebook_solution\.md::([a-z0-9]+)_\w*_verdict`")
VERDICT_AFTER_COLON = re.compile(r":[ \t]*\n?[ \t]*\{glue\}`[^`]*_verdict`")
GLUED_TEXT_VERDICT = re.compile(r"glue\(\s*f?[\"'][^\"']*_verdict[\"'],[^\n]*\.text\b")


def measured_section(text: str) -> str:
    """The chapter's "Lo que se mide" section, up to the next heading of its level."""
    m = re.search(r"^## Lo que se mide\b.*?(?=^## |\Z)", text, flags=re.M | re.S)
    return m.group(0) if m else ""


def page_problems(name: str, text: str) -> list[str]:
    """What keeps a chapter from pasting its verdicts the book's way."""
    problems = [f"{name}: {m.group(0)} pastes a verdict as plain text; use the {{glue}} role"
                for m in VERDICT_AS_TEXT.finditer(text)]
    problems += [f"{name}: a verdict follows a colon: {m.group(0)!r}"
                 for m in VERDICT_AFTER_COLON.finditer(text)]
    labs = {(folder, prefix) for folder, prefix in LAB_VERDICT.findall(text)}
    section = measured_section(text)
    for folder, prefix in sorted(labs):
        table = (f"```{{glue}} {prefix}_decisions\n:doc: ../{folder}/notebook_solution.md\n```")
        if table not in section:
            problems.append(f"{name}: pastes verdicts of {folder} but its 'Lo que se mide' "
                            f"section has no {prefix}_decisions table")
    return problems


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[c.stem for c in CHAPTERS])
def test_chapters_paste_verdicts_as_sentences_with_their_decision_table(chapter):
    problems = page_problems(chapter.name, chapter.read_text(encoding="utf-8"))
    assert problems == [], "\n".join(problems)


@pytest.mark.parametrize("solution", SOLUTIONS, ids=[s.parent.name for s in SOLUTIONS])
def test_lab_pages_glue_verdicts_pasted_and_their_decision_table(solution):
    text = solution.read_text(encoding="utf-8")
    plain = GLUED_TEXT_VERDICT.findall(text)
    assert plain == [], f"glue claim.pasted(), not claim.text: {plain}"
    if "_verdict" in text:
        assert re.search(r'glue\("[a-z0-9]+_decisions", contract_table\(contract\)', text), \
            "the page glues verdicts but no <prefix>_decisions table from contract_table(contract)"


def test_the_page_checks_find_each_problem():
    lab = "../labs/09-speculative/notebook_solution.md"
    good = ("## Lo que se mide en la máquina\n\nLo que midió.\n"
            f"{{glue}}`{lab}::sp_speedup_k1_verdict`\n\n"
            f"```{{glue}} sp_decisions\n:doc: {lab}\n```\n\n## Ejemplo\n")
    assert page_problems("x.md", good) == []
    as_text = good.replace(f"{{glue}}`{lab}::sp_speedup_k1_verdict`",
                           f"{{glue:text}}`{lab}::sp_speedup_k1_verdict:s`")
    assert any("plain text" in p for p in page_problems("x.md", as_text))
    after_colon = good.replace("Lo que midió.\n", "Lo que midió:\n")
    assert any("colon" in p for p in page_problems("x.md", after_colon))
    no_table = good.replace("sp_decisions", "sp_other")
    assert any("no sp_decisions table" in p for p in page_problems("x.md", no_table))
    table_elsewhere = no_table + f"```{{glue}} sp_decisions\n:doc: {lab}\n```\n"
    assert any("no sp_decisions table" in p for p in page_problems("x.md", table_elsewhere))
    assert GLUED_TEXT_VERDICT.search('glue(f"sp_{k}_verdict", found[k].text, display=False)')
    assert not GLUED_TEXT_VERDICT.search('glue(f"sp_{k}_verdict", found[k].pasted(), display=False)')
