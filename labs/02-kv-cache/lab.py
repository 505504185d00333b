"""Lab 2, the KV cache: run it and print its evidence contract as JSON.

    python labs/02-kv-cache/lab.py --seed 0 [--profile ci] [--set max_new_tokens=64] [--json out.json]
"""

import sys

from ai_evolution.labs.__main__ import main

if __name__ == "__main__":
    sys.exit(main(["run", "kv_cache", *sys.argv[1:]]))
