"""Interactive figures for the static, offline book: precomputed data behind HTML controls.

An :class:`Explorer` is a Plotly figure, a few controls (a ``<select>`` or a range slider, each a
list of labelled options) and a readout table. Every combination of the controls' options is a
*state*, computed in Python when the page executes (the build's own measurements): the traces'
data, optional layout changes and one formatted value per readout. The browser only looks a state
up and redraws; it computes nothing, so what the reader sees at a point is what the executed cell
stored for it.

The HTML loads no JavaScript from anywhere: it expects ``window.Plotly`` from the ``plotly.min.js``
the book ships once (``_ext/interactive.py`` copies :func:`plotly_js_path` into the build and adds
it to the pages that hold an explorer). Numbers use the decimal comma (``layout.separators``).

The controls are plain HTML, outside the plot: labelled, usable with a keyboard and readable at
390 px, where Plotly's own sliders and drop-downs crowd the plot.
"""

from __future__ import annotations

import html
import itertools
import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Callable, Sequence

import plotly.graph_objects as go
from plotly.utils import PlotlyJSONEncoder

PLOTLY_JS = "plotly.min.js"   # the name the book serves it under (in _static/)
CSS_CLASS = "ae-explorer"     # the marker _ext/interactive.py looks for in a page
KINDS = ("select", "slider")
# typesetMath off: labels hold no TeX, and the book's own MathJax must not be driven by Plotly.
CONFIG = {"displaylogo": False, "responsive": True, "displayModeBar": False, "typesetMath": False}
FONT = "system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif"


def plotly_js_path() -> Path:
    """The ``plotly.min.js`` inside the installed ``plotly`` package (what the book vendors)."""
    path = Path(str(resources.files("plotly") / "package_data" / PLOTLY_JS))
    if not path.is_file():
        raise FileNotFoundError(f"no encuentro {PLOTLY_JS} en el paquete plotly ({path}); "
                                f"reinstale plotly con pip (requirements.txt)")
    return path


@dataclass(frozen=True)
class Control:
    """One control: ``label`` (Spanish, shown), ``options`` (labels, one per choice), ``kind``
    ``"select"`` or ``"slider"``, ``default`` (index of the option shown first)."""

    name: str
    label: str
    options: tuple[str, ...]
    kind: str = "select"
    default: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "options", tuple(str(o) for o in self.options))
        if self.kind not in KINDS:
            raise ValueError(f"control «{self.name}»: tipo {self.kind!r} desconocido; "
                             f"tipos aceptados: {', '.join(KINDS)}")
        if not self.options:
            raise ValueError(f"control «{self.name}»: necesita al menos una opción")
        if not 0 <= self.default < len(self.options):
            raise ValueError(f"control «{self.name}»: default={self.default} fuera de rango; "
                             f"debe estar entre 0 y {len(self.options) - 1}")


@dataclass(frozen=True)
class State:
    """What one combination of options shows: per trace, the fields that change (``x``, ``y``,
    ``text``...; one dict per trace of the figure, ``{}`` for a trace that stays), layout fields
    that change, and one formatted value per readout."""

    traces: tuple[dict, ...]
    readouts: tuple[str, ...]
    layout: dict = field(default_factory=dict)


def base_layout(title: str, x_title: str, y_title: str, **extra) -> dict:
    """The book's Plotly layout: Spanish decimal comma, legend below the plot (a phone's width),
    tight margins, no fixed width (the figure follows its column). Plotly does not wrap a title:
    keep it under about 40 characters (390 px) and say the rest in the caption."""
    if len(title) > 40:
        raise ValueError(f"título demasiado largo para un teléfono ({len(title)} caracteres, "
                         f"máximo 40): «{title}»; diga el resto en el pie de la figura")
    layout = dict(
        title=dict(text=title, font=dict(size=15)), separators=",.",
        font=dict(family=FONT, size=13), template="simple_white",
        # Fixed ranges: no zoom by dragging (a phone's scroll would zoom) and no drag handles
        # drawn past the plot's right edge.
        xaxis=dict(title=dict(text=x_title), fixedrange=True),
        yaxis=dict(title=dict(text=y_title), fixedrange=True), dragmode=False,
        # The legend sits at the bottom of the figure, not of the plot area: on a phone it wraps
        # to several lines and must push the plot up rather than cover the axis labels.
        legend=dict(orientation="h", yref="container", yanchor="bottom", y=0, x=0,
                    traceorder="normal"),
        margin=dict(l=60, r=24, t=48, b=40), height=380, autosize=True,
        hovermode="x unified",
    )
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(layout.get(key), dict):
            layout[key] = {**layout[key], **value}
        else:
            layout[key] = value
    return layout


