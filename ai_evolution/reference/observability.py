"""Reference answer of the observability lab (chapter 6): the bootstrap interval of a
percentile."""

from __future__ import annotations

from ..metrics import bootstrap_ci


def reference_bootstrap(values, q: float, n_boot: int = 1000, alpha: float = 0.05,
                        seed: int | None = 0) -> tuple[float, float]:
    """The exercise's signature on ``metrics.bootstrap_ci`` (whose second positional argument is
    ``stat``): the autograder's reference for ``bootstrap_interval``."""
    return bootstrap_ci(values, q=q, n_boot=n_boot, alpha=alpha, seed=seed)

