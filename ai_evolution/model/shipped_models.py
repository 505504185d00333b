"""The models shipped inside the package: one list of names, one folder each
(``ai_evolution/model/shipped/<name>``: ``config.json``, safetensors weights, ``tokenizer.json``,
the training record). Presets, checkpoints and tokenizers all resolve shipped names here."""

from __future__ import annotations

from pathlib import Path

SHIPPED_ROOT = Path(__file__).resolve().parent / "shipped"
SHIPPED_MODELS = ("tiny-es",)


def shipped_names() -> list[str]:
    """Names of the models (with their tokenizers) that ship inside the package."""
    return list(SHIPPED_MODELS)


def shipped_model_dir(name: str) -> Path:
    """Folder of a shipped model; a clear error for an unknown name or a missing folder."""
    if name not in SHIPPED_MODELS:
        raise KeyError(f"modelo incluido desconocido {name!r}; modelos incluidos: {', '.join(SHIPPED_MODELS)}")
    folder = SHIPPED_ROOT / name
    if not folder.is_dir():
        raise FileNotFoundError(
            f"el modelo incluido {name!r} debería estar en {folder}, que no existe; "
            "reinstale ai_evolution o regenere los pesos incluidos (scripts/train_tiny_es.py)"
        )
    return folder
