"""Lab 12, operating the service: run it and print its evidence contract as JSON.

    python labs/12-operations/lab.py --seed 0 [--profile ci] [--set flood_factor=16] [--json out.json]
"""

import sys

from ai_evolution.labs.__main__ import main

if __name__ == "__main__":
    sys.exit(main(["run", "operations", *sys.argv[1:]]))
