"""Lab 10, determinism: run it and print its evidence contract as JSON.

    python labs/10-determinism/lab.py --seed 0 [--profile ci] [--set copies=24] [--json out.json]
"""

import sys

from ai_evolution.labs.__main__ import main

if __name__ == "__main__":
    sys.exit(main(["run", "determinism", *sys.argv[1:]]))
