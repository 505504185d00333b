"""The models shipped inside the package: one list of names, one folder each
(``ai_evolution/model/shipped/<name>``: ``config.json``, safetensors weights, ``tokenizer.json``,
the training record). Presets, checkpoints and tokenizers all resolve shipped names here."""

from __future__ import annotations

import json
from pathlib import Path

SHIPPED_ROOT = Path(__file__).resolve().parent / "shipped"
SHIPPED_MODELS = ("tiny-es", "tiny-es-draft", "tiny-es-copy")
HELD_OUT_FILE = "held_out.json"  # the validation split, written by scripts/export_held_out.py


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


def held_out_tokens(name: str = "tiny-es") -> list[list[int]]:
    """The token ids of a shipped model's validation split, one list per corpus file: text its
    training never saw (``held_out.json``, written by ``scripts/export_held_out.py``)."""
    path = shipped_model_dir(name) / HELD_OUT_FILE
    if not path.is_file():
        raise FileNotFoundError(f"el modelo incluido {name!r} no trae {HELD_OUT_FILE}; "
                                "genérelo con scripts/export_held_out.py")
    record = json.loads(path.read_text(encoding="utf-8"))
    return [f["tokens"] for f in record["files"]]
