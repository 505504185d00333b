"""Lab 4, PagedAttention and prefix caching: run it and print its evidence contract as JSON.

    python labs/04-paged-attention/lab.py --seed 0 [--profile ci] [--set block_size=8] [--json out.json]
"""

import sys

from ai_evolution.labs.__main__ import main

if __name__ == "__main__":
    sys.exit(main(["run", "paged_attention", *sys.argv[1:]]))
