"""Tensor parallelism on this machine: decode tokens/s with the model on one rank (TP=1) and
split across two (TP=2, gloo), side by side in one run.

    python benchmarks/tensor_parallel.py [--model tiny-es] [--batch 8] [--prompt-len 32]
        [--max-tokens 64] [--reps 3] [--threads N] [--seed 0]

Both engines are built once (the TP=2 one starts its worker process and joins gloo before the
first rep) and run the same greedy decode workload alternately, A B A B, so the shared machine's
drift hits them alike. Every rank gets ``--threads`` intra-op threads (default 1): TP=2 may use
twice the cores of TP=1, as two GPUs are twice one. (Splitting the same cores instead, TP=1 on 2
threads against 2 ranks of 1, measured nothing but OpenMP's spinning on a 2-core machine shared
with other processes: TP=1's 2 threads ran several times slower than 1.) The figure of merit is decode tokens/s (the
tokens of pure decode steps over their time, from ``engine.history``), reported as the ratio
TP=2 / TP=1 per pair and its median. On a GPU node TP pays when the weights of one GPU's share
are what a decode step waits for; on this CPU both ranks share the same memory bandwidth and
cores, and every layer adds two all-reduces through the loopback, so TP=2 is expected to be
slower here: the script measures by how much, and how much of a TP=2 step rank 0 spends inside
``all_reduce`` (its own sum plus the wait for the other rank), beside what one all-reduce of a
decode step's message costs alone (``measure_allreduce``, two fresh processes doing nothing else).

Exactness: TP=2's greedy tokens must equal TP=1's (exit 1 if not).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys

import torch

from ai_evolution.engine import build_engine
from ai_evolution.engine.tensor_parallel import AllReduceTimer, decode_rate
from ai_evolution.hardware.allreduce import measure_allreduce
from ai_evolution.model import allreduce_bytes_per_step, load_model


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="tiny-es")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="intra-op threads per rank (default 1)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    model = load_model(args.model)
    rng = random.Random(args.seed)
    vocab = model.config.vocab_size
    prompts = [[rng.randrange(3, vocab) for _ in range(args.prompt_len)] for _ in range(args.batch)]
    options = dict(max_num_seqs=args.batch, kv_layout="paged", enable_prefix_caching=False,
                   max_model_len=args.prompt_len + args.max_tokens, decode_graphs=None)
    torch.set_num_threads(args.threads)  # every rank's (the TP=2 worker copies this process's)
    tp2 = build_engine(model, tensor_parallel_size=2, **options)
    tp1 = build_engine(model, **options)
    payload = allreduce_bytes_per_step(model.config, args.batch, next(model.parameters()).dtype)
    print(f"{args.model}: batch {args.batch}, {args.prompt_len} prompt tokens, {args.max_tokens} "
          f"new; {args.threads} thread(s) per rank; all-reduced per "
          f"decode step {payload / 2**10:.0f} KiB in {2 * model.config.num_layers} calls")
    dtype = next(model.parameters()).dtype
    alone = measure_allreduce([args.batch * model.config.hidden_size * dtype.itemsize], repeats=50,
                              warmup=3, dtype=dtype, threads=args.threads)[0]
    print(f"one all-reduce of {alone['bytes'] / 2**10:.0f} KiB alone: median "
          f"{1e6 * alone['median_s']:.0f} us (min {1e6 * alone['min_s']:.0f} us)")
    ratios, status = [], 0
    try:
        for rep in range(args.reps):
            r1, _, want = decode_rate(tp1, prompts, args.max_tokens)
            with AllReduceTimer() as timer:
                r2, s2, got = decode_rate(tp2, prompts, args.max_tokens)
            if got != want:
                print("TP=2 tokens differ from TP=1", file=sys.stderr)
                status = 1
            ratios.append(r2 / r1)
            print(f"rep {rep}: TP=1 {r1:8.1f} tok/s   TP=2 {r2:8.1f} tok/s   ratio "
                  f"{r2 / r1:.2f}   rank 0 in all_reduce {timer.seconds / s2:.0%} of TP=2 "
                  f"time ({timer.calls} calls, {1e6 * timer.seconds / max(timer.calls, 1):.0f} "
                  "us each)")
    finally:
        tp2.executor.close()
    print(f"median TP=2 / TP=1 decode tokens/s: {statistics.median(ratios):.2f} over "
          f"{len(ratios)} pairs (this machine: {os.cpu_count()} cores shared by both ranks)")
    return status


if __name__ == "__main__":
    sys.exit(main())
