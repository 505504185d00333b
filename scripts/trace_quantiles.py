"""Recompute the length quantiles of ``ai_evolution/loadgen/realistic.py`` from the Azure LLM
inference trace 2023 (Patel et al., Splitwise, ISCA'24; CC-BY; github.com/Azure/AzurePublicDataset,
``data/AzureLLMInferenceTrace_{conv,code}.csv``).

    python scripts/trace_quantiles.py path/to/AzureLLMInferenceTrace_conv.csv path/to/..._code.csv

prints, for each file, the request count, the means and the quantiles at ``QUANTILE_GRID`` (the
empirical inverse CDF: values that occur in the trace) of ContextTokens and GeneratedTokens,
in the form of ``TRACES``' entries, so that the table in the library can be checked against the
data.
"""

from __future__ import annotations

import csv
import sys

import numpy as np

from ai_evolution.loadgen.realistic import QUANTILE_GRID


def summarize(path: str) -> dict:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    prompt = np.array([int(r["ContextTokens"]) for r in rows])
    output = np.array([int(r["GeneratedTokens"]) for r in rows])
    q = lambda x: [int(np.percentile(x, 100 * p, method="inverted_cdf")) for p in QUANTILE_GRID]  # noqa: E731
    return {"requests": len(rows), "mean_prompt": round(float(prompt.mean()), 1),
            "mean_output": round(float(output.mean()), 1), "prompt": q(prompt), "output": q(output)}


if __name__ == "__main__":
    for path in sys.argv[1:]:
        print(path, summarize(path))
