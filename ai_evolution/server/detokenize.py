"""Incremental detokenization: the text each new token adds, for streaming.

A byte-level BPE token can hold part of a UTF-8 character (``ñ`` is two bytes, an emoji four), so
one token does not always decode to text on its own. ``IncrementalDetokenizer`` decodes a short
window of recent tokens and releases text only when it does not end in a partial character
(``U+FFFD``), the scheme vLLM uses. Concatenating every ``push`` and the final ``flush`` gives
exactly ``tokenizer.decode(all_ids)``.
"""

from __future__ import annotations

REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.prefix_offset = 0  # start of the window that gives context to the new tokens
        self.read_offset = 0    # tokens before this have been turned into text

    def push(self, token_id: int) -> str:
        """Add one token; return the text it completes (``""`` while a character is partial)."""
        self.ids.append(int(token_id))
        decode = self.tokenizer.decode
        prefix = decode(self.ids[self.prefix_offset:self.read_offset])
        full = decode(self.ids[self.prefix_offset:])
        if len(full) > len(prefix) and not full.endswith(REPLACEMENT):
            self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
            return full[len(prefix):]
        return ""

    def flush(self) -> str:
        """The text still held back (a truncated character shows as ``U+FFFD``)."""
        decode = self.tokenizer.decode
        prefix = decode(self.ids[self.prefix_offset:self.read_offset])
        full = decode(self.ids[self.prefix_offset:])
        self.prefix_offset = self.read_offset = len(self.ids)
        return full[len(prefix):]
