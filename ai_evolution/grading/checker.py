"""The checker: grades a submission's exercise functions in a fresh interpreter of its own.

``python -m ai_evolution.grading.checker`` reads one job from stdin (the assessment folder, the
seed, the lab's setup imports and the submission's screened definition statements, see
:mod:`.rebuild`) and answers on a private copy of its stdout, one authenticated JSON line per
event: ``begin`` (a criterion starts), ``criterion`` (its outcome) and ``done``. Each line
carries an HMAC with the key the grader sent on stdin, so a line printed by the student's code
is not taken as a result.

For each criterion, in this process and against the freshly imported library:

1. the graded name must be defined by the rebuilt statements, and its last definition must have
   passed the screen;
2. it must not delegate to the library's reference (:func:`.rebuild.delegation`);
3. the public and hidden checks run (:func:`.kernel.grade_function`), with the other graded
   names bound to the library's references;
4. the library's modules must be exactly as they were before the submission's code ran
   (:func:`fingerprint`); otherwise the criterion scores 0 and the process stops (the grader
   starts a fresh checker for the criteria left).

:func:`check_functions` is the grader's side: it runs checkers until every criterion has an
outcome, so a submission whose function kills, stops or hangs the checker loses only the
criterion that was being checked.
"""

from __future__ import annotations

import builtins
import contextlib
import hashlib
import hmac
import json
import os
import secrets
import sys
import time
import types
from pathlib import Path

from .kernel import _outcome, _time_limit, clean, grade_function

STATEMENT_LIMIT_S = 10.0
_WATCHED = ("builtins", "math", "numpy", "torch", "json", "hmac", "os", "sys", "functools")


# --- integrity -----------------------------------------------------------------------------------

def fingerprint() -> dict[tuple[str, str], int]:
    """id() of every attribute of the library's modules and classes (and a few modules the
    checks use): a submission that replaces one changes the fingerprint."""
    out: dict[tuple[str, str], int] = {}
    for name, module in list(sys.modules.items()):
        if not isinstance(module, types.ModuleType):
            continue
        if not (name == "ai_evolution" or name.startswith("ai_evolution.") or name in _WATCHED
                or name.startswith("_ai_evolution_hidden_")):
            continue
        for attr, value in list(vars(module).items()):
            if value is None:
                continue  # lazily initialised module state
            out[(name, attr)] = id(value)
            if isinstance(value, type) and getattr(value, "__module__", "") == name:
                for key, member in list(vars(value).items()):
                    out[(f"{name}.{attr}", key)] = id(member)
    tensor = sys.modules.get("torch")
    if tensor is not None:
        for key, member in list(vars(tensor.Tensor).items()):
            out[("torch.Tensor", key)] = id(member)
    return out


def changed(before: dict, after: dict) -> list[str]:
    return sorted(f"{mod}.{attr}" for (mod, attr), ident in before.items()
                  if after.get((mod, attr)) != ident)


# --- the checker process -------------------------------------------------------------------------

class Channel:
    def __init__(self, fd: int, key: bytes):
        self.fd, self.key = fd, key

    def send(self, **event) -> None:
        from .sandbox import write_all

        data = json.dumps(event, ensure_ascii=False, allow_nan=True, default=str)
        mac = hmac.new(self.key, data.encode("utf-8"), hashlib.sha256).hexdigest()
        write_all(self.fd, (json.dumps({"d": data, "m": mac}) + "\n").encode("utf-8"))


def build_namespace(job: dict, assessment, ctx) -> tuple[dict, dict[str, str]]:
    """The lab's setup imports, then the submission's statements, one by one; returns the
    namespace and, for names whose definition failed, why (Spanish)."""
    ns: dict = {"__name__": "entrega", "__builtins__": builtins, "seed": ctx.seed,
                "profile": "ci", "params": ctx.params}
    for line in job["setup"]:
        exec(compile(line, "<preparación del laboratorio>", "exec"), ns)  # noqa: S102
    failures: dict[str, str] = {}
    for stmt in job["statements"]:
        code = compile(stmt["source"], f"<celda {stmt['cell']}>", "exec")
        try:
            with _time_limit(STATEMENT_LIMIT_S):
                exec(code, ns)  # noqa: S102 - screened submission code, in this sandbox
            for name in stmt["defines"]:
                failures.pop(name, None)
        except BaseException as err:  # noqa: BLE001 - SystemExit too: the checker goes on
            why = f"la definición de la celda {stmt['cell']} falló ({type(err).__name__}: " \
                  f"{clean(err, 200)})"
            for name in stmt["defines"]:
                failures[name] = why
    return ns, failures


