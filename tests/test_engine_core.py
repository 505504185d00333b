"""The engine's core seams: one ``EngineConfig`` checked once, one builder, a step as values
(a frozen ``SchedulerOutput`` in, one ``StepResult`` shape out), the runner keeping sampling
generators by request id, drafts entering the scheduler through one method, step hooks, and a
runner whose cache does not match the scheduler's KV manager refused."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from ai_evolution.engine import (LLM, EngineConfig, KVCacheManager, LLMEngine, ModelRunner,
                                 SamplingParams, Scheduler, SchedulerOutput, SpeculativeConfig,
                                 StepResult, build_engine)
from ai_evolution.generation import generate
from ai_evolution.sim import SIM_TOKEN, SimExecutor, sim_engine
from engine_helpers import COST, greedy

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = [[5, 17, 300, 42, 8], [9, 9, 120], [77, 3, 501, 16, 2, 2, 90]]


# --- EngineConfig ---------------------------------------------------------------------------------
@pytest.mark.parametrize("field, value, words", [
    ("max_num_seqs", 0, "max_num_seqs debe ser un entero >= 1"),
    ("max_model_len", 1.5, "max_model_len debe ser un entero >= 1 o None"),
    ("block_size", True, "block_size debe ser un entero >= 1"),
    ("num_blocks", -3, "num_blocks debe ser un entero >= 1 o None"),
    ("kv_layout", "pagged", "aceptados: contiguous, paged"),
    ("policy", "fifo", "aceptadas: static, continuous"),
    ("kv_cache_dtype", "fp8", "aceptados: None"),
    ("decode_graphs", "sí", "aceptados: 'auto', 'cuda', 'eager', None"),
    ("speculative_config", 4, "speculative_config debe ser un SpeculativeConfig"),
])
def test_engine_config_refuses_bad_values_in_spanish_naming_the_accepted_ones(field, value, words):
    with pytest.raises(ValueError, match=words):
        EngineConfig(**{field: value})


def test_engine_config_is_frozen_and_checks_the_budget_against_max_model_len():
    config = EngineConfig(max_model_len=64)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.max_num_seqs = 3
    with pytest.raises(ValueError, match="sin prefill troceado"):
        EngineConfig(max_model_len=64, max_num_batched_tokens=16)
    assert EngineConfig(max_model_len=64, max_num_batched_tokens=16,
                        enable_chunked_prefill=True).max_num_batched_tokens == 16


def test_old_keywords_map_onto_the_config_and_unknown_ones_are_refused():
    config = EngineConfig.of(kv_dtype="int8", enforce_eager=True, max_num_seqs=3)
    assert (config.kv_cache_dtype, config.decode_graphs, config.max_num_seqs) == ("int8", None, 3)
    config = EngineConfig.of(draft_model="tiny-es-draft", num_speculative_tokens=2)
    assert config.speculative_config == SpeculativeConfig("tiny-es-draft", 2)
    assert EngineConfig(speculative_config={"model": "tiny-es-draft"}).speculative_config == \
        SpeculativeConfig("tiny-es-draft", 4)
    with pytest.raises(TypeError, match="opciones desconocidas para el motor: max_batch"):
        EngineConfig.of(max_batch=4)
    with pytest.raises(ValueError, match="num_speculative_tokens .* entero >= 1"):
        SpeculativeConfig("tiny-es-draft", 0)
    with pytest.raises(ValueError, match="speculative_config no acepta \\['k'\\]"):
        EngineConfig(speculative_config={"model": "tiny-es-draft", "k": 3})


def test_build_engine_takes_a_config_and_options_replace_its_fields(tiny):
    config = EngineConfig(max_num_seqs=3, max_model_len=48, kv_layout="paged", block_size=8)
    engine = build_engine(tiny, config, num_blocks=10)
    kv = engine.scheduler.kv
    assert isinstance(kv, KVCacheManager) and (kv.num_blocks, kv.block_size) == (10, 8)
    assert engine.max_model_len == 48 and engine.scheduler.max_num_seqs == 3
    assert build_engine(tiny).max_model_len == tiny.config.max_position_embeddings
    with pytest.raises(TypeError, match="pase un executor"):
        build_engine(tiny.config, max_model_len=32)
    sim = build_engine(tiny.config, max_model_len=32, executor=SimExecutor(tiny.config, COST))
    assert isinstance(sim.executor, SimExecutor) and sim.max_model_len == 32


# --- the geometry check -----------------------------------------------------------------------------
def test_a_runner_whose_cache_differs_from_the_kv_manager_is_refused(tiny):
    with pytest.raises(ValueError, match="caché de 4 bloques de 32 tokens .* 2 bloques de 32"):
        LLMEngine(Scheduler(2, 32), ModelRunner(tiny, 4, 32), tiny.config.vocab_size)
    kv = KVCacheManager(12, 8, 64)
    with pytest.raises(ValueError, match="deben coincidir"):
        LLMEngine(Scheduler(2, 64, kv=kv), ModelRunner(tiny, 12, 16), tiny.config.vocab_size)
    # the same blocks, but requests longer than the runner's decode graphs can read
    runner = ModelRunner(tiny, 12, 8, decode_graphs="eager", max_num_seqs=2, max_model_len=32)
    with pytest.raises(ValueError, match="hasta 64 tokens .* solo puede con 32"):
        LLMEngine(Scheduler(2, 64, kv=kv), runner, tiny.config.vocab_size)
    LLMEngine(Scheduler(2, 64, kv=kv), ModelRunner.for_kv(tiny, kv), tiny.config.vocab_size)


# --- a step as values -------------------------------------------------------------------------------
class Recording:
    """An executor wrapper that keeps every output it was handed and every result it gave."""

    def __init__(self, inner) -> None:
        self.inner, self.outputs, self.results = inner, [], []

    def now(self):
        return self.inner.now()

    def idle_until(self, t):
        self.inner.idle_until(t)

    def execute(self, out):
        result = self.inner.execute(out)
        self.outputs.append(out)
        self.results.append(result)
        return result


def test_the_executor_gets_a_frozen_snapshot_and_returns_one_result_shape(tiny):
    recording = Recording(ModelRunner(tiny, 2, 64))
    engine = LLMEngine(Scheduler(2, 64, max_num_batched_tokens=4, enable_chunked_prefill=True),
                       recording, tiny.config.vocab_size)
    reqs = [engine.add_request(p, greedy(3)) for p in PROMPTS[:2]]
    while engine.has_unfinished_requests():
        engine.step()
    for out, result in zip(recording.outputs, recording.results):
        assert isinstance(out, SchedulerOutput) and isinstance(result, StepResult)
        with pytest.raises(dataclasses.FrozenInstanceError):
            out.scheduled[0].start = 0
        for s in out.scheduled:
            req = next(r for r in reqs if r.request_id == s.request_id)
            # the snapshot's tokens are the request's tokens at those positions
            assert list(s.token_ids) == req.all_token_ids[s.start:s.context_len]
            assert (s.request_id in result.sampled_token_ids) == s.samples
        assert all(len(t) == 1 for t in result.sampled_token_ids.values()) and not result.errors
    # a chunked prompt: some steps computed part of a prompt and sampled nothing for it
    assert any(not s.samples for out in recording.outputs for s in out.scheduled)
    assert [r.output_token_ids for r in reqs] == [generate(tiny, p, 3)[0] for p in PROMPTS[:2]]


def test_the_simulator_returns_the_same_shape(tiny):
    engine = sim_engine(tiny.config, COST, 2, 64, "continuous")
    recording = Recording(engine.executor)
    engine.executor = recording
    engine.add_request(PROMPTS[0], SamplingParams(max_tokens=2, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()
    assert [r.sampled_token_ids for r in recording.results] == [{"0": (SIM_TOKEN,)}] * 2
    assert isinstance(engine.executor.inner, SimExecutor)


def test_sampling_generators_live_in_the_runner_until_their_request_finishes(tiny):
    runner = ModelRunner(tiny, 2, 64)
    engine = LLMEngine(Scheduler(2, 64), runner, tiny.config.vocab_size)
    a = engine.add_request(PROMPTS[0], SamplingParams(max_tokens=2, temperature=0.8, seed=3))
    b = engine.add_request(PROMPTS[1], SamplingParams(max_tokens=6, temperature=0.8, seed=4))
    engine.step()
    assert set(runner.generators) == {a.request_id, b.request_id}
    engine.step()
    assert a.is_finished and not b.is_finished
    engine.step()  # the next step tells the runner that ``a`` finished
    assert set(runner.generators) == {b.request_id}
    assert not hasattr(a, "generator")


def test_the_engine_step_is_short_and_drafts_enter_the_scheduler_through_one_method(tiny):
    body = inspect.getsource(LLMEngine.step).split('"""')[-1].strip().splitlines()
    assert 5 <= len(body) <= 15, "\n".join(body)  # the code after the docstring
    sched = Scheduler(2, 64)
    engine = LLMEngine(sched, ModelRunner(tiny, 2, 64), tiny.config.vocab_size)
    r = engine.add_request(PROMPTS[0], greedy(4))
    engine.step()
    sched.update_draft_token_ids({r.request_id: [11, 12]})
    assert r.draft_token_ids == [11, 12]
    out = sched.schedule()
    assert out.scheduled[0].draft_token_ids == (11, 12) and out.scheduled[0].token_ids[-2:] == (11, 12)


