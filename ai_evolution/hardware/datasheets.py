"""What vendors publish for accelerators the reader may not have (``DEVICE_PRESETS``), each
with its source, so the simulator can replay a run "at H100 scale"."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DeviceSpec:
    """What a vendor publishes about an accelerator, in SI units.

    ``memory_bytes`` and ``bandwidth_bytes_per_s`` use powers of ten (80 GB = 80e9 bytes,
    3,35 TB/s = 3.35e12 bytes/s). ``peak_flops`` maps a dtype name ('fp32', 'tf32', 'fp16',
    'bf16', 'fp8', 'int8') to the DENSE peak in FLOP/s (OP/s for int8); datasheets often print
    the "with sparsity" figure, which is twice the dense one and which no dense GEMM reaches.
    Only dtypes the source publishes are present.

    Interconnect (chapter 13), PER DIRECTION, as a ring all-reduce uses it (each GPU sends and
    receives at once): ``nvlink_bytes_per_s`` (None without NVLink) and ``pcie_bytes_per_s``
    (the GPU's PCIe link). Datasheets print the bidirectional total (H100 SXM: "NVLink 900 GB/s,
    PCIe Gen5 128 GB/s"); the per-direction figure is half of it.
    """

    name: str
    memory_bytes: float
    bandwidth_bytes_per_s: float
    peak_flops: dict[str, float]
    has_bf16: bool
    source: str
    notes: str = ""
    nvlink_bytes_per_s: float | None = None
    pcie_bytes_per_s: float | None = None
    interconnect_source: str = ""


_HOPPER_FLOPS = {  # H100 SXM and H200 share the same GH100 compute
    "fp32": 67e12, "tf32": 494.7e12, "bf16": 989e12, "fp16": 989e12, "fp8": 1979e12,
    "int8": 1979e12,
}

DEVICE_PRESETS: dict[str, DeviceSpec] = {
    "h100-sxm": DeviceSpec(
        name="NVIDIA H100 SXM5 80GB",
        memory_bytes=80e9,
        bandwidth_bytes_per_s=3.35e12,
        peak_flops=dict(_HOPPER_FLOPS),
        has_bf16=True,
        source="https://www.nvidia.com/en-us/data-center/h100/ (H100 SXM datasheet)",
        notes="HBM3. The datasheet prints 1979 TFLOP/s bf16/fp16 and 3958 fp8 *with sparsity*; "
              "dense figures are half of those.",
        nvlink_bytes_per_s=450e9,
        pcie_bytes_per_s=64e9,
        interconnect_source="H100 SXM datasheet: NVLink 900 GB/s and PCIe Gen5 128 GB/s, both "
                            "bidirectional totals; halved here to per direction",
    ),
    "h200": DeviceSpec(
        name="NVIDIA H200 SXM 141GB",
        memory_bytes=141e9,
        bandwidth_bytes_per_s=4.8e12,
        peak_flops=dict(_HOPPER_FLOPS),
        has_bf16=True,
        source="https://www.nvidia.com/en-us/data-center/h200/ (H200 datasheet)",
        notes="HBM3e. Same compute as the H100 SXM: more and faster memory only, so it helps "
              "bandwidth-bound decode, not compute-bound prefill.",
        nvlink_bytes_per_s=450e9,
        pcie_bytes_per_s=64e9,
        interconnect_source="H200 datasheet: NVLink 900 GB/s and PCIe Gen5 128 GB/s, both "
                            "bidirectional totals; halved here to per direction",
    ),
    "a100-80gb": DeviceSpec(
        name="NVIDIA A100 80GB SXM",
        memory_bytes=80e9,
        bandwidth_bytes_per_s=2.039e12,
        peak_flops={"fp32": 19.5e12, "tf32": 156e12, "bf16": 312e12, "fp16": 312e12,
                    "int8": 624e12},
        has_bf16=True,
        source="https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
               "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf",
        notes="HBM2e; 2039 GB/s is the SXM figure (the PCIe card has 1935 GB/s). "
              "Sparsity doubles the tensor-core figures on the datasheet.",
        nvlink_bytes_per_s=300e9,
        pcie_bytes_per_s=32e9,
        interconnect_source="A100 datasheet: NVLink 600 GB/s and PCIe Gen4 64 GB/s, both "
                            "bidirectional totals; halved here to per direction",
    ),
    "l4": DeviceSpec(
        name="NVIDIA L4",
        memory_bytes=24e9,
        bandwidth_bytes_per_s=300e9,
        peak_flops={"fp32": 30.3e12, "tf32": 60e12, "bf16": 121e12, "fp16": 121e12,
                    "fp8": 242.5e12, "int8": 242.5e12},
        has_bf16=True,
        source="https://www.nvidia.com/en-us/data-center/l4/ (L4 datasheet)",
        notes="GDDR6. The datasheet prints 242 TFLOP/s fp16/bf16, 485 fp8/int8 and 120 tf32 "
              "*with sparsity*; dense figures are half of those.",
        pcie_bytes_per_s=32e9,
        interconnect_source="L4 datasheet: PCIe Gen4 x16 64 GB/s bidirectional, no NVLink; "
                            "halved here to per direction",
    ),
    "t4": DeviceSpec(
        name="NVIDIA T4",
        memory_bytes=16e9,
        bandwidth_bytes_per_s=320e9,
        peak_flops={"fp32": 8.1e12, "fp16": 65e12, "int8": 130e12},
        has_bf16=False,
        source="https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/tesla-t4/"
               "t4-tensor-core-datasheet-951643.pdf",
        notes="GDDR6, Turing (compute capability 7.5): no bf16, so labs on a free Colab T4 "
              "serve in fp16. 65 TFLOP/s is mixed precision (fp16 in, fp32 accumulate).",
        pcie_bytes_per_s=16e9,
        interconnect_source="T4 datasheet: PCIe Gen3 x16, 32 GB/s interconnect bandwidth "
                            "(bidirectional), no NVLink; halved here to per direction",
    ),
    "apple-m5-pro-laptop": DeviceSpec(
        name="Apple M5 Pro laptop (the machine of the course's class 000)",
        memory_bytes=48e9,
        bandwidth_bytes_per_s=273e9,
        peak_flops={"fp16": 18e12},
        has_bf16=True,
        source="course seed 000: the blog post of class 000 (measured on the author's laptop)",
        notes="273 GB/s was measured by the source, not taken from a datasheet. 18 TFLOP/s is "
              "the rate its 4-bit prefill achieved, not a datasheet peak: stored as the peak it "
              "is a lower bound, and so is the ridge point computed from it. memory_bytes "
              "(48 GB) is the source's configuration, unified between CPU and GPU. The source "
              "reports prefill 1143 tok/s and decode 42,6 tok/s on a 5,38 GB 4-bit file of "
              "Qwen3.5-9B.",
    ),
}


# Generations for the memory wall (chapter 1): kept apart from DEVICE_PRESETS, which the
# simulator and the self-checks draw from. (year of launch, spec), oldest first.
GENERATIONS: tuple[tuple[int, DeviceSpec], ...] = (
    (2017, DeviceSpec(
        name="NVIDIA Tesla V100 SXM2 32GB",
        memory_bytes=32e9,
        bandwidth_bytes_per_s=900e9,
        peak_flops={"fp32": 15.7e12, "fp16": 125e12},
        has_bf16=False,
        source="https://images.nvidia.com/content/technologies/volta/pdf/"
               "volta-v100-datasheet-update-us-1165301-r5.pdf",
        notes="HBM2. 125 TFLOP/s is the tensor-core (mixed precision) figure; Volta has no "
              "sparsity, so it is dense.",
    )),
    (2020, DEVICE_PRESETS["a100-80gb"]),
    (2022, DEVICE_PRESETS["h100-sxm"]),
    (2024, DeviceSpec(
        name="NVIDIA B200 (HGX B200)",
        memory_bytes=180e9,
        bandwidth_bytes_per_s=8e12,
        peak_flops={"fp16": 2.25e15, "bf16": 2.25e15, "fp8": 4.5e15},
        has_bf16=True,
        source="https://www.nvidia.com/en-us/data-center/hgx/ (HGX B200 datasheet)",
        notes="HBM3e. The datasheet gives the 8-GPU board with sparsity (FP16/BF16 36 PFLOP/s, "
              "FP8 72 PFLOP/s, 64 TB/s, 1,4 TB); per GPU that is 4,5 and 9 PFLOP/s with "
              "sparsity, dense figures are half of those.",
    )),
)


def get_device_spec(name: str) -> DeviceSpec:
    """The preset called ``name`` (case-insensitive), e.g. ``get_device_spec("h100-sxm")``."""
    key = str(name).strip().lower()
    if key not in DEVICE_PRESETS:
        raise KeyError(f"dispositivo desconocido {name!r}; los conocidos son: "
                       f"{', '.join(DEVICE_PRESETS)}")
    return DEVICE_PRESETS[key]
