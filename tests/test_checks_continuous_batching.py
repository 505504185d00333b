"""The continuous-batching self-checks accept the references and reject plausible mistakes,
naming them with a hint in words (the second tier), numbers with a decimal comma."""

import re

import numpy as np
import pytest

from ai_evolution.checks import continuous_batching as checks
from ai_evolution.engine import BatchPlan, continuous_batching
from ai_evolution.metrics import summarize
from ai_evolution.reference import continuous_batching as reference
from checkutil import fails


def test_policy_check_accepts_the_reference_on_the_simulator():
    assert checks.check_policy(continuous_batching, raise_on_fail=False).passed


def test_policy_check_names_a_batch_that_retires_only_when_empty():
    def policy(running, waiting, max_num_seqs):
        if running and not all(r.is_finished for r in running):
            return BatchPlan(retire=[], admit=[])
        return BatchPlan(retire=list(running), admit=list(waiting[:max_num_seqs]))
    fails(checks.check_policy, policy, "falla el caso 1", "Pista:", "ya terminaron")


def test_policy_check_names_one_admission_per_step():
    def policy(running, waiting, max_num_seqs):
        retire = [r for r in running if r.is_finished]
        free = max_num_seqs - (len(running) - len(retire))
        return BatchPlan(retire=retire, admit=list(waiting[:min(free, 1)]))
    fails(checks.check_policy, policy, "Pista:", "Admite menos peticiones")


def _summary(**changes):
    def fn(requests):
        r = summarize(requests)
        for key, f in changes.items():
            r[key] = f(requests)
        return r
    return fn


@pytest.mark.parametrize("changes, match", [
    (dict(e2e_p99_s=lambda rs: max(r.finish_time - r.arrival_time for r in rs)),
     "Tomó el máximo"),
    (dict(throughput_tok_s=lambda rs: sum(len(r.output_token_ids) for r in rs)
          / max(r.finish_time for r in rs)), "primera llegada"),
    (dict(ttft_p50_s=lambda rs: float(np.mean([r.first_token_time - r.arrival_time
                                                for r in rs]))), "Calculó la media"),
])
def test_summarize_check_names_each_plausible_mistake(changes, match):
    assert checks.check_summarize(summarize, raise_on_fail=False).passed
    result = fails(checks.check_summarize, _summary(**changes), "Pista:", match)
    assert not re.search(r"(?<![\w-])\d+\.\d", result.message), result.message


@pytest.mark.slow  # the lab's whole datacenter simulation: `make test` only
def test_challenge_gains_are_simulated_once_and_are_ratios():
    from ai_evolution.labs import get_spec
    p = get_spec("continuous_batching").resolve_params("ci", {})
    args = (p["dc_device"], p["dc_model"], p["dc_requests"], p["dc_prompt_len"],
            p["dc_mean_output"], p["dc_caps"][-1], max(p["dc_caps"]), 0)
    gains = reference.simulated_gains(*args)
    assert set(gains) == set(reference.CHALLENGE_WIDTHS)
    assert all(1 < g < b for b, g in gains.items()), gains  # a ratio: at most B times
    assert reference.simulated_gains(*args) is gains  # cached: graders check many submissions
