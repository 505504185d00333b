"""Hidden checks of lab 13 (``distributed``). Loaded by path by the autograder; never imported by
a notebook. Each function is named after a criterion of ``rubric.json`` and yields its stages:
the notebook's public self-check first, then checks the student never saw."""

from __future__ import annotations

import math

import torch

from ai_evolution.checks import call_student, failed, passed
from ai_evolution.checks import distributed as checks
from ai_evolution.fmt import es_value
from ai_evolution.grading import hidden, public
from ai_evolution.hardware import get_device_spec
from ai_evolution.loadgen.shared_prefix import prefix_sharing_workload
from ai_evolution.model import ModelConfig, get_preset
from ai_evolution.reference.distributed import (reference_affinity_choice,
                                                reference_allreduce_bytes,
                                                reference_shard_linear)
from ai_evolution.router.policies import PrefixAffinity
from ai_evolution.sim import RooflineCostModel
from ai_evolution.sim.routing import routing_engine_factory, simulate_routing


def shard_linear(fn, ctx):
    yield public(checks.check_shard_linear, fn, seed=ctx.seed)
    for s in ctx.hidden_seeds:
        yield hidden(checks.check_shard_linear, fn, seed=s)
    yield hidden(_shard_edges, fn)


def _shard_edges(fn, raise_on_fail=False):
    """One rank (the whole matrix), a float16 weight, as many ranks as outputs or inputs."""
    name = "reparto de una capa lineal (casos límite)"
    g = torch.Generator().manual_seed(13)
    w = torch.randn(8, 6, generator=g)
    cases = [("un solo rango: la matriz entera", w, 0, 1, "row"),
             ("pesos float16", w.half(), 1, 2, "column"),
             ("tantos rangos como salidas", w, 7, 8, "column"),
             ("tantos rangos como entradas", w, 5, 6, "row")]
    for i, (label, weight, rank, n, mode) in enumerate(cases):
        want = reference_shard_linear(weight, rank, n, mode)
        got, crash = call_student(name, fn, weight.clone(), rank, n, mode)
        if crash:
            return failed(name, i, label, crash)
        if not isinstance(got, torch.Tensor) or got.dtype != want.dtype or not torch.equal(got, want):
            return failed(name, i, label, f"se esperaba un trozo de forma {tuple(want.shape)} "
                          f"({want.dtype}) y su función devolvió {es_value(got)}.")
    return passed(name, len(cases))


def allreduce_bytes(fn, ctx):
    yield public(checks.check_allreduce_bytes, fn, seed=ctx.seed)
    for s in ctx.hidden_seeds:
        yield hidden(checks.check_allreduce_bytes, fn, seed=s)
    yield hidden(_bytes_edges, fn)


def _bytes_edges(fn, raise_on_fail=False):
    """Fractional bytes per value (int4), a one-layer model, and Llama 3.1 8B's prefill of a
    long prompt."""
    name = "bytes de all-reduce por paso (casos límite)"
    one = ModelConfig(num_layers=1, hidden_size=8, num_heads=2, num_kv_heads=1,
                      intermediate_size=16, vocab_size=10)
    cases = [("medio byte por valor", get_preset("llama-3.1-8b"), 3, 0.5),
             ("una sola capa", one, 1, 2.0),
             ("prefill de 8192 tokens", get_preset("llama-3.1-8b"), 8192, 2.0)]
    for i, (label, cfg, tokens, b) in enumerate(cases):
        want = reference_allreduce_bytes(cfg, tokens, b)
        got, crash = call_student(name, fn, cfg, tokens, b)
        if crash:
            return failed(name, i, label, crash)
        try:
            ok = math.isclose(float(got), want, rel_tol=1e-12)
        except (TypeError, ValueError):
            ok = False
        if not ok:
            return failed(name, i, label, f"se esperaba {es_value(want)} y su función devolvió "
                          f"{es_value(got)}.")
    return passed(name, len(cases))


def affinity_choice(fn, ctx):
    yield public(checks.check_affinity_choice, fn, seed=ctx.seed)
    for s in ctx.hidden_seeds:
        yield hidden(checks.check_affinity_choice, fn, seed=s)
    yield hidden(_affinity_edges, fn)
    yield hidden(_affinity_in_the_router, fn)


def _affinity_edges(fn, raise_on_fail=False):
    """Every block owned by a different replica, an owner that is not a candidate with a
    shorter owned prefix behind it, and loads that differ exactly by the imbalance."""
    name = "regla de afinidad de prefijo (casos límite)"
    hashes = [bytes([i]) * 4 for i in range(6)]
    cases = [("cada bloque de una réplica distinta", hashes, {h: i for i, h in enumerate(hashes)},
              [0] * 6, list(range(6)), 4),
             ("el dueño del prefijo largo no es candidato", hashes[:3],
              {hashes[2]: 3, hashes[1]: 1}, [0, 0, 0, 0], [0, 1, 2], 4),
             ("diferencia de carga igual al desequilibrio", hashes[:1], {hashes[0]: 2},
              [1, 1, 3], [0, 1, 2], 2),
             ("diferencia de carga uno por encima", hashes[:1], {hashes[0]: 2}, [1, 1, 4],
              [0, 1, 2], 2)]
    for i, (label, prefix, owners, loads, candidates, k) in enumerate(cases):
        want = reference_affinity_choice(prefix, owners, loads, candidates, k)
        got, crash = call_student(name, fn, list(prefix), dict(owners), list(loads),
                                  list(candidates), k)
        if crash:
            return failed(name, i, label, crash)
        if got != want or isinstance(got, bool):
            return failed(name, i, label, f"se esperaba la réplica {want} y su función devolvió "
                          f"{es_value(got)}.")
    return passed(name, len(cases))


def _affinity_in_the_router(fn, raise_on_fail=False):
    """Plugged into the router's policy in front of 4 simulated replicas (two-turn
    conversations over shared system prompts), the student's rule sends every request where the
    library's rule does."""
    name = "regla de afinidad de prefijo en el enrutador"
    cfg = get_preset("llama-3.1-8b")
    make = routing_engine_factory(
        cfg, RooflineCostModel.from_device_spec(get_device_spec("h100-sxm")), num_blocks=512)
    work = prefix_sharing_workload(24, 40.0, cfg.vocab_size, 7, num_system_prompts=3,
                                   system_len=64, turns=2, turn_len=32, output_len=4)
    served = []
    for rule in (reference_affinity_choice, fn):
        try:
            row = simulate_routing(PrefixAffinity(max_imbalance=2, rule=rule), work, 4, make)
        except Exception as err:  # noqa: BLE001 - the student's rule inside the router
            return failed(name, 0, "conversaciones sobre 4 réplicas", getattr(err, "feedback", None)
                          or f"el enrutador se detuvo: {type(err).__name__}: {err}")
        served.append(row["requests_per_replica"])
    if served[0] != served[1]:
        return failed(name, 0, "conversaciones sobre 4 réplicas", f"las peticiones por réplica "
                      f"son {es_value(served[1])}; con la regla del enrutador, {es_value(served[0])}.")
    return passed(name, 1)


def extension(ext, contract, ctx):
    yield hidden(checks.check_challenge, ext, ctx.params, seed=ctx.seed)
