"""The book's interactive figures (``interactive.Explorer``), one builder per chapter.

Kept apart from the matplotlib figures (``plots/__init__``) so that importing the library does
not import Plotly. Every number an explorer shows comes
from the library's arithmetic or from the executed run passed in; the browser only looks it up.
"""

from __future__ import annotations

import plotly.graph_objects as go

from ..fmt import es, es_bytes
from ..model import get_preset, kv_bytes_per_token, weight_bytes
from ..model.memory import MemoryBudget, memory_budget
from .interactive import Control, Explorer, State, base_layout

# -- chapter 2: how many sequences fit -----------------------------------------------------------

GPU_MEMORY_GB = (16, 24, 40, 48, 80)
MAX_LENS = (1024, 2048, 4096, 8192, 16384, 32768)
KV_DTYPES = (("fp16", "fp16 / bf16 (2 bytes)"), ("fp8", "fp8 (1 byte)"))
KV_HEADS = ((None, "las del modelo"), (8, "8 (GQA)"), (1, "1 (MQA)"))
MEMORY_READOUTS = ("Pesos", "Memoria para la caché KV", "Caché KV por token",
                   "Secuencias con reserva contigua", "Secuencias con bloques bajo demanda",
                   "Bloques / reserva")
MEMORY_PARTS = (("pesos", "#7f7f7f"), ("caché con tokens reales", "#1f77b4"),
                ("reservada sin usar", "#ff7f0e"), ("libre", "#d9d9d9"))


def _gb(n_bytes: float) -> str:
    return f"{es(n_bytes / 1e9, 1)} GB"


def memory_models(anchor: MemoryBudget) -> tuple[tuple[str, str, float | None], ...]:
    """(label, preset, weight bytes override) of the chapter 2 explorer's models: the worked
    example's Llama-2-7B with its nominal weights (``anchor.weight_bytes``), the same model with
    its exact weights, and Llama-3.1-8B."""
    return (("Llama-2-7B, pesos nominales", "llama-2-7b", anchor.weight_bytes),
            ("Llama-2-7B, pesos exactos", "llama-2-7b", None),
            ("Llama-3.1-8B", "llama-3.1-8b", None))


def memory_explorer(anchor: MemoryBudget, name: str = "kv-memory-explorer") -> Explorer:
    """GPU memory, model, maximum context, KV dtype and KV heads -> sequences that fit with
    contiguous reservation (``max_len`` each) and with blocks on demand (``anchor.typical_len``
    each), by ``memory_budget``; the figure is the GPU's memory split between weights, cache
    holding real tokens, cache reserved and unused, and free memory. Its first view is the
    chapter's worked example, ``anchor`` (``worked_examples()["gpu24_7b"]``)."""
    models = memory_models(anchor)
    gpu_default = GPU_MEMORY_GB.index(round(anchor.gpu_memory_bytes / 1e9))
    controls = [
        Control("gpu", "Memoria de la GPU", [f"{g} GB" for g in GPU_MEMORY_GB], default=gpu_default),
        Control("model", "Modelo (pesos en fp16)", [m[0] for m in models]),
        Control("max_len", "Contexto máximo (tokens)", [es(n, 0) for n in MAX_LENS], kind="slider",
                default=MAX_LENS.index(anchor.max_len)),
        Control("kv_dtype", "Tipo de la caché KV", [d[1] for d in KV_DTYPES]),
        Control("kv_heads", "Cabezas KV", [h[1] for h in KV_HEADS]),
    ]
    rows = ["reserva contigua", "bloques bajo demanda"]
    fig = go.Figure(
        [go.Bar(name=part, orientation="h", y=rows, x=[0, 0], marker_color=color,
                hovertemplate="%{x:.1f} GB<extra>" + part + "</extra>")
         for part, color in MEMORY_PARTS],
        layout=base_layout("La memoria de la GPU", "", "", xaxis=dict(ticksuffix=" GB"), barmode="stack", hovermode="closest", height=300,
                           margin=dict(l=10), yaxis=dict(automargin=True, autorange="reversed")),
    )

    def state_of(gpu, model, max_len, kv_dtype, kv_heads) -> State:
        label, preset, override = models[model]
        config = get_preset(preset)
        if KV_HEADS[kv_heads][0] is not None:
            config = config.replace(num_kv_heads=KV_HEADS[kv_heads][0])
        memory = GPU_MEMORY_GB[gpu] * 1e9
        weights = weight_bytes(config, "fp16") if override is None else override
        per_token = kv_bytes_per_token(config, KV_DTYPES[kv_dtype][0])
        if weights >= memory:
            traces = ({"x": [weights / 1e9] * 2},) + ({"x": [0, 0]},) * (len(MEMORY_PARTS) - 1)
            return State(traces, (_gb(weights), "los pesos no caben", es_bytes(per_token),
                                  "0", "0", "—"))
        b = memory_budget(config, memory, max_len=MAX_LENS[max_len],
                          typical_len=anchor.typical_len, dtype="fp16",
                          kv_dtype=KV_DTYPES[kv_dtype][0], weights_bytes=override)
        static_used = b.static_slots * b.typical_len * per_token
        static_reserved = b.static_slots * b.max_len * per_token
        paged_used = b.on_demand_sequences * b.typical_len * per_token
        gb = 1e9
        traces = ({"x": [b.weight_bytes / gb] * 2},
                  {"x": [static_used / gb, paged_used / gb]},
                  {"x": [(static_reserved - static_used) / gb, 0]},
                  {"x": [(b.kv_budget_bytes - static_reserved) / gb,
                         (b.kv_budget_bytes - paged_used) / gb]})
        gain = (f"{es(b.on_demand_sequences / b.static_slots, 1)} ×" if b.static_slots
                else "sin ranuras contiguas")
        return State(traces, (_gb(b.weight_bytes), _gb(b.kv_budget_bytes), es_bytes(per_token),
                              es(b.static_slots, 0), es(b.on_demand_sequences, 0), gain))

    caption = (f"Secuencias típicas de {es(anchor.typical_len, 0)} tokens; la reserva contigua "
               f"aparta para cada una el contexto máximo. La cuenta deja fuera las activaciones y "
               f"lo que ocupa el propio entorno de ejecución.")
    return Explorer.from_function(name, fig, controls, MEMORY_READOUTS, state_of, caption)


