"""Lab 5, the scheduler: run it and print its evidence contract as JSON.

    python labs/05-scheduler/lab.py --seed 0 [--profile ci] [--set budgets=16,64,512] [--json out.json]
"""

import sys

from ai_evolution.labs.__main__ import main

if __name__ == "__main__":
    sys.exit(main(["run", "scheduler", *sys.argv[1:]]))
