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
- ``batch-invariant-<dtype>``: with ``batch_invariant=True`` (chapter 10), every request's
  logits in a batch of 8 (paged, chunked prefill, prefix hits) are bit-identical to its logits
  served alone, in fp16 (what a T4 serves in) and bf16 where the device has it;
- ``hf-logits``: the decoder's logits against transformers on the same weights (fp32);
- ``kv-int8``: the engine on an int8 KV cache gives the generator's tokens on the same cache;
- ``speculative``: the engine with a draft (the target itself: every proposal accepted), and with
  n-gram proposals, gives uncached greedy tokens (with the draft, in fewer steps);
- ``quant-<fmt>``: the quantized model's fused kernels (``kernels``) match dequantize-then-matmul
  and the engine serves it with the generator's tokens;
- ``flash``: greedy generation with the tiled attention equals the reference; which SDPA
  backends the device offers (a T4 has no FlashAttention-2);
- ``graphs-<dtype>``: the engine with decode graphs (CUDA graphs on a GPU; on the CPU their
  static padded step without capture) gives the tokens of the engine without them;
- ``server``: the OpenAI-compatible server on the device, through the official ``openai``
  client: concurrent completions (greedy: the same prompt gives the same text), a chat and a
  stream;
- ``bench-b1``: batch-1 decode of a ~0,5B model (random weights of ``qwen2.5-0.5b``; ``tiny-es``
  with ``--quick``) in the device's default dtype, as tokens/s and as the fraction of the
  bandwidth floor (bytes a step reads / read bandwidth measured in this run): ours with graphs,
  ours eager, and ``transformers`` ``generate`` (target >= 70 % with graphs on an H100/H200);
- ``bench-throughput``: 256 requests of 100-1024 tokens in and out (nano-vllm's benchmark shape)
  through our engine, tokens/s, against ``transformers`` ``generate`` on the first 64 of them in
  one padded batch;
- ``tensor-parallel-2``: the engine split across 2 ranks (chapter 13; NCCL on ``cuda:0`` and
  ``cuda:1``, gloo on the CPU) gives the single-process engine's greedy tokens (paged KV, chunked
  prefill, prefix hits) and logits within float tolerance; skipped, with the reason, on a machine
  with fewer than 2 GPUs;
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


def check_batch_invariant(device: torch.device, dtype: torch.dtype, quick: bool) -> str:
    from ai_evolution.engine.batch_invariant import generate_with_logits
    from ai_evolution.model import load_model

    model = load_model("tiny-es", device=device, dtype=dtype)
    rng = random.Random(2)
    system = [rng.randrange(3, model.config.vocab_size) for _ in range(16)]
    prompts = [system + p for p in _prompts(model.config.vocab_size, 4 if quick else 12)]
    params = SamplingParams(max_tokens=6 if quick else 16, ignore_eos=True)
    alone = LLM(model, max_num_seqs=1, max_model_len=256, batch_invariant=True)
    solo = [generate_with_logits(alone, [p], params)[0] for p in prompts]
    batched = LLM(model, max_num_seqs=8, max_model_len=256, batch_invariant=True, kv_layout="paged",
                  max_num_batched_tokens=64, enable_chunked_prefill=True)
    got = generate_with_logits(batched, prompts, params)
    bad = [i for i, ((_, a), (_, b)) in enumerate(zip(solo, got)) if not torch.equal(a, b)]
    if bad:
        worst = max((solo[i][1] - got[i][1]).abs().max().item() for i in bad)
        raise AssertionError(f"{len(bad)} of {len(prompts)} requests' logits differ from solo "
                             f"(max |diff| {worst:.2e}): {bad}")
    plain = LLM(model, max_num_seqs=8, max_model_len=256, kv_layout="paged",
                max_num_batched_tokens=64, enable_chunked_prefill=True, enforce_eager=True)
    usual = generate_with_logits(plain, prompts, params)
    alone_usual = [generate_with_logits(LLM(model, max_num_seqs=1, max_model_len=256,
                                            enforce_eager=True), [p], params)[0] for p in prompts]
    differ = sum(not torch.equal(a, b) for (_, a), (_, b) in zip(alone_usual, usual))
    return (f"{len(prompts)} requests bit-identical to solo; without the mode "
            f"{differ} of {len(prompts)} differ")


