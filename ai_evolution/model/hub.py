"""Checkpoints by Hugging Face Hub id (``"Qwen/Qwen2.5-0.5B-Instruct"``), for a real model on a
GPU Colab. ``huggingface_hub`` is optional: only what serving needs is downloaded (the config,
the safetensors weights and the tokenizer files), with its progress bar, into the usual Hub
cache; offline (``HF_HUB_OFFLINE=1``, or no network) a model already in the cache is used."""

from __future__ import annotations

import re
from pathlib import Path

# Only what load_pretrained and load_tokenizer read (no PyTorch .bin, no ONNX, no GGUF).
HUB_FILES = ["config.json", "generation_config.json", "*.safetensors", "*.safetensors.index.json",
             "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
             "chat_template.jinja"]

_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


def looks_like_hub_id(text: str) -> bool:
    """``owner/name`` with no other separator, and not an existing local path."""
    return bool(_HUB_ID.match(text)) and not Path(text).exists()


class HubUnavailable(FileNotFoundError):
    """The model is not in the local Hub cache and cannot be downloaded (message in Spanish)."""


def hub_folder(repo_id: str, revision: str | None = None) -> Path:
    """The local folder of ``repo_id`` (downloaded if needed and possible)."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise HubUnavailable(f"para cargar {repo_id!r} desde el Hub de Hugging Face hace falta el "
                             "paquete huggingface_hub (pip install huggingface_hub), o pase una "
                             "carpeta local con config.json y *.safetensors") from None
    try:
        return Path(snapshot_download(repo_id, revision=revision, allow_patterns=HUB_FILES))
    except Exception as err:  # noqa: BLE001 - offline, unknown repo, gated, network: say which
        raise HubUnavailable(
            f"no se pudo obtener {repo_id!r} del Hub de Hugging Face ({type(err).__name__}: "
            f"{str(err)[:200]}); sin conexión solo se cargan modelos que ya están en la caché "
            "del Hub (HF_HUB_CACHE); pase una carpeta local o un modelo incluido") from None
