"""Naive attention vs tiled attention (``model.flash``, a Python loop of tiles) vs torch's fused
``scaled_dot_product_attention``: peak memory and time as the sequence grows, side by side.

    python benchmarks/flash_attention.py [--sizes 256 512 1024 2048] [--reps 5] [--heads 8]
                                         [--kv-heads 2] [--head-dim 64] [--block 128] [--threads N]

One causal prefill of N tokens (batch 1, fp32). Memory: the allocator's peak above what was
allocated before the call (``model.flash.peak_memory_bytes``: on CPU every allocation and free
``torch.profiler`` records with ``profile_memory=True``, summed in time order; on CUDA
``torch.cuda.max_memory_allocated``), next to what the naive version must hold by construction
(S and P, ``heads x N^2`` fp32 each) and the output itself (``heads x N x d``). Time: the three
variants interleaved rep by rep (naive, tiled, SDPA, naive, ...), so drift on a shared machine
hits them alike; ratios are medians over the paired reps with a bootstrap interval. A Python
loop of tiles is not a fused kernel: it moves the bytes FlashAttention moves, but every tile
costs a few interpreter round trips and small matmuls, so it is expected to be slower than SDPA
(which on CPU runs its own fused, tiled kernel) and, at small N, slower than the naive version.
The last column is the IO model's slow-memory traffic (``sim.attention_io``, 100 KiB of fast
memory, fp32) for one head: what the tiling buys on a machine where those bytes are the cost.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from ai_evolution import claims
from ai_evolution.model.flash import flash_attention, naive_attention, peak_memory_bytes, random_qkv
from ai_evolution.sim.attention_io import flash_io_for_memory, naive_io

FAST_MEMORY = 100 * 1024   # bytes of SRAM per streaming multiprocessor, the paper's ~100 KB


def variants(block: int):
    return {
        "naive": lambda q, k, v: naive_attention(q, k, v, causal=True),
        "tiled": lambda q, k, v: flash_attention(q, k, v, causal=True, block_q=block, block_k=block),
        "sdpa": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 512, 1024, 2048])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--block", type=int, default=128, help="query and key tile of the loop")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    fns = variants(args.block)
    H, d = args.heads, args.head_dim
    print(f"causal prefill, batch 1, {H} query heads / {args.kv_heads} KV heads, d = {d}, fp32, "
          f"tile {args.block}x{args.block}, {torch.get_num_threads()} thread(s), {args.reps} reps")
    print(f"\n{'N':>6} {'S+P bytes':>11} {'out bytes':>10} | {'peak naive':>11} {'peak tiled':>11} "
          f"{'peak sdpa':>10} | {'IO naive':>9} {'IO tiled':>9} (MB)")
    timings = {}
    for n in args.sizes:
        q, k, v = random_qkv(1, H, args.kv_heads, n, n, d, seed=n)
        ref = fns["sdpa"](q, k, v)
        peaks = {}
        for name, fn in fns.items():
            out, peaks[name] = peak_memory_bytes(lambda: fn(q, k, v))
            assert (out - ref).abs().max() < 1e-4, name
        sp = 2 * H * n * n * 4
        io_naive = H * naive_io(n, d, 4).hbm_bytes
        io_tiled = H * flash_io_for_memory(n, d, FAST_MEMORY, 4, causal=True).hbm_bytes
        print(f"{n:>6} {sp / 1e6:>11.1f} {q.nbytes / 1e6:>10.2f} | {peaks['naive'] / 1e6:>11.1f} "
              f"{peaks['tiled'] / 1e6:>11.2f} {peaks['sdpa'] / 1e6:>10.2f} | "
              f"{io_naive / 1e6:>9.1f} {io_tiled / 1e6:>9.1f}")
        rows = {name: [] for name in fns}
        for r in range(args.reps + 1):                   # the first round warms up, dropped
            for name, fn in fns.items():
                t = time.perf_counter()
                fn(q, k, v)
                if r:
                    rows[name].append((time.perf_counter() - t) * 1e3)
        timings[n] = rows

    print(f"\n{'N':>6} {'naive ms':>9} {'tiled ms':>9} {'sdpa ms':>9} | {'tiled / sdpa':>20} "
          f"{'naive / sdpa':>20}")
    for n, rows in timings.items():
        med = {name: statistics.median(x) for name, x in rows.items()}
        ts, ns = (claims.ratio_estimate(rows[a], rows["sdpa"]) for a in ("tiled", "naive"))
        print(f"{n:>6} {med['naive']:>9.2f} {med['tiled']:>9.2f} {med['sdpa']:>9.2f} | "
              f"{f'{ts.median:.1f} [{ts.low:.1f}-{ts.high:.1f}]':>20} "
              f"{f'{ns.median:.1f} [{ns.low:.1f}-{ns.high:.1f}]':>20}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
