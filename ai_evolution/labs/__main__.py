"""CLI: ``python -m ai_evolution.labs run KIND --seed N [--profile ci] [--set k=v] [--json FILE]``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import PROFILES, LabParamError, list_labs, run_lab, to_json


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ai_evolution.labs")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="list the lab kinds")
    run = sub.add_parser("run", help="run a lab and print its evidence contract as JSON")
    run.add_argument("kind")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--profile", choices=PROFILES, default=None)
    run.add_argument("--device", choices=("cpu", "cuda", "mps"), default=None)
    run.add_argument("--set", dest="sets", action="append", default=[], metavar="K=V",
                     help="a lab parameter (repeatable); lists are comma-separated")
    run.add_argument("--json", type=Path, default=None, help="also write the contract here")
    args = parser.parse_args(argv)

    if args.command == "list":
        print("\n".join(list_labs()))
        return 0
    params = {}
    for item in args.sets:
        if "=" not in item:
            parser.error(f"--set espera K=V, recibió {item!r}")
        key, value = item.split("=", 1)
        params[key.strip()] = value.strip()
    try:
        contract = run_lab(args.kind, seed=args.seed, profile=args.profile, device=args.device,
                           **params)
    except LabParamError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    text = to_json(contract)
    if args.json:
        args.json.write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
