"""One bad request fails only itself: sampling parameters at the edges of their ranges, an error
inside a step, and the inputs that used to fail silently or deep inside a library."""

from __future__ import annotations

import json
import math

import pytest

from ai_evolution.engine import LLM, FinishReason, RequestRejected, SamplingParams, build_engine
from ai_evolution.labs import LabParamError, run_lab
from ai_evolution.model import ModelConfig
from engine_helpers import PoisonedExecutor

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = ["La caché KV", "El planificador decide", "Un lote", "Cada petición"]


@pytest.fixture(scope="module")
def llm(tiny):
    return LLM(tiny, tokenizer="tiny-es", max_num_seqs=4, max_model_len=64, kv_layout="paged")


def _free(llm) -> bool:
    """Nothing left in the engine and every KV block (or row) back in the pool."""
    kv = llm.engine.scheduler.kv
    if hasattr(kv, "check_invariants"):
        kv.check_invariants()
    usage = llm.engine.kv_usage()
    return usage["blocks_used"] == 0 and not llm.engine.has_unfinished_requests() \
        and not llm.engine.scheduler.running


@pytest.mark.parametrize("params", [
    {"temperature": 1e-39},                       # below SAMPLING_EPS: greedy
    {"temperature": 5e-324},
    {"temperature": 0.7, "top_p": 1e-46, "seed": 1},  # below float32: the top token stays
    {"temperature": 0.7, "top_p": 5e-324, "seed": 2},
    {"temperature": 1.0, "seed": 2**64 - 1},
    {"temperature": 1.0, "seed": -(2**63)},
    {"temperature": 1e300, "seed": 3},
])
def test_edge_sampling_params_serve_beside_greedy_requests(llm, params):
    greedy = SamplingParams(max_tokens=8, ignore_eos=True)
    want = llm.generate(PROMPTS[1:], greedy)
    outs = llm.generate(PROMPTS, [SamplingParams(max_tokens=8, ignore_eos=True, **params)]
                        + [greedy] * 3)
    assert outs[0].error is None and len(outs[0].token_ids) == 8
    assert [o.token_ids for o in outs[1:]] == [w.token_ids for w in want]
    if params.get("temperature", 0) < 1e-5 or params.get("top_p", 1) < 1e-30:
        # greedy in effect: the most likely token every time
        assert outs[0].token_ids == llm.generate(PROMPTS[:1], greedy)[0].token_ids
    assert _free(llm)


@pytest.mark.parametrize("params,words", [
    ({"seed": 2**64}, "2**64"),
    ({"seed": -(2**63) - 1}, "-2**63"),
    ({"stop_token_ids": None}, "lista de ids"),
    ({"stop_token_ids": 5}, "lista de ids"),
    ({"temperature": math.inf}, "finito"),
])
def test_out_of_range_sampling_params_are_rejected_in_spanish(params, words):
    with pytest.raises(RequestRejected, match=words.replace("*", r"\*")):
        SamplingParams(**params)


class CountingStops(frozenset):
    """A stop set that counts the membership tests made against it."""
    tests = 0

    def __contains__(self, token) -> bool:
        type(self).tests += 1
        return super().__contains__(token)


def test_stop_tokens_are_deduplicated_once_and_never_rebuilt_per_token(tiny):
    params = SamplingParams(max_tokens=8, ignore_eos=True, stop_token_ids=[9] * 50_000 + [11, 9])
    assert params.stop_token_ids == frozenset({9, 11})
    engine = build_engine(tiny, max_num_seqs=2, max_model_len=64)
    greedy = engine.run([(0.0, [5, 6], SamplingParams(max_tokens=8, ignore_eos=True))])[0] \
        .output_token_ids
    k = next(i for i, t in enumerate(greedy) if i >= 2 and t not in greedy[:i])
    engine = build_engine(tiny, max_num_seqs=2, max_model_len=64)
    req = engine.add_request([5, 6], params)
    assert req.stop_token_set == frozenset({9, 11})
    # the scheduler must test each new token against the request's set, built once: swap in a
    # set that counts, and stops at a greedy token past the second
    req.stop_token_set = CountingStops({greedy[k]})
    while engine.has_unfinished_requests():
        engine.step()
    assert req.output_token_ids == greedy[:k + 1] and req.finish_reason is FinishReason.STOP
    assert CountingStops.tests == k + 1  # once per token, on the set built at add_request


def test_an_error_message_stays_small_whatever_came_in(tiny):
    engine = build_engine(tiny, max_num_seqs=2, max_model_len=64)
    with pytest.raises(RequestRejected) as err:
        engine.add_request([5, 6], SamplingParams(stop_token_ids=list(range(10**6, 10**6 + 100_000))))
    assert len(str(err.value)) < 400 and "100000 valor" in str(err.value) and "y 99995 más" in str(err.value)


