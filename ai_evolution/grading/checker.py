"""The checker: grades a submission's exercise functions without running any of its code.

``python -m ai_evolution.grading.checker`` reads one job from stdin (the assessment folder, the
seed, the grading secret and nonce, the lab's setup imports and the submission's definition
statements, see :mod:`.rebuild`) and answers on a private copy of its stdout, one JSON line per
event: ``begin`` (a criterion starts), ``criterion`` (its outcome) and ``done``.

This process is trusted: it loads the hidden checks, draws the cases from the secret, computes
the expected values with the freshly imported library, compares and scores. The student's
functions live in a separate, jailed *function worker* (:mod:`.worker`, started through
:mod:`.proxy`) that imports a copy of the library without the lab's graded references
(:mod:`.stripped`); the checks call them through proxies that exchange plain data only
(:mod:`.codec`). Nothing the submission defines ever runs here, so there is nothing here for it
to reach: no frame, no channel, no expected value, no module to patch.

For each criterion:

1. the graded name must be defined by the rebuilt statements, and its last definition must have
   passed the screen (:func:`.rebuild.screen`, which keeps exercise code to definitions);
2. the public and hidden checks run (:func:`.namespace.grade_function`) on the proxy; while it is
   checked, the worker binds the other graded names to stubs that call the library's
   references here (one wrong exercise costs only its own points);
3. the static delegation walk (:func:`.delegation.delegation`, run in the worker) is a flag for a
   human, not the defence: the references are not in the worker's library.

:func:`check_functions` is the grader's side: it runs checkers until every criterion has an
outcome, so a check that kills or hangs the checker loses only the criterion being checked.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from .namespace import _outcome, clean, grade_function

STATEMENT_LIMIT_S = 10.0


# --- the checker process -------------------------------------------------------------------------

class Channel:
    """Events for the grader, on this process's private stdout (no child inherits it)."""

    def __init__(self, fd: int):
        self.fd = fd

    def send(self, **event) -> None:
        from .sandbox import write_all

        data = json.dumps(event, ensure_ascii=False, allow_nan=True, default=str)
        write_all(self.fd, (data + "\n").encode("utf-8"))


def checker_main(job: dict | None = None) -> int:
    """One checker: the job from stdin (a fresh process) or as given (a fork of the zygote,
    :mod:`.zygote`, which has imported the modules below already)."""
    if job is None:
        job = json.loads(sys.stdin.buffer.read().decode("utf-8"))
    from .sandbox import private_stdout, set_limits

    channel = Channel(private_stdout())
    if os.environ.get("AI_EVOLUTION_MEMORY_MB"):
        set_limits(int(os.environ["AI_EVOLUTION_MEMORY_MB"]))
    import torch

    torch.set_num_threads(1)
    from . import stripped
    from .assessment import load_assessment, resolve_reference
    from .proxy import FunctionWorker, WorkerLost, assessment_redactor, clean_message, proxies

    assessment = load_assessment(job["assessment"])
    secret = bytes.fromhex(job["secret"]) if job.get("secret") else None
    ctx = assessment.context(int(job["seed"]), secret=secret, nonce=job.get("nonce", ""))
    criteria = [c for c in assessment.functions if c.id in set(job["only"])]
    library = Path(tempfile.mkdtemp(prefix="ai-evolution-lib-"))
    references = {c.name: resolve_reference(c.reference) for c in assessment.functions}
    worker_job = {"setup": job["setup"], "statements": job["statements"], "seed": ctx.seed,
                  "params": ctx.params, "memory_mb": job.get("memory_mb"),
                  "graded": [{"name": c.name, "reference": c.reference,
                              "delegates": list(c.delegates), "methods": list(c.methods)}
                             for c in assessment.functions]}
    worker = FunctionWorker(worker_job, library, job.get("isolation", "session"),
                            int(job.get("memory_mb") or 0), Path(job["log"]), references)
    rejected = job.get("rejected", {})
    redact = assessment_redactor(assessment)
    worker.redact = redact
    try:
        stripped.build(assessment, library)
        try:
            ready = worker.start()
        except WorkerLost as err:
            ready = {"kinds": {}, "failures": {c.name: f"el proceso con sus funciones no "
                                               f"arrancó ({err})" for c in criteria}}
        for c in criteria:
            channel.send(begin=c.id)
            flag = None
            if c.name in rejected:
                outcome = _outcome(False, f"no se corrigió: {rejected[c.name]}, que el corrector "
                                          "no permite en el código de un ejercicio.")
                flag = f"`{c.name}`: {rejected[c.name]}"
            elif c.name not in ready.get("kinds", {}):
                why = ready.get("failures", {}).get(c.name)
                outcome = _outcome(False, f"no se encontró `{c.name}` en el cuaderno: "
                                   + (f"{clean_message(why, redact)}." if why else
                                      "ninguna celda lo define (o cambió de nombre)."))
            elif ready["kinds"][c.name] not in ("function", "class"):
                outcome = _outcome(False, f"`{c.name}` no es una función ni una clase (es "
                                          f"{clean_message(ready['kinds'][c.name], redact, 60)}).")
            else:
                why = ready.get("delegation", {}).get(c.name)
                if why:
                    flag = (f"`{c.name}` parece delegar en la biblioteca "
                            f"({clean_message(why, redact)}); la referencia no está en el proceso "
                            "que ejecuta su código")
                try:
                    worker.begin(c.name)
                    ns = proxies(worker, assessment)
                    with contextlib.redirect_stdout(sys.stderr):
                        outcome = grade_function(ns, assessment, c, ctx, job.get("stage_limit_s"))
                except WorkerLost as err:
                    outcome = _outcome(False, str(err))
            channel.send(criterion=c.id, outcome=outcome, flag=flag)
    finally:
        worker.stop()
        shutil.rmtree(library, ignore_errors=True)
    channel.send(done=True)
    return 0


