"""Device and dtype selection, and the machine facts a contract records."""

import pytest
import torch

from ai_evolution import hardware


def test_picks_cuda_when_present_else_cpu_or_mps():
    dev = hardware.pick_device()
    if torch.cuda.is_available():
        assert dev.type == "cuda"
    else:
        assert dev.type in ("cpu", "mps")


def test_asking_for_missing_cuda_is_a_clear_error():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ValueError, match="cuda"):
        hardware.pick_device("cuda")


def test_unknown_device_names_accepted_ones():
    with pytest.raises(ValueError, match="cuda, mps, cpu"):
        hardware.pick_device("tpu")


def test_cpu_serves_fp32_by_default_and_lists_bf16():
    assert hardware.default_dtype("cpu") == torch.float32
    assert "float32" in hardware.supported_dtypes("cpu")


def test_t4_like_gpu_falls_back_to_fp16(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: False)
    assert hardware.supported_dtypes("cuda") == ["float32", "float16"]
    assert hardware.default_dtype("cuda") == torch.float16


def test_describe_names_device_and_versions():
    env = hardware.describe("cpu")
    assert env["device"] == "cpu" and env["versions"]["torch"] == torch.__version__
    assert env["cpu_count"] >= 1
