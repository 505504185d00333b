"""Batch-1 decode step of the same weights in fp32, bf16, int8 and int4 (reference and fast
paths), against the bytes each step reads, measured side by side in one run.

    python benchmarks/quant_decode.py [--model cpu-200m] [--reps 5] [--new-tokens 24]
                                      [--group-size 128] [--threads N]

Does halving the bytes halve the step? Every variant decodes the same prompt with the library's
``generate`` (contiguous KV cache); its step is the median interval between tokens. The int8 and
int4 variants quantize the bf16 model (``model.quant.quantize_model``: bf16 activations and
scales) and run either ``reference`` (dequantize each matrix, then matmul) or ``fast`` (the fused
torch kernel the layer reports; see ``QuantizedLinear.kernel``). Bytes per step come from the
cost model (``sim.decode_step_cost`` with ``weight_format``): the integers, their scales and the
float embedding row and KV cache, i.e. what a kernel that reads the format directly moves. The
reference path moves more (it writes a dequantized float matrix and reads it back), so its
floor / step ratio says how far dequantize-then-matmul is from what the format allows.

The floor is bytes / the memory's read bandwidth, measured in this same run by
``hardware.measure_stream_bandwidths`` (its ``torch.sum`` probe). Probes and variants are
interleaved rep by rep, so the shared machine's drift hits them alike; ratios are medians over
the paired reps with a bootstrap interval.
"""

from __future__ import annotations

import argparse
import copy
import statistics

import torch

from ai_evolution import claims
from ai_evolution.hardware import measure_stream_bandwidths
from ai_evolution.model import get_preset, random_model
from ai_evolution.model.quant import kernels, quantize_model, set_backend
from ai_evolution.sim import decode_step_cost, time_floor_s
from decode_b1 import ours_step_s as step_s  # the same per-token timing (run from benchmarks/)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="cpu-200m")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=24)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--group-size", type=int, default=128, help="int4 group size")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads for every variant and probe (default: torch's own)")
    args = parser.parse_args(argv)
    if args.threads is not None:
        if args.threads < 1:
            parser.error(f"--threads must be >= 1; got {args.threads}")
        torch.set_num_threads(args.threads)

    fp32 = random_model(get_preset(args.model), seed=0).eval()
    bf16 = copy.deepcopy(fp32).to(torch.bfloat16)
    int4 = f"int4-g{args.group_size}"
    q8, q4 = quantize_model(bf16, "int8"), quantize_model(bf16, int4)
    config = fp32.config
    prompt = torch.randint(3, config.vocab_size, (args.prompt_len,),
                           generator=torch.Generator().manual_seed(0)).tolist()
    ctx = args.prompt_len + args.new_tokens // 2
    # (label, model, backend or None, dtype name of the cost model, weight format)
    variants = [("fp32", fp32, None, "fp32", None), ("bf16", bf16, None, "bf16", None),
                ("int8 reference", q8, "reference", "bf16", "int8"),
                ("int8 fast", q8, "fast", "bf16", "int8"),
                (f"{int4} reference", q4, "reference", "bf16", int4),
                (f"{int4} fast", q4, "fast", "bf16", int4)]
    cost = {label: decode_step_cost(config, 1, ctx, dt, weight_format=fmt).bytes
            for label, _, _, dt, fmt in variants}
    kernel = {}
    for label, model, backend, _, _ in variants:
        if backend is not None:
            set_backend(model, backend)
            kernel[label] = ", ".join(f"{k} x{n}" for k, n in kernels(model, torch.bfloat16).items())
        else:
            kernel[label] = "F.linear"
        step_s(model, prompt, 3)  # warm-up (and the fast kernels' one-off repacking)
    rows: dict[str, list[float]] = {label: [] for label, *_ in variants}

    def measure(rep: int) -> None:
        for label, model, backend, _, _ in variants:
            if backend is not None:
                set_backend(model, backend)
            rows[label].append(step_s(model, prompt, args.new_tokens) * 1e3)
        print(f"rep {rep + 1}/{args.reps}: " + ", ".join(f"{k} {v[-1]:.1f}" for k, v in rows.items()),
              flush=True)

    probes = measure_stream_bandwidths(repeats=args.reps, between=measure, progress=False)
    read = probes["read"]
    print(f"\nmodel {args.model} ({sum(p.numel() for p in fp32.parameters()) / 1e6:.0f} M "
          f"parameters), batch 1, context ~{ctx} tokens, threads {torch.get_num_threads()}, "
          f"torch {torch.__version__}")
    print(f"read probe: {read.median:.1f} GB/s (median of {args.reps}; reps "
          f"{', '.join(f'{x:.1f}' for x in read.samples)})")
    print(f"{'variant':<22}{'MB/step':>9}{'bytes/fp32':>11}{'step ms':>9}{'range':>13}"
          f"{'tok/s':>8}{'fp32 step/step':>20}{'floor ms':>9}{'floor/step':>18}  kernel")
    base = rows["fp32"]
    for label, *_ in variants:
        floors = [time_floor_s(cost[label], g * 1e9) * 1e3 for g in read.samples]
        med = statistics.median(rows[label])
        speed = claims.ratio_estimate(base, rows[label])
        eff = claims.ratio_estimate(floors, rows[label])
        print(f"{label:<22}{cost[label] / 1e6:>9.1f}{cost[label] / cost['fp32']:>11.3f}"
              f"{med:>9.2f}{f'{min(rows[label]):.1f}-{max(rows[label]):.1f}':>13}"
              f"{1e3 / med:>8.1f}"
              f"{f'{speed.median:.2f}x [{speed.low:.2f}-{speed.high:.2f}]':>20}"
              f"{statistics.median(floors):>9.2f}"
              f"{f'{eff.median:.0%} [{eff.low:.0%}-{eff.high:.0%}]':>18}  {kernel[label]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
