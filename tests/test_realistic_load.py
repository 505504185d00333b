"""Realistic load (chapter 12): lengths drawn from the Azure trace's quantiles keep its median,
tail and mean; the uniform benchmark keeps the arrivals and mean lengths with no spread; tenant
mixes are tagged and ordered."""

from __future__ import annotations

import csv
import importlib.util
from pathlib import Path

import numpy as np
import pytest

from ai_evolution.loadgen.realistic import (QUANTILE_GRID, TRACES, flood_mix, realistic_workload,
                                            trace_lengths, uniform_workload)

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("trace", sorted(TRACES))
def test_draws_keep_the_traces_median_tail_and_mean(trace):
    t = TRACES[trace]
    prompt, output = trace_lengths(trace, 100_000, seed=0)
    median, p99 = QUANTILE_GRID.index(0.5), QUANTILE_GRID.index(0.99)
    for got, q, mean in ((prompt, t.prompt, t.mean_prompt), (output, t.output, t.mean_output)):
        assert np.median(got) == pytest.approx(q[median], rel=0.03)
        assert np.percentile(got, 99) == pytest.approx(q[p99], rel=0.05)
        assert np.mean(got) == pytest.approx(mean, rel=0.08)
        assert min(got) >= q[0] and max(got) <= q[-1]


def test_scaled_lengths_fit_the_model_and_keep_the_tail_ratio():
    prompt, output = trace_lengths("conversation", 5000, seed=1, scale=16, max_model_len=512)
    assert all(p + o <= 511 for p, o in zip(prompt, output)) and min(prompt) >= 1
    full, _ = trace_lengths("conversation", 5000, seed=1)
    ratio = lambda x: np.percentile(x, 99) / np.median(x)  # noqa: E731
    assert ratio(prompt) == pytest.approx(ratio(full), rel=0.15)


def test_bad_arguments_are_refused_in_spanish():
    with pytest.raises(ValueError, match="aceptadas: conversation, code"):
        trace_lengths("chat", 3, 0)
    with pytest.raises(ValueError, match="scale debe ser un número > 0"):
        trace_lengths("code", 3, 0, scale=0)
    with pytest.raises(ValueError, match="flood_factor debe ser >= 1"):
        flood_mix(3, 1.0, 0.5, 100, 0)


def test_uniform_workload_has_the_same_arrivals_and_mean_lengths_without_spread():
    real = realistic_workload(300, 5.0, 500, seed=2, scale=16, max_model_len=512, tenant="a")
    uni = uniform_workload(real, 500, seed=2)
    assert [w.arrival_time for w in uni] == [w.arrival_time for w in real]
    assert len({len(w.prompt_token_ids) for w in uni}) == 1 == len({w.params.max_tokens for w in uni})
    offered = lambda wl: sum(len(w.prompt_token_ids) + w.params.max_tokens for w in wl)  # noqa: E731
    assert offered(uni) == pytest.approx(offered(real), rel=0.01)
    assert np.std([len(w.prompt_token_ids) for w in real]) > 0
    assert all(w.tags == {"tenant": "a"} for w in uni)


def test_flood_mix_tags_both_tenants_at_their_rates_in_arrival_order():
    mix = flood_mix(20, 2.0, 4, 500, seed=3, scale=16, max_model_len=512)
    tenants = [w.tags["tenant"] for w in mix]
    assert tenants.count("polite") == 20 and tenants.count("flood") == 80
    times = [w.arrival_time for w in mix]
    assert times == sorted(times)


def test_the_script_recomputes_the_table_from_a_trace_csv(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "trace.csv"
    prompt, output = rng.integers(1, 5000, 1000), rng.integers(1, 800, 1000)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["TIMESTAMP", "ContextTokens", "GeneratedTokens"])
        w.writerows([["2023-11-16 18:15:46", p, o] for p, o in zip(prompt, output)])
    spec = importlib.util.spec_from_file_location("trace_quantiles", ROOT / "scripts/trace_quantiles.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = mod.summarize(str(path))
    assert out["requests"] == 1000 and out["mean_prompt"] == round(float(prompt.mean()), 1)
    assert out["prompt"][0] == prompt.min() and out["prompt"][-1] == prompt.max()
    assert out["output"][QUANTILE_GRID.index(0.5)] == int(np.percentile(output, 50, method="inverted_cdf"))
