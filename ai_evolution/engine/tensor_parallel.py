"""Tensor parallelism (chapter 13): one model split across N ranks with ``torch.distributed``.

Megatron-LM's split, as vLLM and nano-vllm run it. In every layer the projections that fan out
are *column-parallel*: rank ``r`` holds a slice of their output features (Q/K/V by whole heads,
the MLP's gate and up by ``intermediate_size / N`` rows), computes its slice from the full input
and needs nothing from the others. The projections that fan back in are *row-parallel*: the
attention output ``o_proj`` and the MLP's ``down_proj`` hold the matching slice of their *input*
features, so each rank's product is a partial sum of the full one, and one ``all_reduce`` (sum)
per row-parallel linear rebuilds it on every rank: two all-reduces per layer, of ``hidden`` values
per token each (``allreduce_bytes_per_step``). Each rank's KV cache holds only its KV heads; when
there are fewer KV heads than ranks, each rank keeps a copy of the one its query heads read.
The embedding table is replicated; the vocabulary projection (``lm_head``) is split by rows
(column-parallel over the vocabulary, padded to a multiple of N) and its pieces are gathered on
rank 0, the only rank that samples.

The processes: rank 0 is the engine process itself (as in nano-vllm): the scheduler, the
sampling and rank 0's shard of the forward pass run there, so a step's tokens need no extra hop
back; ranks 1..N-1 are worker processes (``torch.multiprocessing``, spawn) that each load only
their shard. Every step, rank 0 sends the ``SchedulerOutput`` (a frozen value) down a pipe to
each worker, and all ranks run the same forward pass, meeting in the collectives: gloo on the
CPU, NCCL when the model is on CUDA (rank ``r`` on ``cuda:r``).

Shutdown: ``close()`` sends every worker a stop and joins it; a worker that fails reports its
traceback through its pipe and exits, which breaks rank 0's next collective: the engine raises
``ExecutorFailed`` and the other workers are stopped; a worker whose parent dies finds its pipe
closed (or its parent's sentinel ready, watched by a thread) and exits: no orphans.
"""

from __future__ import annotations

import math
import os
import threading
import time
import traceback
from datetime import timedelta
from multiprocessing.connection import wait as wait_for

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import Tensor, nn

from ..model.checkpoint import meta_modules
from ..model.config import ModelConfig
from ..model.decoder import Transformer
from ..model.memory import allreduce_bytes_per_step, allreduce_bytes_per_token
from .llm_engine import ExecutorFailed
from .runner import ModelRunner
from .step import SchedulerOutput, StepResult

STEP_TIMEOUT = timedelta(minutes=10)  # a collective that waits longer means a rank is stuck
START_TIMEOUT_S = 300.0               # spawning a worker imports torch: seconds on a busy CPU


