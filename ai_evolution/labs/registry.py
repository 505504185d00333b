"""The lab registry: each lab kind declares its parameters, and ``run_lab`` checks them.

A lab module defines ``SPEC = LabSpec(...)`` and a ``run(seed, profile, params, device)`` that
returns ``results``, ``evidence``, ``limitations`` and ``volatile_fields``; ``run_lab`` adds
everything else of the contract and validates it.
"""

from __future__ import annotations

import importlib
import math
import random
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch

from .. import __version__
from ..hardware import describe, pick_device
from .contract import validate_contract
from .profiles import resolve_profile

# kind -> module that defines SPEC and run(); modules are imported on first use.
_LABS: dict[str, str] = {
    "continuous_batching": "ai_evolution.labs.continuous_batching",
    "determinism": "ai_evolution.labs.determinism",
    "distributed": "ai_evolution.labs.distributed",
    "flash_attention": "ai_evolution.labs.flash_attention",
    "hybrid": "ai_evolution.labs.hybrid",
    "kv_cache": "ai_evolution.labs.kv_cache",
    "observability": "ai_evolution.labs.observability",
    "operations": "ai_evolution.labs.operations",
    "paged_attention": "ai_evolution.labs.paged_attention",
    "quantization": "ai_evolution.labs.quantization",
    "roofline": "ai_evolution.labs.roofline",
    "scheduler": "ai_evolution.labs.scheduler",
    "speculative": "ai_evolution.labs.speculative",
}


class LabParamError(ValueError):
    """A parameter a lab does not accept, or a value outside its accepted ones."""


@dataclass(frozen=True)
class Param:
    """One lab parameter: a default per profile, a type, and the accepted values."""

    default: Any
    type: type = int
    help: str = ""
    choices: tuple | None = None
    min: float | None = None
    max: float | None = None
    is_list: bool = False
    by_profile: dict[str, Any] = field(default_factory=dict)

    def default_for(self, profile: str) -> Any:
        return self.by_profile.get(profile, self.default)

    def accepted(self) -> str:
        kind = f"lista de {self.type.__name__}" if self.is_list else self.type.__name__
        if self.choices is not None:
            return f"uno de {', '.join(map(str, self.choices))}"
        bounds = []
        if self.min is not None:
            bounds.append(f">= {self.min}")
        if self.max is not None:
            bounds.append(f"<= {self.max}")
        return kind + (f" ({' y '.join(bounds)})" if bounds else "")

    def coerce(self, name: str, value: Any) -> Any:
        """Convert (from a CLI string too) and check one value; LabParamError otherwise."""
        def bad() -> LabParamError:
            return LabParamError(f"valor no válido para el parámetro {name!r}: {value!r}; "
                                 f"valores aceptados: {self.accepted()}")

        if self.is_list:
            items = value.split(",") if isinstance(value, str) else value
            if not isinstance(items, (list, tuple)) or not items:
                raise bad()
            return [self._one(name, v, bad) for v in items]
        return self._one(name, value, bad)

    def _one(self, name: str, value: Any, bad: Callable[[], LabParamError]) -> Any:
        try:
            if self.type is bool and isinstance(value, str):
                if value.lower() not in ("true", "false", "1", "0"):
                    raise bad()
                value = value.lower() in ("true", "1")
            elif isinstance(value, bool) and self.type is not bool:
                raise bad()
            else:
                converted = self.type(value)
                if self.type is int and isinstance(value, float) and value != converted:
                    raise bad()
                value = converted
        except (TypeError, ValueError, OverflowError):
            raise bad() from None
        if isinstance(value, float) and not math.isfinite(value):  # NaN passes every bound
            raise bad()
        if self.choices is not None and value not in self.choices:
            raise bad()
        if self.min is not None and value < self.min:
            raise bad()
        if self.max is not None and value > self.max:
            raise bad()
        return value


@dataclass(frozen=True)
class LabSpec:
    kind: str
    title: str
    chapter: int
    folder: str
    params: dict[str, Param]
    run: Callable[..., dict]
    # CPU seconds the lab's notebook (its kernel, one torch thread) takes in the `ci` profile on
    # the reference machine (`REFERENCE_MACHINE` of `scripts/execute_book.py`, measured by its
    # book build); the book test fails a lab that takes twice as long, scaled by the build
    # machine's calibration against the reference (a faster core gets a smaller budget).
    ci_budget_s: float = 60.0

    def resolve_params(self, profile: str, given: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(given) - set(self.params))
        if unknown:
            raise LabParamError(
                f"parámetro desconocido {unknown[0]!r} para el laboratorio {self.kind!r}; "
                f"parámetros aceptados: {', '.join(sorted(self.params))}"
            )
        return {name: p.coerce(name, given[name]) if name in given else p.default_for(profile)
                for name, p in self.params.items()}


def list_labs() -> list[str]:
    """The lab kinds ``run_lab`` accepts."""
    return sorted(_LABS)


def get_spec(kind: str) -> LabSpec:
    if kind not in _LABS:
        raise LabParamError(f"laboratorio desconocido {kind!r}; laboratorios disponibles: "
                            f"{', '.join(list_labs())}")
    return importlib.import_module(_LABS[kind]).SPEC


SEED_MAX = 2**64 - 1  # torch.manual_seed's upper bound


def check_seed(seed: Any) -> int:
    """A lab seed: an integer in [0, 2**64); LabParamError (Spanish) otherwise."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= SEED_MAX:
        raise LabParamError(f"seed debe ser un entero entre 0 y 2**64 - 1; se recibió {str(seed)[:40]}")
    return seed


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def run_lab(kind: str, seed: int = 0, profile: str | None = None, device: str | None = None,
            **params: Any) -> dict:
    """Run a lab and return its validated evidence contract (see ``contract.py``)."""
    spec = get_spec(kind)
    check_seed(seed)
    profile = resolve_profile(profile)
    resolved = spec.resolve_params(profile, params)
    dev = pick_device(device)
    seed_everything(seed)
    body = spec.run(seed=seed, profile=profile, params=resolved, device=dev)
    return assemble_contract(kind, seed, profile, resolved, body, dev)


def assemble_contract(kind: str, seed: int, profile: str, params: dict, body: dict,
                      device: torch.device | str | None = None) -> dict:
    """The validated contract around a lab's ``body`` (``results``, ``evidence``,
    ``limitations``, ``volatile_fields``, optional ``environment``), as ``run_lab`` returns it.

    A notebook that ran the lab's steps itself (with the student's functions plugged in) builds
    its contract with this instead of running everything again; ``params`` are checked as
    ``run_lab`` checks them.
    """
    check_seed(seed)
    profile = resolve_profile(profile)
    params = get_spec(kind).resolve_params(profile, params)
    dev = pick_device(device) if not isinstance(device, torch.device) else device
    body = dict(body)
    environment = describe(dev)
    environment["versions"]["ai_evolution"] = __version__
    environment.update(body.pop("environment", {}))
    contract = {
        "schema_version": 1,
        "kind": kind,
        "seed": seed,
        "profile": profile,
        "params": params,
        "environment": environment,
        **body,
    }
    contract.setdefault("volatile_fields", [])
    return validate_contract(contract)
