"""ai_evolution: the library behind the course "Servir un LLM"."""

__version__ = "0.1.0"
