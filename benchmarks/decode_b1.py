"""Batch-1 decode step of the library's model against the memory-bandwidth floor, and against
Hugging Face ``generate`` on the same weights, measured side by side in one run.

    python benchmarks/decode_b1.py [--model cpu-200m] [--reps 5] [--new-tokens 64] [--threads N]

The figure of merit is a ratio, not a time: floor / measured step, where the floor is the bytes a
decode step reads divided by the read bandwidth probed in this same run. Variants are interleaved
rep by rep so that the shared machine's drift hits them alike. Target on CPU, fp32, ~200M
params: >= 90 % of the floor. The floor of a cold matrix-vector product (measured in the same run)
is printed too: it is the best decode's matmuls can stream, so it separates "the GEMM kernel is
slower than a reduction" from "the engine adds overhead". "The linears alone" runs the model's
own matrix-vector products back to back with nothing between them: the ceiling that removing
every other cost of the step would reach with torch's GEMV kernels.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from ai_evolution.generation import generate
from ai_evolution.hardware import measure_bandwidth, measure_decode_matmul
from ai_evolution.model import get_preset, random_model
from ai_evolution.sim import decode_step_cost, time_floor_s

TARGET = 0.90  # issue 3: batch-1 decode on CPU, fp32, ~200M params


def ours_step_s(model, prompt: list[int], new_tokens: int) -> float:
    stamps: list[float] = []
    generate(model, prompt, new_tokens, on_token=lambda step, toks: stamps.append(time.perf_counter()))
    return statistics.median(b - a for a, b in zip(stamps, stamps[1:]))


def linears_only_step_s(model, steps: int) -> float:
    """One decode step's matrix-vector products and nothing else: every ``nn.Linear`` of the
    model, in order, on a one-row input. The ceiling that removing all other overhead would
    reach with torch's own GEMV kernels."""
    weights = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]
    xs = [torch.randn(1, w.shape[1], dtype=w.dtype) for w in weights]
    times = []
    with torch.inference_mode():
        for _ in range(steps):
            t = time.perf_counter()
            for x, w in zip(xs, weights):
                F.linear(x, w)
            times.append(time.perf_counter() - t)
    return statistics.median(times)


def hf_model_from(model):
    from transformers import AutoConfig, AutoModelForCausalLM

    hf_dict = model.config.to_hf_config()
    hf = AutoModelForCausalLM.from_config(AutoConfig.for_model(hf_dict.pop("model_type"), **hf_dict),
                                          dtype=torch.float32)
    missing, unexpected = hf.load_state_dict(model.state_dict(), strict=False)
    assert not unexpected and all("rotary" in m for m in missing), (missing, unexpected)
    return hf.eval()


def hf_step_s(hf, prompt: list[int], new_tokens: int) -> float:
    from transformers import StoppingCriteria, StoppingCriteriaList

    stamps: list[float] = []

    class Stamp(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            stamps.append(time.perf_counter())
            return torch.zeros(input_ids.shape[0], dtype=torch.bool)

    with torch.inference_mode():
        hf.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=new_tokens,
                    min_new_tokens=new_tokens, eos_token_id=None, pad_token_id=0,
                    stopping_criteria=StoppingCriteriaList([Stamp()]))
    return statistics.median(b - a for a, b in zip(stamps, stamps[1:]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="cpu-200m")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--no-hf", action="store_true", help="skip the transformers reference")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads for every variant and probe (default: torch's own)")
    args = parser.parse_args(argv)
    if args.threads is not None:
        if args.threads < 1:
            parser.error(f"--threads must be >= 1; got {args.threads}")
        torch.set_num_threads(args.threads)

    model = random_model(get_preset(args.model), seed=0).eval()
    prompt = torch.randint(3, model.config.vocab_size, (args.prompt_len,),
                           generator=torch.Generator().manual_seed(0)).tolist()
    hf = None if args.no_hf else hf_model_from(model)
    cost = decode_step_cost(model.config, 1, args.prompt_len + args.new_tokens // 2, dtype="fp32")
    rows: dict[str, list[float]] = {"bandwidth_gbps": [], "gemv_gbps": [], "linears_ms": [],
                                    "ours_ms": [], "hf_ms": []}
    ours_step_s(model, prompt, 4)  # warm-up
    if hf is not None:
        hf_step_s(hf, prompt, 4)
    for rep in range(args.reps):
        rows["bandwidth_gbps"].append(measure_bandwidth(kind="read", repeats=3, progress=False).median)
        # What a cold matrix-vector product streams: the rate decode's matmuls can reach at best.
        gemv = measure_decode_matmul(rows=(1,), repeats=3, progress=False)[0]
        rows["gemv_gbps"].append(gemv.params["weight_gbps"])
        rows["linears_ms"].append(linears_only_step_s(model, args.new_tokens) * 1e3)
        rows["ours_ms"].append(ours_step_s(model, prompt, args.new_tokens) * 1e3)
        if hf is not None:
            rows["hf_ms"].append(hf_step_s(hf, prompt, args.new_tokens) * 1e3)
        print(f"rep {rep + 1}/{args.reps}: " + ", ".join(f"{k} {v[-1]:.1f}" for k, v in rows.items() if v),
              flush=True)

    bw = statistics.median(rows["bandwidth_gbps"]) * 1e9
    floor_ms = time_floor_s(cost.bytes, bw) * 1e3
    print(f"\nmodel {args.model}: {cost.bytes / 1e6:.1f} MB read per decode step (fp32), "
          f"threads {torch.get_num_threads()}")
    gemv_bw = statistics.median(rows["gemv_gbps"]) * 1e9
    gemv_floor_ms = time_floor_s(cost.bytes, gemv_bw) * 1e3
    print(f"read bandwidth (median of {args.reps}): {bw / 1e9:.1f} GB/s -> floor {floor_ms:.2f} ms/token")
    print(f"cold GEMV bandwidth: {gemv_bw / 1e9:.1f} GB/s -> floor {gemv_floor_ms:.2f} ms/token")
    print(f"{'variant':<24}{'step ms (median)':>18}{'range':>14}{'floor / step':>14}{'GEMV floor / step':>19}")
    for key, label in (("linears_ms", "the linears alone"), ("ours_ms", "ai_evolution"),
                       ("hf_ms", "transformers generate")):
        if rows[key]:
            med = statistics.median(rows[key])
            print(f"{label:<24}{med:>18.2f}{f'{min(rows[key]):.1f}-{max(rows[key]):.1f}':>14}"
                  f"{floor_ms / med:>14.0%}{gemv_floor_ms / med:>19.0%}")
    ratio = floor_ms / statistics.median(rows["ours_ms"])
    print(f"target floor / step >= {TARGET:.0%} with {torch.get_num_threads()} thread(s): "
          f"{ratio:.0%} -> {'PASS' if ratio >= TARGET else 'FAIL'}")
    if rows["hf_ms"]:
        print(f"speed ratio ai_evolution / transformers: "
              f"{statistics.median(rows['hf_ms']) / statistics.median(rows['ours_ms']):.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