def check_hf_logits(device: torch.device, quick: bool) -> str:
    from ai_evolution.model import load_pretrained
    ours = load_pretrained("tiny-es", dtype=torch.float32, device=device)
    hf = _hf_twin(ours)
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
    ngram = build_engine(model, max_num_seqs=4, max_model_len=256, kv_layout="paged",
                         speculative_config={"method": "ngram", "num_speculative_tokens": 3,
                                             "prompt_lookup_min": 1, "prompt_lookup_max": 3})
    ref = [r.output_token_ids for r in plain.run(items)]
    got = [r.output_token_ids for r in spec.run(items)]
    if got != ref:
        raise AssertionError("speculative output differs from plain greedy")
    if [r.output_token_ids for r in ngram.run(items)] != ref:
        raise AssertionError("n-gram speculative output differs from plain greedy")
    return (f"identical (draft and n-gram); steps {len(spec.history)} with a draft, "
            f"{len(ngram.history)} with n-grams, {len(plain.history)} without")


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


def check_graphs(device: torch.device, dtype: torch.dtype, quick: bool) -> str:
    from ai_evolution.engine import build_engine
    from ai_evolution.model import load_model

    model = load_model("tiny-es", device=device, dtype=dtype)
    prompts = _prompts(model.config.vocab_size, 6 if quick else 40)
    rng = random.Random(2)
    items = [(0.0, p, SamplingParams(max_tokens=rng.randint(2, 8 if quick else 40), ignore_eos=True))
             for p in prompts]
    backend = "cuda" if device.type == "cuda" else "eager"
    outs, engines = {}, {}
    for graphs in (None, backend):
        engines[graphs] = build_engine(model, max_num_seqs=4 if quick else 24, max_model_len=128,
                                       kv_layout="paged", decode_graphs=graphs)
        outs[graphs] = [r.output_token_ids for r in engines[graphs].run(items)]
    bad = [i for i, (a, b) in enumerate(zip(outs[None], outs[backend])) if a != b]
    runs = engines[backend].executor.graphs
    if runs.disabled:
        raise AssertionError(f"graph capture failed, the engine ran eager: {runs.disabled}")
    detail = f"{runs.steps} decode steps through {backend} graphs of sizes {sorted(runs.graphs) or runs.sizes}"
    if bad and dtype == torch.float32:
        raise AssertionError(f"{len(bad)} of {len(items)} requests differ with graphs: {bad}")
    if bad:  # 16-bit: padded batches and whole-table reads round a near-tie differently
        return f"{len(items) - len(bad)} of {len(items)} identical (16-bit: informative); {detail}"
    return f"{len(items)} requests identical; {detail}"


def check_server(device: torch.device, quick: bool) -> str:
    from concurrent.futures import ThreadPoolExecutor

    import openai

    from ai_evolution.server import serve_in_thread

    n, tokens = (4, 6) if quick else (16, 24)
    # fp32: the same prompt alone and in a batch must agree (16-bit may flip a near-tie)
    llm = LLM("tiny-es", device=device, dtype=torch.float32, max_num_seqs=8, kv_layout="paged")
    with serve_in_thread(llm, max_waiting=64) as server:
        client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0)
        model = client.models.list().data[0].id
        prompts = [f"Había una vez {i}" for i in range(n)] + ["Había una vez 0"]

        def complete(prompt: str):
            return client.completions.create(model=model, prompt=prompt, max_tokens=tokens,
                                             temperature=0)

        with ThreadPoolExecutor(8) as pool:
            outs = list(pool.map(complete, prompts))
        chat = client.chat.completions.create(model=model, max_tokens=tokens, temperature=0,
                                              messages=[{"role": "user", "content": "Hola"}])
        pieces = [c.choices[0].text for c in client.completions.create(
            model=model, prompt=prompts[0], max_tokens=tokens, temperature=0, stream=True)
                  if c.choices]
    if any(o.usage.completion_tokens < 1 for o in outs) or not chat.choices[0].message.content:
        raise AssertionError("an empty answer")
    if outs[0].choices[0].text != outs[-1].choices[0].text or "".join(pieces) != outs[0].choices[0].text:
        raise AssertionError("greedy answers to the same prompt differ (batched, alone, streamed)")
    return (f"{n + 1} concurrent completions, a chat and a stream of {model} through the openai "
            "client; greedy answers agree")


def _bench_model(device: torch.device, quick: bool):
    """~0,5B parameters (random weights: only the shapes matter), tiny-es with ``quick``, in the
    device's serving dtype."""
    from ai_evolution.hardware import default_dtype
    from ai_evolution.model import load_model

    return load_model("tiny-es" if quick else "qwen2.5-0.5b", device=device,
                      dtype=default_dtype(device))


