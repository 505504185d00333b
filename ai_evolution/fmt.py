"""Numbers as the book writes them: Spanish decimal comma, a space between thousands."""

from __future__ import annotations

import math

_NBSP = "\u00a0"


def es(x: float, decimals: int = 2) -> str:
    """``es(2147483.648, 1) -> '2 147 483,6'``; integers of 4 digits keep no separator (RAE)."""
    if isinstance(x, bool) or not math.isfinite(float(x)):
        return str(x)
    text = f"{float(x):,.{decimals}f}" if decimals > 0 else f"{round(float(x)):,d}"
    intpart, _, frac = text.partition(".")
    digits = intpart.lstrip("-").replace(",", "")
    if len(digits) <= 4:
        intpart = intpart.replace(",", "")
    else:
        intpart = intpart.replace(",", _NBSP)
    return (intpart + ("," + frac if frac else "")).replace("-", "\u2212")  # typographic minus


def es_bytes(n: float, decimals: int = 2) -> str:
    """A byte count with its unit: GB = 1e9 bytes for memories (as datasheets write them),
    KiB/MiB for exact powers of two (per-token KV sizes usually are), else kB/MB."""
    n = float(n)
    if n >= 1e9:
        return f"{es(n / 1e9, decimals)} GB"
    if n >= 2**20 and (n / 2**20) == int(n / 2**20):
        return f"{es(n / 2**20, 0)} MiB"
    if n >= 2**20:
        return f"{es(n / 1e6, decimals)} MB"
    if n >= 2**10 and (n / 2**10) == int(n / 2**10):
        return f"{es(n / 2**10, 0)} KiB"
    if n >= 1e3:
        return f"{es(n / 1e3, decimals)} kB"
    return f"{es(n, 0)} B"
