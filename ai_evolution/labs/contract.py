"""The evidence contract every lab returns, its JSON Schema, and how to compare two runs.

A contract is a plain JSON-able dict::

    {"schema_version": 1, "kind": "kv_cache", "seed": 0, "profile": "ci", "params": {...},
     "environment": {...}, "results": {...},
     "evidence": [{"statement": "...", "value": 131072, "unit": "B", "source": "computed"}],
     "limitations": ["..."], "volatile_fields": ["results.timing"]}

``volatile_fields`` lists the dotted paths whose values may change from run to run with the same
seed: wall-clock timings and floating-point round-off that depends on the machine's kernels.
Evidence items that rest on such a value carry ``"volatile": true``. Everything else must be
identical for one seed.
"""

from __future__ import annotations

import copy
import json
import math
from functools import lru_cache
from importlib import resources
from typing import Any

import jsonschema


class ContractError(ValueError):
    """A contract does not satisfy the schema."""


@lru_cache(maxsize=1)
def contract_schema() -> dict:
    return json.loads(resources.files(__package__).joinpath("contract.schema.json").read_text())


def validate_contract(contract: dict) -> dict:
    """Raise ContractError naming the first problem, else return the contract unchanged."""
    try:
        jsonschema.validate(contract, contract_schema())
    except jsonschema.ValidationError as err:
        where = "/".join(str(p) for p in err.absolute_path) or "(raíz)"
        raise ContractError(f"el contrato no cumple el esquema en {where}: {err.message}") from None
    _check_json_numbers(contract, "")
    for path in contract["volatile_fields"]:
        try:
            _get_path(contract, path)
        except KeyError as err:
            raise ContractError(str(err.args[0])) from None
    return contract


def _check_json_numbers(value: Any, where: str) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise ContractError(f"valor no finito ({value}) en {where or '(raíz)'}: JSON no lo admite")
    if isinstance(value, dict):
        for k, v in value.items():
            _check_json_numbers(v, f"{where}.{k}" if where else str(k))
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _check_json_numbers(v, f"{where}[{i}]")


def _get_path(obj: dict, path: str) -> Any:
    cur: Any = obj
    for part in path.split("."):
        if not isinstance(cur, dict) or part not in cur:
            raise KeyError(f"el campo volátil {path!r} no existe en el contrato")
        cur = cur[part]
    return cur


def without_volatile(contract: dict) -> dict:
    """A copy without the volatile fields and evidence (for run-to-run comparison)."""
    out = copy.deepcopy(contract)
    for path in contract.get("volatile_fields", []):
        *parents, last = path.split(".")
        cur = out
        for part in parents:
            cur = cur[part]
        cur.pop(last, None)
    out["evidence"] = [e for e in out.get("evidence", []) if not e.get("volatile", False)]
    return out


def to_json(contract: dict, indent: int = 2) -> str:
    return json.dumps(contract, indent=indent, ensure_ascii=False, sort_keys=False)


def evidence(statement: str, value: Any, unit: str, source: str = "computed",
             volatile: bool = False) -> dict:
    """One evidence item: a sentence, the number it rests on, its unit and where it comes from
    (``computed`` from formulas, ``measured`` on this machine, ``cited`` from a source)."""
    if hasattr(value, "item"):  # numpy / torch scalars
        value = value.item()
    item = {"statement": statement, "value": value, "unit": unit, "source": source}
    if volatile:
        item["volatile"] = True
    return item


def claims_starting(found: dict, prefix: str) -> dict:
    """The claims of ``found`` whose key starts with ``prefix`` (one per case, per k, per batch
    size...), in their order."""
    return {k: c for k, c in found.items() if k.startswith(prefix)}


def datasheet_sim_limitation() -> str:
    """The limitation every lab that simulates a datacenter GPU from its datasheet must state."""
    return ("El simulador de centro de datos usa el roofline de la hoja de datos sin sobrecarga: es "
            "una cota optimista del tiempo de cada paso, no una medida.")


def timing_limitation(repeats: int) -> str:
    """The limitation every lab that times things must state."""
    what = "una sola medición" if repeats == 1 else f"la mediana de {repeats} repeticiones"
    return (f"Cada tiempo es {what} en una máquina compartida: otra ejecución, o la misma máquina "
            "con otra carga, da otros números. Las conclusiones que comparan tiempos las decide el "
            "intervalo de cada comparación (no concluyente si contiene la igualdad), no una sola "
            "medida.")


def threads_limitation(threads: int) -> str:
    """How many torch threads the timings ran with, and why (the labs' ``torch_threads``)."""
    if not threads:
        return ("Los tiempos se miden con los hilos que elige torch; en una máquina compartida, un "
                "hilo que espera a un núcleo ocupado añade ruido.")
    return (f"Los tiempos se miden con {threads} {'hilo' if threads == 1 else 'hilos'} de torch, no "
            "con los que torch elegiría: en una máquina compartida es lo más estable, y no es el "
            "mejor tiempo posible del motor.")


def met_criteria_sentence(criteria, met: dict[str, bool]) -> str:
    """Which of a chapter's ``criteria`` ((key, text) pairs) this run meets, from the booleans
    ``met`` computed from its own numbers."""
    missed = [text for key, text in criteria if not met[key]]
    if not missed:
        return f"Esta ejecución cumple los {len(criteria)} criterios."
    listed = "; ".join(f"«{text}»" for text in missed)
    return f"Esta ejecución no cumple {len(missed)} de los {len(criteria)} criterios: {listed}."
