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


_SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def es_count(n: int, singular: str, plural: str | None = None) -> str:
    """``es_count(1, "hilo") -> '1 hilo'``, ``es_count(4, "hilo") -> '4 hilos'``: a count with
    its noun in the right number, never "hilo(s)" (``plural`` when adding "s" is wrong)."""
    return f"{es(n, 0)} {singular if n == 1 else plural or singular + 's'}"


def es_sig(x: float, digits: int = 6) -> str:
    """``x`` with about ``digits`` significant digits and a decimal comma (a Spanish ``%g``):
    ``es_sig(0.0123456, 3) -> '0,0123'``; powers of ten, ``'1,5 × 10⁻⁶'``, when extreme."""
    if isinstance(x, bool) or not math.isfinite(float(x)):
        return str(x)
    x = float(x)
    if x == 0:
        return "0"
    e = math.floor(math.log10(abs(x)))
    if -4 <= e < 15:
        text = es(x, max(0, digits - 1 - e))
        return text.rstrip("0").rstrip(",") if "," in text else text
    mantissa = es(x / 10**e, digits - 1)
    mantissa = mantissa.rstrip("0").rstrip(",") if "," in mantissa else mantissa
    return f"{mantissa} × 10{str(e).translate(_SUPERSCRIPT)}"


def es_value(value) -> str:
    """What a student's function returned, as a check message shows it: numbers with
    ``es_sig`` (decimal comma), sequences as ``[a; b]`` and dicts as ``{'k': a; 'j': b}`` (the
    semicolon keeps the decimal commas apart), anything else as its ``repr``."""
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, (int, float)) or type(value).__module__ == "numpy" and \
            getattr(value, "ndim", 1) == 0:
        try:
            return es_sig(float(value), 7)
        except (TypeError, ValueError):
            return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + "; ".join(es_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + "; ".join(f"{k!r}: {es_value(v)}" for k, v in value.items()) + "}"
    return repr(value)


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


def es_bytes_column(values, digits: int = 3) -> list[str]:
    """Byte counts for one column of a table, every one in a binary unit (KiB, MiB or GiB, the
    largest that keeps the value at 1 or more) with ``digits`` significant digits: a column
    never mixes kB with KiB or MB with MiB, and its small values stay readable."""
    out = []
    for v in (float(v) for v in values):
        unit, size = next(((u, s) for u, s in (("GiB", 2**30), ("MiB", 2**20)) if abs(v) >= s),
                          ("KiB", 2**10))
        out.append(f"{es_sig(v / size, digits)} {unit}")
    return out


def table(rows: list[dict], columns: list[tuple]) -> str:
    """A plain-text table, one line per row, numbers in Spanish.

    ``columns`` holds ``(header, key, decimals)`` or ``(header, key, decimals, scale)``: the
    cell is ``es(row[key] * scale, decimals)``; a ``(low, high)`` pair prints as ``[low; high]``
    (an interval: the semicolon keeps the decimal commas apart); None or NaN as ``—``; a string
    as it is. Columns are right-aligned to their widest cell.
    """
    def cell(value, decimals: int, scale: float) -> str:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return "—"
        if isinstance(value, str):
            return value
        if isinstance(value, (tuple, list)):
            return "[" + "; ".join(cell(v, decimals, scale) for v in value) + "]"
        return es(value * scale, decimals)

    specs = [(c[0], c[1], c[2], c[3] if len(c) > 3 else 1.0) for c in columns]
    grid = [[h for h, *_ in specs]] + [[cell(r.get(k), d, s) for _, k, d, s in specs] for r in rows]
    widths = [max(len(line[i]) for line in grid) for i in range(len(specs))]
    lines = ["  ".join(text.rjust(w) for text, w in zip(line, widths)) for line in grid]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