class Explorer:
    """An interactive figure; ``to_html()`` (and Jupyter's ``_repr_html_``) writes it.

    ``states`` maps each tuple of option indices (one per control, in order) to its
    :class:`State`; :meth:`from_function` builds it from a function of the chosen options.
    """

    def __init__(self, name: str, figure: go.Figure, controls: Sequence[Control],
                 readout_labels: Sequence[str], states: dict[tuple[int, ...], State],
                 caption: str = ""):
        if not name.replace("-", "").replace("_", "").isalnum():
            raise ValueError(f"nombre de figura {name!r} no válido: solo letras, dígitos, - y _")
        self.name, self.figure, self.caption = name, figure, caption
        self.controls, self.readout_labels = tuple(controls), tuple(readout_labels)
        expected = set(itertools.product(*(range(len(c.options)) for c in self.controls)))
        if set(states) != expected:
            missing = sorted(expected - set(states))[:3]
            extra = sorted(set(states) - expected)[:3]
            raise ValueError(f"«{name}»: los estados deben cubrir exactamente cada combinación de "
                             f"opciones; faltan {missing}, sobran {extra}")
        n_traces = len(figure.data)
        for key, state in states.items():
            if len(state.readouts) != len(self.readout_labels):
                raise ValueError(f"«{name}», estado {key}: {len(state.readouts)} lecturas para "
                                 f"{len(self.readout_labels)} etiquetas")
            if len(state.traces) != n_traces:
                raise ValueError(f"«{name}», estado {key}: {len(state.traces)} trazas; la figura "
                                 f"tiene {n_traces}")
        self.states = dict(states)

    @classmethod
    def from_function(cls, name: str, figure: go.Figure, controls: Sequence[Control],
                      readout_labels: Sequence[str], state_of: Callable[..., State],
                      caption: str = "") -> "Explorer":
        """``state_of(**{control.name: option_index})`` for every combination of options."""
        controls = tuple(controls)
        states = {}
        for key in itertools.product(*(range(len(c.options)) for c in controls)):
            states[key] = state_of(**{c.name: i for c, i in zip(controls, key)})
        return cls(name, figure, controls, readout_labels, states, caption)

    @property
    def default_key(self) -> tuple[int, ...]:
        return tuple(c.default for c in self.controls)

    def readouts(self, **chosen: int) -> dict[str, str]:
        """The readouts shown for the given option indices (defaults for controls not named)."""
        unknown = set(chosen) - {c.name for c in self.controls}
        if unknown:
            raise ValueError(f"controles desconocidos: {sorted(unknown)}; los de «{self.name}»: "
                             f"{[c.name for c in self.controls]}")
        key = tuple(chosen.get(c.name, c.default) for c in self.controls)
        return dict(zip(self.readout_labels, self.states[key].readouts))

    # -- HTML ----------------------------------------------------------------------------------

    def spec(self) -> dict:
        """What the page's script reads: the base figure, the config and every state."""
        figure = self.figure.to_plotly_json()
        return {
            "figure": {"data": figure["data"], "layout": figure["layout"]},
            "config": CONFIG,
            "states": {",".join(map(str, key)): {"traces": list(s.traces),
                                                 "layout": s.layout,
                                                 "readouts": list(s.readouts)}
                       for key, s in self.states.items()},
        }

    def _control_html(self, i: int, control: Control) -> str:
        cid = f"{self.name}-c{i}"
        label = f'<label for="{cid}">{html.escape(control.label)}</label>'
        if control.kind == "select":
            options = "".join(
                f'<option value="{j}"{" selected" if j == control.default else ""}>'
                f"{html.escape(o)}</option>" for j, o in enumerate(control.options))
            widget = f'<select id="{cid}" data-ae-control="{html.escape(control.name)}">{options}</select>'
        else:
            widget = (f'<input type="range" id="{cid}" data-ae-control="{html.escape(control.name)}" '
                      f'min="0" max="{len(control.options) - 1}" step="1" value="{control.default}" '
                      f'data-labels="{html.escape(json.dumps(control.options, ensure_ascii=False))}">'
                      f'<output for="{cid}">{html.escape(control.options[control.default])}</output>')
        return f'<div class="ae-control">{label}{widget}</div>'

    def to_html(self) -> str:
        default = self.states[self.default_key]
        rows = "".join(f"<tr><th scope=\"row\">{html.escape(label)}</th><td>{html.escape(value)}</td></tr>"
                       for label, value in zip(self.readout_labels, default.readouts))
        data = json.dumps(self.spec(), cls=PlotlyJSONEncoder, ensure_ascii=False,
                          separators=(",", ":")).replace("</", "<\\/")
        caption = f'<p class="ae-caption">{html.escape(self.caption)}</p>' if self.caption else ""
        controls = "".join(self._control_html(i, c) for i, c in enumerate(self.controls))
        return (
            f'<div class="{CSS_CLASS}" id="{self.name}">{_STYLE}'
            f'<form class="ae-controls" onsubmit="return false">{controls}</form>'
            f'<div class="ae-plot" role="img" style="min-height:{self.figure.layout.height or 380}px" '
            f'aria-label="{html.escape(self.figure.layout.title.text or "")}"></div>'
            f'<table class="ae-readouts"><tbody>{rows}</tbody></table>{caption}'
            f'<script type="application/json" class="ae-data">{data}</script>'
            f"<script>{_SCRIPT.replace('__ID__', self.name)}</script></div>"
        )

    def __repr__(self) -> str:  # stable: a notebook's text/plain output must not hold an address
        return (f"Explorer({self.name!r}: {len(self.controls)} controles, "
                f"{len(self.states)} estados)")

    def _repr_html_(self) -> str:
        return self.to_html()