def _hf_twin(model):
    """The transformers model with ``model``'s weights, on its device and in its dtype."""
    import transformers

    hf_dict = model.config.to_hf_config()
    param = next(model.parameters())
    hf = transformers.AutoModelForCausalLM.from_config(
        transformers.AutoConfig.for_model(hf_dict.pop("model_type"), **hf_dict), dtype=param.dtype)
    missing, unexpected = hf.load_state_dict(model.state_dict(), strict=False)
    if unexpected or any("rotary" not in m for m in missing):
        raise AssertionError(f"state dicts differ: missing {missing}, unexpected {unexpected}")
    return hf.to(param.device).eval()


def check_bench_b1(device: torch.device, quick: bool, with_hf: bool) -> str:
    import statistics

    from ai_evolution.engine import build_engine
    from ai_evolution.hardware import synchronize
    from ai_evolution.sim import decode_step_cost

    model = _bench_model(device, quick)
    prompt, new = _prompts(model.config.vocab_size, 1)[0][:32], 16 if quick else 128
    bandwidth = probe_summary(device, quick=quick)["bandwidth_read_gbps"] * 1e9
    floor = decode_step_cost(model.config, 1, len(prompt) + new // 2,
                             dtype=next(model.parameters()).dtype).bytes / bandwidth
    steps = {}
    graphs = "cuda" if device.type == "cuda" else "eager"
    for name, mode in (("graphs", graphs), ("eager", None)):
        engine = build_engine(model, max_num_seqs=1, max_model_len=len(prompt) + new + 1,
                              kv_layout="paged", decode_graphs=mode)
        for _ in range(2):  # the first run warms up
            engine.run([(0.0, prompt, SamplingParams(max_tokens=new, ignore_eos=True))])
        steps[name] = statistics.median(h.duration for h in engine.history[-(new - 1):])
    if with_hf:
        hf = _hf_twin(model)
        ids = torch.tensor([prompt], device=device)
        times = []
        for n in (1, new, 1, new):
            synchronize(device)
            start = time.perf_counter()
            with torch.inference_mode():
                hf.generate(ids, do_sample=False, max_new_tokens=n, min_new_tokens=n,
                            eos_token_id=None, pad_token_id=0)
            synchronize(device)
            times.append(time.perf_counter() - start)
        steps["hf"] = (times[3] - times[2]) / (new - 1)  # the second pair: warm
    return "; ".join(f"{name} {1 / t:.0f} tok/s ({floor / t:.0%} of the floor)"
                     for name, t in steps.items()) + f"; floor {floor * 1e3:.2f} ms/step"


def check_bench_throughput(device: torch.device, quick: bool, with_hf: bool) -> str:
    from ai_evolution.engine import build_engine
    from ai_evolution.hardware import synchronize

    model = _bench_model(device, quick)
    rng = random.Random(0)
    n, lo, hi = (8, 4, 16) if quick else (256, 100, 1024)
    vocab = model.config.vocab_size
    reqs = [([rng.randrange(3, vocab) for _ in range(rng.randint(lo, hi))], rng.randint(lo, hi))
            for _ in range(n)]
    engine = build_engine(model, max_num_seqs=n, max_model_len=2 * hi + 1, kv_layout="paged",
                          max_num_batched_tokens=max(4 * hi, 2048), enable_chunked_prefill=True,
                          decode_graphs="auto")
    synchronize(device)
    start = time.perf_counter()
    engine.run([(0.0, p, SamplingParams(max_tokens=m, ignore_eos=True)) for p, m in reqs])
    synchronize(device)
    ours = sum(m for _, m in reqs) / (time.perf_counter() - start)
    detail = f"ours {ours:.0f} tok/s on {n} requests of {lo}-{hi} tokens in and out"
    if with_hf:
        hf = _hf_twin(model)
        batch = reqs[:min(64, n)]
        width = max(len(p) for p, _ in batch)
        ids = torch.tensor([[0] * (width - len(p)) + p for p, _ in batch], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p, _ in batch], device=device)
        longest = max(m for _, m in batch)
        synchronize(device)
        start = time.perf_counter()
        with torch.inference_mode():
            hf.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=longest,
                        min_new_tokens=longest, eos_token_id=None, pad_token_id=0)
        synchronize(device)
        hf_rate = sum(m for _, m in batch) / (time.perf_counter() - start)
        detail += f"; transformers {hf_rate:.0f} tok/s on the first {len(batch)} (one padded batch)"
    return detail


class SkipCheck(Exception):
    """A check that cannot run on this machine: its row says why, and it is not a failure."""


