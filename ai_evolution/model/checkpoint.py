"""Build a ``Transformer`` with random weights, or load/save Hugging Face safetensors checkpoints.

A checkpoint folder holds ``config.json`` and either ``model.safetensors`` or shards
``model-0000i-of-0000n.safetensors`` listed in ``model.safetensors.index.json``.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch.overrides import TorchFunctionMode

from .config import ModelConfig
from .decoder import Transformer
from .presets import get_preset
from .hub import hub_folder, looks_like_hub_id
from .shipped_models import SHIPPED_MODELS, shipped_model_dir

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# Buffers some exporters store although they are recomputed from the config.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
# Qwen3.5's published checkpoints are multimodal (Qwen3_5ForConditionalGeneration): the text
# decoder sits under model.language_model, beside a vision tower and a multi-token-prediction
# head that a text-only decoder does not use.
_TEXT_PREFIX = "model.language_model."
_IGNORED_PREFIXES = ("model.visual.", "mtp.")


class CheckpointError(ValueError):
    """A checkpoint folder exists but its content does not match the model it describes."""


class _SkipInit(TorchFunctionMode):
    """Inside :func:`_empty_model`: the modules' default initialisation of their meta tensors
    (``nn.init``'s in-place draws and fills) is skipped. On the meta device there is nothing to
    draw, but torch routes those ops through its Python reference implementations, whose first
    use imports ``torch._dynamo``: about 3 s of CPU in every fresh process that builds a model
    (each kernel, each grading checker)."""

    SKIPPED = frozenset({"normal_", "uniform_", "fill_", "zero_", "kaiming_uniform_",
                         "trunc_normal_", "ones_", "zeros_"})  # nn.init's and Tensor's in-place

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        target = args[0] if args else kwargs.get("tensor")
        if (getattr(func, "__name__", None) in self.SKIPPED and isinstance(target, torch.Tensor)
                and target.is_meta):
            return target
        return func(*args, **kwargs)


@contextmanager
def meta_modules():
    """Modules built inside are on the meta device, without their default initialisation:
    shapes only, for weights that are loaded or drawn afterwards."""
    with torch.device("meta"), _SkipInit():
        yield


def _empty_model(config: ModelConfig, device: str | torch.device) -> Transformer:
    # Build on the meta device so no memory is written twice (default init, then ours).
    with meta_modules():
        model = Transformer(config)
    # Fresh storage for every meta tensor from the factory, not `to_empty`: its `empty_like` on a
    # meta tensor runs torch's Python reference, whose first use imports sympy (about 0.7 s of
    # CPU in every fresh process that builds a model).
    model._apply(lambda t: torch.empty(t.shape, dtype=t.dtype, device=device))
    model.tie_weights()  # new parameters untie the shared head
    return model


def random_model(config: ModelConfig, seed: int = 0, dtype: torch.dtype = torch.float32,
                 device: str | torch.device = "cpu", init_std: float = 0.02) -> Transformer:
    """A ``Transformer`` with seeded random weights (eval mode).

    Norm weights are the identity (ones; zeros for a zero-centered norm); every other parameter (embeddings, linear weights and biases) is drawn
    from N(0, init_std^2). Values are drawn on the CPU in float32 in parameter order, so one seed
    gives the same weights on every device and dtype.
    """
    model = _empty_model(config, device)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(model.get_submodule(name.removesuffix(".weight")).identity)
            else:
                p.copy_(torch.empty(p.shape).normal_(0.0, init_std, generator=gen))
    return model.to(dtype).eval()


def _resolve(name_or_path: str | Path) -> Path:
    if isinstance(name_or_path, str) and name_or_path in SHIPPED_MODELS:
        return shipped_model_dir(name_or_path)
    if isinstance(name_or_path, str) and looks_like_hub_id(name_or_path):
        return hub_folder(name_or_path)
    folder = Path(name_or_path)
    if not folder.is_dir():
        raise FileNotFoundError(
            f"la carpeta del checkpoint {folder} no existe; pase una carpeta con config.json y "
            f"*.safetensors, un id del Hub de Hugging Face (organización/nombre) o el nombre de "
            f"un modelo incluido: {', '.join(SHIPPED_MODELS)}"
        )
    return folder


def _listing(folder: Path) -> str:
    names = sorted(p.name for p in folder.iterdir())
    return ", ".join(names) if names else "(empty folder)"


def _weight_files(folder: Path) -> list[Path]:
    """The safetensors files of a checkpoint, the index's shards first if there is an index."""
    index = folder / INDEX_FILE
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (ValueError, KeyError) as e:
            raise CheckpointError(f"no se puede leer el índice de fragmentos {index}: {e!r}") from e
        files = [folder / f for f in dict.fromkeys(weight_map.values())]
        for f in files:
            if not f.exists():
                raise FileNotFoundError(f"{index} nombra el fragmento {f.name}, que no está en {folder}; "
                                        f"hay: {_listing(folder)}")
        return files
    if (folder / SINGLE_FILE).exists():
        return [folder / SINGLE_FILE]
    files = sorted(folder.glob("*.safetensors"))
    if files:
        return files
    hint = " (los checkpoints .bin de PyTorch no están soportados; conviértalos a safetensors)" \
        if any(folder.glob("*.bin")) else ""
    raise FileNotFoundError(f"no hay pesos en {folder}: se esperaba {SINGLE_FILE} o {INDEX_FILE} con "
                            f"sus fragmentos; hay: {_listing(folder)}{hint}")


def _read_tensors(files: list[Path], expected: dict[str, torch.Size], optional: set[str],
                  dtype: torch.dtype, device: str | torch.device) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as reader:
                for stored in reader.keys():
                    if stored.endswith(_IGNORED_SUFFIXES) or stored.startswith(_IGNORED_PREFIXES):
                        continue
                    name = ("model." + stored.removeprefix(_TEXT_PREFIX)
                            if stored.startswith(_TEXT_PREFIX) else stored)
                    if name not in expected:
                        raise CheckpointError(
                            f"tensor inesperado {name!r} en {f}: este modelo de {len(expected)} tensores "
                            "no tiene ningún parámetro con ese nombre (¿es config.json de otro modelo?)"
                        )
                    shape = tuple(reader.get_slice(stored).get_shape())
                    if shape != tuple(expected[name]):
                        raise CheckpointError(
                            f"el tensor {name!r} de {f} tiene forma {list(shape)}; el modelo construido "
                            f"con config.json espera {list(expected[name])}"
                        )
                    state[name] = reader.get_tensor(stored).to(device=device, dtype=dtype)
        except CheckpointError:
            raise
        except Exception as e:  # safetensors raises its own error types for corrupt files
            raise CheckpointError(f"no se puede leer el archivo safetensors {f}: {e}") from e
    missing = [n for n in expected if n not in state and n not in optional]
    if missing:
        searched = ", ".join(f.name for f in files)
        more = f" (y {len(missing) - 1} más)" if len(missing) > 1 else ""
        raise CheckpointError(f"falta el tensor {missing[0]!r}{more} en el checkpoint; "
                              f"se buscó en: {searched}, en {files[0].parent}")
    return state


def load_pretrained(name_or_path: str | Path, dtype: torch.dtype = torch.float32,
                    device: str | torch.device = "cpu") -> Transformer:
    """Load a shipped model (``"tiny-es"``), a Hugging Face checkpoint folder, or a Hub id such as
    ``"Qwen/Qwen2.5-0.5B-Instruct"`` (downloaded once into the Hub cache; see ``model.hub``), in
    eval mode."""
    folder = _resolve(name_or_path)
    config_path = folder / "config.json"
    if not config_path.exists():
        raise FileNotFoundError(f"no se encuentra {config_path}; hay: {_listing(folder)}")
    # A Hub snapshot's folder is named after a commit: the model is named after its id.
    hub_id = name_or_path if isinstance(name_or_path, str) and looks_like_hub_id(name_or_path) else None
    try:
        config = ModelConfig.from_hf_config(config_path, name=hub_id)
    except (ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"{config_path}: {e}") from e
    files = _weight_files(folder)

    model = _empty_model(config, device)
    expected = {n: t.shape for n, t in model.state_dict().items()}
    optional = {"lm_head.weight"} if config.tie_word_embeddings else set()
    state = _read_tensors(files, expected, optional, dtype, device)
    if config.tie_word_embeddings:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    model.load_state_dict(state, strict=True, assign=True)
    model.tie_weights()
    return model.eval()


def load_model(name: str, seed: int = 0, device: str | torch.device = "cpu", *,
               dtype: torch.dtype = torch.float32) -> Transformer:
    """A model by name, as the labs use them: a shipped model with its trained weights
    (``"tiny-es"``), or a preset's configuration with seeded random weights (only the shapes
    matter then: bytes read, FLOPs, time)."""
    if name in SHIPPED_MODELS:
        return load_pretrained(name, dtype=dtype, device=device)
    return random_model(get_preset(name), seed=seed, dtype=dtype, device=device)


def save_pretrained(model: Transformer, folder: str | Path, max_shard_bytes: int | None = None) -> Path:
    """Write ``config.json`` and safetensors weights that both ``load_pretrained`` and
    ``transformers.AutoModelForCausalLM.from_pretrained`` read.

    With ``max_shard_bytes``, weights that do not fit in one file of that size are split into
    ``model-0000i-of-0000n.safetensors`` plus ``model.safetensors.index.json``. Weight files
    already in ``folder`` (``model*.safetensors`` and the index) are replaced.
    """
    if max_shard_bytes is not None and max_shard_bytes < 1:
        raise ValueError(f"max_shard_bytes debe ser un número de bytes positivo o None; se recibió {max_shard_bytes}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = model.config
    state = {n: t.detach().to("cpu").contiguous() for n, t in model.state_dict().items()}
    if config.tie_word_embeddings:
        del state["lm_head.weight"]  # the same tensor as the embedding; safetensors refuses aliases
    dtype = next(iter(state.values())).dtype

    hf = config.to_hf_config()
    hf["torch_dtype"] = str(dtype).removeprefix("torch.")
    (folder / "config.json").write_text(json.dumps(hf, indent=2) + "\n")

    for old in [*folder.glob("model*.safetensors"), folder / INDEX_FILE]:
        old.unlink(missing_ok=True)
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, t in state.items():
        if max_shard_bytes is not None and shards[-1] and size + t.nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += t.nbytes
    metadata = {"format": "pt"}
    if len(shards) == 1:
        save_file(shards[0], str(folder / SINGLE_FILE), metadata=metadata)
        return folder
    weight_map = {}
    for i, shard in enumerate(shards, start=1):
        fname = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(folder / fname), metadata=metadata)
        weight_map.update(dict.fromkeys(shard, fname))
    index = {"metadata": {"total_size": sum(t.nbytes for t in state.values())}, "weight_map": weight_map}
    (folder / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
    return folder
