"""How an engine is configured, and the one builder that assembles it.

``EngineConfig`` gathers every setting of the engine under vLLM's names (``max_num_seqs``,
``max_model_len``, ``max_num_batched_tokens``, ``block_size``, ``enable_prefix_caching``,
``enable_chunked_prefill``, ``kv_cache_dtype``, ``speculative_config``...). It is frozen and
checked once, when it is made: an invalid value raises a Spanish ``ValueError`` naming the
accepted ones. ``build_engine(model, config)`` turns it into an ``LLMEngine``: a scheduler with its
KV manager, and an executor (the real ``ModelRunner`` by default; a lab passes ``executor=``, as
the simulator does, to show the seam). ``LLM``, the server's command line and ``sim_engine`` all
build through it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from pathlib import Path

import torch

from ..model.checkpoint import load_pretrained
from ..model.config import ModelConfig
from ..model.decoder import Transformer
from ..model.kv_quant import check_kv_dtype
from ..model.memory import state_bytes_per_sequence
from ..model.tokenizer import shipped_names
from .batch_invariant import BatchInvariantKernels, DefaultKernels
from .drafter import DraftProposer, NgramProposer, check_lookup_window
from .graphs import GRAPH_BACKENDS
from .kv_cache import ContiguousKVManager, KVCacheManager, KVManager
from .llm_engine import Executor, LLMEngine
from .runner import ModelRunner
from .scheduler import POLICIES, Policy, Scheduler, check_positive_int, check_token_budget
from .scheduling_policy import SchedulingPolicy, check_scheduling_policy
from .state_slots import HybridKVManager, check_checkpoint_interval
from .tensor_parallel import TensorParallelRunner, check_shardable, check_tensor_parallel_size

KV_LAYOUTS = ("contiguous", "paged")
DECODE_GRAPHS = ("auto", *GRAPH_BACKENDS, None)
SPECULATIVE_METHODS = ("ngram", "draft_model")
NGRAM_DEFAULT_WINDOW = 5  # vLLM's prompt_lookup_min = prompt_lookup_max when neither is given


@dataclass(frozen=True)
class SpeculativeConfig:
    """Speculative decoding (chapter 9), with vLLM's names: every greedy request gets up to
    ``num_speculative_tokens`` draft tokens per step, and the target verifies them in one
    forward pass.

    ``method="ngram"`` (prompt lookup): the drafts are copied from the request's own context,
    after the most recent earlier occurrence of its last ``n`` tokens, ``n`` from
    ``prompt_lookup_max`` down to ``prompt_lookup_min`` (vLLM's defaults: 5 and 5; one given sets
    the other). ``method="draft_model"``: ``model`` proposes them (a ``Transformer`` or anything
    ``LLM`` accepts as a model: a shipped name such as ``"tiny-es-draft"``, a folder, a Hub id),
    with the target's tokenizer. ``method=None`` means ``"draft_model"`` when a ``model`` is
    given. Checked when made: a Spanish ``ValueError`` names the problem and the accepted values.
    """

    model: Transformer | str | Path | None = None
    num_speculative_tokens: int = 4
    method: str | None = None
    prompt_lookup_min: int | None = None
    prompt_lookup_max: int | None = None

    def __post_init__(self) -> None:
        method = self.method
        if method is None:
            if self.model is None:
                raise ValueError("speculative_config necesita method (aceptados: "
                                 f"{', '.join(SPECULATIVE_METHODS)}) o un model borrador")
            method = "draft_model"
        if method not in SPECULATIVE_METHODS:
            raise ValueError(f"method={method!r} no está soportado; aceptados: "
                             f"{', '.join(SPECULATIVE_METHODS)}")
        object.__setattr__(self, "method", method)
        check_positive_int("num_speculative_tokens (tokens borrador por paso)",
                           self.num_speculative_tokens)
        lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
        if method == "ngram":
            if self.model is not None:
                raise ValueError("method='ngram' no usa modelo borrador (las propuestas salen del "
                                 "propio contexto); quite model o use method='draft_model'")
            lo, hi = (NGRAM_DEFAULT_WINDOW if lo is None and hi is None else lo if lo is not None else hi,
                      NGRAM_DEFAULT_WINDOW if lo is None and hi is None else hi if hi is not None else lo)
            check_lookup_window(lo, hi)
            object.__setattr__(self, "prompt_lookup_min", lo)
            object.__setattr__(self, "prompt_lookup_max", hi)
            return
        if lo is not None or hi is not None:
            raise ValueError("prompt_lookup_min y prompt_lookup_max solo valen con method='ngram'")
        if not isinstance(self.model, (Transformer, str, Path)):
            raise ValueError(f"method='draft_model' necesita model: un Transformer, el nombre de "
                             f"un modelo incluido ({', '.join(shipped_names())}), una carpeta o un "
                             f"id del Hub; se recibió {type(self.model).__name__}")

    @classmethod
    def of(cls, value) -> "SpeculativeConfig | None":
        """A ``SpeculativeConfig`` from itself, a dict of its fields (as vLLM's
        ``speculative_config={"method": "ngram", "num_speculative_tokens": 4,
        "prompt_lookup_max": 4}``) or None."""
        if value is None or isinstance(value, cls):
            return value
        if isinstance(value, dict):
            unknown = set(value) - {f.name for f in fields(cls)}
            if unknown:
                raise ValueError(f"speculative_config no acepta {sorted(unknown)}; aceptados: "
                                 f"{', '.join(f.name for f in fields(cls))}")
            return cls(**value)
        raise ValueError("speculative_config debe ser un SpeculativeConfig, un dict con sus campos "
                         f"({', '.join(f.name for f in fields(cls))}) o None; se recibió "
                         f"{type(value).__name__}")

    def proposer(self, target: Transformer | ModelConfig, max_model_len: int
                 ) -> DraftProposer | NgramProposer:
        """The engine's proposer for ``target`` (a draft model is loaded on the target's device
        and dtype, and must share its vocabulary; the n-gram method needs nothing of it)."""
        if self.method == "ngram":
            return NgramProposer(self.num_speculative_tokens, self.prompt_lookup_min,
                                 self.prompt_lookup_max, max_model_len)
        param = next(target.parameters())
        drafter = DraftProposer(load_model(self.model, param.dtype, param.device),
                                self.num_speculative_tokens, max_model_len)
        drafter.check_target(target)
        return drafter


@dataclass(frozen=True)
class EngineConfig:
    """Every setting of an engine, checked once when made.

    ``max_num_seqs``: the batch width. ``max_model_len``: the longest request (None: the model's
    maximum, filled in by ``build_engine``). ``policy``: ``"continuous"``, ``"static"`` or a
    policy function. ``kv_layout="contiguous"``: one ``max_model_len`` row per request
    (``max_num_seqs`` rows); ``"paged"``: ``num_blocks`` blocks of ``block_size`` tokens (default:
    the same memory as the contiguous rows), with prefix caching unless
    ``enable_prefix_caching=False``. ``max_num_batched_tokens`` caps the tokens of a step;
    ``enable_chunked_prefill`` splits prompts that do not fit into chunks (chapter 5).
    ``kv_cache_dtype="int8"``: the KV tensors are stored as int8 with a scale per token and head
    (chapter 7). ``speculative_config``: speculative decoding (chapter 9). ``decode_graphs``:
    ``"auto"`` captures pure decode steps as CUDA graphs on a GPU and does nothing on the CPU,
    None turns them off, ``"eager"`` runs their static padded step without capture.
    ``batch_invariant=True``: kernels whose result for one request does not depend on the batch
    around it (chapter 10, ``engine/batch_invariant.py``; vLLM's ``VLLM_BATCH_INVARIANT=1``):
    the same logits, bit for bit, whatever the batch, at a cost in speed; every step eager.
    ``scheduling_policy``: who is admitted first and who is preempted (chapter 12): ``"fcfs"``,
    ``"priority"`` (vLLM's), ``"vtc"`` (fair share between tenants) or a class that makes a
    ``SchedulingPolicy``. ``tensor_parallel_size=N`` (vLLM's name; chapter 13): the model split
    across N processes with ``torch.distributed`` (``engine/tensor_parallel.py``); N must divide
    the attention heads, the KV heads (or be a multiple of them) and the MLP width.

    Hybrid models (linear-attention layers, chapter 11) with paged KV and prefix caching keep
    copies of a request's state at checkpoints (``engine/state_slots.py``):
    ``state_checkpoint_interval`` tokens apart (a positive multiple of ``block_size``; None: the
    block size itself, the finest grain the prefix cache's block hashes allow, so a repeated
    prompt hits from its first full block, as a transformer's does; vLLM instead grows the block
    to the state's page, ``model.memory.state_page_block_size``, 528 tokens for Qwen3.5-9B),
    in a pool of ``num_state_checkpoints`` states (None: one per checkpoint boundary the KV
    blocks can hold, ``num_blocks * block_size // state_checkpoint_interval``, so the KV cache and
    not the pool bounds the hits, as in vLLM where every block has its state page; the engine's
    ``kv_usage()`` reports their bytes), least recently used evicted first. A hit reaches only as far
    as the last checkpoint: prompts shorter than the interval never hit. Both are ignored for a
    model without linear layers.
    """

    max_num_seqs: int = 8
    max_model_len: int | None = None
    policy: str | Policy = "continuous"
    kv_layout: str = "contiguous"
    block_size: int = 16
    num_blocks: int | None = None
    enable_prefix_caching: bool = True
    max_num_batched_tokens: int | None = None
    enable_chunked_prefill: bool = False
    kv_cache_dtype: str | None = None
    speculative_config: SpeculativeConfig | None = None
    decode_graphs: str | None = "auto"
    batch_invariant: bool = False
    scheduling_policy: "str | type[SchedulingPolicy]" = "fcfs"
    tensor_parallel_size: int = 1
    state_checkpoint_interval: int | None = None
    num_state_checkpoints: int | None = None

    # Older keyword names, still accepted by ``build_engine`` and ``LLM``.
    ALIASES = {"kv_dtype": "kv_cache_dtype"}

    def __post_init__(self) -> None:
        check_positive_int("max_num_seqs", self.max_num_seqs)
        check_positive_int("max_model_len", self.max_model_len, allow_none=True)
        check_positive_int("block_size", self.block_size)
        check_positive_int("num_blocks", self.num_blocks, allow_none=True)
        if self.kv_layout not in KV_LAYOUTS:
            raise ValueError(f"kv_layout {self.kv_layout!r} desconocido; aceptados: {', '.join(KV_LAYOUTS)}")
        if not callable(self.policy) and self.policy not in POLICIES:
            raise ValueError(f"política {self.policy!r} desconocida; aceptadas: {', '.join(POLICIES)} "
                             f"o una función policy(running, waiting, max_num_seqs) -> BatchPlan")
        if self.max_model_len is not None:
            check_token_budget(self.max_num_batched_tokens, self.max_model_len,
                               self.enable_chunked_prefill)
        check_kv_dtype(self.kv_cache_dtype)
        if self.decode_graphs not in DECODE_GRAPHS:
            raise ValueError(f"decode_graphs={self.decode_graphs!r} no es válido; aceptados: "
                             f"{', '.join(repr(b) for b in DECODE_GRAPHS)}")
        if not isinstance(self.batch_invariant, bool):
            raise ValueError(f"batch_invariant debe ser True o False; se recibió "
                             f"{self.batch_invariant!r} ({type(self.batch_invariant).__name__})")
        if self.batch_invariant and self.decode_graphs in GRAPH_BACKENDS:
            raise ValueError(f"decode_graphs={self.decode_graphs!r} no es compatible con "
                             "batch_invariant=True (el modo ejecuta cada paso sin grafos); use "
                             "decode_graphs='auto' o None")
        object.__setattr__(self, "speculative_config", SpeculativeConfig.of(self.speculative_config))
        check_scheduling_policy(self.scheduling_policy)
        if self.state_checkpoint_interval is not None:
            check_checkpoint_interval(self.state_checkpoint_interval, self.block_size)
        check_positive_int("num_state_checkpoints", self.num_state_checkpoints, allow_none=True)
        check_tensor_parallel_size(self.tensor_parallel_size)
        if self.tensor_parallel_size > 1:
            self._check_tensor_parallel()

    def _check_tensor_parallel(self) -> None:
        """What tensor parallelism does not cover yet is refused, never mis-computed."""
        n = self.tensor_parallel_size
        unsupported = [(self.speculative_config is not None, "speculative_config (decodificación "
                        "especulativa)"),
                       (self.batch_invariant, "batch_invariant=True (sus núcleos no se reparten)"),
                       (self.decode_graphs in GRAPH_BACKENDS, f"decode_graphs={self.decode_graphs!r} "
                        "(los pasos con paralelismo de tensores se ejecutan sin grafos)")]
        for bad, what in unsupported:
            if bad:
                raise ValueError(f"tensor_parallel_size={n} no es compatible con {what}; quítelo "
                                 "o use tensor_parallel_size=1")

    @classmethod
    def of(cls, config: "EngineConfig | None" = None, **options) -> "EngineConfig":
        """``config`` (default: ``EngineConfig()``) with ``options`` replaced: its field names,
        ``kv_dtype`` (= ``kv_cache_dtype``), ``enforce_eager=True`` (= ``decode_graphs=None``),
        and ``draft_model`` with ``num_speculative_tokens`` (= a ``speculative_config``)."""
        config = cls() if config is None else config
        names = {f.name for f in fields(cls)}
        changes = {cls.ALIASES.get(k, k): v for k, v in options.items()}
        if changes.pop("enforce_eager", False):
            changes["decode_graphs"] = None
        draft = changes.pop("draft_model", None)
        num_draft = changes.pop("num_speculative_tokens", None)
        if draft is not None:
            changes["speculative_config"] = SpeculativeConfig(draft, 4 if num_draft is None else num_draft)
        elif num_draft is not None:
            spec = SpeculativeConfig.of(changes.get("speculative_config", config.speculative_config))
            if spec is None:
                raise ValueError("num_speculative_tokens sin draft_model ni speculative_config: "
                                 "no hay especulación a la que aplicarlo")
            changes["speculative_config"] = replace(spec, num_speculative_tokens=num_draft)
        unknown = sorted(set(changes) - names)
        if unknown:
            raise TypeError(f"opciones desconocidas para el motor: {', '.join(unknown)}; aceptadas: "
                            f"{', '.join(sorted(names | set(cls.ALIASES)))}, enforce_eager, "
                            "draft_model, num_speculative_tokens")
        return replace(config, **changes) if changes else config

    def kv_manager(self) -> KVManager:
        """The scheduler's KV manager for this layout (``max_model_len`` must be known)."""
        if self.kv_layout == "contiguous":
            return ContiguousKVManager(self.max_num_seqs, self.max_model_len)
        num_blocks = self.num_blocks
        if num_blocks is None:  # the same memory as the contiguous rows
            num_blocks = self.max_num_seqs * -(-self.max_model_len // self.block_size)
        return KVCacheManager(num_blocks, self.block_size, self.max_model_len, self.enable_prefix_caching)


def load_model(model, dtype: torch.dtype | None = None,
               device: str | torch.device | None = None) -> Transformer:
    """``model`` itself if it is a ``Transformer``; else the checkpoint it names."""
    if isinstance(model, Transformer):
        return model
    if isinstance(model, (str, Path)):
        return load_pretrained(model, dtype=dtype or torch.float32, device=device or "cpu")
    raise TypeError(f"model debe ser un Transformer, el nombre de un modelo incluido "
                    f"({', '.join(shipped_names())}), una carpeta de checkpoint o un id del Hub "
                    f"(organización/nombre); se recibió {type(model).__name__}")


def build_engine(model: Transformer | ModelConfig, config: EngineConfig | None = None, *,
                 executor: Executor | None = None, kv: KVManager | None = None,
                 eos_token_id: int | None = None, token_fn=None, victim_fn=None,
                 kernels: DefaultKernels | None = None, **options) -> LLMEngine:
    """The engine ``config`` describes (``options``: settings that replace the config's, see
    ``EngineConfig.of``), on ``model``.

    By default the executor is a ``ModelRunner`` on ``model`` (a ``Transformer``); a lab passes
    its own ``executor`` (for example the simulator's, and then ``model`` may be just a
    ``ModelConfig``). ``kv``: a ready KV manager (for example a ``KVCacheManager`` with a
    student's pool), used as given. ``token_fn`` and ``victim_fn`` replace the scheduler's token
    split and preemption choice (chapter 5). ``kernels``: the runner's kernel set (default:
    ``BatchInvariantKernels()`` with ``batch_invariant=True``, the usual ones otherwise); chapter
    10 passes ``BatchInvariantKernels(linear=...)`` with a student's matmul."""
    config = EngineConfig.of(config, **options)
    if kernels is None:
        kernels = BatchInvariantKernels() if config.batch_invariant else DefaultKernels()
    elif config.batch_invariant and not kernels.batch_invariant:
        raise ValueError(f"batch_invariant=True necesita núcleos invariantes al lote; se recibió "
                         f"{type(kernels).__name__} (use BatchInvariantKernels)")
    if executor is None and not isinstance(model, Transformer):
        raise TypeError(f"sin executor=, build_engine necesita el modelo (un Transformer) para "
                        f"ejecutarlo; se recibió {type(model).__name__} (con un ModelConfig, pase "
                        "un executor, p. ej. SimExecutor)")
    model_config = model if isinstance(model, ModelConfig) else model.config
    if config.max_model_len is None:
        config = replace(config, max_model_len=model_config.max_position_embeddings)
    if executor is None and config.max_model_len > model_config.max_position_embeddings:
        raise ValueError(f"max_model_len={config.max_model_len} supera las "
                         f"{model_config.max_position_embeddings} posiciones del modelo")
    kv = config.kv_manager() if kv is None else kv
    tp = config.tensor_parallel_size
    if tp > 1:
        check_shardable(model_config, tp)
        if executor is not None or type(kernels) is not DefaultKernels:
            raise ValueError(f"tensor_parallel_size={tp} usa su propio ejecutor y los núcleos por "
                             "defecto: no pase executor= ni kernels=")
        executor = TensorParallelRunner.start(model, kv, tp, config.kv_cache_dtype,
                                              max_num_seqs=config.max_num_seqs,
                                              max_model_len=config.max_model_len)
    if model_config.is_hybrid and not isinstance(kv, HybridKVManager):
        if config.speculative_config is not None:
            raise ValueError("la decodificación especulativa no está disponible para un modelo "
                             "híbrido: descartar borradores rechazados exigiría volver atrás su "
                             "estado fijo; quite speculative_config")
        # one state slot per running request; with prefix caching, the state checkpoints
        kv = HybridKVManager(kv, config.max_num_seqs, config.state_checkpoint_interval,
                             config.num_state_checkpoints, state_bytes_per_sequence(model_config))
    scheduler = Scheduler(config.max_num_seqs, config.max_model_len, config.policy, kv=kv,
                          max_num_batched_tokens=config.max_num_batched_tokens,
                          enable_chunked_prefill=config.enable_chunked_prefill,
                          token_fn=token_fn, victim_fn=victim_fn,
                          scheduling_policy=config.scheduling_policy)
    spec = config.speculative_config
    drafter = None if spec is None else spec.proposer(model, config.max_model_len)
    if executor is None:
        executor = ModelRunner.for_kv(model, kv, config.kv_cache_dtype, decode_graphs=config.decode_graphs,
                                      max_num_seqs=config.max_num_seqs, max_model_len=config.max_model_len,
                                      kernels=kernels)
    return LLMEngine(scheduler, executor, model_config.vocab_size, eos_token_id, drafter)


__all__ = ["DECODE_GRAPHS", "EngineConfig", "KV_LAYOUTS", "SpeculativeConfig", "SPECULATIVE_METHODS",
           "build_engine", "load_model"]
