"""The book's matplotlib figures, one module per chapter (``style`` holds what they share). Each
figure has a title and axis labels with units, and returns the Figure.

Every figure is importable from here too: ``from ai_evolution.plots import step_times_figure``.
"""

from .continuous_batching import batching_gain_figure, latency_cdf_figure, row_timeline_figure
from .flash_attention import attention_time_figure, flash_io_memory_figure
from .kv_cache import kv_bytes_figure, step_times_figure
from .observability import load_curve_figure, repeat_spread_figure, settle_figure
from .paged_attention import block_size_figure, block_table_figure, utilization_figure
from .prefill_decode import batching_curve_figure, memory_wall_figure
from .quantization import layer_error_figure, pareto_figure, quant_speed_figure, weights_kv_figure
from .scheduler import (LIFECYCLE_STATES, preemption_figure, request_lifecycle_figure,
                        tradeoff_figure)
from .style import decimal_comma

__all__ = [
    "LIFECYCLE_STATES", "attention_time_figure", "batching_curve_figure", "batching_gain_figure",
    "block_size_figure", "block_table_figure", "decimal_comma", "flash_io_memory_figure",
    "kv_bytes_figure", "latency_cdf_figure", "layer_error_figure", "load_curve_figure",
    "memory_wall_figure",
    "pareto_figure", "preemption_figure", "quant_speed_figure", "repeat_spread_figure",
    "request_lifecycle_figure", "row_timeline_figure", "settle_figure", "step_times_figure",
    "tradeoff_figure", "utilization_figure", "weights_kv_figure",
]
