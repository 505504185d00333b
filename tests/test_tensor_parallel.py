"""Tensor parallelism (chapter 13): the model split across 2 processes on gloo gives the
single-process engine's greedy tokens, logits within float tolerance, all-reduces of exactly the
bytes ``allreduce_bytes_per_step`` says; bad sizes get Spanish errors; no worker outlives its
engine, its parent (killed with SIGKILL) or a dead peer.

Each tensor-parallel engine costs a few seconds to start (spawned workers import torch, gloo
connects): the module starts two, shared by the tests that run them."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

import psutil
import pytest
import torch
import torch.distributed as dist

from ai_evolution.engine import LLM, EngineConfig, SamplingParams, build_engine
from ai_evolution.engine.llm_engine import ExecutorFailed
from ai_evolution.engine.tensor_parallel import (_backend, allreduce_bytes_per_step,
                                                 allreduce_bytes_per_token, check_shardable,
                                                 ring_allreduce_traffic, shard_config)
from ai_evolution.model.checkpoint import random_model
from ai_evolution.model.config import ModelConfig

pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = Path(__file__).resolve().parents[1]
# Multi-query attention (one KV head for 2 ranks: each keeps a copy), biases on q/k/v and o,
# Qwen3's q/k norms, and a vocabulary that 2 does not divide (the last lm_head slice is padded).
MQA = ModelConfig(num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=1, intermediate_size=96,
                  vocab_size=101, max_position_embeddings=128, attention_bias=True,
                  o_proj_bias=True, qk_norm=True, model_type="qwen3")
# Paged KV with prefix caching and prompts chunked by a small token budget: the features the
# tensor-parallel engine must keep.
OPTIONS = dict(kv_layout="paged", block_size=8, max_num_seqs=4, enable_chunked_prefill=True,
               max_num_batched_tokens=24)
MAX_TOKENS = 8


def _prompts(vocab: int, n: int = 5) -> list[list[int]]:
    rng = random.Random(0)
    system = [rng.randrange(3, vocab) for _ in range(17)]  # a shared prefix: prefix-cache hits
    return [system + [rng.randrange(3, vocab) for _ in range(rng.randint(1, 30))] for _ in range(n)]


def _params(i: int) -> SamplingParams:
    """Greedy prompts, and one seeded sampled prompt: rank 0 samples from the gathered logits."""
    if i == 3:
        return SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, temperature=0.8, seed=7)
    return SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)


def _run(llm: LLM, prompts) -> tuple[list[list[int]], dict[str, list[torch.Tensor]]]:
    """Tokens per prompt, and the logits of every step of every request (by request id)."""
    seen: dict[str, list[torch.Tensor]] = {}
    llm.engine.executor.on_logits = lambda rid, logits: seen.setdefault(rid, []).append(logits.clone())
    try:
        outs = llm.generate(prompts, [_params(i) for i in range(len(prompts))])
    finally:
        llm.engine.executor.on_logits = None
    return [o.token_ids for o in outs], seen


@pytest.fixture(scope="module")
def mqa_model():
    return random_model(MQA, seed=5, init_std=0.2)


@pytest.fixture(scope="module")
def engines(tiny, mqa_model):
    """Tensor-parallel engines (N = 2) over tiny-es and the MQA model, one at a time: a process
    holds one ``torch.distributed`` group."""
    made = {}

    def get(name: str) -> LLM:
        if name not in made:
            for other in made.values():
                other.close()
            made.clear()
            made[name] = LLM({"tiny": tiny, "mqa": mqa_model}[name], tensor_parallel_size=2, **OPTIONS)
        return made[name]

    yield get
    for llm in made.values():
        llm.close()


def test_tp2_gives_single_process_tokens_and_logits_tiny_es(engines, tiny):
    _check_same_as_single_process(engines("tiny"), tiny)


def _check_same_as_single_process(parallel: LLM, model) -> None:
    prompts = _prompts(model.config.vocab_size)
    single = LLM(model, **OPTIONS)
    want, want_logits = _run(single, prompts)
    got, got_logits = _run(parallel, prompts)
    assert got == want
    assert all(len(t) == MAX_TOKENS for t in got)
    assert got_logits.keys() == want_logits.keys()
    for rid, steps in want_logits.items():
        assert len(got_logits[rid]) == len(steps)
        for a, b in zip(got_logits[rid], steps):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    assert parallel.engine.scheduler.kv.hit_tokens > 0, "no prefix-cache hit: the prompts do not test it"
    prefill_steps = Counter(r.request_id for step in parallel.engine.history
                            for r in step.scheduled if r.is_prefill)
    assert max(prefill_steps.values()) > 1, "no prompt was chunked: the options do not test it"


def test_each_rank_holds_its_shard(engines, tiny):
    llm = engines("tiny")
    shard = llm.model
    assert shard.full_config == tiny.config
    assert (shard.config.num_heads, shard.config.num_kv_heads) == (2, 1)
    assert shard.config.intermediate_size == tiny.config.intermediate_size // 2
    full = sum(p.numel() for p in tiny.parameters())
    held = sum(p.numel() for p in shard.parameters())
    assert held < full
    cache = llm.engine.executor.cache
    assert cache.k.shape[2] == tiny.config.num_kv_heads // 2  # this rank's KV heads only


def test_allreduce_bytes_match_what_a_step_reduces(engines, tiny, monkeypatch):
    """Count what rank 0 really all-reduces in one step against the formula."""
    llm = engines("tiny")
    reduced = []
    real = dist.all_reduce

    def counting(t, *args, **kw):
        reduced.append(t.numel() * t.element_size())
        return real(t, *args, **kw)

    monkeypatch.setattr(dist, "all_reduce", counting)
    engine = llm.engine
    for p in _prompts(tiny.config.vocab_size, 3):
        engine.add_request(p, SamplingParams(max_tokens=3, ignore_eos=True))
    while engine.has_unfinished_requests():
        before = len(reduced)
        engine.step()
        tokens = engine.history[-1].num_tokens
        want = allreduce_bytes_per_step(tiny.config, tokens, torch.float32)
        assert sum(reduced[before:]) == want
        assert len(reduced) - before == 2 * tiny.config.num_layers


def test_allreduce_bytes_formula():
    cfg = ModelConfig(num_layers=80, hidden_size=8192, num_heads=64, num_kv_heads=8,
                      intermediate_size=28672, vocab_size=128256)  # Llama-3.1-70B's sizes
    assert allreduce_bytes_per_token(cfg, "bf16") == 2 * 80 * 8192 * 2
    assert allreduce_bytes_per_step(cfg, 32, "bf16") == 2 * 80 * 8192 * 32 * 2
    assert allreduce_bytes_per_step(cfg, 0) == 0
    assert ring_allreduce_traffic(1000.0, 1) == 0
    assert ring_allreduce_traffic(1000.0, 4) == 1500.0
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="num_tokens"):
            allreduce_bytes_per_step(cfg, bad)


@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "2", None])
def test_tensor_parallel_size_must_be_a_positive_int(bad):
    with pytest.raises(ValueError, match=r"tensor_parallel_size debe ser un entero >= 1"):
        EngineConfig(tensor_parallel_size=bad)


@pytest.mark.parametrize("cfg, n, what", [
    (dict(num_heads=4, num_kv_heads=2, intermediate_size=96), 3, "no divide las 4 cabezas"),
    (dict(num_heads=12, num_kv_heads=4, intermediate_size=96), 6, "no reparte las 4 cabezas KV"),
    (dict(num_heads=4, num_kv_heads=2, intermediate_size=90), 4, "no divide intermediate_size=90"),
])
def test_sizes_that_do_not_divide_are_refused(cfg, n, what):
    config = ModelConfig(num_layers=1, hidden_size=96, vocab_size=50, head_dim=8, **cfg)
    with pytest.raises(ValueError, match=what) as err:
        check_shardable(config, n)
    assert "valores aceptados para este modelo" in str(err.value)


def test_accepted_sizes_are_named(tiny):
    with pytest.raises(ValueError, match="valores aceptados para este modelo: 1, 2, 4"):
        check_shardable(tiny.config, 3)
    assert shard_config(tiny.config, 4).num_kv_heads == 1  # 2 KV heads, 4 ranks: one copy each


def test_bad_size_starts_nothing(tiny):
    before, group = psutil.Process().children(recursive=True), dist.is_initialized()
    with pytest.raises(ValueError, match="no divide las 4 cabezas"):
        LLM(tiny, tensor_parallel_size=3)
    assert psutil.Process().children(recursive=True) == before
    assert dist.is_initialized() == group


@pytest.mark.parametrize("option, what", [
    (dict(speculative_config={"method": "ngram", "num_speculative_tokens": 2}), "speculative_config"),
    (dict(batch_invariant=True), "batch_invariant"),
    (dict(decode_graphs="eager"), "decode_graphs"),
])
def test_unsupported_features_are_refused(option, what):
    with pytest.raises(ValueError, match=f"tensor_parallel_size=2 no es compatible con {what}"):
        EngineConfig(tensor_parallel_size=2, **option)


def test_more_ranks_than_devices_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ValueError, match="necesita 2 GPU .* y hay 1"):
        _backend(torch.device("cuda"), 2)
    cores = os.cpu_count()
    with pytest.raises(ValueError, match=f"más procesos que los {cores} núcleos"):
        _backend(torch.device("cpu"), cores + 1)


def test_tp2_gives_single_process_tokens_and_logits_mqa(engines, mqa_model):
    _check_same_as_single_process(engines("mqa"), mqa_model)


def test_one_engine_per_process(engines, mqa_model):
    engines("mqa")
    with pytest.raises(RuntimeError, match="ya tiene un grupo de torch.distributed"):
        build_engine(mqa_model, tensor_parallel_size=2)


def test_dead_worker_fails_the_engine_and_stops_the_rest(engines, mqa_model):
    """Runs last: it breaks the shared MQA engine."""
    llm = engines("mqa")
    workers = [psutil.Process(pid) for pid in llm.engine.executor.pids]
    os.kill(workers[0].pid, signal.SIGKILL)
    with pytest.raises(ExecutorFailed, match="paralelismo de tensores falló") as err:
        llm.generate(_prompts(MQA.vocab_size, 1), SamplingParams(max_tokens=2))
    assert "tp-worker-1" in str(err.value)
    assert not dist.is_initialized()
    gone, alive = psutil.wait_procs(workers, timeout=10)
    assert not alive
    with pytest.raises(ExecutorFailed, match="cerrado"):
        llm.generate(_prompts(MQA.vocab_size, 1), SamplingParams(max_tokens=2))


CHILD = textwrap.dedent("""
    import sys, time
    from ai_evolution.engine import LLM
    from ai_evolution.model.checkpoint import random_model
    from ai_evolution.model.config import ModelConfig
    if __name__ == "__main__":
        cfg = ModelConfig(num_layers=1, hidden_size=32, num_heads=2, num_kv_heads=2,
                          intermediate_size=32, vocab_size=50, max_position_embeddings=32)
        llm = LLM(random_model(cfg), tensor_parallel_size=2)
        print(" ".join(map(str, llm.engine.executor.pids)), flush=True)
        time.sleep(600)
