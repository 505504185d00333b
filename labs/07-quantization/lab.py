"""Lab 7, quantization: run it and print its evidence contract as JSON.

    python labs/07-quantization/lab.py --seed 0 [--profile ci] [--set repeats=5] [--json out.json]
"""

import sys

from ai_evolution.labs.__main__ import main

if __name__ == "__main__":
    sys.exit(main(["run", "quantization", *sys.argv[1:]]))
