"""run_lab, the registry, the contract schema and the CLI."""

import dataclasses
import importlib
import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest

from ai_evolution.labs import (ContractError, LabParamError, get_spec, list_labs, resolve_profile,
                               run_lab, validate_contract, without_volatile)

ROOT = Path(__file__).resolve().parents[1]
# A small but complete run of the kv_cache lab (a few seconds on 2 cores).
FAST = dict(max_new_tokens=24, repeats=1, exactness_tokens=6, batch_size=2)


@pytest.fixture(scope="module")
def contract():
    return run_lab("kv_cache", seed=3, profile="ci", **FAST)


def test_contract_has_the_required_fields(contract):
    for key in ("kind", "seed", "params", "environment", "results", "evidence", "limitations"):
        assert key in contract
    assert contract["kind"] == "kv_cache" and contract["seed"] == 3
    assert contract["params"]["max_new_tokens"] == 24


def test_kv_cache_lab_reports_exactness_and_matching_cache_bytes(contract):
    r = contract["results"]
    assert r["exactness"]["identical_greedy_tokens"] is True
    assert r["model"]["cache_bytes_allocated"] == r["model"]["cache_bytes_predicted"]
    assert r["worked_examples"]["h100_llama31_8b_bf16"]["static_slots_4096"] == 116
    assert len(r["timing"]["step_ms_cached"]) == 24


def test_evidence_statements_use_decimal_comma(contract):
    text = " ".join(e["statement"] for e in contract["evidence"])
    assert "85,5 GB" in text and "85.5" not in text


def test_unknown_kind_lists_known_kinds():
    with pytest.raises(LabParamError, match="kv_cache"):
        run_lab("no_such_lab")


def test_unknown_parameter_lists_accepted_ones():
    with pytest.raises(LabParamError, match="max_new_tokens"):
        run_lab("kv_cache", profile="ci", max_new_token=3)


@pytest.mark.parametrize("name,value,accepted", [("model", "gpt-5", "tiny-es"),
                                                 ("repeats", 0, ">= 1"),
                                                 ("prompt_len", "veinte", "int")])
def test_bad_parameter_value_names_accepted_values(name, value, accepted):
    with pytest.raises(LabParamError, match=name) as err:
        run_lab("kv_cache", profile="ci", **{name: value})
    assert accepted in str(err.value)


def test_bad_profile_names_accepted_profiles():
    with pytest.raises(ValueError, match="ci, cpu, gpu"):
        resolve_profile("tpu")


def test_profile_comes_from_environment(monkeypatch):
    monkeypatch.setenv("AI_EVOLUTION_PROFILE", "ci")
    assert resolve_profile(None) == "ci"


def test_schema_rejects_contract_without_evidence(contract):
    broken = dict(contract, evidence=[])
    with pytest.raises(ContractError, match="evidence"):
        validate_contract(broken)


def test_schema_rejects_missing_volatile_path(contract):
    with pytest.raises(ContractError, match="results.nope"):
        validate_contract(dict(contract, volatile_fields=["results.nope"]))


def test_schema_rejects_incomplete_student_extension(contract):
    with pytest.raises(ContractError, match="student_extension"):
        validate_contract(dict(contract, student_extension={"assumption": "algo largo aquí"}))


@pytest.mark.slow  # a whole lab, a long soak or a sampling statistic: `make test` only
def test_lab_py_twice_with_one_seed_gives_the_same_contract(tmp_path):
    outs = []
    for i in range(2):
        out = tmp_path / f"c{i}.json"
        args = [sys.executable, str(ROOT / "labs/02-kv-cache/lab.py"), "--seed", "5",
                "--profile", "ci", "--json", str(out)]
        args += [f"--set={k}={v}" for k, v in FAST.items()]
        subprocess.run(args, check=True, capture_output=True, cwd=ROOT)
        outs.append(json.loads(out.read_text()))
    assert without_volatile(outs[0]) == without_volatile(outs[1])
    # ...and the volatile part really holds the timings
    assert "timing" in outs[0]["results"] and "timing" not in without_volatile(outs[0])["results"]


def test_cli_reports_bad_parameter_with_exit_code_2():
    proc = subprocess.run([sys.executable, "-m", "ai_evolution.labs", "run", "kv_cache",
                           "--set", "repeats=-1"], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2
    assert "repeats" in proc.stderr and ">= 1" in proc.stderr


def test_list_labs_includes_kv_cache():
    assert "kv_cache" in list_labs()


# --- one shape for every lab: measurements -> Findings -> report(findings) ------------------------
def lab_module(kind: str):
    return importlib.import_module(get_spec(kind).run.__module__)


@pytest.mark.parametrize("kind", list_labs())
def test_every_lab_reports_from_one_frozen_findings(kind):
    mod = lab_module(kind)
    assert dataclasses.is_dataclass(mod.Findings) and mod.Findings.__dataclass_params__.frozen
    params = list(inspect.signature(mod.report).parameters.values())
    assert len(params) == 1 and params[0].annotation in ("Findings", mod.Findings), kind


@pytest.mark.parametrize("kind", list_labs())
def test_every_lab_names_its_claims_and_criteria_alike(kind):
    """Claims come from ``verdicts``-named functions and criteria from ``CRITERIA``, in every lab:
    the words of one lab (``EXPECTATIONS``, ``claims_of``) do not come back."""
    mod = lab_module(kind)
    names = set(vars(mod))
    assert not names & {"EXPECTATIONS", "expectations", "expectations_sentence", "claims_of",
                        "chapter_criteria"}, kind
    if "criteria_sentence" in names:
        keys = [key for key, _ in mod.CRITERIA]
        assert hasattr(mod.Findings, "criteria_met") and len(set(keys)) == len(keys)