""")


def test_no_orphans_when_the_parent_is_killed(tmp_path):
    script = tmp_path / "parent.py"
    script.write_text(CHILD)
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                              env=env)
    try:
        line = parent.stdout.readline()
        assert line.strip(), f"the parent started no workers (exit {parent.poll()})"
        descendants = psutil.Process(parent.pid).children(recursive=True)
        workers = [int(p) for p in line.split()]
        assert set(workers) <= {p.pid for p in descendants}
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            alive = [p for p in descendants if _alive(p)]
            if not alive:
                break
            time.sleep(0.2)
        assert not alive, f"orphans after the parent died: {alive}"
    finally:
        if parent.poll() is None:
            parent.kill()


def _alive(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_server_flag_uses_vllms_name():
    from ai_evolution.server.__main__ import engine_config, parser

    assert engine_config(parser().parse_args(["--tensor-parallel-size", "2"])).tensor_parallel_size == 2
    assert engine_config(parser().parse_args([])).tensor_parallel_size == 1
    with pytest.raises(ValueError, match="tensor_parallel_size debe ser un entero >= 1"):
        engine_config(parser().parse_args(["--tensor-parallel-size", "0"]))


def test_four_shards_rebuild_the_layer_and_the_vocabulary(monkeypatch):
    """N = 4 in one process (no workers): 8 heads, 2 KV heads (each copied on two ranks), a
    vocabulary of 97 (padded to 100). With the all-reduce left out, each rank's attention and MLP
    give a partial sum; the four partial sums add up to the full layer's output, and the four
    vocabulary slices, side by side, are the full lm_head."""
    n = 4
    cfg = ModelConfig(num_layers=1, hidden_size=64, num_heads=8, num_kv_heads=2,
                      intermediate_size=96, vocab_size=97, attention_bias=True, o_proj_bias=True)
    full = random_model(cfg, seed=2, init_std=0.2)
    monkeypatch.setattr(dist, "all_reduce", lambda t, *a, **k: None)  # each rank's partial sum
    from ai_evolution.engine.tensor_parallel import load_shard, shard_state_dict
    shards = [load_shard(cfg, shard_state_dict(full, r, n), r, n, "cpu", torch.float32)
              for r in range(n)]
    torch.manual_seed(0)
    x = torch.randn(1, 5, cfg.hidden_size)
    pos = torch.arange(5)[None]
    cos, sin = full.model.rotary_emb(pos, x.dtype)
    layer = full.model.layers[0]
    with torch.no_grad():
        want_attn = layer.self_attn(x, cos, sin, pos, None, None)
        want_mlp = layer.mlp(x)
        bias = layer.self_attn.o_proj.bias
        got_attn = sum(s.model.layers[0].self_attn(x, cos, sin, pos, None, None) for s in shards)
        got_mlp = sum(s.model.layers[0].mlp(x) for s in shards)
        torch.testing.assert_close(got_attn - (n - 1) * bias, want_attn, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got_mlp, want_mlp, rtol=1e-5, atol=1e-5)
        vocab = torch.cat([s.lm_head(x) for s in shards], dim=-1)
        assert vocab.shape[-1] == 100
        torch.testing.assert_close(vocab[..., :97], full.lm_head(x), rtol=1e-5, atol=1e-5)
        assert not vocab[..., 97:].any()
    kv_rows = [s.model.layers[0].self_attn.k_proj.weight for s in shards]
    assert torch.equal(kv_rows[0], kv_rows[1]) and torch.equal(kv_rows[2], kv_rows[3])
    assert not torch.equal(kv_rows[1], kv_rows[2])


def test_allreduce_is_measured_against_message_size():
    from ai_evolution.hardware.allreduce import measure_allreduce

    rows = measure_allreduce([1024, 2**16 + 3], repeats=3, warmup=1)
    assert [r["bytes"] for r in rows] == [1024, 2**16]  # whole float32 elements
    for r in rows:
        assert 0 < r["min_s"] <= r["median_s"] <= r["max_s"]
        assert r["algbw_bytes_per_s"] == pytest.approx(r["bytes"] / r["median_s"])


@pytest.mark.parametrize("kw, what", [
    (dict(world_size=1), "world_size debe ser un entero >= 2"),
    (dict(repeats=0), "repeats debe ser un entero >= 1"),
    (dict(sizes_bytes=[2]), "sizes_bytes debe ser una lista de enteros >= 4"),
    (dict(sizes_bytes=[]), "sizes_bytes"), (dict(world_size=1.5), "world_size debe ser un entero"),
    (dict(world_size=10**4), "más procesos que los"), (dict(threads=0), "threads"),
])
def test_allreduce_measure_refuses_bad_input(kw, what):
    from ai_evolution.hardware.allreduce import measure_allreduce

    with pytest.raises(ValueError, match=what):
        measure_allreduce(**kw)
