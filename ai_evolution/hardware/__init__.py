"""What machine the labs run on: the device, the dtype it supports, and facts for the contract.

Three layers, from cheapest to most honest:

- *describe*: what the device says about itself (name, dtypes, memory);
- *datasheet presets* (``DEVICE_PRESETS``): what vendors publish for GPUs the reader may not
  have, each with its source, so the simulator can replay a run "at H100 scale";
- *probes* (``measure_bandwidth``, ``measure_matmul``, ``measure_decode_matmul``,
  ``measure_stream_bandwidths``): what this machine actually achieves, measured with a warm-up
  and repetitions and reported as medians.
"""

from .allreduce import fit_allreduce, measure_allreduce
from .datasheets import DEVICE_PRESETS, GENERATIONS, DeviceSpec, get_device_spec
from .device import (default_dtype, describe, device_name, pick_device, supported_dtypes,
                     synchronize)
from .probes import (BANDWIDTH_KINDS, GiB, ProbeResult, available_memory_bytes, measure_bandwidth,
                     measure_decode_matmul, measure_matmul, measure_stream_bandwidths,
                     probe_summary)

__all__ = ["fit_allreduce", "measure_allreduce", "DEVICE_PRESETS", "GENERATIONS", "DeviceSpec",
           "get_device_spec", "default_dtype", "describe", "device_name", "pick_device",
           "supported_dtypes", "synchronize", "BANDWIDTH_KINDS",
           "GiB", "ProbeResult", "available_memory_bytes", "measure_bandwidth",
           "measure_decode_matmul", "measure_matmul", "measure_stream_bandwidths",
           "probe_summary"]
