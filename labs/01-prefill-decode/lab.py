"""Lab 1, prefill, decode and the memory roofline: run it and print its evidence contract as JSON.

    python labs/01-prefill-decode/lab.py --seed 0 [--profile ci] [--set batch_sizes=1,2,4] [--json out.json]
"""

import sys

from ai_evolution.labs.__main__ import main

if __name__ == "__main__":
    sys.exit(main(["run", "roofline", *sys.argv[1:]]))