def checker_main() -> int:
    job = json.loads(sys.stdin.buffer.read().decode("utf-8"))
    from .sandbox import private_stdout, set_limits

    channel = Channel(private_stdout(), bytes.fromhex(job.pop("key")))
    if os.environ.get("AI_EVOLUTION_MEMORY_MB"):
        set_limits(int(os.environ["AI_EVOLUTION_MEMORY_MB"]))
    import torch

    torch.set_num_threads(1)
    from .assessment import load_assessment, resolve_reference
    from .rebuild import delegation, forbidden_for

    assessment = load_assessment(job["assessment"])
    ctx = assessment.context(int(job["seed"]))
    criteria = [c for c in assessment.functions if c.id in set(job["only"])]
    forbidden = {c.id: forbidden_for(c, resolve_reference) for c in criteria}
    with contextlib.redirect_stdout(sys.stderr):
        ctx.model()  # loaded before the snapshot: loading imports modules of its own
    for c in assessment.functions:
        resolve_reference(c.reference)
    before = fingerprint()
    ns, failures = build_namespace(job, assessment, ctx)
    touched = changed(before, fingerprint())
    rejected = job.get("rejected", {})
    for c in criteria:
        channel.send(begin=c.id)
        flag = None
        if touched:
            outcome = _outcome(False, "el código del cuaderno modificó la biblioteca al "
                                      f"definirse ({', '.join(touched[:3])}); no se corrige.")
            flag = outcome["message"]
        elif c.name in rejected:
            outcome = _outcome(False, f"no se corrigió: {rejected[c.name]}, que el corrector no "
                                      "permite en el código de un ejercicio.")
            flag = f"`{c.name}`: {rejected[c.name]}"
        elif c.name not in ns:
            why = failures.get(c.name)
            outcome = _outcome(False, f"no se encontró `{c.name}` en el cuaderno: "
                               + (f"{why}." if why else "ninguna celda lo define (o cambió de "
                                                        "nombre)."))
        else:
            reason = delegation(ns[c.name], forbidden[c.id], c.methods)
            if reason:
                outcome = _outcome(False, f"delega en la biblioteca: `{c.name}` {reason}. "
                                          "Un ejercicio se puntúa por el código que usted "
                                          "escribe.")
                flag = f"`{c.name}` delega en la biblioteca ({reason})"
            else:
                with contextlib.redirect_stdout(sys.stderr):
                    outcome = grade_function(ns, assessment, c, ctx, job.get("stage_limit_s"))
                after = changed(before, fingerprint())
                if after:
                    outcome = _outcome(False, "el código del ejercicio modificó la biblioteca "
                                              f"mientras se corregía ({', '.join(after[:3])}).")
                    channel.send(criterion=c.id, outcome=outcome, flag=outcome["message"])
                    return 3
        channel.send(criterion=c.id, outcome=outcome, flag=flag)
    channel.send(done=True)
    return 0


# --- the grader's side ---------------------------------------------------------------------------

