"""The grader against one submission that would stop grading for everyone (issue 26, items 4 and 5),
cheaply: no kernel runs here. File names in any bytes, links, FIFOs, colliding long names, a
recursion bomb and an exception inside the grader each cost their own row only; the gradebook is
safe to open in a spreadsheet; every process of a submission draws from one wall-clock budget
and its scratch folder has a size bound; the grader records the library version it used."""

from __future__ import annotations

import ast
import csv
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from ai_evolution import __version__
from ai_evolution.grading import grade_folder, merge_outputs, student_ids
from ai_evolution.grading.intake import (MAX_AST_DEPTH, MAX_ID, Refused, list_submissions,
                                         parse_problem, read_submission, shown_name)
from ai_evolution.grading.report import csv_cell, feedback_md, gradebook_csv, md_code
from ai_evolution.grading.sandbox import (Finished, _bwrap_base, budget_left, disk_bytes,
                                          isolation, new_scratch, run_untrusted,
                                          submission_limits)
from ai_evolution.grading.score import CriterionScore, Grade, version_notes
from ai_evolution.grading import find_assessment


def code_nb(*sources: str) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(s) for s in sources]
    return nb


def long_sum(n: int) -> str:
    return "x = " + " + ".join(["1"] * n)


# --- ids and names ----------------------------------------------------------------------------------

def test_long_colliding_names_get_bounded_unique_ids():
    a, b, c = ("a" * 240 + mark * 8 for mark in "ñ!?")  # 248 characters, one id once cleaned
    got = [sid for sid, _ in student_ids([Path(f"{a}.ipynb"), Path(f"{b}.ipynb"),
                                          Path(f"{c}.ipynb")])]
    assert len(set(got)) == 3 and all(len(sid) <= MAX_ID for sid in got), got
    assert all(len(f"{sid}.ipynb".encode()) < 255 for sid in got)  # a file name the OS accepts
    assert got[0] == "a" * (MAX_ID - 5)


def test_names_in_any_bytes_and_with_newlines_are_shown_safely(tmp_path):
    raw = os.fsencode(tmp_path) + b"/no_utf8_\xff\xfe.ipynb"
    with open(raw, "wb") as fh:
        fh.write(b"{}")
    forged = tmp_path / "ana\n- Puntuación automática: **13 de 13**.ipynb"
    forged.write_text("{}", encoding="utf-8")
    subs = {s.student_id: s for s in list_submissions(tmp_path)}
    assert set(subs) == {"no_utf8", "ana_-_Puntuación_automática_13_de_13"}
    shown = subs["no_utf8"].shown
    assert shown == "no_utf8_\ufffd\ufffd.ipynb" and shown.encode("utf-8")  # encodable
    assert "\n" not in subs["ana_-_Puntuación_automática_13_de_13"].shown
    assert read_submission(subs["no_utf8"].path) == b"{}"  # the real bytes name still opens
    assert shown_name("a\u202eb\tc") == "a\ufffdb\ufffdc"  # bidi override and tab


def test_a_file_name_cannot_close_its_code_span_or_start_a_line():
    name = shown_name("x` **13 de 13** `\n# Nota: 13.ipynb")
    span = md_code(name)
    fence = span[: len(span) - len(span.lstrip("`"))]
    assert len(fence) == 2 and span.endswith(fence) and span.count(fence) == 2
    g = Grade("x", name, "ok", "", [CriterionScore("a", "A", 1, 0, "m")], ())
    text = feedback_md(g, find_assessment("kv_cache"), 0)
    assert [line for line in text.splitlines() if "13 de 13" in line] == \
        [f"- Archivo entregado: {span}"]


# --- files --------------------------------------------------------------------------------------------

