"""A thin wrapper over a byte-level BPE ``tokenizers.Tokenizer``.

The shipped tokenizers work on bytes, so every string round-trips: ``decode(encode(s)) == s`` for
any text, accents, ``ñ``, ``¿¡``, emoji and newlines included. The wrapper exposes only what the
course needs (ids in, ids out, the special-token ids) and resolves shipped names such as
``"tiny-es"`` to the folder inside the package.

A Hugging Face tokenizer folder may also hold ``tokenizer_config.json`` (and
``chat_template.jinja``): its special tokens (Qwen's have no BOS, and end a turn with
``<|im_end|>``) replace the shipped ``<s>``/``</s>``/``<pad>``, and its chat template is kept in
``chat_template`` for the server.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer as _HFTokenizer

from .hub import hub_folder, looks_like_hub_id
from .shipped_models import SHIPPED_ROOT, shipped_names

BOS_TOKEN = "<s>"
EOS_TOKEN = "</s>"
PAD_TOKEN = "<pad>"


def _token_text(value) -> str | None:
    """A special token as ``tokenizer_config.json`` writes it: a string, ``{"content": ...}``,
    or null."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def read_tokenizer_config(folder: Path) -> tuple[dict | None, str | None]:
    """``tokenizer_config.json`` of a folder (None if there is none) and its chat template
    (``chat_template.jinja`` first, as recent exports write it; None if there is none)."""
    config = None
    path = folder / "tokenizer_config.json"
    if path.is_file():
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except ValueError as e:
            raise ValueError(f"no se puede leer {path}: {e}") from e
        if not isinstance(config, dict):
            raise ValueError(f"{path} debe contener un objeto JSON; contiene un {type(config).__name__}")
    jinja = folder / "chat_template.jinja"
    template = jinja.read_text(encoding="utf-8") if jinja.is_file() else (config or {}).get("chat_template")
    if isinstance(template, list):  # named templates: [{"name": "default", "template": "..."}]
        template = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}.get("default")
    return config, template if isinstance(template, str) and template.strip() else None


class Tokenizer:
    """Text <-> token ids, with the BOS, EOS and padding ids at hand (``<s>``, ``</s>`` and
    ``<pad>`` unless a ``tokenizer_config.json`` names others), and the chat template if the
    tokenizer has one."""

    def __init__(self, backend: _HFTokenizer, path: str | Path | None = None, *,
                 config: dict | None = None, chat_template: str | None = None,
                 name: str | None = None) -> None:
        self._tok = backend
        self.path = Path(path) if path is not None else None
        self.name = name or (self.path.parent.name if self.path is not None else None)
        self.chat_template = chat_template
        # Without tokenizer_config.json, the shipped names; with it, what it declares (null or
        # absent: none, as transformers reads it).
        self._declared = config is not None
        special = {key: (_token_text(config.get(key)) if self._declared else default)
                   for key, default in (("bos_token", BOS_TOKEN), ("eos_token", EOS_TOKEN),
                                        ("pad_token", PAD_TOKEN))}
        self.bos_token, self.eos_token, self.pad_token = (
            special["bos_token"], special["eos_token"], special["pad_token"])
        self.bos_token_id = backend.token_to_id(self.bos_token) if self.bos_token else None
        self.eos_token_id = backend.token_to_id(self.eos_token) if self.eos_token else None
        self.pad_token_id = backend.token_to_id(self.pad_token) if self.pad_token else None

    @classmethod
    def from_file(cls, path: str | Path, name: str | None = None) -> "Tokenizer":
        """Load a ``tokenizer.json`` file (and the ``tokenizer_config.json`` and
        ``chat_template.jinja`` beside it, if any)."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"no se encuentra el archivo del tokenizador: {path}")
        config, template = read_tokenizer_config(path.parent)
        return cls(_HFTokenizer.from_file(str(path)), path, config=config, chat_template=template,
                   name=name)

    @property
    def backend(self) -> _HFTokenizer:
        """The underlying ``tokenizers.Tokenizer`` (for training-time or advanced use)."""
        return self._tok

    @property
    def vocab_size(self) -> int:
        """Number of ids, special tokens included."""
        return self._tok.get_vocab_size(with_added_tokens=True)

    @property
    def longest_token_chars(self) -> int:
        """Characters of the longest vocabulary entry: no token covers more characters of a
        text, so a text of ``n`` characters has at least ``n / longest_token_chars`` tokens."""
        if not hasattr(self, "_longest"):
            self._longest = max((len(t) for t in self._tok.get_vocab(with_added_tokens=True)), default=1)
        return self._longest

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        """Token ids of ``text``; with ``add_bos`` the BOS id (``<s>``) goes first. A tokenizer
        whose ``tokenizer_config.json`` declares no BOS token (Qwen's) starts without one, as
        its model was trained."""
        ids = self._tok.encode(text, add_special_tokens=False).ids
        if add_bos:
            if self.bos_token_id is None:
                if self._declared and self.bos_token is None:
                    return ids
                raise ValueError(f"este tokenizador no tiene token {self.bos_token or BOS_TOKEN}")
            ids = [self.bos_token_id] + ids
        return ids

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        """Text of ``ids`` (a list of ints or a 1-D tensor); special tokens are dropped by default."""
        if hasattr(ids, "tolist"):
            ids = ids.tolist()
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def token_strings(self, ids) -> list[str]:
        """The text each id stands for, one string per id (partial UTF-8 bytes show as U+FFFD)."""
        if hasattr(ids, "tolist"):
            ids = ids.tolist()
        return [self._tok.decode([int(i)], skip_special_tokens=False) for i in ids]

    def __len__(self) -> int:
        return self.vocab_size

    def __repr__(self) -> str:
        where = f", path={str(self.path)!r}" if self.path else ""
        return f"Tokenizer(vocab_size={self.vocab_size}{where})"


def load_tokenizer(name_or_path: str | Path) -> Tokenizer:
    """Load a shipped tokenizer by name (``"tiny-es"``) or from a folder / ``tokenizer.json`` path.

    A string without a path separator that is not an existing file or folder is taken as a shipped
    name; an unknown one raises ``ValueError`` listing the shipped names.
    """
    candidate = Path(name_or_path)
    if candidate.is_file():
        return Tokenizer.from_file(candidate)
    if candidate.is_dir():
        path = candidate / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"no hay tokenizer.json en la carpeta: {path}")
        return Tokenizer.from_file(path)
    text = str(name_or_path)
    if looks_like_hub_id(text):
        path = hub_folder(text) / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"{text!r} no trae tokenizer.json en el Hub: {path}")
        return Tokenizer.from_file(path, name=text)
    looks_like_path = "/" in text or "\\" in text or text.endswith(".json")
    if looks_like_path:
        raise FileNotFoundError(f"no se encuentra el tokenizador: {candidate}")
    path = SHIPPED_ROOT / text / "tokenizer.json"
    if text in shipped_names() and path.is_file():
        return Tokenizer.from_file(path)
    if text in shipped_names():
        raise FileNotFoundError(f"el tokenizador incluido {text!r} no tiene tokenizer.json: {path}")
    names = shipped_names()
    raise ValueError(
        f"tokenizador incluido desconocido {text!r}; incluidos: {', '.join(names) if names else '(ninguno)'}"
    )
