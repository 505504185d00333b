"""Lab 11, hybrid models: run it and print its evidence contract as JSON.

    python labs/11-hybrid/lab.py --seed 0 [--profile ci] [--set rounds=9] [--json out.json]
"""

import sys

from ai_evolution.labs.__main__ import main

if __name__ == "__main__":
    sys.exit(main(["run", "hybrid", *sys.argv[1:]]))
