"""Lab 13, beyond one GPU: run it and print its evidence contract as JSON.

    python labs/13-distributed/lab.py --seed 0 [--profile ci] [--set tp_pairs=9] [--json out.json]
"""

import sys

from ai_evolution.labs.__main__ import main

if __name__ == "__main__":
    sys.exit(main(["run", "distributed", *sys.argv[1:]]))
