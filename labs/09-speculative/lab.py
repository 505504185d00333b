"""Lab 9, speculative decoding: run it and print its evidence contract as JSON.

    python labs/09-speculative/lab.py --seed 0 [--profile ci] [--set ks=1,2,4] [--json out.json]
"""

import sys

from ai_evolution.labs.__main__ import main

if __name__ == "__main__":
    sys.exit(main(["run", "speculative", *sys.argv[1:]]))
