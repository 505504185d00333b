"""What several labs share, side by side rather than importing each other: the models the
serving labs offer and how labs 2 and 6 load a real checkpoint (with its fallback), the chapter
2 worked memory budgets (chapter 4 returns to them), and the short dtype names of the contracts."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from ..fmt import es
from ..hardware import default_dtype
from ..model import (MemoryBudget, Tokenizer, Transformer, dtype_bytes, get_preset, load_model,
                     load_pretrained, load_tokenizer, memory_budget, param_count, shipped_names)
from ..model.hub import looks_like_hub_id
from .registry import Param

# Served by the engine labs (2-6): the shipped trained model, and two presets with random weights.
SERVED_MODELS = ("tiny-es", "smollm2-135m", "cpu-200m")
# Real checkpoints by Hugging Face Hub id, for the labs whose point needs real text (chapter 2's
# generation, chapter 6's serving); downloaded once into the Hub cache. The other labs keep
# random weights: only their shapes matter there.
HUB_MODELS = ("Qwen/Qwen2.5-0.5B-Instruct", "Qwen/Qwen3-0.6B")
TEXT_MODELS = SERVED_MODELS + HUB_MODELS
GPU_TEXT_MODEL = "Qwen/Qwen2.5-0.5B-Instruct"  # the `gpu` profile's model of labs 2 and 6
FALLBACK_MODEL = "tiny-es"                     # served when the checkpoint cannot be had


# The dtype of the served model's weights in the engine labs (2-6, 9).
MODEL_DTYPES = ("auto", "fp32", "fp16", "bf16")
MODEL_DTYPE_PARAM = Param("auto", str, "dtype de los pesos del modelo servido (auto: fp32 en CPU, "
                          "donde se compara con la decodificación voraz exacta; en GPU, bf16, o "
                          "fp16 si la GPU no tiene bf16, como una T4)", choices=MODEL_DTYPES)


def served_dtype(choice: str, device: torch.device | str) -> torch.dtype:
    """The weights' dtype for ``MODEL_DTYPE_PARAM``'s value on ``device``."""
    if choice == "auto":
        return torch.float32 if torch.device(device).type == "cpu" else default_dtype(device)
    return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[choice]


class ServedModelFallback(UserWarning):
    """A lab asked for a Hub checkpoint it could not get and serves ``FALLBACK_MODEL`` instead."""


@dataclass
class ServedModel:
    """The model a lab serves, its tokenizer (None for a preset with random weights), the name
    the lab asked for, and why it serves another one (None when it serves what it asked for)."""

    model: Transformer
    tokenizer: Tokenizer | None
    requested: str
    fallback_reason: str | None = None

    @property
    def name(self) -> str:
        """The name of the model actually served (a Hub id, ``tiny-es``, a preset)."""
        return self.model.config.name

    @property
    def fell_back(self) -> bool:
        return self.fallback_reason is not None

    def limitations(self) -> list[str]:
        """The sentence the contract needs when the lab did not serve what it asked for."""
        if not self.fell_back:
            return []
        return [f"Se pidió el modelo {self.requested} y no se sirvió (motivo: "
                f"{self.fallback_reason}); todas las mediciones son del modelo incluido "
                f"{self.name} ({es(param_count(self.model.config) / 1e6, 1)} M parámetros), no "
                f"de {self.requested}."]

    def environment(self) -> dict:
        """What the contract's ``environment`` records about the served model."""
        return {"model": self.name, "model_requested": self.requested,
                "model_fallback_reason": self.fallback_reason}


def fallback_message(requested: str, reason: str) -> str:
    """The Spanish warning of a fallback: the id, the reason and what is served instead."""
    return (f"El modelo {requested!r} no está disponible ({reason}). El laboratorio sigue con el "
            f"modelo incluido {FALLBACK_MODEL!r}: sus mediciones y sus textos son de "
            f"{FALLBACK_MODEL}, no de {requested}, y el contrato lo dice en sus limitaciones. "
            "Para usar el modelo real, ejecute con conexión a internet (se descarga una vez en la "
            "caché del Hub) o con el modelo ya en la caché.")


def _short_reason(err: Exception) -> str:
    """The first clause of a loading error: what failed, without the advice that follows it."""
    text = str(err).split("; ")[0].strip() or type(err).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def load_served_model(name: str, seed: int = 0, device: str | torch.device = "cpu", *,
                      dtype: torch.dtype = torch.float32) -> ServedModel:
    """The served model of labs 2 and 6 and its tokenizer. A Hub id (``HUB_MODELS``) loads the
    real checkpoint and its tokenizer (downloaded once, or from the Hub cache offline); when it
    cannot be had (no network and not in the cache, an unknown or gated repository, a failed
    download), the lab serves ``FALLBACK_MODEL`` and says so: a ``ServedModelFallback``
    warning, and a sentence for the contract's limitations (``ServedModel.limitations``)."""
    if name in HUB_MODELS or (name not in SERVED_MODELS and looks_like_hub_id(name)):
        try:
            model = load_pretrained(name, dtype=dtype, device=device)
            return ServedModel(model, load_tokenizer(name), name)
        except (OSError, ValueError) as err:  # HubUnavailable, CheckpointError, missing files
            reason = _short_reason(err)
        warnings.warn(fallback_message(name, reason), ServedModelFallback, stacklevel=2)
        return ServedModel(load_model(FALLBACK_MODEL, seed, device, dtype=dtype),
                           load_tokenizer(FALLBACK_MODEL), name, reason)
    model = load_model(name, seed, device, dtype=dtype)
    return ServedModel(model, load_tokenizer(name) if name in shipped_names() else None, name)


def dtype_name(model) -> str:
    """The short name (fp32, fp16, bf16) of a model's weights' dtype."""
    return {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}[
        next(model.parameters()).dtype]


def worked_examples() -> dict[str, MemoryBudget]:
    """The chapter's worked memory budgets; the chapter and the lab both read them from here."""
    llama2, llama31 = get_preset("llama-2-7b"), get_preset("llama-3.1-8b")
    gpu24 = 24e9                      # a 24 GB consumer GPU
    nominal_7b = 7e9 * dtype_bytes("fp16")  # the back-of-the-envelope "7B x 2 bytes"
    h100, h100_utilization = 85.5e9, 0.92   # memory the runtime sees; fraction the engine takes
    return {
        "gpu24_7b": memory_budget(llama2, gpu24, max_len=4096, typical_len=512, dtype="fp16",
                                  weights_bytes=nominal_7b),
        "gpu24_7b_8kv": memory_budget(llama2.replace(num_kv_heads=8), gpu24, max_len=4096,
                                      typical_len=512, dtype="fp16", weights_bytes=nominal_7b),
        "gpu24_7b_exact": memory_budget(llama2, gpu24, max_len=4096, typical_len=512,
                                        dtype="fp16"),
        "h100_llama31_8b": memory_budget(llama31, h100, max_len=4096,
                                         utilization=h100_utilization, dtype="bf16"),
    }
