"""Lab 6, observability and load testing: run it and print its evidence contract as JSON.

    python labs/06-observability/lab.py --seed 0 [--profile ci] [--set load_fractions=0.5,1,2] [--json out.json]
"""

import sys

from ai_evolution.labs.__main__ import main

if __name__ == "__main__":
    sys.exit(main(["run", "observability", *sys.argv[1:]]))