def check_tensor_parallel(device: torch.device, quick: bool) -> str:
    if device.type == "cuda" and torch.cuda.device_count() < 2:
        raise SkipCheck(f"needs 2 GPUs for tensor_parallel_size=2; this machine has "
                        f"{torch.cuda.device_count()}")
    if device.type not in ("cuda", "cpu"):
        raise SkipCheck(f"tensor parallelism runs on cuda (NCCL) or cpu (gloo), not {device.type}")
    from ai_evolution.model import load_model

    model = load_model("tiny-es", device=device)
    options = dict(max_num_seqs=4, kv_layout="paged", block_size=8, max_num_batched_tokens=32,
                   enable_chunked_prefill=True, enforce_eager=True)
    system = [3 + 7 * i for i in range(16)]  # two blocks shared by every prompt: prefix hits
    prompts = [system + p for p in _prompts(model.config.vocab_size, 4 if quick else 8)]
    params = SamplingParams(max_tokens=8 if quick else 24, ignore_eos=True)
    runs = {}
    for n in (1, 2):
        logits: dict[str, list] = {}
        with LLM(model, tensor_parallel_size=n, **options) as llm:
            llm.engine.executor.on_logits = lambda r, x: logits.setdefault(r, []).append(x.clone())
            start = time.perf_counter()
            outs = llm.generate(prompts, params)
            seconds = time.perf_counter() - start
        runs[n] = ([o.token_ids for o in outs], logits, seconds)
    (want, want_logits, t1), (got, got_logits, t2) = runs[1], runs[2]
    diff = max(float((a - b).abs().max()) for r in want_logits
               for a, b in zip(want_logits[r], got_logits[r]))
    bad = [i for i, (a, b) in enumerate(zip(want, got)) if a != b]
    if bad or diff > 1e-3:
        raise AssertionError(f"TP=2 differs from one process: requests {bad}, "
                             f"max |logit difference| {diff:.2e}")
    return (f"{len(prompts)} requests token-identical to one process, max |logit difference| "
            f"{diff:.1e}; {t1:.2f} s with 1 rank, {t2:.2f} s with 2")


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
    for name in ("float16", *(d for d in supported_dtypes(device) if d == "bfloat16")):
        dtype = getattr(torch, name)
        checks.append((f"batch-invariant-{name}",
                       lambda dtype=dtype: check_batch_invariant(device, dtype, args.quick)))
    if not args.no_hf:
        checks.append(("hf-logits", lambda: check_hf_logits(device, args.quick)))
    checks.append(("kv-int8", lambda: check_kv_int8(device, args.quick)))
    checks.append(("speculative", lambda: check_speculative(device, args.quick)))
    for fmt in ("int8", "int4"):
        checks.append((f"quant-{fmt}", lambda fmt=fmt: check_quant(device, fmt, args.quick)))
    checks.append(("flash", lambda: check_flash(device, args.quick)))
    for name in supported_dtypes(device):
        dtype = getattr(torch, name)
        checks.append((f"graphs-{name}", lambda dtype=dtype: check_graphs(device, dtype, args.quick)))
    checks.append(("server", lambda: check_server(device, args.quick)))
    with_hf = not args.no_hf
    checks.append(("bench-b1", lambda: check_bench_b1(device, args.quick, with_hf)))
    checks.append(("bench-throughput", lambda: check_bench_throughput(device, args.quick, with_hf)))
    checks.append(("tensor-parallel-2", lambda: check_tensor_parallel(device, args.quick)))
    for kind in kinds:
        checks.append((f"lab-{kind}", lambda kind=kind: check_lab(kind, profile, device)))

    env = describe(device)
    print(f"device {env.get('device_name', device)}, torch {torch.__version__}, "
          f"dtypes {', '.join(supported_dtypes(device))}", flush=True)
    rows, failed, skipped = [], 0, 0
    for name, run in checks:
        start = time.perf_counter()
        try:
            status, detail = "ok", run()
        except SkipCheck as why:  # this machine cannot run it: said, not failed
            status, detail = "skip", str(why)
            skipped += 1
        except Exception as err:  # one failing check must not hide the others
            status, detail = "FAIL", f"{type(err).__name__}: {err}"
            failed += 1
            traceback.print_exc(limit=3)
        rows.append((name, status, time.perf_counter() - start, detail))
        print(f"{name:<26}{status:<6}{rows[-1][2]:>8.1f} s  {detail}", flush=True)
    print(f"\n{len(rows) - failed - skipped} of {len(rows)} checks passed"
          + (f", {skipped} skipped" if skipped else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
