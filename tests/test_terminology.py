"""One term per concept, as the glossary (book/glossary.md) fixes them, in everything a student
reads: the chapters, the labs' markdown, the assessments and the library's Spanish strings."""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "book").glob("[0-9][0-9]-*.md"))
PROSE_FILES = (CHAPTERS + [ROOT / "book" / "intro.md", ROOT / "book" / "instructor-guide.md"]
               + sorted(ROOT.glob("labs/*/notebook_solution.md"))
               + sorted(ROOT.glob("assessments/*/assessment.md")))

# Forms the book does not use, and the term it uses instead (see the glossary).
BANNED = {
    r"\bdispersidad\b": "dispersión estructurada",
    r"\bhojas? técnicas?\b": "hoja de datos",
    r"\btechos?\b": "roofline",
    r"\boverheads?\b": "sobrecarga",
    r"\bsu semilla\b|\bsemilla del curso\b|\b(portátil|pregunta|fenómeno|las) de la semilla\b":
        "la clase 000 del curso (la fuente citada); «semilla» es solo la del generador aleatorio",
    r"\brecomputaci[oó]n\b": "recálculo",
    r"\brendimiento alcanzable\b|\brendimiento de cálculo\b": "ritmo de cálculo (FLOP/s)",
    r"\berror de uno\b": "error por uno (*off-by-one*)",
}
# The glossary names the other translations once, and chapter 1 explains where the name comes from.
GLOSSED_ONCE = {r"\btejados?\b": ROOT / "book" / "01-prefill-decode.md"}


def prose(text: str) -> str:
    """Markdown without code cells, fenced blocks, inline code, roles' targets, math and the
    English glosses in parentheses, ``(*overhead*)``, that introduce a term."""
    text = re.sub(r"^(`{3,}|:{3,}).*?^\1\s*$", "", text, flags=re.S | re.M)
    text = re.sub(r"\$\$.*?\$\$", "", text, flags=re.S)
    text = re.sub(r"\{[a-z:]+\}`[^`]*`", "", text)
    text = re.sub(r"\(\*[^*()]+\*\)", "", text)
    return re.sub(r"`[^`]*`", "", text)


def python_strings(path: Path) -> list[tuple[int, str]]:
    """The string literals of a Python file (docstrings and comments are English, so they are
    skipped: a docstring is a string statement, a comment is not a string)."""
    out, previous = [], None
    for tok in tokenize.generate_tokens(io.StringIO(path.read_text(encoding="utf-8")).readline):
        if tok.type == tokenize.STRING and previous not in (tokenize.INDENT, tokenize.NEWLINE,
                                                            tokenize.DEDENT, None):
            out.append((tok.start[0], tok.string))
        if tok.type not in (tokenize.NL, tokenize.COMMENT):
            previous = tok.type
    return out


def test_every_chapter_links_the_glossary_and_the_toc_lists_it():
    assert len(CHAPTERS) >= 6
    for chapter in CHAPTERS:
        assert "<glossary>`" in chapter.read_text(encoding="utf-8"), chapter.name
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
    assert "book/glossary" in str(toc)
    glossary = (ROOT / "book" / "glossary.md").read_text(encoding="utf-8")
    assert glossary.startswith("(glossary)=")
    for term in ("**Desalojo** (*eviction*)", "**Expulsión** (*preemption*)",
                 "**Rendimiento** (*throughput*)", "**Sobrecarga** (*overhead*)",
                 "**Roofline**", "**Semilla** (*seed*)",
                 # chapters 2, 7, 8 and 9 (issue 28)
                 "**MHA, GQA y MQA**", "**Cuantización** (*quantization*)", "**Escala** (*scale*)",
                 "**Grupo** (*group*", "**Perplejidad** (*perplexity*)", "**Kernel**",
                 "**Flash-decoding**", "**Modelo borrador y modelo objetivo**",
                 "**Tasa de aceptación** (*acceptance rate*", "**Residuo**",
                 "**Error por uno** (*off-by-one*)", "**Decodificación especulativa**"):
        assert term in glossary, term


def test_every_chapter_has_one_measured_section_at_the_same_level():
    for chapter in CHAPTERS:
        headings = re.findall(r"^(#+) Lo que se mide\b.*$", chapter.read_text(encoding="utf-8"),
                              flags=re.M)
        assert headings == ["##"], (chapter.name, headings)


def test_prose_uses_one_term_per_concept():
    found = []
    for path in PROSE_FILES:
        text = prose(path.read_text(encoding="utf-8"))
        for pattern, use in BANNED.items():
            for m in re.finditer(pattern, text, flags=re.I):
                found.append(f"{path.relative_to(ROOT)}: «{m.group(0)}» (use {use})")
        for pattern, allowed in GLOSSED_ONCE.items():
            hits = re.findall(pattern, text, flags=re.I)
            if len(hits) > (1 if path == allowed else 0):
                found.append(f"{path.relative_to(ROOT)}: «{hits[0]}» more than its one gloss")
    assert not found, "\n".join(found)


def test_the_librarys_spanish_strings_use_the_same_terms():
    files = sorted((ROOT / "ai_evolution").rglob("*.py")) + sorted(
        ROOT.glob("assessments/*/hidden_checks.py"))
    found = []
    for path in files:
        for line, literal in python_strings(path):
            for pattern, use in BANNED.items():
                if re.search(pattern, literal, flags=re.I) and re.search(r"[áéíóúñ¿¡]| de | la ",
                                                                          literal):
                    found.append(f"{path.relative_to(ROOT)}:{line}: {literal[:80]} (use {use})")
    assert not found, "\n".join(found)


def test_the_term_scan_sees_what_it_must_and_skips_code():
    text = ("El **overhead** y la hoja técnica.\n\n```{code-cell} ipython3\noverhead = 1\n```\n"
            "`overhead_s`, la sobrecarga (*overhead*), y {glue:text}`techo`.")
    seen = prose(text)
    assert len(re.findall(r"\boverheads?\b", seen)) == 1  # the bold one, not code nor gloss
    assert "hoja técnica" in seen and "overhead = 1" not in seen and "techo" not in seen
