"""A thin wrapper over a byte-level BPE ``tokenizers.Tokenizer``.

The shipped tokenizers work on bytes, so every string round-trips: ``decode(encode(s)) == s`` for
any text, accents, ``ñ``, ``¿¡``, emoji and newlines included. The wrapper exposes only what the
course needs (ids in, ids out, the special-token ids) and resolves shipped names such as
``"tiny-es"`` to the folder inside the package.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer as _HFTokenizer

from .hub import hub_folder, looks_like_hub_id
from .shipped_models import SHIPPED_ROOT, shipped_names

BOS_TOKEN = "<s>"
EOS_TOKEN = "</s>"
PAD_TOKEN = "<pad>"


class Tokenizer:
    """Text <-> token ids, with the ``<s>``, ``</s>`` and ``<pad>`` ids at hand."""

    def __init__(self, backend: _HFTokenizer, path: str | Path | None = None) -> None:
        self._tok = backend
        self.path = Path(path) if path is not None else None
        self.bos_token_id = backend.token_to_id(BOS_TOKEN)
        self.eos_token_id = backend.token_to_id(EOS_TOKEN)
        self.pad_token_id = backend.token_to_id(PAD_TOKEN)

    @classmethod
    def from_file(cls, path: str | Path) -> "Tokenizer":
        """Load a ``tokenizer.json`` file."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"no se encuentra el archivo del tokenizador: {path}")
        return cls(_HFTokenizer.from_file(str(path)), path)

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
        """Token ids of ``text``; with ``add_bos`` the ``<s>`` id goes first."""
        ids = self._tok.encode(text, add_special_tokens=False).ids
        if add_bos:
            if self.bos_token_id is None:
                raise ValueError("este tokenizador no tiene token <s>")
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
        return Tokenizer.from_file(path)
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