# --- the grader's side ---------------------------------------------------------------------------

def check_functions(assessment, seed: int, extract, stage_limit_s: float, memory_mb: int,
                    log_dir: Path, setup: list[str], secret: bytes | None = None,
                    nonce: str = "") -> tuple[dict, list[str]]:
    """Outcome per function criterion (``{id: {"passed", "message", ...}}``) and the flags,
    starting checkers until every criterion has one. The checker is trusted (it runs no
    submitted code) and is not jailed; the worker it starts is. Inside a grading run each
    checker is forked from the run's zygote (:mod:`.zygote`), else started as a new process."""
    from .sandbox import isolation, new_scratch, run_untrusted
    from .zygote import current as current_zygote

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
    log_dir.mkdir(parents=True, exist_ok=True)
    while remaining and attempts <= len(assessment.functions):
        attempts += 1
        job = {"assessment": str(assessment.folder), "seed": seed,
               "secret": secret.hex() if secret else None, "nonce": nonce,
               "stage_limit_s": stage_limit_s, "only": remaining, "setup": setup,
               "statements": [vars(s) for s in extract.statements], "rejected": rejected,
               "isolation": isolation(), "memory_mb": memory_mb,
               "log": str(log_dir / "functions.log")}
        state = {"current": None, "since": time.monotonic(), "done": False}
        events: list[dict] = []

        def on_line(line: bytes) -> None:
            try:
                event = json.loads(line)
            except ValueError:
                return
            if not isinstance(event, dict):
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
        data = json.dumps(job).encode("utf-8")
        zygote = current_zygote()

        def fork(env: dict, cwd: Path, log, zygote=zygote, data=data):
            try:
                return zygote.spawn(env, cwd, data, log) if zygote else None
            except OSError:  # the zygote is gone: a fresh process instead
                return None

        try:
            cmd = [sys.executable, "-P", "-m", "ai_evolution.grading.checker"]
            done = run_untrusted(cmd, data, scratch,
                                 timeout_s=startup_s + per_criterion_s * len(remaining),
                                 memory_mb=memory_mb, log_path=log_dir / "checker.log",
                                 on_line=on_line, stop=too_long, spawn=fork)
        finally:
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
