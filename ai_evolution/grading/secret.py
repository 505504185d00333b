"""The grading secret and the run's nonce: where the hidden cases come from.

Hidden cases are drawn from HMAC(secret, lab + nonce + seed + label)
(:func:`.assessment.derive`). The instructor keeps the secret (``--secret-file PATH`` or the
environment variable ``AI_EVOLUTION_GRADING_SECRET``); the nonce is random for each run unless
given (``--nonce`` or ``AI_EVOLUTION_GRADING_NONCE``) and is written to ``run.json`` beside the
gradebook, with a fingerprint of the secret (never the secret): the same folder, secret and nonce
give the same gradebook.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

SECRET_ENV = "AI_EVOLUTION_GRADING_SECRET"
NONCE_ENV = "AI_EVOLUTION_GRADING_NONCE"
GENERATED_WARNING = ("aviso: no se dio un secreto de corrección (--secret-file o la variable "
                     f"{SECRET_ENV}); se generó uno solo para esta ejecución: los casos ocultos "
                     "no se podrán reproducir.")


@dataclass(frozen=True)
class RunSecret:
    secret: bytes
    source: str     # "archivo" | "entorno" | "generado"
    nonce: str

    @property
    def fingerprint(self) -> str:
        """Names the secret in ``run.json`` without revealing it."""
        return hashlib.sha256(b"ai-evolution-grading\x00" + self.secret).hexdigest()[:16]

    def record(self, kind: str, seed: int) -> str:
        return json.dumps({"lab": kind, "seed": seed, "nonce": self.nonce,
                           "secret_source": self.source,
                           "secret_fingerprint": self.fingerprint},
                          ensure_ascii=False, indent=1) + "\n"


class SecretError(ValueError):
    """A secret file or nonce that cannot be used (Spanish message)."""


def resolve(secret_file: str | Path | None = None, nonce: str | None = None) -> RunSecret:
    """The secret (file, else environment, else generated for this run) and the nonce (given,
    else environment, else random). SecretError for an unreadable or empty file, or a nonce
    that is empty, too long or not printable."""
    if secret_file is not None:
        try:
            secret = Path(secret_file).read_bytes().strip()
        except FileNotFoundError:
            raise SecretError(f"no se puede leer el secreto: --secret-file {secret_file} no "
                              "existe") from None
        except PermissionError:
            raise SecretError(f"no se puede leer el secreto: sin permiso de lectura sobre "
                              f"--secret-file {secret_file}") from None
        except OSError as err:
            raise SecretError(f"no se puede leer el secreto de --secret-file {secret_file} "
                              f"(error {err.errno})") from None
        if not secret:
            raise SecretError(f"el archivo de secreto {secret_file} está vacío")
        source = "archivo"
    elif os.environ.get(SECRET_ENV):
        secret, source = os.environ[SECRET_ENV].encode("utf-8"), "entorno"
    else:
        secret, source = secrets.token_bytes(32), "generado"
    nonce = nonce if nonce is not None else os.environ.get(NONCE_ENV) or secrets.token_hex(8)
    if not nonce or len(nonce) > 200 or not nonce.isprintable():
        raise SecretError("--nonce espera un texto imprimible de 1 a 200 caracteres")
    return RunSecret(secret, source, nonce)