def check_tensor_parallel_size(n, name: str = "tensor_parallel_size") -> None:
    """``n`` must be an int >= 1 (Spanish ``ValueError`` naming the accepted values)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"{name} debe ser un entero >= 1 (1: sin paralelismo; N: el modelo "
                         f"repartido en N procesos); se recibió {n!r} ({type(n).__name__})")


def check_shardable(config: ModelConfig, n: int) -> None:
    """Refuse (Spanish ``ValueError``) a model that cannot be split across ``n`` ranks: the
    attention heads, the KV heads (or, with fewer KV heads than ranks, the ranks by the KV heads)
    and the MLP width must divide evenly; hybrid models are not split."""
    check_tensor_parallel_size(n)
    if config.is_hybrid:
        raise ValueError("tensor_parallel_size > 1 no está disponible para un modelo híbrido "
                         "(sus capas de atención lineal no se reparten); use tensor_parallel_size=1")
    divisors = [d for d in range(1, config.num_heads + 1) if _valid_size(config, d)]
    accepted = f"valores aceptados para este modelo: {', '.join(map(str, divisors))}"
    if config.num_heads % n:
        raise ValueError(f"tensor_parallel_size={n} no divide las {config.num_heads} cabezas de "
                         f"atención (cada proceso se queda con cabezas enteras); {accepted}")
    hkv = config.num_kv_heads
    if (hkv >= n and hkv % n) or (hkv < n and n % hkv):
        raise ValueError(f"tensor_parallel_size={n} no reparte las {hkv} cabezas KV: deben "
                         f"dividirse entre los procesos, o (si hay menos que procesos) los "
                         f"procesos entre ellas; {accepted}")
    if config.intermediate_size % n:
        raise ValueError(f"tensor_parallel_size={n} no divide intermediate_size="
                         f"{config.intermediate_size} (el MLP se reparte por columnas); {accepted}")


def _valid_size(config: ModelConfig, n: int) -> bool:
    hkv = config.num_kv_heads
    return (not config.num_heads % n and not config.intermediate_size % n
            and (not hkv % n if hkv >= n else not n % hkv))


# --- bytes moved ---------------------------------------------------------------------------------
def ring_allreduce_traffic(payload_bytes: float, n: int) -> float:
    """Bytes each rank sends (and receives) to all-reduce ``payload_bytes`` over a ring of ``n``
    ranks: reduce-scatter then all-gather, ``2 (n - 1) / n`` times the payload (0 for n = 1)."""
    check_tensor_parallel_size(n, "n")
    return 2 * (n - 1) / n * payload_bytes


# --- the sharded model ---------------------------------------------------------------------------
class RowParallelLinear(nn.Linear):
    """A linear holding a slice of the input features: its product is a partial sum, completed
    by an ``all_reduce`` over the ranks; the bias (held whole) is added once, after it."""

    def forward(self, x: Tensor) -> Tensor:
        y = F.linear(x, self.weight)
        dist.all_reduce(y)
        return y if self.bias is None else y + self.bias


class ShardedTransformer(Transformer):
    """One rank's shard of a ``Transformer``: a ``Transformer`` of the shard's sizes (``config``:
    heads, KV heads and MLP width divided by N), with row-parallel ``o_proj``/``down_proj`` and a
    vocabulary slice as ``lm_head``. ``full_config`` is the whole model's. ``logits`` gathers the
    slices on rank 0 and returns None on the other ranks."""

    def __init__(self, full_config: ModelConfig, rank: int, world_size: int) -> None:
        super().__init__(shard_config(full_config, world_size))
        self.full_config, self.rank, self.world_size = full_config, rank, world_size
        hidden = full_config.hidden_size
        for layer in self.model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            attn.o_proj = RowParallelLinear(attn.o_proj.in_features, hidden,
                                            bias=attn.o_proj.bias is not None)
            mlp.down_proj = RowParallelLinear(mlp.down_proj.in_features, hidden, bias=False)
        self.lm_head = nn.Linear(hidden, _padded_vocab(full_config, world_size) // world_size,
                                 bias=False)

    def logits(self, hidden: Tensor) -> Tensor | None:
        local = self.lm_head(hidden).contiguous()                     # [..., V_pad / N]
        if self.rank:
            dist.gather(local, dst=0)
            return None
        pieces = [torch.empty_like(local) for _ in range(self.world_size)]
        dist.gather(local, pieces, dst=0)
        return torch.cat(pieces, dim=-1)[..., :self.full_config.vocab_size]


def shard_config(config: ModelConfig, n: int) -> ModelConfig:
    """The sizes one of ``n`` ranks computes: heads, KV heads (at least one) and MLP width
    divided by ``n``; ``head_dim`` kept; the lm_head untied (each rank holds a vocabulary slice
    of its own, the embedding table whole)."""
    check_shardable(config, n)
    return config.replace(num_heads=config.num_heads // n,
                          num_kv_heads=max(1, config.num_kv_heads // n),
                          intermediate_size=config.intermediate_size // n,
                          head_dim=config.head_dim, tie_word_embeddings=False)


def _padded_vocab(config: ModelConfig, n: int) -> int:
    return math.ceil(config.vocab_size / n) * n


def shard_state_dict(model: Transformer, rank: int, n: int) -> dict[str, Tensor]:
    """Rank ``rank``'s weights, sliced from ``model``'s full state dict (copies on the CPU, so
    that they can travel to a worker and the full model can be freed)."""
    config = model.config
    check_shardable(config, n)
    d, h_local = config.head_dim, config.num_heads // n
    q_rows = slice(rank * h_local * d * (2 if config.attn_output_gate else 1),
                   (rank + 1) * h_local * d * (2 if config.attn_output_gate else 1))
    if config.num_kv_heads >= n:
        kv_local = config.num_kv_heads // n
        kv_rows = slice(rank * kv_local * d, (rank + 1) * kv_local * d)
    else:  # one KV head per rank: the one its query heads read (a copy on N / Hkv ranks)
        kv_head = rank * config.num_kv_heads // n
        kv_rows = slice(kv_head * d, (kv_head + 1) * d)
    o_cols = slice(rank * h_local * d, (rank + 1) * h_local * d)
    i_local = config.intermediate_size // n
    mlp_rows = slice(rank * i_local, (rank + 1) * i_local)
    out = {}
    for name, tensor in model.state_dict().items():
        t = tensor
        part = name.split(".")[-2] if "." in name else ""
        is_weight = name.endswith(".weight")
        if part == "q_proj":
            t = t[q_rows]
        elif part in ("k_proj", "v_proj"):
            t = t[kv_rows]
        elif part == "o_proj" and is_weight:
            t = t[:, o_cols]
        elif part in ("gate_proj", "up_proj"):
            t = t[mlp_rows]
        elif part == "down_proj":
            t = t[:, mlp_rows]
        elif name == "lm_head.weight":
            v_local = _padded_vocab(config, n) // n
            t = t[rank * v_local:(rank + 1) * v_local]
            if t.shape[0] < v_local:  # the last rank's slice, padded with zero rows
                t = torch.cat((t, t.new_zeros(v_local - t.shape[0], t.shape[1])))
        out[name] = t.detach().to("cpu", copy=True).contiguous()
    return out


def load_shard(full_config: ModelConfig, state: dict[str, Tensor], rank: int, n: int,
               device: torch.device | str, dtype: torch.dtype) -> ShardedTransformer:
    """Build rank ``rank``'s ``ShardedTransformer`` from its sliced ``state`` on ``device``."""
    with meta_modules():
        model = ShardedTransformer(full_config, rank, n)
    model.load_state_dict(state, assign=True, strict=True)
    return model.to(device=device, dtype=dtype).eval()