def test_a_step_without_outputs_runs_the_same_steps_and_still_feeds_the_hooks(tiny):
    """``step(outputs=False)`` (what ``run`` and the simulator's drivers use) returns nothing and
    changes nothing else: the same steps and tokens, and the hooks still get their outputs."""
    runs = {}
    for outputs in (True, False):
        engine = build_engine(tiny, max_num_seqs=2, max_model_len=64, policy="continuous")
        reqs = [engine.add_request(p, greedy(3)) for p in PROMPTS]
        returned = []
        while engine.has_unfinished_requests():
            returned.append(len(engine.step(outputs=outputs)))
        runs[outputs] = ([(h.step, h.scheduled) for h in engine.history],
                         [r.output_token_ids for r in reqs], returned)
    assert runs[True][:2] == runs[False][:2]
    assert all(runs[True][2]) and not any(runs[False][2])
    engine = build_engine(tiny, max_num_seqs=2, max_model_len=64, policy="continuous")
    seen = []
    engine.step_hooks.append(lambda record, outputs: seen.append(len(outputs)))
    engine.add_request(PROMPTS[0], greedy(3))
    while engine.has_unfinished_requests():
        engine.step(outputs=False)
    assert seen == [1, 1, 1]


# --- hooks and retirement -----------------------------------------------------------------------------
def test_step_hooks_see_every_record_and_the_engine_retires_when_it_runs_dry(tiny):
    engine = build_engine(tiny, max_num_seqs=2, max_model_len=64, policy="static")
    seen = []
    engine.step_hooks.append(lambda record, outputs: seen.append((record.step, len(outputs))))
    for p in PROMPTS[:2]:
        engine.add_request(p, greedy(3))
    while engine.has_unfinished_requests():
        engine.step()
    assert [s for s, _ in seen] == [h.step for h in engine.history] and all(n for _, n in seen)
    # static batching holds finished members; running dry, the engine let them go by itself
    assert engine.scheduler.running == [] and engine.scheduler.kv.holders == {}


# --- speculative decoding through LLM and the server's flags ------------------------------------------
def test_llm_takes_a_speculative_config_and_stays_exact(tiny):
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    plain = LLM(tiny, tokenizer="tiny-es", max_num_seqs=3, max_model_len=64)
    spec = LLM(tiny, tokenizer="tiny-es", max_num_seqs=3, max_model_len=64,
               speculative_config={"model": "tiny-es-draft", "num_speculative_tokens": 3})
    want = [o.token_ids for o in plain.generate(PROMPTS, params)]
    assert [o.token_ids for o in spec.generate(PROMPTS, params)] == want
    drafted = [e.num_draft_tokens for h in spec.engine.history for e in h.scheduled]
    assert max(drafted) == 3


def test_the_server_flags_make_a_speculative_config():
    from ai_evolution.server.__main__ import engine_config, parser

    config = engine_config(parser().parse_args(["--speculative-model", "tiny-es-draft",
                                                "--num-speculative-tokens", "2", "--enforce-eager"]))
    assert config.speculative_config == SpeculativeConfig("tiny-es-draft", 2)
    assert config.decode_graphs is None and config.kv_layout == "paged"
    assert engine_config(parser().parse_args([])).speculative_config is None