_STYLE = """<style>
.ae-explorer{margin:1em 0;max-width:100%}
.ae-explorer .ae-controls{display:flex;flex-wrap:wrap;gap:.4em 1.2em;margin-bottom:.4em}
.ae-explorer .ae-control{display:flex;flex-wrap:wrap;align-items:center;gap:.4em;max-width:100%}
.ae-explorer .ae-control label{font-weight:600}
.ae-explorer .ae-control input[type=range]{width:12em;max-width:60vw}
.ae-explorer .ae-control select{max-width:100%}
.ae-explorer .ae-plot{width:100%}
.ae-explorer table.ae-readouts{border-collapse:collapse;margin-top:.4em}
.ae-explorer table.ae-readouts th{text-align:left;font-weight:normal;padding:.1em 1em .1em 0}
.ae-explorer table.ae-readouts td{text-align:right;font-variant-numeric:tabular-nums;font-weight:600;white-space:nowrap}
.ae-explorer .ae-caption{font-size:.9em}
</style>"""

# One generic script per explorer: read the controls, look the state up, redraw, fill the table.
_SCRIPT = """(function () {
  var root = document.getElementById("__ID__");
  var spec = JSON.parse(root.querySelector("script.ae-data").textContent);
  var plot = root.querySelector(".ae-plot");
  var controls = Array.prototype.slice.call(root.querySelectorAll("[data-ae-control]"));
  var cells = root.querySelectorAll("table.ae-readouts td");
  if (!window.Plotly) {
    plot.textContent = "La figura interactiva necesita plotly.js, que el libro publicado incluye.";
    return;
  }
  function merge(base, change) {
    var out = {}, k;
    for (k in base) out[k] = base[k];
    for (k in change) out[k] = change[k];
    return out;
  }
  function draw() {
    var key = controls.map(function (c) { return c.value; }).join(",");
    var state = spec.states[key];
    var data = spec.figure.data.map(function (t, i) { return merge(t, state.traces[i] || {}); });
    var layout = merge(spec.figure.layout, state.layout || {});
    state.readouts.forEach(function (text, i) { cells[i].textContent = text; });
    controls.forEach(function (c) {
      var out = c.parentElement.querySelector("output");
      if (out) out.textContent = JSON.parse(c.getAttribute("data-labels"))[+c.value];
    });
    root.setAttribute("data-state", key);
    return Plotly.react(plot, data, layout, spec.config);
  }
  controls.forEach(function (c) {
    c.addEventListener("input", draw);
    c.addEventListener("change", draw);
  });
  root.aeReady = draw();
})();"""
