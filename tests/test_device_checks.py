"""scripts/device_checks.py: the one script a session lent a GPU runs. On the CPU, small."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import device_checks  # noqa: E402


@pytest.mark.slow  # a whole lab, a long soak or a sampling statistic: `make test` only
def test_every_check_passes_on_the_cpu_and_prints_a_row(capsys, one_thread):
    assert device_checks.main(["--device", "cpu", "--quick", "--no-hf"]) == 0
    out = capsys.readouterr().out
    for name in ("probes", "exact-float32", "exact-bfloat16", "batch-invariant-float16",
                 "batch-invariant-bfloat16", "kv-int8", "speculative",
                 "quant-int8", "quant-int4", "flash", "graphs-float32", "graphs-bfloat16",
                 "server", "bench-b1", "bench-throughput", "tensor-parallel-2"):
        assert f"\n{name} " in out and "FAIL" not in out
    assert "16 of 16 checks passed" in out
    assert "decode steps through eager graphs" in out and "of the floor" in out


def test_a_failing_check_is_reported_and_the_others_still_run(capsys, monkeypatch, one_thread):
    """The runner's isolation: the other checks are stand-ins that answer at once (the real
    ones run in the test above)."""
    def broken(device, quick):
        raise RuntimeError("sonda rota")

    for name in ("check_exact", "check_batch_invariant", "check_kv_int8", "check_speculative", "check_quant", "check_flash",
                 "check_graphs", "check_server", "check_bench_b1", "check_bench_throughput",
                 "check_tensor_parallel"):
        monkeypatch.setattr(device_checks, name, lambda *args, name=name: f"{name} sustituido")
    monkeypatch.setattr(device_checks, "check_probes", broken)
    assert device_checks.main(["--device", "cpu", "--quick", "--no-hf"]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "RuntimeError: sonda rota" in out
    assert "exact-float32             ok" in out and "15 of 16 checks passed" in out
    assert out.count("sustituido") == 15  # every other check ran after the failing one


def test_a_check_this_machine_cannot_run_is_skipped_with_its_reason(capsys, monkeypatch):
    """The tensor-parallel row on a machine with one GPU: skipped, said why, not failed."""
    monkeypatch.setattr(device_checks.torch.cuda, "device_count", lambda: 1)
    with pytest.raises(device_checks.SkipCheck, match="needs 2 GPUs .* has 1"):
        device_checks.check_tensor_parallel(device_checks.torch.device("cuda"), quick=True)
    for name in ("check_probes", "check_exact", "check_batch_invariant", "check_kv_int8",
                 "check_speculative", "check_quant", "check_flash", "check_graphs", "check_server",
                 "check_bench_b1", "check_bench_throughput"):
        monkeypatch.setattr(device_checks, name, lambda *args, name=name: f"{name} sustituido")

    def one_gpu(device, quick):
        raise device_checks.SkipCheck("needs 2 GPUs for tensor_parallel_size=2; this machine has 1")

    monkeypatch.setattr(device_checks, "check_tensor_parallel", one_gpu)
    assert device_checks.main(["--device", "cpu", "--quick", "--no-hf"]) == 0
    out = capsys.readouterr().out
    assert "tensor-parallel-2         skip" in out and "this machine has 1" in out
    assert "15 of 16 checks passed, 1 skipped" in out


def test_an_unknown_lab_kind_is_refused_with_the_accepted_ones(capsys):
    with pytest.raises(SystemExit):
        device_checks.main(["--device", "cpu", "--labs", "kv_cach"])
    err = capsys.readouterr().err
    assert "kv_cach" in err and "kv_cache" in err


def test_the_benchmark_rows_compare_with_transformers_on_the_cpu(one_thread):
    """The `transformers` side of the benchmark rows (left out above by --no-hf), small."""
    cpu = device_checks.torch.device("cpu")
    b1 = device_checks.check_bench_b1(cpu, quick=True, with_hf=True)
    assert b1.count("tok/s") == 3 and "hf " in b1 and "of the floor" in b1
    rate = device_checks.check_bench_throughput(cpu, quick=True, with_hf=True)
    assert "ours " in rate and "transformers " in rate and "first 8" in rate