# --- the processes -------------------------------------------------------------------------------
class TensorParallelRunner(ModelRunner):
    """Rank 0's ``ModelRunner`` over its shard, driving N - 1 worker processes that run the same
    steps on theirs. The engine sees an ordinary executor; ``close()`` (or the ``LLM``'s) stops
    the workers. Only one tensor-parallel engine at a time in a process (it owns the process's
    default ``torch.distributed`` group)."""

    def __init__(self, model: Transformer, n: int, num_blocks: int, block_size: int,
                 kv_dtype: str | None = None, max_num_seqs: int = 1,
                 max_model_len: int | None = None) -> None:
        check_shardable(model.config, n)
        if n < 2:
            raise ValueError("TensorParallelRunner necesita tensor_parallel_size >= 2")
        if dist.is_available() and dist.is_initialized():
            raise RuntimeError("este proceso ya tiene un grupo de torch.distributed (otro motor "
                               "con tensor_parallel_size > 1 abierto): ciérrelo con close() antes "
                               "de crear otro")
        custom = sorted({type(m).__name__ for name, m in model.named_modules()
                         if name.endswith(("_proj", "lm_head")) and type(m) is not nn.Linear})
        if custom:
            raise ValueError(f"tensor_parallel_size={n} reparte capas nn.Linear y este modelo "
                             f"tiene {', '.join(custom)} (¿cuantizado?); use el modelo sin "
                             "cuantizar o tensor_parallel_size=1")
        param = next(model.parameters())
        device, dtype = param.device, param.dtype
        backend = _backend(device, n)
        self.world_size, self.conns, self.procs = n, [], []
        self._closed = False
        store = dist.TCPStore("127.0.0.1", 0, n, is_master=True, wait_for_workers=False,
                              timeout=timedelta(seconds=START_TIMEOUT_S))
        runner_args = dict(num_blocks=num_blocks, block_size=block_size, kv_dtype=kv_dtype,
                           max_num_seqs=max_num_seqs, max_model_len=max_model_len)
        ctx = mp.get_context("spawn")
        try:
            for rank in range(1, n):
                parent, child = ctx.Pipe()
                proc = ctx.Process(
                    target=_worker_main, daemon=True, name=f"tp-worker-{rank}",
                    args=(child, rank, n, store.port, backend, model.config,
                          shard_state_dict(model, rank, n), _worker_device(device, rank), dtype,
                          runner_args, torch.get_num_threads()))
                proc.start()
                child.close()
                self.conns.append(parent)
                self.procs.append(proc)
            self._expect("started")
            dist.init_process_group(backend, store=store, rank=0, world_size=n,
                                    timeout=STEP_TIMEOUT)
            shard = load_shard(model.config, shard_state_dict(model, 0, n), 0, n, device, dtype)
            self._expect("ready")
        except BaseException:
            self._shutdown()
            raise
        self._store = store
        super().__init__(shard, num_blocks, block_size, kv_dtype, None, max_num_seqs, max_model_len)

    @classmethod
    def start(cls, model: Transformer, kv, n: int, kv_dtype: str | None = None, *,
              max_num_seqs: int = 1, max_model_len: int | None = None) -> "TensorParallelRunner":
        """Sized from the scheduler's KV manager, as ``ModelRunner.for_kv``."""
        return cls(model, n, kv.num_blocks, kv.block_size, kv_dtype, max_num_seqs,
                   max_model_len or getattr(kv, "max_model_len", None))

    @property
    def pids(self) -> list[int]:
        """The worker processes' ids (ranks 1..N-1)."""
        return [p.pid for p in self.procs]

    def execute(self, out: SchedulerOutput) -> StepResult:
        if self._closed:
            raise ExecutorFailed("el motor con paralelismo de tensores está cerrado (close()); "
                                 "cree otro LLM para seguir")
        try:
            for conn in self.conns:
                conn.send(out)
            return super().execute(out)
        except Exception as err:  # noqa: BLE001 - any failure leaves the ranks out of step
            reports = self._worker_errors()
            self._shutdown()
            raise ExecutorFailed("un paso con paralelismo de tensores falló y los procesos ya no "
                                 "están sincronizados; se detuvieron todos. "
                                 + (reports or f"Error en el rango 0: {err!r}")) from err

    def close(self) -> None:
        """Stop the workers (each gets a stop message and is joined; one that does not exit in
        a few seconds is terminated) and leave the process group. Safe to call twice."""
        self._shutdown(graceful=True)

    def __del__(self) -> None:  # best effort: the workers also exit when their pipe closes
        try:
            self._shutdown(graceful=True)
        except Exception:  # noqa: BLE001 - interpreter shutdown: nothing left to report to
            pass

    def _expect(self, what: str) -> None:
        """Wait until every worker has sent ``what``; raise (Spanish ``RuntimeError`` with its
        traceback) if one reports an error or dies first."""
        pending = dict(zip(self.conns, self.procs))
        while pending:
            ready = wait_for(list(pending) + [p.sentinel for p in pending.values()],
                             timeout=START_TIMEOUT_S)
            if not ready:
                raise RuntimeError(f"los procesos de paralelismo de tensores no respondieron en "
                                   f"{START_TIMEOUT_S:.0f} s (esperando {what!r})")
            for conn, proc in list(pending.items()):
                if conn in ready or conn.poll():
                    try:
                        kind, detail = conn.recv()
                    except EOFError:
                        kind, detail = "error", f"el proceso {proc.name} terminó sin avisar"
                    if kind == "error":
                        raise RuntimeError(f"el proceso {proc.name} falló al arrancar:\n{detail}")
                    del pending[conn]
                elif proc.sentinel in ready:
                    raise RuntimeError(f"el proceso {proc.name} terminó al arrancar (código "
                                       f"{proc.exitcode})")

    def _worker_errors(self) -> str:
        """The tracebacks the workers sent, and which ones have died (waits up to a second for
        them: a worker killed by a signal may not be reaped yet when rank 0's collective fails)."""
        reports = []
        deadline = time.monotonic() + 1.0
        for conn, proc in zip(self.conns, self.procs):
            ready = wait_for([conn, proc.sentinel], timeout=max(0.0, deadline - time.monotonic()))
            gone = proc.sentinel in ready
            try:
                if conn.poll():
                    kind, detail = conn.recv()
                    if kind == "error":
                        reports.append(f"Error en el proceso {proc.name}:\n{detail}")
                        continue
            except (EOFError, OSError):  # its end of the pipe closed: it is exiting
                gone = True
            if gone:  # its files are closed; wait until it is reaped, for its exit code
                proc.join(timeout=max(0.1, deadline - time.monotonic()))
            if gone or not proc.is_alive():
                reports.append(f"El proceso {proc.name} terminó (código {proc.exitcode}).")
        return " ".join(reports)

    def _shutdown(self, graceful: bool = False) -> None:
        if getattr(self, "_closed", True):
            return
        self._closed = True
        for conn in self.conns:
            try:
                if graceful:
                    conn.send(None)
                conn.close()
            except (OSError, ValueError, BrokenPipeError):
                pass
        for proc in self.procs:
            proc.join(timeout=5 if graceful else 0.5)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


