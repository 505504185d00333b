"""N-gram (prompt lookup) speculation in the engine against plain greedy decoding, at batch 1 and
batch 8, on a copy-heavy and a free-generation workload, measured side by side in one run.

    python benchmarks/speculative_ngram.py [--model tiny-es-copy] [--k 2,4] [--window 1,3]
                                           [--prompts 8] [--passage 48] [--new-tokens 40]
                                           [--reps 5] [--threads 1]

The target is ``tiny-es-copy`` (tiny-es fine-tuned on copy tasks: ``scripts/train_tiny_es.py
--copy``); ``--model tiny-es`` runs the same measurement on the model that never learned to copy.
Workloads, both from the course's corpus (the held-out text, as lab 9 builds them,
``ai_evolution.labs.speculative.ngram_workloads``):

- ``copia``: "repeat this paragraph": the prompt is a passage, a blank line and the passage's
  first tokens again, so a model that copies continues with the rest of the passage (by default
  the requests ask for exactly that many tokens).
- ``libre``: the passage's first half alone (free generation).

For every rep, every configuration (plain, then n-gram with each k) serves the same requests
(batch 1: one request at a time; batch 8: all eight together), interleaved, and the figure of
merit is the paired ratio of generated tokens per second (n-gram / plain, ``claims.compare``),
beside the acceptance rate and the tokens per target step. Every n-gram output is checked
against the plain one, token for token (the script fails if any differs). The copy fraction
(greedy tokens equal to the passage's continuation in their place) says how much the model copies.
"""

from __future__ import annotations

import argparse
import time

import torch

from ai_evolution import claims
from ai_evolution.engine import SamplingParams, build_engine
from ai_evolution.fmt import es
from ai_evolution.labs.speculative import copy_rate, ngram_workloads
from ai_evolution.model import load_model
from ai_evolution.model.tokenizer import load_tokenizer


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
    ap.add_argument("--model", default="tiny-es-copy", choices=("tiny-es-copy", "tiny-es"))
    ap.add_argument("--k", default="2,4", help="tokens propuestos por paso, separados por comas")
    ap.add_argument("--window", default="1,3", help="prompt_lookup_min,prompt_lookup_max")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--passage", type=int, default=48, help="tokens de cada párrafo")
    ap.add_argument("--new-tokens", type=int, default=40,
                    help="tokens por petición (por omisión, lo que falta del párrafo en «copia»)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--goal", type=float, default=1.5,
                    help="razón de tokens/s que el n-grama debe superar en «copia» con lote 1")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    ks = [int(k) for k in args.k.split(",")]
    lo, hi = (int(x) for x in args.window.split(","))
    model = load_model(args.model)
    sep = load_tokenizer(args.model).encode("\n\n", add_bos=False)
    loads = ngram_workloads(args.model, args.prompts, args.passage, sep)
    configs = {"plain": None, **{k: {"method": "ngram", "num_speculative_tokens": k,
                                     "prompt_lookup_min": lo, "prompt_lookup_max": hi} for k in ks}}
    identical = True
    print(f"{args.model}, n-grama con ventana {lo}–{hi}, {args.prompts} peticiones × {args.new_tokens} "
          f"tokens, {args.reps} rondas, {torch.get_num_threads()} hilo(s)")
    for name, load in loads.items():
        prompts = load["prompts"]
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
            if load["expected"] is not None and batch == 1:
                print(f"\n{name}: {args.model} reproduce el "
                      f"{es(100 * copy_rate(ref, load['expected']), 1)} % del párrafo en su sitio")
            print(f"\n{name}, lote {batch}: voraz normal "
                  f"{es(sorted(tok_s['plain'])[len(tok_s['plain']) // 2], 1)} tokens/s (mediana)")
            for k in ks:
                drafted, accepted, steps = counts[k]
                claim = claims.compare(tok_s[k], tok_s["plain"],
                                       what=f"tokens/s con n-grama / normales con k = {k}",
                                       higher="el n-grama acelera", lower="el n-grama frena")
                print(f"  k = {k}: aceptados {accepted} de {drafted} propuestos; pasos del objetivo "
                      f"{es(steps / plain_steps, 2)} de los normales; {claim}")
                if name == "copia" and batch == 1:
                    goal = claims.compare(tok_s[k], [args.goal * t for t in tok_s["plain"]],
                                          what=f"tokens/s con n-grama / ({es(args.goal, 1)} × normales), k = {k}",
                                          higher=f"el n-grama supera {es(args.goal, 1)} veces la voraz",
                                          lower=f"el n-grama no llega a {es(args.goal, 1)} veces la voraz")
                    print(f"    objetivo: {goal}")
    print("\nsalida con n-grama igual a la voraz en todas las ejecuciones:", "sí" if identical else "NO")
    if not identical:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
