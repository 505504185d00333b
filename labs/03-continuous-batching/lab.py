"""Lab 3, continuous batching: run it and print its evidence contract as JSON.

    python labs/03-continuous-batching/lab.py --seed 0 [--profile ci] [--set caps=8,32,192] [--json out.json]
"""

import sys

from ai_evolution.labs.__main__ import main

if __name__ == "__main__":
    sys.exit(main(["run", "continuous_batching", *sys.argv[1:]]))
