"""The in-process target: the load generator drives an ``LLMEngine`` in the same Python process.

No HTTP, no tokenizer, no network: what is measured is the engine itself (its scheduler and its
steps, on the real model or on the simulator). The same workloads can be sent to an
OpenAI-compatible server instead (the HTTP client of this package); the timing records have the
same meaning. A request is added when the engine's clock reaches its arrival time, so a request
that arrives during a step waits for the step to end, and that wait counts in its TTFT (its
``arrival_time`` is the scheduled one): no coordinated omission.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator, Sequence

from ..engine.request import Request
from .arrivals import ClosedLoopRun, closed_loop
from .workload import WorkItem


@contextmanager
def progress_bar(engine, total: int, desc: str, enabled: bool = True) -> Iterator[None]:
    """While the block runs, a tqdm bar counts ``engine``'s finished requests out of ``total``
    (a hook in ``engine.step_hooks``, removed afterwards). ``enabled=False`` does nothing."""
    if not enabled:
        yield
        return
    from tqdm import tqdm

    bar = tqdm(total=total, desc=desc, unit="pet", leave=False, mininterval=0.5)

    def count_finished(record, outputs) -> None:
        done = sum(1 for o in outputs if o.finished)
        if done:
            bar.update(done)

    engine.step_hooks.append(count_finished)
    try:
        yield
    finally:
        engine.step_hooks.remove(count_finished)
        bar.close()


def run_open_loop(engine, workload: Sequence[WorkItem], progress: bool = False,
                  desc: str = "peticiones") -> list[Request]:
    """Serve ``workload`` (``(arrival_time, prompt, params)`` items, times relative to now) on
    ``engine`` in real time (or simulated time) and return its requests, in workload order."""
    with progress_bar(engine, len(workload), desc, progress):
        return engine.run(workload)


def run_closed_loop(engine, clients: int, total_requests: int,
                    make_item: Callable[[int], tuple], seed: int | None = None,
                    progress: bool = False, desc: str = "bucle cerrado") -> ClosedLoopRun:
    """``loadgen.closed_loop`` with an optional progress bar."""
    with progress_bar(engine, total_requests, desc, progress):
        return closed_loop(engine, clients, total_requests, make_item, seed=seed)
