"""Decode steps through static buffers (the CUDA-graph path of ``ModelRunner``), checked on the
CPU with the ``"eager"`` backend: the same padded batches, scratch block, whole-table reads and
masks that a CUDA graph replays, run without capture. The capture itself needs a GPU
(scripts/device_checks.py, check ``graphs``)."""

from __future__ import annotations

import random

import pytest

from ai_evolution.engine import LLM, build_engine
from ai_evolution.engine.graphs import MAX_GRAPH_BATCH, DecodeGraphs, graph_batch_sizes
from ai_evolution.engine.request import FinishReason

from engine_helpers import greedy, solo


def test_graph_batch_sizes_cover_every_batch_up_to_the_cap():
    assert graph_batch_sizes(1) == [1]
    assert graph_batch_sizes(5) == [1, 2, 4, 5]
    assert graph_batch_sizes(20) == [1, 2, 4, 8, 16, 20]
    assert graph_batch_sizes(32) == [1, 2, 4, 8, 16, 24, 32]
    for n in range(1, 40):
        sizes = graph_batch_sizes(n)
        assert sizes == sorted(set(sizes)) and sizes[-1] == n
        assert all(any(b >= k for b in sizes) for k in range(1, n + 1))
    with pytest.raises(ValueError, match="max_batch"):
        graph_batch_sizes(0)


def _workload(vocab: int, n: int, seed: int):
    rng = random.Random(seed)
    shared = [rng.randrange(3, vocab) for _ in range(20)]  # a common prefix for prefix caching
    items = []
    for i in range(n):
        own = [rng.randrange(3, vocab) for _ in range(rng.randint(1, 30))]
        items.append(((shared if i % 2 else []) + own, greedy(rng.randint(1, 14))))
    return items


CASES = {
    "contiguous": dict(kv_layout="contiguous"),
    "paged-tight": dict(kv_layout="paged", block_size=8, num_blocks=14),      # preemptions
    "paged-chunked": dict(kv_layout="paged", block_size=4, max_num_batched_tokens=24,
                          enable_chunked_prefill=True),
    "paged-int8": dict(kv_layout="paged", block_size=8, kv_dtype="int8"),
}


@pytest.mark.parametrize("case", CASES)
def test_static_decode_steps_give_the_eager_engines_tokens(tiny, one_thread, case):
    items = _workload(tiny.config.vocab_size, 11, seed=len(case))
    runs = {}
    for graphs in (None, "eager"):
        engine = build_engine(tiny, max_num_seqs=6, max_model_len=64, decode_graphs=graphs,
                              **CASES[case])
        for i, (prompt, params) in enumerate(items):
            engine.add_request(prompt, params, request_id=f"r{i}")
        while engine.has_unfinished_requests():
            engine.step()
        runs[graphs] = engine
    eager, static = runs[None], runs["eager"]
    assert eager.executor.graphs is None
    for i, (prompt, params) in enumerate(items):
        got = static.requests[f"r{i}"]
        assert got.output_token_ids == eager.requests[f"r{i}"].output_token_ids, f"request {i}"
        assert got.finish_reason is FinishReason.LENGTH
        if case != "paged-int8":  # int8 K/V round: the reference is the eager engine on it
            assert got.output_token_ids == solo(tiny, prompt, params), f"request {i}"
    # the static path served every pure decode step, at batch sizes that needed padding too
    decode_steps = [h for h in static.history
                    if h.scheduled and all(e.num_tokens == 1 for e in h.scheduled)]
    assert static.executor.graphs.steps == len(decode_steps) > 0
    widths = {len(h.scheduled) for h in decode_steps}
    assert widths - set(static.executor.graphs.sizes), "no decode step needed a padded batch"
    if case == "paged-tight":
        assert static.kv_usage()["num_preemptions"] > 0


def test_padding_rows_write_only_the_scratch_block(tiny, one_thread):
    engine = build_engine(tiny, max_num_seqs=4, max_model_len=32, kv_layout="paged", block_size=8,
                          decode_graphs="eager")
    cache = engine.executor.cache
    graphs = engine.executor.graphs
    assert cache.num_blocks == engine.scheduler.kv.num_blocks + 1 == graphs.scratch + 1
    for i in range(3):  # three decoding requests: a batch of 3 padded to 4
        engine.add_request([5 + i, 6, 7], greedy(4), request_id=f"r{i}")
    engine.step()  # the prefills
    before = cache.k.clone()
    engine.step()  # a decode step of 3 requests, padded to 4
    assert graphs.steps == 1
    changed = {int(b) for b in (cache.k != before).any(dim=(0, 2, 3, 4)).nonzero()}
    owned = {b.block_id for r in engine.scheduler.running
             for b in engine.scheduler.kv.tables[r.request_id]}
    assert graphs.scratch in changed and changed - {graphs.scratch} <= owned


def test_graphs_on_the_cpu_are_refused_and_auto_leaves_them_off(tiny):
    with pytest.raises(ValueError, match="GPU"):
        build_engine(tiny, max_num_seqs=2, max_model_len=32, decode_graphs="cuda")
    with pytest.raises(ValueError, match="'auto'.*'cuda'.*'eager'"):
        build_engine(tiny, max_num_seqs=2, max_model_len=32, decode_graphs="sí")
    assert build_engine(tiny, max_num_seqs=2, max_model_len=32).executor.graphs is None
    for eager in (True, False):
        assert LLM(tiny, max_num_seqs=2, max_model_len=32, enforce_eager=eager).engine.executor.graphs is None


def test_decode_graphs_cap_their_batch(tiny):
    engine = build_engine(tiny, max_num_seqs=MAX_GRAPH_BATCH + 8, max_model_len=16,
                          decode_graphs="eager")
    assert isinstance(engine.executor.graphs, DecodeGraphs)
    assert engine.executor.graphs.sizes[-1] == MAX_GRAPH_BATCH



def test_a_failed_capture_warns_and_the_engine_goes_on_without_graphs(tiny, one_thread, monkeypatch):
    items = _workload(tiny.config.vocab_size, 5, seed=7)
    engine = build_engine(tiny, max_num_seqs=4, max_model_len=64, kv_layout="paged",
                          decode_graphs="eager")
    graphs = engine.executor.graphs

    def broken(size):
        raise RuntimeError("operación no capturable")

    monkeypatch.setattr(graphs, "_capture", broken)
    with pytest.warns(RuntimeWarning, match="no se pudo capturar.*operación no capturable"):
        graphs.capture_all()  # what a CUDA engine does when it starts
    assert graphs.disabled == "RuntimeError: operación no capturable"
    for i, (prompt, params) in enumerate(items):
        engine.add_request(prompt, params, request_id=f"r{i}")
    while engine.has_unfinished_requests():
        engine.step()
    assert graphs.steps == 0  # every step ran on the eager path
    for i, (prompt, params) in enumerate(items):
        assert engine.requests[f"r{i}"].output_token_ids == solo(tiny, prompt, params)