@pytest.mark.parametrize("kv_layout", ["contiguous", "paged"])
def test_an_error_inside_a_step_fails_only_the_request_that_caused_it(tiny, kv_layout):
    llm = LLM(tiny, tokenizer="tiny-es", max_num_seqs=4, max_model_len=64, kv_layout=kv_layout)
    params = SamplingParams(max_tokens=10, ignore_eos=True)
    want = llm.generate(PROMPTS, params)
    llm.engine.executor = PoisonedExecutor(llm.engine.executor, marker=7)
    poisoned = [7, 20, 30, 40]
    outs = llm.generate([poisoned] + PROMPTS, params)
    assert outs[0].finish_reason is FinishReason.ERROR and "RuntimeError" in outs[0].error
    assert "paso" in outs[0].error and outs[0].finished
    assert [o.token_ids for o in outs[1:]] == [w.token_ids for w in want]
    assert all(o.error is None for o in outs[1:])
    assert _free(llm)
    # the engine goes on serving: offline LLM recovers
    assert [o.token_ids for o in llm.generate(PROMPTS, params)] == [w.token_ids for w in want]


def test_a_sampling_error_fails_only_its_request(tiny, monkeypatch):
    from ai_evolution.engine import runner as runner_mod

    real = runner_mod.pick_tokens

    def flaky(logits, temperature, top_k, top_p, generator):
        if top_k == 13:
            raise ValueError("probability tensor contains nan (simulated)")
        return real(logits, temperature, top_k, top_p, generator)

    monkeypatch.setattr(runner_mod, "pick_tokens", flaky)
    llm = LLM(tiny, tokenizer="tiny-es", max_num_seqs=4, max_model_len=64)
    outs = llm.generate(PROMPTS[:3], [SamplingParams(max_tokens=6, temperature=0.8, top_k=13, seed=1),
                                      SamplingParams(max_tokens=6, temperature=0.8, seed=1),
                                      SamplingParams(max_tokens=6)])
    assert outs[0].finish_reason is FinishReason.ERROR and "ValueError" in outs[0].error
    assert [len(o.token_ids) for o in outs[1:]] == [6, 6] and all(o.error is None for o in outs[1:])


def test_bad_arguments_get_clear_spanish_errors(tiny, llm):
    with pytest.raises(TypeError, match="prompts debe ser"):
        llm.generate(None)
    with pytest.raises(TypeError, match=r"SamplingParams\(\*\*d\)"):
        llm.generate(["Hola"], {"max_tokens": 3})
    for kw, words in [({"block_size": 0}, "block_size"), ({"max_model_len": 0}, "max_model_len"),
                      ({"max_num_seqs": 0}, "max_num_seqs"), ({"num_blocks": 0}, "num_blocks")]:
        args = {"max_num_seqs": 2, "max_model_len": 64, "kv_layout": "paged", **kw}
        with pytest.raises(ValueError, match=f"{words} debe ser un entero >= 1"):
            build_engine(tiny, **args)
    assert _free(llm)


@pytest.mark.parametrize("seed", [2**64, -1, 1.5, True])
def test_lab_seeds_outside_the_generators_range_are_refused(seed):
    with pytest.raises(LabParamError, match="seed debe ser un entero entre 0 y 2\\*\\*64 - 1"):
        run_lab("kv_cache", seed=seed, profile="ci")


def test_nan_lab_parameters_are_refused():
    with pytest.raises(LabParamError, match="valores aceptados"):
        run_lab("continuous_batching", profile="ci", mean_output=float("nan"))
    with pytest.raises(LabParamError, match="valores aceptados"):
        run_lab("continuous_batching", profile="ci", mean_output="nan")


@pytest.mark.parametrize("change,words", [
    ({"rms_norm_eps": 0.0}, "rms_norm_eps"), ({"rms_norm_eps": -1e-6}, "rms_norm_eps"),
    ({"rope_theta": 0}, "rope_theta"), ({"rope_theta": math.nan}, "rope_theta"),
])
def test_model_config_refuses_non_positive_constants(change, words):
    base = dict(num_layers=1, hidden_size=8, num_heads=2, num_kv_heads=1, intermediate_size=16,
                vocab_size=32)
    with pytest.raises(ValueError, match=f"{words} debe ser un número finito > 0"):
        ModelConfig(**base, **change)


def test_config_json_must_be_an_object_with_a_supported_activation(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps([1, 2]))
    with pytest.raises(ValueError, match="objeto JSON"):
        ModelConfig.from_hf_config(tmp_path)
    hf = {"model_type": "llama", "num_hidden_layers": 1, "hidden_size": 8, "num_attention_heads": 2,
          "intermediate_size": 16, "vocab_size": 32, "hidden_act": "gelu"}
    with pytest.raises(ValueError, match="hidden_act='gelu'.*silu"):
        ModelConfig.from_hf_config(hf)
    assert ModelConfig.from_hf_config({**hf, "hidden_act": "silu"}).num_layers == 1
