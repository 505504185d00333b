"""CLI: ``python -m ai_evolution.grading --lab KIND FOLDER [--out DIR] [--timeout S] [--budget S]
[--disk-mb N] [--jobs N] [--shard i/n]`` and ``python -m ai_evolution.grading merge OUT PART [PART...]``.

Grades every ``*.ipynb`` directly inside FOLDER (one per student; the student id is the file
name without extension), or with ``--shard i/n`` the deterministic subset ``i`` of ``n``, and
writes ``OUT/gradebook.csv``, ``OUT/grading.json`` (the library version used),
``OUT/feedback/<id>.md`` and ``OUT/executed/<id>.ipynb``.
``merge`` joins the outputs of the shards into OUT. Exit code 0 when grading (or merging)
completed, whatever the students scored; 2 for a usage error (unknown lab, missing folder,
bad shard, gradebooks that do not match).

The process makes itself a child subreaper (Linux), so whatever a submission leaves behind
after detaching from its process tree is re-parented here and killed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import BUDGET_FACTOR, DEFAULTS, grade_folder, merge_outputs, parse_shard
from .assessment import AssessmentError, available_kinds
from .sandbox import set_subreaper
from .secret import SecretError


def merge_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m ai_evolution.grading merge",
                                     description="Une los libros de notas de varios fragmentos.")
    parser.add_argument("out", type=Path, help="carpeta de salida")
    parser.add_argument("parts", type=Path, nargs="+",
                        help="carpetas de salida de los fragmentos (o sus gradebook.csv)")
    args = parser.parse_args(argv)
    try:
        n = merge_outputs(args.parts, args.out)
    except (OSError, ValueError, StopIteration) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"{n} estudiantes; libro de notas: {args.out / 'gradebook.csv'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["merge"]:
        return merge_main(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m ai_evolution.grading",
                                     description="Corrector automático de los laboratorios.")
    parser.add_argument("folder", type=Path, help="carpeta con un cuaderno .ipynb por estudiante")
    parser.add_argument("--lab", required=True, help="tipo de laboratorio (p. ej. kv_cache)")
    parser.add_argument("--out", type=Path, default=None,
                        help="carpeta de salida (por defecto FOLDER/grading)")
    parser.add_argument("--timeout", type=float, default=DEFAULTS["timeout_s"],
                        help="segundos por cuaderno entero (por defecto %(default)s)")
    parser.add_argument("--budget", type=float, default=None,
                        help="segundos en total por entrega: el cuaderno y cada arranque de la "
                             f"corrección de sus ejercicios (por defecto {BUDGET_FACTOR} veces "
                             "--timeout)")
    parser.add_argument("--disk-mb", type=int, default=DEFAULTS["disk_mb"],
                        help="MiB de disco por carpeta de trabajo de una entrega (por defecto "
                             "%(default)s)")
    parser.add_argument("--cell-timeout", type=float, default=DEFAULTS["cell_timeout_s"],
                        help="segundos por celda antes de interrumpirla (por defecto %(default)s)")
    parser.add_argument("--memory-mb", type=int, default=DEFAULTS["memory_mb"],
                        help="MiB de memoria por cuaderno (por defecto %(default)s)")
    parser.add_argument("--jobs", type=int, default=1, help="cuadernos a la vez (por defecto 1)")
    parser.add_argument("--seed", type=int, default=0, help="semilla inyectada (por defecto 0)")
    parser.add_argument("--assessments", type=Path, default=None,
                        help="carpeta de evaluaciones (por defecto assessments/ del repositorio)")
    parser.add_argument("--keep-scratch", action="store_true",
                        help="no borrar los registros de ejecución (para depurar)")
    parser.add_argument("--secret-file", type=Path, default=None,
                        help="archivo con el secreto del que salen los casos ocultos (o la "
                             "variable AI_EVOLUTION_GRADING_SECRET; sin ninguno, se genera uno)")
    parser.add_argument("--nonce", default=None,
                        help="nonce de la ejecución (por defecto, aleatorio; queda en run.json)")
    parser.add_argument("--shard", default=None,
                        help="corregir solo el fragmento i de n (i/n, por ejemplo 2/8)")
    args = parser.parse_args(argv)
    try:
        shard = parse_shard(args.shard) if args.shard else None
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for flag, value in (("--timeout", args.timeout), ("--budget", args.budget),
                        ("--disk-mb", args.disk_mb), ("--memory-mb", args.memory_mb)):
        if value is not None and not value > 0:
            print(f"error: {flag} debe ser un número positivo, no {value!r}", file=sys.stderr)
            return 2
    if not args.folder.is_dir():
        print(f"error: {args.folder} no es una carpeta", file=sys.stderr)
        return 2
    try:
        grades = grade_folder(args.lab, args.folder, out=args.out, timeout_s=args.timeout,
                              cell_timeout_s=args.cell_timeout, memory_mb=args.memory_mb,
                              jobs=args.jobs, seed=args.seed, assessments_dir=args.assessments,
                              keep_scratch=args.keep_scratch, log=sys.stderr, shard=shard,
                              secret_file=args.secret_file, nonce=args.nonce,
                              budget_s=args.budget, disk_mb=args.disk_mb)
    except SecretError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except (AssessmentError, ValueError) as err:
        kinds = ", ".join(available_kinds(args.assessments))
        print(f"error: {err} (laboratorios con evaluación: {kinds})", file=sys.stderr)
        return 2
    out = args.out or args.folder / "grading"
    print(f"{len(grades)} cuadernos corregidos; libro de notas: {out / 'gradebook.csv'}")
    return 0


if __name__ == "__main__":
    set_subreaper()
    sys.exit(main())
