"""Lab 8, FlashAttention: run it and print its evidence contract as JSON.

    python labs/08-flash-attention/lab.py --seed 0 [--profile ci] [--set block=32] [--json out.json]
"""

import sys

from ai_evolution.labs.__main__ import main

if __name__ == "__main__":
    sys.exit(main(["run", "flash_attention", *sys.argv[1:]]))
