#!/usr/bin/env python
"""Write ``held_out.json`` beside a shipped model: the token ids of its validation split, the
text its training never saw (the last ``val_fraction`` of every file of ``data/corpus/``, split
exactly as ``scripts/train_tiny_es.py`` splits it). The labs measure perplexity on it without
the corpus at hand (a pip install carries the package, not ``data/``).

    python scripts/export_held_out.py            # tiny-es
    python scripts/export_held_out.py --check    # exit 1 if the stored file is out of date
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(0, str(REPO))

from train_tiny_es import DEFAULT_CORPUS, read_corpus, split_tokens  # noqa: E402

from ai_evolution.model.shipped_models import HELD_OUT_FILE, shipped_model_dir  # noqa: E402
from ai_evolution.model.tokenizer import load_tokenizer  # noqa: E402


def held_out_record(name: str = "tiny-es", corpus: Path = DEFAULT_CORPUS) -> dict:
    """The validation split of ``name``'s training, as its ``training.json`` records it."""
    training = json.loads((shipped_model_dir(name) / "training.json").read_text(encoding="utf-8"))
    fraction = training["hyperparameters"]["val_fraction"]
    docs, info = read_corpus(corpus)
    if info["sha256"] != training["corpus"]["sha256"]:
        raise SystemExit(f"data/corpus ({info['sha256'][:16]}...) is not the corpus {name} was "
                         f"trained on ({training['corpus']['sha256'][:16]}...)")
    _, val = split_tokens(load_tokenizer(name), docs, fraction)
    return {"model": name, "split": training["hyperparameters"]["val_split"],
            "val_fraction": fraction, "corpus_sha256": info["sha256"],
            "num_tokens": sum(len(v) for v in val),
            "files": [{"file": f, "tokens": v.tolist()} for (f, _), v in zip(docs, val)]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="tiny-es")
    p.add_argument("--check", action="store_true", help="compare with the stored file only")
    args = p.parse_args(argv)
    text = json.dumps(held_out_record(args.model), ensure_ascii=False, separators=(",", ":")) + "\n"
    path = shipped_model_dir(args.model) / HELD_OUT_FILE
    if args.check:
        ok = path.is_file() and path.read_text(encoding="utf-8") == text
        print(f"{path}: {'up to date' if ok else 'OUT OF DATE (run scripts/export_held_out.py)'}")
        return 0 if ok else 1
    path.write_text(text, encoding="utf-8")
    print(f"wrote {path} ({len(text):,} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