# -- chapter 1: the batching curve -----------------------------------------------------------------

BATCHING_READOUTS = ("Paso medido", "Paso predicho", "Tokens/s",
                     "Rendimiento frente a una secuencia", "Coste medido por secuencia extra",
                     "Coste predicho por secuencia extra")


def _ms_text(ms: float) -> str:
    return f"{es(ms, 2)} ms"


def batching_explorer(results: dict, name: str = "batching-explorer") -> Explorer:
    """The batching curves of lab 1's contract (``results``): the measured model's
    (``results["batching"]``, model ``results["model"]["name"]``) and the contrast model's
    (``results["batching_contrast"]``), measured step against the roofline prediction calibrated
    on one sequence; a slider over the batch sizes reads the step, its prediction, tokens/s, the
    throughput over one sequence and the cost of each extra sequence, measured and predicted.
    A dotted line marks where the lab found the curve departs. Every value is the contract's."""
    curves = [(results["model"]["name"], results["batching"])]
    if "batching_contrast" in results:
        curves.append((results["batching_contrast"]["model"], results["batching_contrast"]))
    batches = curves[0][1]["batch_sizes"]
    if any(c["batch_sizes"] != batches for _, c in curves):
        raise ValueError("las curvas deben medir los mismos tamaños de lote; "
                         f"se recibieron {[c['batch_sizes'] for _, c in curves]}")
    controls = [Control("model", "Modelo", [n for n, _ in curves]),
                Control("batch", "Secuencias a la vez", [str(b) for b in batches], kind="slider")]
    fig = go.Figure(
        [go.Scatter(name="medido", x=batches, y=batches, mode="lines+markers",
                    line=dict(color="#1f77b4"), hovertemplate="%{y:.2f} ms"),
         go.Scatter(name="roofline calibrado", x=batches, y=batches, mode="lines+markers",
                    line=dict(color="#7f7f7f", dash="dash"), marker=dict(symbol="square"),
                    hovertemplate="%{y:.2f} ms"),
         go.Scatter(name="punto elegido", x=[1], y=[0], mode="markers", showlegend=False,
                    marker=dict(size=14, color="rgba(0,0,0,0)", line=dict(width=2, color="#d62728")),
                    hoverinfo="skip")],
        layout=base_layout("Paso de decodificación", "secuencias en el lote", "ms por paso",
                           xaxis=dict(type="log", tickvals=batches, ticktext=[str(b) for b in batches]),
                           yaxis=dict(rangemode="tozero")),
    )

    def state_of(model: int, batch: int) -> State:
        curve = curves[model][1]
        meas, pred = curve["measured_ms"], curve["predicted_ms"]
        b = batches[batch]
        extra = ((_ms_text((meas[batch] - meas[0]) / (b - 1)), _ms_text((pred[batch] - pred[0]) / (b - 1)))
                 if b > 1 else ("—", "—"))
        depart = curve["departure_batch"]
        shapes = [] if depart is None else [dict(
            type="line", xref="x", yref="paper", x0=depart, x1=depart, y0=0, y1=1,
            line=dict(color="#d62728", dash="dot", width=1))]
        return State(
            traces=({"y": meas}, {"y": pred}, {"x": [b], "y": [meas[batch]]}),
            readouts=(_ms_text(meas[batch]), _ms_text(pred[batch]),
                      es(curve["tokens_per_s"][batch], 0),
                      f"{es(curve['tokens_per_s'][batch] / curve['tokens_per_s'][0], 2)} ×") + extra,
            layout={"shapes": shapes})

    caption = ("Cada punto es la mediana de las rondas del laboratorio; la predicción suma al "
               "roofline de cada lote la sobrecarga que el paso de una secuencia tarda de más. La "
               "línea de puntos roja marca el lote en el que el laboratorio encontró que la curva "
               "se separa.")
    return Explorer.from_function(name, fig, controls, BATCHING_READOUTS, state_of, caption)


