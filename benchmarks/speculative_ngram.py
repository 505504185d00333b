"""N-gram (prompt lookup) speculation in the engine against plain greedy decoding, at batch 1 and
batch 8, on a copy-heavy and a free-generation workload, measured side by side in one run.

    python benchmarks/speculative_ngram.py [--k 2,4] [--window 1,3] [--prompts 8] [--new-tokens 48]
                                           [--reps 5] [--threads 1]

Workloads, both from the course's corpus (the held-out text of ``tiny-es``):

- ``copia``: "repeat this paragraph": the prompt is a passage, a blank line and the passage's
  first tokens again, so a model that copies would continue with the rest of the passage.
- ``libre``: the passage's first tokens alone (free generation).

For every rep, every configuration (plain, then n-gram with each k) serves the same requests
(batch 1: one request at a time; batch 8: all eight together), interleaved, and the figure of
merit is the paired ratio of generated tokens per second (n-gram / plain, ``claims.compare``),
beside the acceptance rate and the tokens per target step. Every n-gram output is checked
against the plain one, token for token (the script fails if any differs).
"""

from __future__ import annotations

import argparse
import time

import torch

from ai_evolution import claims
from ai_evolution.engine import SamplingParams, build_engine
from ai_evolution.fmt import es
from ai_evolution.labs.speculative import held_out_prompts
from ai_evolution.model import load_model
from ai_evolution.model.tokenizer import load_tokenizer


def workloads(count: int) -> dict[str, list[list[int]]]:
    """The copy-heavy and the free-generation prompts (see the module's docstring)."""
    sep = load_tokenizer("tiny-es").encode("\n\n", add_bos=False)
    passages = held_out_prompts("tiny-es", count, 48)
    return {"copia": [p + sep + p[:8] for p in passages], "libre": [p[:24] for p in passages]}


def serve(model, prompts: list[list[int]], batch: int, new_tokens: int, spec: dict | None):
    """Serve ``prompts`` ``batch`` at a time; (outputs, seconds, drafted, accepted, target steps)."""
    params = SamplingParams(max_tokens=new_tokens, ignore_eos=True)
    outputs, seconds, drafted, accepted, steps = [], 0.0, 0, 0, 0
    for i in range(0, len(prompts), batch):
        engine = build_engine(model, max_num_seqs=batch, max_model_len=256, speculative_config=spec)
        t = time.perf_counter()
        reqs = engine.run([(0.0, p, params) for p in prompts[i:i + batch]])
        seconds += time.perf_counter() - t
        outputs += [r.output_token_ids for r in reqs]
        drafted += sum(r.num_draft_tokens for r in reqs)
        accepted += sum(r.num_accepted_tokens for r in reqs)
        steps += len(engine.history)
    return outputs, seconds, drafted, accepted, steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", default="2,4", help="tokens propuestos por paso, separados por comas")
    ap.add_argument("--window", default="1,3", help="prompt_lookup_min,prompt_lookup_max")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    ks = [int(k) for k in args.k.split(",")]
    lo, hi = (int(x) for x in args.window.split(","))
    model = load_model("tiny-es")
    configs = {"plain": None, **{k: {"method": "ngram", "num_speculative_tokens": k,
                                     "prompt_lookup_min": lo, "prompt_lookup_max": hi} for k in ks}}
    identical = True
    print(f"tiny-es, n-grama con ventana {lo}–{hi}, {args.prompts} peticiones × {args.new_tokens} "
          f"tokens, {args.reps} rondas, {torch.get_num_threads()} hilo(s)")
    for name, prompts in workloads(args.prompts).items():
        for batch in (1, 8):
            tok_s = {c: [] for c in configs}
            counts = {c: [0, 0, 0] for c in configs}
            for rep in range(args.reps + 1):  # the first rep warms up
                ref = None
                for c, spec in configs.items():
                    outs, secs, drafted, accepted, steps = serve(model, prompts, batch, args.new_tokens, spec)
                    ref = outs if ref is None else ref
                    identical &= outs == ref
                    if rep:
                        tok_s[c].append(len(prompts) * args.new_tokens / secs)
                        counts[c] = [a + b for a, b in zip(counts[c], (drafted, accepted, steps))]
            plain_steps = counts["plain"][2]
            print(f"\n{name}, lote {batch}: voraz normal "
                  f"{es(sorted(tok_s['plain'])[len(tok_s['plain']) // 2], 1)} tokens/s (mediana)")
            for k in ks:
                drafted, accepted, steps = counts[k]
                claim = claims.compare(tok_s[k], tok_s["plain"],
                                       what=f"tokens/s con n-grama / normales con k = {k}",
                                       higher="el n-grama acelera", lower="el n-grama frena")
                print(f"  k = {k}: aceptados {accepted} de {drafted} propuestos; pasos del objetivo "
                      f"{es(steps / plain_steps, 2)} de los normales; {claim}")
    print("\nsalida con n-grama igual a la voraz en todas las ejecuciones:", "sí" if identical else "NO")
    if not identical:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
