"""Routing policies: which replica serves the next request (values in, an index out).

A policy sees the replicas as numbers only: ``loads[i]`` is replica ``i``'s outstanding requests
(sent, not yet answered), ``candidates`` the indices it may choose (healthy, not already tried
for this request), and ``prefix`` the chain of hashes of the prompt's leading blocks
(``prefix_blocks``). It returns ``Choice(index, reason)``; the reason feeds the router's
``chosen`` counter. The HTTP router and the simulator (``sim.routing``) call the same objects.

- ``round-robin``: the next candidate in turn, whatever it holds.
- ``least-outstanding``: the candidate with the fewest outstanding requests (lowest index on a
  tie).
- ``prefix-affinity``: the candidate that served the longest leading run of the prompt's blocks
  last (an approximate, router-side map of each replica's prefix cache, as SGLang's cache-aware
  router keeps a radix tree per worker); no match -> least-outstanding. **Load guard**: when the
  matched replica has more than ``max_imbalance`` outstanding requests above the least-loaded
  candidate, the request goes to the least-loaded one instead (which then becomes the prefix's
  last server), so one hot prefix cannot pile its whole traffic on one replica.

The map is bounded (``max_entries`` block hashes, least recently used dropped first), so the
router's memory stays bounded whatever the prompts.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Mapping, Sequence

POLICIES = ("round-robin", "least-outstanding", "prefix-affinity")
DEFAULT_BLOCK_CHARS = 64   # a text block: about 16 tokens of Spanish or English text
DEFAULT_MAX_BLOCKS = 64    # the leading blocks that count; a longer prompt's tail is ignored


@dataclass(frozen=True)
class Choice:
    index: int
    reason: str  # round_robin, least_outstanding, prefix_hit, prefix_miss, load_guard


def prefix_blocks(prompt, block_size: int, max_blocks: int = DEFAULT_MAX_BLOCKS) -> list[bytes]:
    """Chain hashes of the leading FULL blocks of ``prompt`` (a list of token ids, blocks of
    ``block_size`` tokens, or a string, blocks of ``block_size`` characters): hash ``k`` covers
    blocks ``0..k``, so two prompts share hash ``k`` exactly when they share their first ``k + 1``
    blocks (as the engine's prefix cache chains its block hashes). A partial last block has no
    hash (the cache only shares full blocks); at most ``max_blocks`` hashes."""
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size debe ser un entero >= 1; se recibió {block_size!r}")
    if isinstance(prompt, str):
        units = prompt[:block_size * max_blocks]
        encoded = [units[i:i + block_size].encode("utf-8", "surrogatepass")
                   for i in range(0, len(units) - block_size + 1, block_size)]
    else:
        units = [int(t) for t in list(prompt)[:block_size * max_blocks]]
        encoded = [json.dumps(units[i:i + block_size]).encode()
                   for i in range(0, len(units) - block_size + 1, block_size)]
    out, parent = [], b""
    for piece in encoded:
        parent = hashlib.sha256(parent + piece).digest()[:16]
        out.append(parent)
    return out


def _least_loaded(loads: Sequence[int], candidates: Sequence[int]) -> int:
    return min(candidates, key=lambda i: (loads[i], i))


def _check(loads: Sequence[int], candidates: Sequence[int]) -> None:
    if not candidates:
        raise ValueError("no hay réplicas candidatas entre las que elegir")
    bad = [i for i in candidates if not 0 <= i < len(loads)]
    if bad:
        raise ValueError(f"índices de réplica fuera de rango: {bad}; hay {len(loads)} réplicas")


def longest_match(prefix: Sequence[bytes], owners: Mapping, candidates: Sequence[int]) -> int | None:
    """The candidate that last served the longest leading run of ``prefix`` (``owners``: block
    hash -> replica index), None if none did."""
    for h in reversed(prefix):
        i = owners.get(h)
        if i is not None and i in candidates:
            return i
    return None


def affinity_choice(prefix: Sequence[bytes], owners: Mapping, loads: Sequence[int],
                    candidates: Sequence[int], max_imbalance: int) -> Choice:
    """The prefix-affinity rule on values (``PrefixAffinity.choose`` without the bookkeeping):
    the longest match's owner, unless it has more than ``max_imbalance`` outstanding requests
    above the least-loaded candidate; no match -> the least-loaded candidate."""
    _check(loads, candidates)
    lightest = _least_loaded(loads, candidates)
    owner = longest_match(prefix, owners, candidates)
    if owner is None:
        return Choice(lightest, "prefix_miss")
    if loads[owner] - loads[lightest] > max_imbalance:
        return Choice(lightest, "load_guard")
    return Choice(owner, "prefix_hit")


class RoundRobin:
    name = "round-robin"

    def __init__(self) -> None:
        self._next = 0

    def choose(self, prefix: Sequence[bytes], loads: Sequence[int],
               candidates: Sequence[int]) -> Choice:
        _check(loads, candidates)
        n = len(loads)
        for step in range(n):  # the first candidate at or after the turn
            i = (self._next + step) % n
            if i in candidates:
                self._next = (i + 1) % n
                return Choice(i, "round_robin")
        raise AssertionError("unreachable: candidates are in range")


class LeastOutstanding:
    name = "least-outstanding"

    def choose(self, prefix: Sequence[bytes], loads: Sequence[int],
               candidates: Sequence[int]) -> Choice:
        _check(loads, candidates)
        return Choice(_least_loaded(loads, candidates), "least_outstanding")


class PrefixAffinity:
    """See the module's docstring for the rule. ``owner(prefix)``: who served it last."""

    name = "prefix-affinity"

    def __init__(self, max_imbalance: int = 4, max_entries: int = 65536, rule=None) -> None:
        """``rule(prefix, owners, loads, candidates, max_imbalance) -> index``: another
        implementation of ``affinity_choice``'s rule (a lab plugs a student's in here; it gets a
        copy of the map, plain data that can cross to the autograder's worker); its choices are counted under the reason ``rule``."""
        if isinstance(max_imbalance, bool) or not isinstance(max_imbalance, int) or max_imbalance < 0:
            raise ValueError(f"max_imbalance debe ser un entero >= 0; se recibió {max_imbalance!r}")
        if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 1:
            raise ValueError(f"max_entries debe ser un entero >= 1; se recibió {max_entries!r}")
        self.max_imbalance = max_imbalance
        self.max_entries = max_entries
        self.rule = rule
        self._owner: OrderedDict[bytes, int] = OrderedDict()

    def match(self, prefix: Sequence[bytes], candidates: Sequence[int]) -> int | None:
        """The candidate that last served the longest leading run of ``prefix`` (None if none)."""
        return longest_match(prefix, self._owner, candidates)

    def choose(self, prefix: Sequence[bytes], loads: Sequence[int],
               candidates: Sequence[int]) -> Choice:
        if self.rule is None:
            choice = affinity_choice(prefix, self._owner, loads, candidates, self.max_imbalance)
        else:
            _check(loads, candidates)
            index = self.rule(list(prefix), dict(self._owner), list(loads), list(candidates),
                              self.max_imbalance)
            if index not in candidates:
                raise ValueError(f"la regla de afinidad devolvió {index!r}, que no es una de las "
                                 f"réplicas candidatas {list(candidates)}")
            choice = Choice(index, "rule")
        self.record(prefix, choice.index)
        return choice

    def record(self, prefix: Sequence[bytes], index: int) -> None:
        """``index`` served ``prefix``: it is now the last server of each of its blocks."""
        for h in prefix:
            self._owner[h] = index
            self._owner.move_to_end(h)
        while len(self._owner) > self.max_entries:
            self._owner.popitem(last=False)

    def forget(self, index: int) -> None:
        """Replica ``index`` died (its cache is gone): drop what it served."""
        for h in [h for h, i in self._owner.items() if i == index]:
            del self._owner[h]


def make_policy(name: str, **options):
    """A fresh policy by name (``POLICIES``); ``options`` go to ``PrefixAffinity``."""
    key = str(name).strip().lower().replace("_", "-")
    if key == "round-robin":
        policy = RoundRobin()
    elif key == "least-outstanding":
        policy = LeastOutstanding()
    elif key == "prefix-affinity":
        return PrefixAffinity(**options)
    else:
        raise ValueError(f"política de enrutado desconocida {name!r}; las aceptadas son: "
                         f"{', '.join(POLICIES)}")
    if options:
        raise ValueError(f"la política {key} no acepta opciones; se recibió {sorted(options)}")
    return policy
