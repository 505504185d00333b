"""nbval on a notebook that was already executed: its comparison, without a second execution.

    pytest --nbval-lax -p nbval_replay --nbval-replay EXECUTED.ipynb REFERENCE.ipynb

nbval collects REFERENCE (a lab's committed ``notebook_solution.ipynb``, whose cells tagged
``nbval-check-output`` hold the outputs a run must reproduce), sends each cell's source to a
kernel and compares what comes back with its own rules (tags, sanitisers, stream coalescing,
image outputs skipped). This plugin gives nbval a kernel that executes nothing: it replays
EXECUTED (the book build's execution of the same notebook), answering each cell with the outputs
the execution produced for the cell with the same source. So the lab runs once per suite, and a
checked output that changed still fails with nbval's message.
"""

from __future__ import annotations

import itertools
from queue import Empty

import nbformat


def pytest_addoption(parser):
    parser.addoption("--nbval-replay", default=None, metavar="EXECUTED.ipynb",
                     help="answer every cell with this executed notebook's outputs instead of "
                          "running a kernel")


def pytest_configure(config):
    executed = config.getoption("--nbval-replay")
    if executed is None:
        return
    import nbval.plugin

    cells = [c for c in nbformat.read(executed, as_version=4).cells if c.cell_type == "code"]
    nbval.plugin.RunningKernel = lambda *args, **kwargs: ReplayKernel(cells)


def _message(msg_id: str, msg_type: str, content: dict) -> dict:
    return {"msg_type": msg_type, "content": content, "parent_header": {"msg_id": msg_id},
            "header": {"msg_type": msg_type}}


def output_messages(msg_id: str, outputs: list) -> list[dict]:
    """The iopub messages a kernel sends for one cell that produced ``outputs``."""
    messages = [_message(msg_id, "status", {"execution_state": "busy"})]
    for out in outputs:
        kind = out["output_type"]
        if kind == "stream":
            content = {"name": out["name"], "text": out["text"]}
        elif kind in ("display_data", "execute_result"):
            content = {"data": out.get("data", {}), "metadata": out.get("metadata", {}),
                       "execution_count": out.get("execution_count")}
        elif kind == "error":
            content = {"ename": out["ename"], "evalue": out["evalue"],
                       "traceback": out.get("traceback", [])}
        else:
            continue
        messages.append(_message(msg_id, kind, content))
    messages.append(_message(msg_id, "status", {"execution_state": "idle"}))
    return messages


class ReplayKernel:
    """The part of nbval's ``RunningKernel`` that nbval's cells call, answering from the cells of
    an executed notebook: each cell's source is matched, in order, to the first executed cell with
    the same source that has not answered yet."""

    def __init__(self, executed_cells: list):
        self._cells = list(executed_cells)
        self._used: set[int] = set()
        self._queue: list[dict] = []
        self._ids = itertools.count()
        self._alive = True

    def is_alive(self) -> bool:
        return self._alive

    def execute_cell_input(self, cell_input: str, allow_stdin=None) -> str:
        msg_id = f"replay-{next(self._ids)}"
        index = next((i for i, c in enumerate(self._cells)
                      if i not in self._used and c.source == cell_input), None)
        if index is None:
            outputs = [nbformat.v4.new_output(
                "error", ename="ReplayError",
                evalue="la ejecución del libro no tiene esta celda (¿cuaderno emparejado "
                       "desactualizado? `make sync`)", traceback=[])]
        else:
            self._used.add(index)
            outputs = self._cells[index].get("outputs", [])
        self._queue.extend(output_messages(msg_id, outputs))
        return msg_id

    def await_reply(self, msg_id, timeout=None) -> dict:
        return _message(msg_id, "execute_reply", {"status": "ok"})

    def await_idle(self, parent_id, timeout) -> None:
        self._queue = [m for m in self._queue if m["parent_header"]["msg_id"] != parent_id]

    def get_message(self, stream, timeout=None) -> dict:
        if stream != "iopub" or not self._queue:
            raise Empty
        return self._queue.pop(0)

    def interrupt(self) -> None:
        pass

    def restart(self) -> None:
        self._queue.clear()

    def stop(self) -> None:
        self._alive = False

