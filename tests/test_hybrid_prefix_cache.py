"""Prefix caching for a hybrid model: state checkpoints every `state_checkpoint_interval` tokens,
hits cut to the last checkpoint, exact greedy output (issue 32)."""

from __future__ import annotations

import pytest
import torch

from ai_evolution.engine import SamplingParams
from ai_evolution.engine.config import EngineConfig, build_engine
from ai_evolution.engine.state_slots import StateCheckpointPool
from ai_evolution.generation import generate
from ai_evolution.model.checkpoint import random_model
from ai_evolution.model.linear_attention import LinearAttentionState, SlotState
from ai_evolution.model.memory import state_bytes_per_sequence
from test_hybrid_model import HYBRID, random_ids, serve_greedy


@pytest.fixture(scope="module")
def model():
    return random_model(HYBRID, seed=7, init_std=0.2)


def shared_prefix_workload(seed: int = 0):
    """Eight requests on three shared prefixes (9, 14 and 19 tokens) with suffixes of 0..5
    tokens: the later ones find the earlier ones' blocks and checkpoints."""
    gen = torch.Generator().manual_seed(seed)
    prefixes = [random_ids(1, n, seed=seed * 10 + i)[0].tolist() for i, n in enumerate((9, 14, 19))]
    items = []
    for i in range(8):
        prefix = prefixes[i % 3]
        suffix = torch.randint(0, HYBRID.vocab_size, (i % 6,), generator=gen).tolist()
        items.append((prefix + suffix, 2 + i % 4))
    return items


def first_starts(engine) -> dict[str, list[int]]:
    """Per request, the position of its first computed token at each admission (the tokens a
    prefix hit skipped; 0 without a hit)."""
    starts: dict[str, list[int]] = {}
    seen: set[tuple[str, int]] = set()
    for h in engine.history:
        for e in h.scheduled:
            start = e.context_len - e.num_tokens
            admitted = e.request_id in h.admitted
            if admitted and (e.request_id, h.step) not in seen:
                seen.add((e.request_id, h.step))
                starts.setdefault(e.request_id, []).append(start)
    return starts


@pytest.mark.parametrize("options", [
    dict(kv_layout="contiguous"),
    dict(kv_layout="paged", block_size=4),
    dict(kv_layout="paged", block_size=4, state_checkpoint_interval=8),
    # chunks of 6 tokens: checkpoints at 8, 16 fall inside chunks, computed in two pieces
    dict(kv_layout="paged", block_size=4, state_checkpoint_interval=8,
         max_num_batched_tokens=6, enable_chunked_prefill=True),
    # few blocks: requests are preempted and come back through their own checkpoints
    dict(kv_layout="paged", block_size=4, num_blocks=9, num_state_checkpoints=6,
         max_num_batched_tokens=8, enable_chunked_prefill=True),
], ids=["contiguous", "paged-every-block", "paged-interval-8", "chunked", "preempted"])
def test_prefix_hits_give_the_tokens_of_solo_uncached_decoding(model, options):
    items = shared_prefix_workload()
    refs = [generate(model, p, m, cache=None)[0] for p, m in items]
    engine = serve_greedy(model, items, 2, 40, **options)
    for i, ref in enumerate(refs):
        assert engine.requests[f"r{i}"].output_token_ids == ref, f"request {i}"
    kv = engine.scheduler.kv
    kv.check_invariants()
    assert sorted(kv._free) == [0, 1]  # every state slot came back
    usage = engine.kv_usage()
    if options["kv_layout"] == "contiguous":
        assert usage["prefix_hit_tokens"] == 0 and kv.num_state_checkpoints == 0
        return
    interval = options.get("state_checkpoint_interval", options["block_size"])
    hits = [s for starts in first_starts(engine).values() for s in starts if s]
    assert hits and all(s % interval == 0 for s in hits), hits
    assert usage["prefix_hit_tokens"] == sum(hits)
    assert usage["state_checkpoint_restores"] == len(hits)
    assert 0 < usage["state_checkpoints"] <= usage["state_checkpoint_capacity"]
    assert usage["state_checkpoint_bytes"] == usage["state_checkpoints"] * \
        state_bytes_per_sequence(HYBRID)
    if "num_blocks" in options:
        assert engine.scheduler.num_preemptions > 0
    if "max_num_batched_tokens" in options:  # some checkpoint fell strictly inside a chunk
        assert any(e.is_prefill and (e.context_len - e.num_tokens) // interval
                   < (e.context_len - 1) // interval for h in engine.history for e in h.scheduled
                   if e.context_len % interval)