def test_links_fifos_folders_and_huge_files_are_refused_without_blocking(tmp_path):
    real = tmp_path / "solucion.ipynb"
    real.write_text("{}", encoding="utf-8")
    (tmp_path / "enlace.ipynb").symlink_to(real)
    os.mkfifo(tmp_path / "tuberia.ipynb")  # opening it for reading would block forever
    (tmp_path / "carpeta.ipynb").mkdir()
    (tmp_path / ".oculto.ipynb").write_text("{}", encoding="utf-8")
    subs = {s.student_id: s.path for s in list_submissions(tmp_path)}
    assert set(subs) == {"solucion", "enlace", "tuberia", "carpeta"}
    start = time.monotonic()
    reasons = {}
    for sid, path in subs.items():
        try:
            read_submission(path)
        except Refused as why:
            reasons[sid] = str(why)
    assert time.monotonic() - start < 5
    assert set(reasons) == {"enlace", "tuberia", "carpeta"}
    assert "enlace simbólico" in reasons["enlace"] and "FIFO" in reasons["tuberia"]
    assert "carpeta" in reasons["carpeta"]


# --- code the grader's parser cannot take ---------------------------------------------------------------

def test_a_recursion_bomb_is_refused_before_the_graders_walks_see_it():
    from ai_evolution.grading.rebuild import extract

    bomb = code_nb("def f():\n    " + long_sum(800) + "\n    return x")
    with pytest.raises(RecursionError):  # what the screen protects the grader from
        extract(bomb, set())
    assert "anida" in parse_problem(bomb)
    assert "no se puede analizar" in parse_problem(code_nb("import math", long_sum(5000)))
    assert parse_problem(code_nb("x = (" * 40 + "1" + ")" * 40,
                                 "def f(:\n    pass",  # a syntax error is the kernel's business
                                 "%matplotlib inline\nimport math")) is None
    assert MAX_AST_DEPTH >= 100


# --- the gradebook in a spreadsheet ---------------------------------------------------------------------

def test_gradebook_text_cells_cannot_be_formulas_and_points_stay_numbers():
    assert [csv_cell(x) for x in ("=1+1", "+1", "-1", "@SUM(A1)", "\tx", "\rx", "ok", "")] == \
        ["'=1+1", "'+1", "'-1", "'@SUM(A1)", "'\tx", "'\rx", "ok", ""]
    a = find_assessment("kv_cache")
    scores = [CriterionScore(c.id, c.title, c.points, c.points, "m") for c in a.criteria]
    g = Grade("=HYPERLINK(\"http://x\")", "s", "error", "=cmd|' /C calc'!A0", scores, (),
              notes=["-2+3"])
    row = list(csv.DictReader(io.StringIO(gradebook_csv([g], a))))[0]
    assert row["student_id"].startswith("'=") and row["reason"].startswith("'=")
    assert row["notes"] == "'-2+3" and row["similarity"] == ""
    assert float(row["total"]) == sum(c.points for c in a.criteria)
    assert all(row[c.id] == f"{c.points:g}" for c in a.criteria)


# --- the library version --------------------------------------------------------------------------------

def test_a_contract_from_another_library_version_gets_a_warning():
    assert version_notes({"environment": {"versions": {"ai_evolution": __version__}}}) == []
    assert version_notes(None) == []
    (note,) = version_notes({"environment": {"versions": {"ai_evolution": "0.0.9"}}})
    assert "0.0.9" in note and __version__ in note
    (note,) = version_notes({"environment": {}})
    assert "no dice" in note


# --- limits from outside ----------------------------------------------------------------------------------

def _run(code: str, scratch: Path, timeout_s: float = 60) -> Finished:
    return run_untrusted([sys.executable, "-c", code], b"", scratch, timeout_s, 0,
                         scratch / "log.txt")


def test_every_process_of_a_submission_draws_from_one_wall_clock_budget():
    scratch = new_scratch()
    try:
        with submission_limits(budget_s=2.0):
            start = time.monotonic()
            first = _run("import time; time.sleep(30)", scratch)
            elapsed = time.monotonic() - start
            second = _run("print('no debe arrancar')", scratch)
            assert budget_left() < 0
        assert first.killed == "budget" and elapsed < 6
        assert second.killed == "budget" and second.returncode is None  # never started
        assert budget_left() is None  # the limits end with the submission
        assert _run("print('ok')", scratch).stdout == b"ok\n"
    finally:
        import shutil

        shutil.rmtree(scratch, ignore_errors=True)


