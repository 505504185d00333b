"""ai_evolution: the library behind the course "Servir un LLM"."""

# The one place the version lives: pyproject.toml reads it (dynamic version), `make release
# VERSION=...` writes it, and the course's tag is "v" + this string.
__version__ = "0.1.0"


def library_version() -> str:
    """The version of this library (``__version__``): what a contract or a gradebook records."""
    return __version__
