"""The simulator's speculative steps against a real run on this machine, as chapter 3 validates
the plain simulator: fit the cost model on one workload, predict another it never saw.

    python benchmarks/sim_speculation.py [--batch 4] [--k 3] [--prompts 8] [--new-tokens 24]
                                         [--reps 3] [--threads 1]

1. Calibration: ``tiny-es`` serves held-out prompts plainly, with n-gram proposals and with the
   ``tiny-es-draft`` model (``--reps`` passes, each step's fastest duration kept); the cost model
   is fitted to every step (bandwidth probed, peak and overheads fitted, absolute errors), and
   each method's acceptance rate is counted per proposal (kept / examined). The draft's own
   forwards (one token, as ``DraftProposer`` runs them, outside the engine's steps) are timed
   and fitted to a cost model of their own.
2. Validation: other held-out prompts, served the same ways; the busy time of each run (fastest
   of ``--reps``, drafting included) against the simulator's clock for the same requests, with
   ``SimSpeculation`` given the calibration's acceptance rate (and the draft's config, whose
   decode steps cost the proposals). The error is printed against chapter 3's criterion.
"""

from __future__ import annotations

import argparse
import time

import torch

from ai_evolution.engine import SamplingParams, build_engine
from ai_evolution.fmt import es
from ai_evolution.hardware.probes import measure_bandwidth
from ai_evolution.labs.continuous_batching import SIM_ERROR_LIMIT, fastest_steps, step_costs
from ai_evolution.labs.speculative import held_out_prompts
from ai_evolution.model import load_model
from ai_evolution.model.attention import ContiguousKVCache
from ai_evolution.sim import SimSpeculation, fit_cost_model, sim_engine, step_cost


def methods(draft, k: int) -> dict[str, dict | None]:
    return {"normal": None,
            "n-grama": {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 1,
                        "prompt_lookup_max": 3},
            "borrador": {"model": draft, "num_speculative_tokens": k}}


def serve(model, prompts, spec, batch: int, new_tokens: int, max_len: int):
    """One run: (history, wall seconds, kept drafts, examined drafts)."""
    engine = build_engine(model, max_num_seqs=batch, max_model_len=max_len, speculative_config=spec)
    counts, last = [0, 0], {}

    def count(record, _outputs):  # kept / examined per verification, from the requests' counters
        for e in record.scheduled:
            r = engine.requests[e.request_id]
            kept = r.num_accepted_tokens - last.get(e.request_id, 0)
            last[e.request_id] = r.num_accepted_tokens
            if e.num_draft_tokens:
                counts[0] += kept
                counts[1] += min(kept + 1, e.num_draft_tokens)

    engine.step_hooks.append(count)
    sp = SamplingParams(max_tokens=new_tokens, ignore_eos=True)
    t = time.perf_counter()
    engine.run([(0.0, p, sp) for p in prompts])
    return engine.history, time.perf_counter() - t, counts[0], counts[1]


@torch.inference_mode()
def draft_forwards(draft, prompt: list[int], new_tokens: int):
    """One-token forwards of the draft after ``prompt`` (its K/V cached), at growing contexts,
    after a warm-up: their step costs and seconds."""
    kv = ContiguousKVCache(draft.config, 1, len(prompt) + new_tokens + 1)
    draft.hidden_states(torch.tensor([prompt]), kv_cache=kv)
    costs, seconds = [], []
    for i in range(-3, new_tokens):
        pos = len(prompt) + max(i, 0)
        t = time.perf_counter()
        draft.logits(draft.hidden_states(torch.tensor([[prompt[-1]]]), torch.tensor([[pos]]),
                                         kv_cache=kv)[0, -1])
        if i >= 0:
            seconds.append(time.perf_counter() - t)
            costs.append(step_cost(draft.config, [1], [pos + 1], "fp32"))
    return costs, seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=24)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, draft = load_model("tiny-es"), load_model("tiny-es-draft")
    prompts = held_out_prompts("tiny-es", 2 * args.prompts, 16)
    work = {"calibración": prompts[:args.prompts], "validación": prompts[args.prompts:]}
    max_len = 16 + args.new_tokens + args.k + 2
    runs = {}
    for name, ps in work.items():
        for m, spec in methods(draft, args.k).items():
            serve(model, ps[:2], spec, args.batch, 4, max_len)  # warm-up
            runs[name, m] = [serve(model, ps, spec, args.batch, args.new_tokens, max_len)
                             for _ in range(args.reps)]
    bandwidth = measure_bandwidth("cpu", kind="read", repeats=3, progress=False).median
    costs, seconds, alpha = [], [], {}
    for m in methods(draft, args.k):
        history, durations = fastest_steps([h for h, *_ in runs["calibración", m]])
        costs += step_costs(model.config, history, "fp32")
        seconds += durations
        kept, examined = runs["calibración", m][0][2:]
        alpha[m] = kept / examined if examined else 0.0
    fitted = fit_cost_model(costs, seconds, bandwidth * 1e9, name="calibrado", errors="absolute")
    draft_costs, draft_s = draft_forwards(draft, prompts[0], args.new_tokens)
    draft_fitted = fit_cost_model(draft_costs, draft_s, bandwidth * 1e9, name="borrador",
                                  errors="absolute")
    print(f"tiny-es, lote {args.batch}, k = {args.k}, {args.prompts} peticiones × {args.new_tokens} "
          f"tokens, {args.reps} pasadas, {torch.get_num_threads()} hilo(s); ancho de banda "
          f"{es(bandwidth, 1)} GB/s; criterio del capítulo 3: error ≤ {es(100 * SIM_ERROR_LIMIT, 0)} %")
    for m in methods(draft, args.k):
        speculation = None if m == "normal" else SimSpeculation(
            alpha[m], args.k, draft.config if m == "borrador" else None,
            draft_cost_model=draft_fitted)
        sim = sim_engine(model.config, fitted, args.batch, max_len, dtype="fp32",
                         speculation=speculation)
        sp = SamplingParams(max_tokens=args.new_tokens, ignore_eos=True)
        sim.run([(0.0, p, sp) for p in work["validación"]])
        measured = min(w for _, w, *_ in runs["validación", m])
        error = (sim.executor.now() - measured) / measured
        print(f"{m}: α de la calibración {es(alpha[m], 3)}; validación medida {es(1e3 * measured, 1)} ms, "
              f"simulada {es(1e3 * sim.executor.now(), 1)} ms: error {es(100 * error, 1)} % "
              f"({'dentro' if abs(error) <= SIM_ERROR_LIMIT else 'fuera'} del criterio)")


if __name__ == "__main__":
    main()