# -- chapter 6: the Poisson runs ---------------------------------------------------------------------

POISSON_READOUTS = ("Tasa realizada", "Carga", "Tokens/s ofrecidos", "Capacidad (bucle cerrado)",
                    "TTFT p50", "TTFT p99", "TPOT p50")


def _seconds_text(s: float) -> str:
    return f"{es(s * 1e3, 1)} ms" if s < 1 else f"{es(s, 2)} s"


def poisson_explorer(study: dict, name: str = "poisson-explorer") -> Explorer:
    """Every Poisson run of lab 6's ``study`` (``results["measured"]`` or ``["simulated"]``:
    the sweep and the repeated runs), sorted by its *realised* rate; a slider moves across them.
    TTFT p50 and p99 on a log scale against the realised rate, the closed loop's capacity as a
    vertical line; readouts: the load as a share of that capacity, offered tokens/s against it,
    TTFT p50/p99 and TPOT p50. Every value is the contract's."""
    cap = study["capacity"]
    runs = sorted(study["sweep"] + study.get("repeats", []), key=lambda r: r["realized_rate"])
    if not runs:
        raise ValueError("el estudio no tiene ejecuciones de Poisson")
    tokens_per_request = cap["capacity_tok_s"] / cap["capacity_req_s"]
    rates = [r["realized_rate"] for r in runs]
    controls = [Control("run", "Ejecución (por tasa realizada)",
                        [f"{es(r, 2)} pet/s" for r in rates], kind="slider")]
    fig = go.Figure(
        [go.Scatter(name="TTFT p50", x=rates, y=[r["ttft_p50_s"] * 1e3 for r in runs],
                    mode="markers", marker=dict(color="#1f77b4"), hovertemplate="%{y:.1f} ms"),
         go.Scatter(name="TTFT p99", x=rates, y=[r["ttft_p99_s"] * 1e3 for r in runs],
                    mode="markers", marker=dict(color="#d62728", symbol="diamond"),
                    hovertemplate="%{y:.1f} ms"),
         go.Scatter(name="ejecución elegida", x=[rates[0]] * 2, y=[1, 1], mode="markers",
                    showlegend=False, hoverinfo="skip",
                    marker=dict(size=15, color="rgba(0,0,0,0)", line=dict(width=2, color="#000")))],
        layout=base_layout("TTFT frente a la tasa realizada", "peticiones/s", "TTFT (ms)",
                           yaxis=dict(type="log"), hovermode="closest",
                           shapes=[dict(type="line", xref="x", yref="paper",
                                        x0=cap["capacity_req_s"], x1=cap["capacity_req_s"],
                                        y0=0, y1=1, line=dict(color="#7f7f7f", dash="dash"))]),
    )

    def state_of(run: int) -> State:
        r = runs[run]
        return State(
            traces=({}, {}, {"x": [r["realized_rate"]] * 2,
                             "y": [r["ttft_p50_s"] * 1e3, r["ttft_p99_s"] * 1e3]}),
            readouts=(f"{es(r['realized_rate'], 2)} pet/s",
                      f"{es(100 * r['realized_rate'] / cap['capacity_req_s'], 0)} % de la capacidad",
                      es(r["realized_rate"] * tokens_per_request, 0),
                      f"{es(cap['capacity_tok_s'], 0)} tokens/s",
                      _seconds_text(r["ttft_p50_s"]), _seconds_text(r["ttft_p99_s"]),
                      _seconds_text(r["tpot_p50_s"])))

    caption = ("Cada punto es una ejecución de Poisson del laboratorio (el barrido y las "
               "repeticiones), colocada en la tasa que de verdad realizaron sus llegadas; la línea "
               "discontinua es la capacidad medida en bucle cerrado.")
    return Explorer.from_function(name, fig, controls, POISSON_READOUTS, state_of, caption)