def _backend(device: torch.device, n: int) -> str:
    if device.type == "cuda":
        available = torch.cuda.device_count()
        if n > available:
            raise ValueError(f"tensor_parallel_size={n} necesita {n} GPU (un proceso por GPU) y "
                             f"hay {available}; use tensor_parallel_size <= {available}")
        if device.index not in (None, 0):
            raise ValueError(f"con tensor_parallel_size > 1 el modelo va en cuda:0 (el rango r usa "
                             f"cuda:r); se recibió {device}")
        return "nccl"
    if device.type != "cpu":
        raise ValueError(f"tensor_parallel_size > 1 funciona en cpu (gloo) o cuda (NCCL); se "
                         f"recibió el dispositivo {device.type}")
    cores = os.cpu_count() or 1
    if n > cores:
        raise ValueError(f"tensor_parallel_size={n} pide más procesos que los {cores} núcleos de "
                         f"esta CPU; use tensor_parallel_size <= {cores}")
    return "gloo"


def _worker_device(device: torch.device, rank: int) -> str:
    return f"cuda:{rank}" if device.type == "cuda" else "cpu"


def _watch_parent() -> None:
    """Exit as soon as the parent process is gone, whatever the main thread is blocked in (a
    collective waiting for rank 0 included): a daemon thread waits on the parent's sentinel."""
    parent = mp.parent_process()
    if parent is None:
        return

    def watch() -> None:
        wait_for([parent.sentinel])
        os._exit(3)

    threading.Thread(target=watch, daemon=True, name="tp-parent-watch").start()