def check_functions(assessment, seed: int, extract, stage_limit_s: float, memory_mb: int,
                    log_dir: Path, setup: list[str]) -> tuple[dict, list[str]]:
    """Outcome per function criterion (``{id: {"passed", "message", ...}}``) and the flags,
    running fresh checker processes until every criterion has one."""
    from .sandbox import command, isolation, new_scratch, run_untrusted

    rejected: dict[str, str] = {}
    for r in extract.rejected:  # the last definition of a name decides, as in the kernel
        for name in r.defines:
            rejected[name] = f"la celda {r.cell} {r.reason}"
    last_ok = {n: s.cell for s in extract.statements for n in s.defines}
    last_bad = {n: r.cell for r in extract.rejected for n in r.defines}
    rejected = {n: why for n, why in rejected.items() if last_bad[n] >= last_ok.get(n, 0)}
    remaining = [c.id for c in assessment.functions]
    results: dict[str, dict] = {}
    flags: list[str] = []
    per_criterion_s = 3 * (stage_limit_s or 120) + 30
    startup_s = 240 + STATEMENT_LIMIT_S * len(extract.statements)
    attempts = 0
    while remaining and attempts <= len(assessment.functions):
        attempts += 1
        key = secrets.token_bytes(32)
        job = {"key": key.hex(), "assessment": str(assessment.folder), "seed": seed,
               "stage_limit_s": stage_limit_s, "only": remaining, "setup": setup,
               "statements": [vars(s) for s in extract.statements], "rejected": rejected}
        state = {"current": None, "since": time.monotonic(), "done": False}
        events: list[dict] = []

        def on_line(line: bytes) -> None:
            try:
                wrapper = json.loads(line)
                data = wrapper["d"]
                mac = hmac.new(key, data.encode("utf-8"), hashlib.sha256).hexdigest()
                if not hmac.compare_digest(mac, str(wrapper["m"])):
                    return
                event = json.loads(data)
            except (ValueError, KeyError, TypeError):
                return
            events.append(event)
            if "begin" in event:
                state["current"], state["since"] = event["begin"], time.monotonic()
            elif "criterion" in event:
                state["current"], state["since"] = None, time.monotonic()
            elif event.get("done"):
                state["done"] = True

        def too_long() -> bool:
            limit = per_criterion_s if state["current"] else startup_s
            return time.monotonic() - state["since"] > limit

        scratch = new_scratch()
        try:
            cmd = command("ai_evolution.grading.checker", scratch, isolation(),
                          readonly=[Path(assessment.folder)])
            done = run_untrusted(cmd, json.dumps(job).encode("utf-8"), scratch,
                                 timeout_s=startup_s + per_criterion_s * len(remaining),
                                 memory_mb=memory_mb, log_path=log_dir / "checker.log",
                                 on_line=on_line, stop=too_long)
        finally:
            import shutil

            shutil.rmtree(scratch, ignore_errors=True)
        for event in events:
            if "criterion" in event and event["criterion"] in remaining:
                results[event["criterion"]] = event["outcome"]
                remaining.remove(event["criterion"])
                if event.get("flag"):
                    flags.append(clean(event["flag"], 300))
        if done.killed == "budget":  # the submission's wall clock is spent: no restart
            from .sandbox import budget_reason

            results |= {cid: _outcome(False, budget_reason()) for cid in remaining}
            remaining = []
            break
        current = state["current"]
        if current in remaining:
            if done.killed == "timeout":
                why = (f"la corrección de este ejercicio superó {per_criterion_s:g} s y se "
                       "detuvo (¿un bucle que no termina?).")
            elif done.killed == "memory":
                why = f"la corrección de este ejercicio superó {memory_mb} MiB de memoria."
            elif done.killed == "stopped":
                why = "el código de este ejercicio detuvo el proceso de corrección (SIGSTOP)."
            else:
                why = ("el proceso de corrección terminó mientras se corregía este ejercicio "
                       "(¿su código termina el proceso o agota la memoria?).")
            results[current] = _outcome(False, why)
            remaining.remove(current)
        elif remaining and not any("begin" in e for e in events):
            tail = ""
            try:
                tail = (log_dir / "checker.log").read_text(encoding="utf-8", errors="replace")
                tail = clean(tail.strip().splitlines()[-1], 200) if tail.strip() else ""
            except OSError:
                pass
            for cid in remaining:
                results[cid] = _outcome(False, "error interno del corrector al preparar las "
                                               f"comprobaciones{': ' + tail if tail else '.'}")
            remaining = []
    for cid in remaining:
        results[cid] = _outcome(False, "la corrección no llegó a este ejercicio.")
    return results, flags


if __name__ == "__main__":
    sys.exit(checker_main())
