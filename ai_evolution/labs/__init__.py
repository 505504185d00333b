"""Labs: ``run_lab(kind, seed=0, profile=None, **params) -> dict`` (the evidence contract)."""

from .contract import ContractError, contract_schema, to_json, validate_contract, without_volatile
from .profiles import PROFILES, resolve_profile
from .registry import (LabParamError, LabSpec, Param, assemble_contract, get_spec, list_labs,
                       run_lab)

__all__ = [
    "ContractError", "contract_schema", "to_json", "validate_contract", "without_volatile",
    "PROFILES", "resolve_profile", "LabParamError", "LabSpec", "Param", "get_spec", "list_labs",
    "run_lab", "assemble_contract",
]
