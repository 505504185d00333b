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
- ``kv-int8``: the engine on an int8 KV cache gives the generator's tokens on the same cache;
- ``speculative``: the engine with a draft (the target itself: every proposal accepted) gives
  uncached greedy tokens in fewer steps;
- ``quant-<fmt>``: the quantized model's fused kernels (``kernels``) match dequantize-then-matmul
  and the engine serves it with the generator's tokens;
- ``flash``: greedy generation with the tiled attention equals the reference; which SDPA
  backends the device offers (a T4 has no FlashAttention-2);
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


def _prompts(vocab: int, n: int) -> list[list[int]]:
    rng = random.Random(1)
    return [[rng.randrange(3, vocab) for _ in range(rng.randint(4, 40))] for _ in range(n)]


def check_kv_int8(device: torch.device, quick: bool) -> str:
    llm = LLM("tiny-es", device=device, max_num_seqs=4, kv_layout="paged", kv_dtype="int8")
    prompts = _prompts(llm.model.config.vocab_size, 4 if quick else 12)
    params = SamplingParams(max_tokens=8 if quick else 24, ignore_eos=True)
    outs = llm.generate(prompts, params)
    refs = [generate(llm.model, p, params.max_tokens, kv_dtype="int8")[0] for p in prompts]
    bad = [i for i, (o, r) in enumerate(zip(outs, refs)) if o.token_ids != r]
    if bad:
        raise AssertionError(f"{len(bad)} of {len(prompts)} requests differ from the generator's "
                             f"int8 cache: {bad}")
    return f"{len(prompts)} requests identical; KV {llm.engine.executor.cache.nbytes / 2**20:.1f} MiB"


def check_speculative(device: torch.device, quick: bool) -> str:
    from ai_evolution.engine import build_engine
    from ai_evolution.model import load_model

    model = load_model("tiny-es", device=device)
    prompts = _prompts(model.config.vocab_size, 4 if quick else 12)
    items = [(0.0, p, SamplingParams(max_tokens=8 if quick else 24, ignore_eos=True)) for p in prompts]
    plain = build_engine(model, max_num_seqs=4, max_model_len=256, kv_layout="paged")
    spec = build_engine(model, max_num_seqs=4, max_model_len=256, kv_layout="paged",
                        draft_model=model, num_speculative_tokens=4)
    ref = [r.output_token_ids for r in plain.run(items)]
    got = [r.output_token_ids for r in spec.run(items)]
    if got != ref:
        raise AssertionError("speculative output differs from plain greedy")
    return f"identical; steps {len(spec.history)} vs {len(plain.history)} without a draft"


def check_quant(device: torch.device, fmt: str, quick: bool) -> str:
    from ai_evolution.model import load_model
    from ai_evolution.model.quant import kernels, quantize_model

    model = load_model("tiny-es", device=device)
    q = quantize_model(model, fmt, 64 if fmt.startswith("int4") else None, backend="fast")
    prompts = _prompts(model.config.vocab_size, 3 if quick else 8)
    llm = LLM(q, max_num_seqs=4, max_model_len=256, kv_layout="paged")
    outs = llm.generate(prompts, SamplingParams(max_tokens=8, ignore_eos=True))
    bad = [i for i, (p, o) in enumerate(zip(prompts, outs)) if o.token_ids != generate(q, p, 8)[0]]
    if bad:
        raise AssertionError(f"{len(bad)} of {len(prompts)} requests differ from generate: {bad}")
    return f"kernels {kernels(q)}; engine identical on {len(prompts)} requests"


def check_flash(device: torch.device, quick: bool) -> str:
    from ai_evolution.model import load_model
    from ai_evolution.model.flash import flash_cached_attention

    model = load_model("tiny-es", device=device)
    prompts = _prompts(model.config.vocab_size, 2 if quick else 6)
    bad = [i for i, p in enumerate(prompts)
           if generate(model, p, 8, attn_fn=flash_cached_attention) != generate(model, p, 8)]
    if bad:
        raise AssertionError(f"tiled attention changed the greedy tokens of prompts {bad}")
    backends = "n/a (cpu)"
    if device.type == "cuda":
        b = torch.backends.cuda
        backends = ", ".join(name for name, on in (("flash", b.flash_sdp_enabled()),
                                                    ("mem_efficient", b.mem_efficient_sdp_enabled()),
                                                    ("math", b.math_sdp_enabled())) if on)
    return f"greedy identical on {len(prompts)} prompts; SDPA backends enabled: {backends}"


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
    checks.append(("kv-int8", lambda: check_kv_int8(device, args.quick)))
    checks.append(("speculative", lambda: check_speculative(device, args.quick)))
    for fmt in ("int8", "int4"):
        checks.append((f"quant-{fmt}", lambda fmt=fmt: check_quant(device, fmt, args.quick)))
    checks.append(("flash", lambda: check_flash(device, args.quick)))
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
