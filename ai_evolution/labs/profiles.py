"""Size profiles: how big a lab's workload is on the machine it runs on.

``ci``  : a 2-core CPU in continuous integration, about two minutes per notebook.
``cpu`` : a laptop's CPU.
``gpu`` : a GPU, from a Colab T4 to an H100/H200.

``None`` means: the ``AI_EVOLUTION_PROFILE`` environment variable if set (the book build and CI
set it to ``ci``), else ``gpu`` when CUDA is present, else ``cpu``.
"""

from __future__ import annotations

import os

import torch

PROFILES = ("ci", "cpu", "gpu")
ENV_VAR = "AI_EVOLUTION_PROFILE"


def resolve_profile(profile: str | None = None) -> str:
    if profile is None:
        profile = os.environ.get(ENV_VAR) or ("gpu" if torch.cuda.is_available() else "cpu")
    if profile not in PROFILES:
        raise ValueError(f"perfil desconocido {profile!r}; perfiles aceptados: {', '.join(PROFILES)}")
    return profile