@pytest.mark.parametrize("interval", [4, 8, 16])
def test_prompts_shorter_than_the_interval_never_hit(model, interval):
    """The same prompt twice, one after the other: the second reuses the longest prefix that is
    a multiple of the interval and leaves its last token to compute; a transformer-like cache
    (KV blocks only) would reuse every full block before the last token."""
    for length in (3, 4, 5, 8, 9, 12, 17, 20):
        prompt = random_ids(1, length, seed=length)[0].tolist()
        engine = build_engine(model, max_num_seqs=1, max_model_len=40, decode_graphs=None,
                              kv_layout="paged", block_size=4, state_checkpoint_interval=interval,
                              num_state_checkpoints=8)
        outs = []
        for i in range(2):
            engine.add_request(prompt, SamplingParams(max_tokens=2, ignore_eos=True),
                               request_id=f"r{i}")
            while engine.has_unfinished_requests():
                engine.step()
            outs.append(engine.requests[f"r{i}"].output_token_ids)
        usage = engine.kv_usage()
        expected = (length - 1) // interval * interval
        assert usage["prefix_hit_tokens"] == expected, (length, usage["prefix_hit_tokens"])
        assert usage["prefix_truncated_tokens"] == (length - 1) // 4 * 4 - expected
        if length <= interval:
            assert usage["prefix_hit_tokens"] == 0
        assert outs[0] == outs[1]


def test_an_evicted_checkpoint_cuts_the_hit_and_is_counted_in_bytes(model):
    a, b = (random_ids(1, 10, seed=s)[0].tolist() for s in (1, 2))
    engine = build_engine(model, max_num_seqs=1, max_model_len=40, decode_graphs=None,
                          kv_layout="paged", block_size=4, num_blocks=40,
                          state_checkpoint_interval=8, num_state_checkpoints=1)
    for i, prompt in enumerate((a, b, a)):
        engine.add_request(prompt, SamplingParams(max_tokens=1, ignore_eos=True), request_id=f"r{i}")
        while engine.has_unfinished_requests():
            engine.step()
    usage = engine.kv_usage()
    # a's blocks are still cached, but b's checkpoint took the only row: a's third run misses
    assert usage["prefix_hit_tokens"] == 0 and usage["prefix_truncated_tokens"] == 8
    assert usage["state_checkpoint_evictions"] == 2 and usage["state_checkpoints"] == 1
    assert usage["state_checkpoint_capacity_bytes"] == state_bytes_per_sequence(HYBRID)
    engine.scheduler.kv.check_invariants()


def test_the_pool_never_hands_a_row_read_or_written_in_the_same_step():
    pool = StateCheckpointPool(2, bytes_per_checkpoint=10.0)
    r0 = pool.reserve(b"a", step=0)
    r1 = pool.reserve(b"b", step=0)
    assert pool.reserve(b"c", step=0) is None          # both rows are written in step 0
    assert pool.reserve(b"a", step=1) is None          # "a" is being written already
    pool.commit(r0)
    pool.commit(r1)
    assert pool.use(b"a") == r0                          # "b" is now the least recently used
    pool.mark_busy(r1, 2)                                # ... but read in step 2
    assert pool.reserve(b"c", step=2) == r0 and pool.num_evictions == 1
    pool.release(r0)                                     # that write never happened
    assert pool.lookup(b"a") is None and pool.lookup(b"b") == r1
    assert pool.stats()["state_checkpoint_bytes"] == 10.0
    pool.check_invariants()


def test_a_checkpoint_inside_a_chunk_holds_the_state_after_its_prefix(model):
    """StateSegments computes a segment in pieces ending at each save: the copied state equals
    the state after running the prefix alone."""
    ids = random_ids(1, 11, seed=3)
    store = LinearAttentionState(HYBRID, 2)
    ckpt = LinearAttentionState(HYBRID, 2)
    positions = torch.arange(11)[None]
    from ai_evolution.model.attention import ContiguousKVCache
    with torch.inference_mode():
        # (only the linear layers' state matters here; attention runs on a contiguous cache)
        model(ids, positions, kv_cache=ContiguousKVCache(HYBRID, 1, 11),
              state=SlotState(store, ((0, 11, 1),), ckpt, ((0, 4, 0), (0, 8, 1))))
        for m, row in ((4, 0), (8, 1)):
            alone = LinearAttentionState(HYBRID, 1)
            model(ids[:, :m], positions[:, :m], kv_cache=ContiguousKVCache(HYBRID, 1, m),
                  state=alone)
            torch.testing.assert_close(ckpt.recurrent[:, row], alone.recurrent[:, 0])
            torch.testing.assert_close(ckpt.conv[:, row], alone.conv[:, 0])
        whole = LinearAttentionState(HYBRID, 1)
        model(ids, positions, kv_cache=ContiguousKVCache(HYBRID, 1, 11), state=whole)
        torch.testing.assert_close(store.recurrent[:, 1], whole.recurrent[:, 0])


