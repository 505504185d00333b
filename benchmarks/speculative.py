"""Speculative decoding against plain greedy decoding at batch 1, on the same weights, measured
side by side in one run.

    python benchmarks/speculative.py [--k 1,2,4] [--prompts 6] [--new-tokens 48] [--reps 5] [--threads 1]

The target is ``tiny-es`` and the draft ``tiny-es-draft`` (the shipped pair of chapter 9); the
prompts come from the corpus's held-out text. For every k, each rep generates every prompt plainly
and speculatively, interleaved, and the figure of merit is the paired ratio of tokens per second
(speculative / plain) with its bootstrap interval (``claims.compare``), next to the acceptance
rate and what Leviathan et al.'s formula predicts with the measured draft/target cost ratio.
Every speculative output is checked against the plain one, token for token.
"""

from __future__ import annotations

import argparse
import time

import torch

from ai_evolution import claims
from ai_evolution.fmt import es
from ai_evolution.generation import generate
from ai_evolution.labs.speculative import held_out_prompts, measure_step_costs
from ai_evolution.model import load_model
from ai_evolution.sim.cost_model import speculative_speedup
from ai_evolution.speculative import pooled, speculative_generate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", default="1,2,4", help="tokens propuestos por paso, separados por comas")
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    ks = [int(k) for k in args.k.split(",")]
    target, draft = load_model("tiny-es"), load_model("tiny-es-draft")
    prompts = held_out_prompts("tiny-es", args.prompts, 16)
    n = args.new_tokens
    tok_s = {"plain": [], **{k: [] for k in ks}}
    runs = {k: [] for k in ks}
    identical = True
    with torch.inference_mode():
        for rep in range(args.reps + 1):  # the first rep warms up
            for p in prompts:
                t = time.perf_counter()
                ref = generate(target, p, n)[0]
                plain_s = time.perf_counter() - t
                for k in ks:
                    t = time.perf_counter()
                    out = speculative_generate(target, draft, p, n, k)
                    spec_s = time.perf_counter() - t
                    identical &= out.tokens == ref
                    if rep:
                        tok_s[k].append(n / spec_s)
                        runs[k].append(out)
                if rep:
                    tok_s["plain"].append(n / plain_s)
    costs = measure_step_costs(target, draft, prompts[0], {"ks": ks, "step_repeats": 20})
    print(f"tiny-es + tiny-es-draft, lote 1, {len(prompts)} prompts × {n} tokens, {args.reps} rondas, "
          f"{torch.get_num_threads()} hilo(s); c = {es(costs['cost_ratio'], 3)}")
    print(f"voraz normal: {es(sorted(tok_s['plain'])[len(tok_s['plain']) // 2], 1)} tokens/s (mediana)")
    for k in ks:
        alpha = pooled(runs[k]).alpha
        claim = claims.compare(tok_s[k], tok_s["plain"],
                               what=f"tokens/s especulativos / normales con k = {k}",
                               higher="la especulación acelera", lower="la especulación frena")
        print(f"k = {k}: α = {es(alpha, 3)}; fórmula {es(speculative_speedup(alpha, k, costs['cost_ratio']), 2)}; "
              f"{claim}")
    print("salida especulativa igual a la voraz en todas las ejecuciones:", "sí" if identical else "NO")


if __name__ == "__main__":
    main()
