"""Every check that needs an accelerator, in one run, as a short table.

    python scripts/device_checks.py [--device cuda] [--labs roofline,observability] [--profile gpu]
    python scripts/device_checks.py --device cpu --quick      # the same checks, small, on the CPU

A session that is lent a GPU has minutes of it: this script is what it runs (once, with a
timeout that leaves room for a rerun). Each check is independent: one that fails prints its
error in the table and the others still run; the exit code is 1 when any failed.

Checks:
- ``probes``: read bandwidth and matmul throughput in the device's default dtype;
- ``exact-<dtype>``: the engine (paged KV, continuous batching, a token budget with chunked
  prefill) gives the tokens of uncached greedy decoding, on the device, for each dtype it runs
  (a failure in float32; a count in 16-bit, where other shapes may round a near-tie apart);
- ``hf-logits``: the decoder's logits against transformers on the same weights (fp32);
- ``lab-<kind>``: ``run_lab(kind, profile=...)`` runs and its contract validates, with its time.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
import traceback

import torch

from ai_evolution.engine import LLM, SamplingParams
from ai_evolution.generation import generate
from ai_evolution.hardware import describe, pick_device, probe_summary, supported_dtypes
from ai_evolution.labs import list_labs, run_lab


def check_probes(device: torch.device, quick: bool) -> str:
    s = probe_summary(device, quick=quick)
    return (f"{s['device_name']}, {s['dtype']}: read {s['bandwidth_read_gbps']:.1f} GB/s, "
            f"matmul {s['matmul_gflops'] / 1e3:.1f} TFLOP/s")


def check_exact(device: torch.device, dtype: torch.dtype, quick: bool) -> str:
    rng = random.Random(0)
    n = 4 if quick else 16
    llm = LLM("tiny-es", device=device, dtype=dtype, max_num_seqs=4 if quick else 8,
              kv_layout="paged", max_num_batched_tokens=64, enable_chunked_prefill=True)
    vocab = llm.model.config.vocab_size
    prompts = [[rng.randrange(3, vocab) for _ in range(rng.randint(4, 90))] for _ in range(n)]
    params = SamplingParams(max_tokens=8 if quick else 24, ignore_eos=True)
    outs = llm.generate(prompts, params)
    bad = [i for i, (p, o) in enumerate(zip(prompts, outs))
           if o.token_ids != generate(llm.model, p, params.max_tokens, cache=None)[0]]
    if bad and dtype == torch.float32:
        raise AssertionError(f"{len(bad)} of {n} requests differ from uncached greedy: {bad}")
    if bad:  # 16-bit: other batch shapes round differently, and a near-tie can flip an argmax
        return f"{n - len(bad)} of {n} requests token-identical to uncached greedy (16-bit: informative)"
    return f"{n} requests, token-identical to uncached greedy"


def check_hf_logits(device: torch.device, quick: bool) -> str:
    import transformers

    from ai_evolution.model import load_pretrained
    ours = load_pretrained("tiny-es", dtype=torch.float32, device=device)
    hf_dict = ours.config.to_hf_config()
    hf = transformers.AutoModelForCausalLM.from_config(
        transformers.AutoConfig.for_model(hf_dict.pop("model_type"), **hf_dict),
        dtype=torch.float32).to(device).eval()
    missing, unexpected = hf.load_state_dict(ours.state_dict(), strict=False)
    if unexpected or any("rotary" not in m for m in missing):
        raise AssertionError(f"state dicts differ: missing {missing}, unexpected {unexpected}")
    ids = torch.randint(3, ours.config.vocab_size, (2, 32 if quick else 256),
                        generator=torch.Generator().manual_seed(0)).to(device)
    with torch.inference_mode():
        diff = (ours(ids) - hf(ids).logits).abs().max().item()
    if not diff < 1e-3:
        raise AssertionError(f"max |logit difference| {diff:.2e} >= 1e-3")
    return f"max |logit difference| {diff:.1e}"


def check_lab(kind: str, profile: str, device: torch.device) -> str:
    contract = run_lab(kind, seed=0, profile=profile, device=str(device))  # validates itself
    return f"{len(contract['evidence'])} evidence items, profile {contract['profile']}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default=None, help="cuda, mps or cpu (default: the best one)")
    parser.add_argument("--labs", default=None,
                        help="comma-separated lab kinds (default: all on an accelerator, none on cpu)")
    parser.add_argument("--profile", default=None, help="lab profile (default: gpu, or ci on cpu)")
    parser.add_argument("--quick", action="store_true", help="small sizes (tests, a dry run)")
    parser.add_argument("--no-hf", action="store_true", help="skip the transformers comparison")
    args = parser.parse_args(argv)
    device = pick_device(args.device)
    on_cpu = device.type == "cpu"
    kinds = list_labs() if args.labs is None and not on_cpu else \
        [k for k in (args.labs or "").split(",") if k]
    unknown = sorted(set(kinds) - set(list_labs()))
    if unknown:
        parser.error(f"unknown lab kinds {unknown}; accepted: {', '.join(list_labs())}")
    profile = args.profile or ("ci" if on_cpu else "gpu")

    checks = [("probes", lambda: check_probes(device, args.quick))]
    for name in supported_dtypes(device):
        dtype = getattr(torch, name)
        checks.append((f"exact-{name}", lambda dtype=dtype: check_exact(device, dtype, args.quick)))
    if not args.no_hf:
        checks.append(("hf-logits", lambda: check_hf_logits(device, args.quick)))
    for kind in kinds:
        checks.append((f"lab-{kind}", lambda kind=kind: check_lab(kind, profile, device)))

    env = describe(device)
    print(f"device {env.get('device_name', device)}, torch {torch.__version__}, "
          f"dtypes {', '.join(supported_dtypes(device))}", flush=True)
    rows, failed = [], 0
    for name, run in checks:
        start = time.perf_counter()
        try:
            status, detail = "ok", run()
        except Exception as err:  # one failing check must not hide the others
            status, detail = "FAIL", f"{type(err).__name__}: {err}"
            failed += 1
            traceback.print_exc(limit=3)
        rows.append((name, status, time.perf_counter() - start, detail))
        print(f"{name:<26}{status:<6}{rows[-1][2]:>8.1f} s  {detail}", flush=True)
    print(f"\n{len(rows) - failed} of {len(rows)} checks passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