def test_a_scratch_folder_over_its_disk_bound_is_stopped(tmp_path):
    (tmp_path / "sparse").open("wb").truncate(2**30)  # 1 GiB apparent, nothing allocated
    (tmp_path / "full").write_bytes(os.urandom(3 * 2**20))
    assert 3 * 2**20 <= disk_bytes(tmp_path) < 8 * 2**20
    scratch = new_scratch()
    try:
        with submission_limits(disk_mb=8):
            done = _run("import time\nwith open('relleno', 'wb') as fh:\n"
                        "    for _ in range(64):\n        fh.write(b'x' * 2**20)\n"
                        "        fh.flush()\ntime.sleep(30)", scratch)
        assert done.killed == "disk"
    finally:
        import shutil

        shutil.rmtree(scratch, ignore_errors=True)


@pytest.mark.skipif(isolation() != "bwrap", reason="bubblewrap (bwrap) no está disponible")
@pytest.mark.parametrize("sized", [True, False], ids=["bwrap>=0.5", "bwrap<0.5"])
def test_bubblewrap_ram_filesystems_are_bounded_and_its_root_is_read_only(tmp_path, monkeypatch,
                                                                           sized):
    import ai_evolution.grading.sandbox as sandbox

    monkeypatch.setattr(sandbox, "_bwrap_sizes_tmpfs", lambda: sized)
    script = ("import os, sys\nout = {}\n"
              "for path in ('/tmp/x', '/dev/shm/x', '/x', '/dev/x', sys.argv[1] + '/x'):\n"
              "    try:\n        with open(path, 'wb') as fh:\n"
              "            for _ in range(96):\n                fh.write(b'x' * 2**20)\n"
              "        out[path] = 'escrito'\n"
              "    except OSError as err:\n        out[path] = err.strerror\n"
              "print(repr(out))")
    done = subprocess.run(_bwrap_base([tmp_path], []) + ["--", sys.executable, "-c", script,
                                                         str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    seen = ast.literal_eval(done.stdout)
    ram = "No space left on device" if sized else "Read-only file system"
    assert seen["/tmp/x"] == seen["/dev/shm/x"] == ram, seen
    assert seen["/x"] == seen["/dev/x"] == "Read-only file system", seen
    assert seen[f"{tmp_path}/x"] == "escrito"  # the scratch folder, on disk, is where to write


# --- the whole folder: one bad file never stops the others -------------------------------------------------

def test_pathological_files_and_a_grader_crash_cost_only_their_own_rows(tmp_path, monkeypatch):
    import ai_evolution.grading as grading

    folder = tmp_path / "entregas"
    folder.mkdir()
    good = code_nb("x = 1")
    nbformat.write(good, folder / "bien.ipynb")
    nbformat.write(code_nb("y = 2"), folder / "rompe_corrector.ipynb")
    nbformat.write(code_nb("z = 3"), folder / "otra_version.ipynb")
    nbformat.write(code_nb(long_sum(800)), folder / "bomba.ipynb")
    nbformat.write(code_nb(long_sum(5000)), folder / "bomba_grande.ipynb")
    (folder / "enlace.ipynb").symlink_to(folder / "bien.ipynb")
    os.mkfifo(folder / "tuberia.ipynb")
    with open(os.fsencode(folder) + b"/mal_\xff.ipynb", "wb") as fh:
        fh.write(b"no es JSON")
    for mark in "!?":  # 254-byte names that clean to one id
        (folder / (("a" * 240) + mark * 8 + ".ipynb")).write_text("{}", encoding="utf-8")
    (folder / "linea\n13 de 13.ipynb").write_text("{}", encoding="utf-8")
    ran = []

    def fake_run(data, assessment, *args):  # no kernel here: the bad files never get this far
        from ai_evolution.grading.notebook import RunInfo

        if b"y = 2" in data:
            raise RuntimeError("fallo del corrector")
        if b"z = 3" in data:  # ran fine, with a contract printed by another library version
            return RunInfo(status="ok", exported=True, isolation=isolation(), contract={
                "environment": {"versions": {"ai_evolution": "0.0.9"}}})
        ran.append(data)
        return RunInfo(status="invalid", reason="prueba", isolation=isolation())

    monkeypatch.setattr(grading, "run_notebook", fake_run)
    import ai_evolution.grading.checker as checker

    monkeypatch.setattr(checker, "check_functions", lambda *a, **k: ({}, []))  # no checker here
    grades = {g.student_id: g for g in grade_folder("kv_cache", folder, out=tmp_path / "notas")}
    out = tmp_path / "notas"
    book = {r["student_id"]: r for r in csv.DictReader(
        (out / "gradebook.csv").open(encoding="utf-8", newline=""))}
    assert len(book) == 11 and set(book) == set(grades)
    other = book["otra_version"]  # the contract's library version is not the grader's
    assert "0.0.9" in other["notes"] and __version__ in other["notes"]
    assert "- Aviso: el contrato se produjo con ai_evolution 0.0.9" in \
        (out / "feedback" / "otra_version.md").read_text(encoding="utf-8")
    assert all(r["notes"] == "" for sid, r in book.items() if sid != "otra_version")
    status = {sid: r["status"] for sid, r in book.items()}
    assert status["enlace"] == status["tuberia"] == "refused"
    assert status["bomba"] == status["bomba_grande"] == "refused"
    assert status["bien"] == "invalid" and status["rompe_corrector"] == "grader_error"
    assert "fallo del corrector" in book["rompe_corrector"]["reason"]
    assert status["mal"] == "invalid"
    assert len(ran) == 5  # bien, mal, the two long names and the newline: nothing else ran
    assert all(float(r["total"]) == 0 for sid, r in book.items() if sid != "otra_version")
    assert all(len(sid) <= MAX_ID for sid in book)
    for sid in book:
        text = (out / "feedback" / f"{sid}.md").read_text(encoding="utf-8")
        assert "13 de 13" not in text.replace(md_code(grades[sid].source), "")
    assert json.loads((out / "grading.json").read_text())["ai_evolution"] == __version__


def test_merge_keeps_the_version_record_and_refuses_shards_of_other_versions(tmp_path):
    header = "student_id,runs,total,max_total,status,reason,isolation\n"
    parts = []
    for name, sid, version in (("uno", "a", __version__), ("dos", "b", __version__),
                               ("tres", "c", "0.0.1")):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "gradebook.csv").write_text(header + f"{sid},1,1,1,ok,,bwrap\n")
        (folder / "grading.json").write_text(json.dumps(
            {"ai_evolution": version, "lab": "kv_cache", "seed": 0, "students": 1}))
        parts.append(folder)
    assert merge_outputs(parts[:2], tmp_path / "todo") == 2
    record = json.loads((tmp_path / "todo" / "grading.json").read_text())
    assert record == {"ai_evolution": __version__, "lab": "kv_cache", "seed": 0, "students": 2}
    with pytest.raises(ValueError, match="versión de ai_evolution"):
        merge_outputs(parts, tmp_path / "mal")


def test_the_cli_refuses_limits_that_are_not_positive(tmp_path, capsys):
    from ai_evolution.grading.__main__ import main

    for flag, value in (("--budget", "0"), ("--disk-mb", "-5"), ("--timeout", "0")):
        assert main(["--lab", "kv_cache", str(tmp_path), flag, value]) == 2
        err = capsys.readouterr().err
        assert f"{flag} debe ser un número positivo" in err, err
