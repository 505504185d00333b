"""The reference answers live in one package, ``ai_evolution.reference``: self-checks, labs and
hidden checks import them from there, and checks and labs never import each other."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

import ai_evolution
from ai_evolution.grading.assessment import resolve_reference

PACKAGE = Path(ai_evolution.__file__).resolve().parent
ROOT = PACKAGE.parent


def imported_modules(path: Path, root: Path = ROOT) -> set[str]:
    """Every module ``path`` imports, anywhere in the file (function-local imports too),
    as absolute dotted names (``root`` holds the top package)."""
    package = ".".join(path.relative_to(root).with_suffix("").parts[:-1])
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[:len(parts) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)
    return out


def imports_of(folder: Path, root: Path = ROOT) -> dict[str, set[str]]:
    return {p.relative_to(root).as_posix(): imported_modules(p, root)
            for p in sorted(folder.glob("*.py"))}


def reaching(imports: dict[str, set[str]], *targets: str) -> list[str]:
    return sorted(f"{path} -> {m}" for path, modules in imports.items() for m in modules
                  if any(m == t or m.startswith(t + ".") for t in targets))


def test_the_import_scan_sees_relative_and_function_local_imports(tmp_path):
    checks = tmp_path / "ai_evolution" / "checks"
    checks.mkdir(parents=True)
    (checks / "probe.py").write_text(
        "from ..labs import x\n"
        "def f():\n    from ..labs.continuous_batching import simulate\n"
        "import ai_evolution.checks.roofline\n", encoding="utf-8")
    found = reaching(imports_of(checks, tmp_path), "ai_evolution.labs", "ai_evolution.checks")
    assert found == ["ai_evolution/checks/probe.py -> ai_evolution.checks.roofline",
                     "ai_evolution/checks/probe.py -> ai_evolution.labs",
                     "ai_evolution/checks/probe.py -> ai_evolution.labs.continuous_batching",
                     "ai_evolution/checks/probe.py -> ai_evolution.labs.continuous_batching.simulate",
                     "ai_evolution/checks/probe.py -> ai_evolution.labs.x"]


def test_checks_do_not_import_labs():
    assert reaching(imports_of(PACKAGE / "checks"), "ai_evolution.labs") == []


def test_labs_do_not_import_checks():
    assert reaching(imports_of(PACKAGE / "labs"), "ai_evolution.checks") == []


def test_the_reference_package_imports_neither_checks_nor_labs_nor_the_grader():
    assert reaching(imports_of(PACKAGE / "reference"), "ai_evolution.checks", "ai_evolution.labs",
                    "ai_evolution.grading") == []


def rubric_references() -> list[tuple[str, str]]:
    out = []
    for rubric in sorted((ROOT / "assessments").glob("*/rubric.json")):
        for c in json.loads(rubric.read_text(encoding="utf-8"))["criteria"]:
            for ref in [c.get("reference"), *c.get("delegates", ())]:
                if ref:
                    out.append((rubric.parent.name, ref))
    return out


@pytest.mark.parametrize("lab, ref", rubric_references())
def test_no_rubric_reference_lives_in_checks_or_labs(lab, ref):
    """A reference answer lives in ``ai_evolution.reference`` (or is the library piece the
    exercise rebuilds); a lab's measurement may be an equivalent (``delegates``), never the
    reference."""
    module = ref.partition(":")[0]
    assert not module.startswith("ai_evolution.checks"), ref
    resolve_reference(ref)  # it exists


def test_checks_and_hidden_checks_use_the_reference_package():
    from ai_evolution.checks import roofline as checks_roofline
    from ai_evolution.reference import roofline

    assert checks_roofline.reference_decode_roofline is roofline.reference_decode_roofline
    for hidden in sorted((ROOT / "assessments").glob("*/hidden_checks.py")):
        text = hidden.read_text(encoding="utf-8")
        assert "checks.reference_" not in text and "checks._reference" not in text, hidden


@pytest.mark.slow  # the lab's whole datacenter simulation: `make test` only
def test_the_challenge_gains_are_the_labs_own_datacenter_simulation():
    """The reference of lab 3's challenge simulates what the lab's section 6 simulates: the same
    workload and engine give the same gains, to the last bit."""
    from ai_evolution.hardware import get_device_spec
    from ai_evolution.labs import get_spec
    from ai_evolution.labs.continuous_batching import simulate, workload
    from ai_evolution.metrics import summarize
    from ai_evolution.model import get_preset
    from ai_evolution.reference.continuous_batching import CHALLENGE_WIDTHS, simulated_gains
    from ai_evolution.sim import RooflineCostModel

    p = get_spec("continuous_batching").resolve_params("ci", {})
    cap, max_cap = p["dc_caps"][-1], max(p["dc_caps"])
    gpu, big = get_device_spec(p["dc_device"]), get_preset(p["dc_model"])
    dtype = "bf16" if "bf16" in gpu.peak_flops else "fp16"
    cost = RooflineCostModel.from_device_spec(gpu, dtype)
    items = workload(p["dc_requests"], p["dc_prompt_len"], p["dc_mean_output"], cap,
                     big.vocab_size, 0)
    lab = {}
    for b in CHALLENGE_WIDTHS:
        tput = {policy: summarize(simulate(big, cost, items, policy, b,
                                           p["dc_prompt_len"] + max_cap, dtype)[0])
                ["throughput_tok_s"] for policy in ("static", "continuous")}
        lab[b] = tput["continuous"] / tput["static"]
    assert simulated_gains(p["dc_device"], p["dc_model"], p["dc_requests"], p["dc_prompt_len"],
                           p["dc_mean_output"], cap, max_cap, 0) == lab
