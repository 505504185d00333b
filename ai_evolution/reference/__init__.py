"""The reference answers: what each student exercise is compared against, in one package.

One module per lab (``roofline``, ``kv_cache``, ...). The self-checks (``ai_evolution.checks``),
the labs (``ai_evolution.labs``, whose measurements run with the library's answer when no
student function is plugged in) and the autograder's hidden checks
(``assessments/*/hidden_checks.py``) import their references from here; checks and labs never
import each other.

Exercises whose answer *is* a piece of the library (the engine's ``BlockPool``, the model's
``cached_attention``, ``metrics.percentile``...) keep that piece where the library uses it;
this package holds the answers that exist only to be compared against.

The jailed function worker of the autograder imports a copy of the library in which every
function of this package raises ``NotImplementedError`` (``ai_evolution.grading.stripped``).
"""