def _worker_main(conn, rank: int, n: int, port: int, backend: str, full_config: ModelConfig,
                 state: dict[str, Tensor], device: str, dtype: torch.dtype, runner_args: dict,
                 threads: int) -> None:
    """A worker's life: join the group, build its shard, then run every step rank 0 sends until
    it sends None (or its pipe closes)."""
    _watch_parent()
    torch.set_num_threads(threads)
    try:
        if device.startswith("cuda"):
            torch.cuda.set_device(device)
        conn.send(("started", None))
        store = dist.TCPStore("127.0.0.1", port, n, is_master=False,
                              timeout=timedelta(seconds=START_TIMEOUT_S))
        dist.init_process_group(backend, store=store, rank=rank, world_size=n, timeout=STEP_TIMEOUT)
        runner = ModelRunner(load_shard(full_config, state, rank, n, device, dtype), **runner_args)
        del state
        conn.send(("ready", None))
        while True:
            try:
                out = conn.recv()
            except EOFError:  # rank 0 is gone
                break
            if out is None:
                break
            runner.execute(out)
    except BaseException:  # noqa: BLE001 - reported to rank 0, then this process exits
        try:
            conn.send(("error", traceback.format_exc()))
        finally:
            os._exit(1)
    if dist.is_initialized():
        dist.destroy_process_group()


# --- measuring a tensor-parallel engine (the benchmark and the chapter 13 lab) -------------------
def decode_rate(engine, prompts, max_tokens: int) -> tuple[float, float, list[list[int]]]:
    """Run greedy requests (one per prompt, ``max_tokens`` each, all at t = 0) on ``engine``:
    (decode tokens/s over the pure decode steps, seconds of all its steps, tokens of each
    request). The step times are measured: volatile."""
    from .request import SamplingParams
    first = len(engine.history)
    items = [(0.0, p, SamplingParams(max_tokens=max_tokens, ignore_eos=True)) for p in prompts]
    done = engine.run(items)
    steps = [s for s in engine.history[first:] if not any(e.is_prefill for e in s.scheduled)]
    rate = sum(s.num_tokens for s in steps) / sum(s.duration for s in steps)
    return rate, sum(s.duration for s in engine.history[first:]), [r.output_token_ids for r in done]


class AllReduceTimer:
    """Wraps ``dist.all_reduce`` in this process (rank 0) while open: ``calls``, ``seconds``
    inside it (its own sum plus the wait for the other ranks) and ``bytes`` reduced."""

    def __init__(self) -> None:
        self.calls, self.seconds, self.bytes, self._real = 0, 0.0, 0, dist.all_reduce

    def __enter__(self) -> "AllReduceTimer":
        def timed(tensor, *args, **kw):
            start = time.perf_counter()
            try:
                return self._real(tensor, *args, **kw)
            finally:
                self.seconds += time.perf_counter() - start
                self.calls += 1
                self.bytes += tensor.numel() * tensor.element_size()
        dist.all_reduce = timed
        return self

    def __exit__(self, *exc) -> None:
        dist.all_reduce = self._real


__all__ = ["AllReduceTimer", "RowParallelLinear", "ShardedTransformer", "TensorParallelRunner",
           "allreduce_bytes_per_step", "allreduce_bytes_per_token", "check_shardable",
           "check_tensor_parallel_size", "decode_rate", "load_shard",
           "ring_allreduce_traffic", "shard_config", "shard_state_dict"]