@pytest.mark.parametrize("options, message", [
    (dict(block_size=4, state_checkpoint_interval=6),
     r"state_checkpoint_interval=6 debe ser un múltiplo positivo de block_size=4 \(aceptados: 4, "
     r"8, 12, \.\.\. o None"),
    (dict(state_checkpoint_interval=0), r"state_checkpoint_interval=0 debe ser un múltiplo"),
    (dict(state_checkpoint_interval=True), r"state_checkpoint_interval=True debe ser"),
    (dict(num_state_checkpoints=0), r"num_state_checkpoints debe ser un entero >= 1"),
])
def test_bad_checkpoint_settings_name_the_accepted_values(options, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(**options)


def test_the_engine_refuses_a_runner_without_the_managers_checkpoints(model):
    from ai_evolution.engine import LLMEngine, ModelRunner, Scheduler
    engine = build_engine(model, max_num_seqs=2, max_model_len=16, decode_graphs=None,
                          kv_layout="paged", block_size=4, num_state_checkpoints=3)
    kv = engine.scheduler.kv
    assert kv.num_state_checkpoints == 3 and engine.executor.checkpoints.batch_size == 3
    runner = ModelRunner(model, kv.num_blocks, kv.block_size, max_num_seqs=2)  # no checkpoints
    with pytest.raises(ValueError, match="el ejecutor guarda 0 puntos de control del estado y el "
                                         "gestor de KV reparte 3"):
        LLMEngine(Scheduler(2, 16, kv=kv), runner, HYBRID.vocab_size)


def test_the_server_flags_set_the_checkpoints():
    from ai_evolution.server.__main__ import engine_config, parser
    config = engine_config(parser().parse_args(["--block-size", "8", "--state-checkpoint-interval",
                                                "24", "--num-state-checkpoints", "5"]))
    assert (config.state_checkpoint_interval, config.num_state_checkpoints) == (24, 5)
    with pytest.raises(ValueError, match="state_checkpoint_interval=20 debe ser un múltiplo "
                                         "positivo de block_size=8"):
        engine_config(parser().parse_args(["--block-size", "8", "--state-checkpoint-interval", "20"]))


class FailsAfterRunning:
    """Wraps a runner: a step with several requests, one of them poisoned (its prompt starts
    with ``marker``), raises after the model has run, when every state is already updated (as a
    failure in the last layer or in the head would); alone, the poisoned request raises."""

    def __init__(self, inner, marker: int) -> None:
        self.inner, self.marker, self.poisoned = inner, marker, set()

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def execute(self, out):
        self.poisoned |= {s.request_id for s in out.scheduled
                          if s.start == 0 and s.token_ids[0] == self.marker}
        hit = any(s.request_id in self.poisoned for s in out.scheduled)
        if hit and len(out.scheduled) == 1:
            raise RuntimeError("fallo simulado del núcleo")
        result = self.inner.execute(out)
        if hit:
            raise RuntimeError("fallo simulado del núcleo tras actualizar los estados")
        return result


@pytest.mark.parametrize("kv_layout", ["contiguous", "paged"])
def test_a_step_that_fails_after_updating_the_states_fails_only_its_culprit(model, kv_layout):
    """Running a request again after its state advanced would advance it twice: the engine
    preempts those requests instead, and they compute their state again."""
    from ai_evolution.engine import FinishReason
    items = shared_prefix_workload(seed=1)[:5]
    refs = [generate(model, p, m, cache=None)[0] for p, m in items]
    marker = 96
    assert all(p[0] != marker for p, _ in items)
    engine = build_engine(model, max_num_seqs=3, max_model_len=40, decode_graphs=None,
                          kv_layout=kv_layout, block_size=4)
    engine.executor = FailsAfterRunning(engine.executor, marker)
    for i, (prompt, n) in enumerate(items):
        engine.add_request(prompt, SamplingParams(max_tokens=n, ignore_eos=True), request_id=f"r{i}")
    engine.step()
    engine.step()  # the first ones decode now: the poisoned request joins them
    engine.add_request([marker, 1, 2], SamplingParams(max_tokens=6, ignore_eos=True),
                       request_id="bad")
    while engine.has_unfinished_requests():
        engine.step()
    engine.retire_finished()
    assert engine.requests["bad"].finish_reason is FinishReason.ERROR
    for i, ref in enumerate(refs):
        assert engine.requests[f"r{i}"].output_token_ids == ref, f"request {i}"
        assert engine.requests[f"r{i}"].error is None
    assert engine.scheduler.num_preemptions > 0
    engine.scheduler.kv.check_invariants()
