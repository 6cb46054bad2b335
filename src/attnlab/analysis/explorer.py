"""The attention explorer: attention weights → one self-contained, interactive HTML page.

Drawn with **Bokeh** (``bokeh.resources.INLINE``): its JavaScript is inlined in the page, so
the file opens offline, from disk or inside the MLflow UI's artifact pane (which shows an
``.html`` artifact as a blob URL in an ``<iframe sandbox="allow-scripts">``: scripts run, no
network or same-origin access is needed). Bokeh was chosen over Plotly for three reasons:
its inlined JS (the core and widget bundles, about 1.7 MB) is under half of ``plotly.min.js``
(about 4.7 MB, which the Python package can only inline whole); its widgets (selects, slider,
radio buttons) run with ``CustomJS`` callbacks and no server; and heatmaps with per-cell hover
tooltips and token tick labels are built-in glyphs. The little glue JS (``explorer_js/*.js``) only picks which
numbers the glyphs show.

The page's numbers travel in ``<script type="application/json" id="attnlab-explorer-data">``
(:func:`read_data` reads them back), weights as little-endian uint16 fixed point (``round(w ·
65535)``, base64): at most 7.7e-6 from the float weights, a third of the size of JSON text.

Its initial state can be set in the URL fragment, e.g. ``explorer.html#sentence=0&kind=
encoder_decoder&layer=2&head=3&epoch=2`` (sentence: 0-based index into the page's sentences;
layer and head: 1-based, ``head=all`` for the grid of all heads; epoch: the epoch number), or
``#fit=2&query=10`` on the Nadaraya–Watson page. Once a state is drawn the page logs
``attnlab-explorer: drawn <state>`` to the console and sets ``data-explorer`` on ``<html>``;
its widgets are named (``sentence``, ``kind``, ``layer``, ``head``, ``epoch``; ``fit``,
``query``), so a script can choose as a person would:
``Bokeh.documents[0].get_model_by_name("head").active = 3``.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path

import numpy as np
import torch

from attnlab.analysis.viz import SentenceMaps
from attnlab.files import write_text_atomic

DATA_ID = "attnlab-explorer-data"
SCALE = 65535  # uint16 fixed point: weight = stored / SCALE


def encode_weights(weights: torch.Tensor | np.ndarray) -> dict:
    """Attention weights as the page stores them: ``{"shape": [...], "data": base64}``.

    Args:
        weights: any shape, float, values in [0, 1] (attention weights).
    Returns:
        ``shape`` (list of ints) and ``data``: the C-order values as little-endian uint16
        ``round(w · 65535)``, base64-encoded.
    Raises:
        ValueError: a value outside [0, 1] or not finite (not attention weights).
    """
    w = (
        weights.detach().float().cpu().numpy()
        if isinstance(weights, torch.Tensor)
        else np.asarray(weights, dtype=np.float64)
    )
    if w.size and not (np.isfinite(w).all() and w.min() >= 0.0 and w.max() <= 1.0):
        raise ValueError(f"attention weights must be finite and in [0, 1]; got min {w.min()}, max {w.max()}")
    q = np.rint(w.astype(np.float64) * SCALE).astype("<u2")
    return {"shape": list(w.shape), "data": base64.b64encode(q.tobytes()).decode("ascii")}


def decode_weights(entry: Mapping) -> np.ndarray:
    """The float64 array of an :func:`encode_weights` entry, shaped ``entry["shape"]``."""
    q = np.frombuffer(base64.b64decode(entry["data"]), dtype="<u2")
    return (q.astype(np.float64) / SCALE).reshape(entry["shape"])


def translation_epoch(collected: Sequence[SentenceMaps], epoch: int, label: str | None = None) -> dict:
    """One epoch's maps as the translation page stores them (JSON-ready; a resumed run's
    :class:`attnlab.lit.heatmaps.EpochHeatmaps` reads them back from the page: :func:`read_data`).

    Args:
        collected: :func:`attnlab.analysis.viz.collect_translation_maps` of the heatmap sentences.
        epoch: the 1-based epoch number; label: its name on the slider (default ``"epoch N"``).
    Returns:
        ``{"epoch", "label", "sentences": [{"source", "translation", "kinds": {kind: {"keys",
        "queries", "key_axis", "query_axis", "layers": [encode_weights((H, Q, K))]}}}]}``.
    """
    return {
        "epoch": int(epoch),
        "label": label or f"epoch {epoch}",
        "sentences": [
            {
                "source": s.sentence,
                "translation": s.translation,
                "kinds": {
                    kind: {
                        "keys": list(k.keys),
                        "queries": list(k.queries),
                        "key_axis": k.key_axis,
                        "query_axis": k.query_axis,
                        "layers": [encode_weights(w) for w in k.layers],
                    }
                    for kind, k in s.kinds.items()
                },
            }
            for s in collected
        ],
    }


def translation_explorer(epochs: Sequence[Mapping], title: str) -> str:
    """The translation page: sentence, kind, layer and head (or all heads) selectors, an epoch
    slider, token labels on both axes and the weight under the pointer.

    Args:
        epochs: :func:`translation_epoch` dicts, in slider order (usually by epoch), each with
            the same sentences and kinds.
        title: the page's heading (e.g. the run's name).
    Returns:
        The HTML page (str, about 1.7 MB of inlined Bokeh plus the weights).
    Raises:
        ValueError: no epoch, no sentence, or epochs that differ in their sentences or kinds.
    """
    epochs = list(epochs)
    if not epochs or not epochs[0]["sentences"]:
        raise ValueError("the explorer needs at least one epoch with at least one sentence")
    shape = [(s["source"], list(s["kinds"])) for s in epochs[0]["sentences"]]
    for e in epochs[1:]:
        if [(s["source"], list(s["kinds"])) for s in e["sentences"]] != shape:
            raise ValueError(f"{e['label']} has other sentences or kinds than {epochs[0]['label']}")
    heads = max(
        k["layers"][0]["shape"][0] for e in epochs for s in e["sentences"] for k in s["kinds"].values()
    )
    data = {"task": "translation", "title": title, "epochs": epochs}
    return _page(title, data, *_translation_layout(data, heads))


def nw_explorer(x_train, y_train, x_test, y_test, fits: Mapping[str, Mapping], title: str) -> str:
    """The Nadaraya–Watson page (D2L 11.2 (zh 10.2)): choose a fit (kernel and width); see its test ×
    training weights (hover: x, x_i, weight), its prediction against the truth and the training
    data, and the weights of one test point (a slider) over the training inputs.

    Args:
        x_train, y_train: (n,) float tensors or arrays, x_train sorted; x_test, y_test: (m,).
        fits: name → {"prediction": (m,), "weights": (m, n)} (float, rows summing to 1), in the
            selector's order.
        title: the page's heading.
    Returns:
        The HTML page (str).
    Raises:
        ValueError: no fit, or a fit whose shapes do not match the data.
    """
    xs = [
        np.asarray(torch.as_tensor(v).detach().float().cpu(), dtype=np.float64)
        for v in (x_train, y_train, x_test, y_test)
    ]
    n, m = len(xs[0]), len(xs[2])
    if not fits:
        raise ValueError("the explorer needs at least one fit")
    out = []
    for name, fit in fits.items():
        w, pred = torch.as_tensor(fit["weights"]), torch.as_tensor(fit["prediction"])
        if tuple(w.shape) != (m, n) or tuple(pred.shape) != (m,):
            raise ValueError(
                f"fit {name!r}: weights {tuple(w.shape)} and prediction "
                f"{tuple(pred.shape)} do not match {m} test and {n} training points "
                "((m, n) and (m,))"
            )
        out.append({"name": name, "prediction": _floats(pred), "weights": encode_weights(w)})
    data = {
        "task": "nw",
        "title": title,
        "x_train": _floats(xs[0]),
        "y_train": _floats(xs[1]),
        "x_test": _floats(xs[2]),
        "y_test": _floats(xs[3]),
        "fits": out,
    }
    return _page(title, data, *_nw_layout(data))


def write_explorer(path: Path, html: str) -> Path:
    """Write the page to ``path`` (atomically, parents created); returns ``path``."""
    return write_text_atomic(Path(path), html)


def read_data(html: str) -> dict:
    """The data a page embeds (the ``data`` :func:`translation_explorer` or :func:`nw_explorer`
    built it from). Raises ValueError when ``html`` is not an explorer page."""
    start_tag = f'<script type="application/json" id="{DATA_ID}">'
    start = html.find(start_tag)
    if start < 0:
        raise ValueError("not an attnlab explorer page (no embedded data)")
    start += len(start_tag)
    return json.loads(html[start : html.index("</script>", start)])


# --- the page ------------------------------------------------------------------------------


def _floats(v) -> list[float]:
    return [round(float(x), 6) for x in torch.as_tensor(v).detach().float().cpu().reshape(-1)]


def _js(name: str) -> str:
    """The page's glue JavaScript ``explorer_js/<name>`` (package data; Bokeh passes the widgets
    to it as named arguments)."""
    return (resources.files(__package__) / "explorer_js" / name).read_text(encoding="utf-8")


def _page(title: str, data: dict, layout, on_ready) -> str:
    """Bokeh's standalone page of ``layout`` with every resource inlined and the data as a JSON
    script; ``on_ready`` (a ``CustomJS``) runs once the page is built."""
    from bokeh.document import Document
    from bokeh.embed import file_html
    from bokeh.resources import INLINE

    doc = Document()
    doc.add_root(layout)
    doc.js_on_event("document_ready", on_ready)

    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    # JSON escapes, so that no "</script>" (or markup) can appear inside the script element
    text = text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    template = (
        "{% block postamble %}<style>body { font-family: sans-serif; margin: 8px; }"
        '</style><script type="application/json" id="' + DATA_ID + '">{{ explorer_data }}'
        "</script>{% endblock %}"
    )
    return file_html(doc, INLINE, title, template=template, template_variables={"explorer_data": text})


def _palette() -> list[str]:
    """White (weight 0) to dark red (weight 1), like the PNGs' ``Reds``."""
    from bokeh.palettes import Reds256

    return list(reversed(Reds256))


def _heatmap(source, mapper, width: int, height: int, tooltips):
    """A figure with one rect per (query, key) cell, integer tick positions (labels set by JS),
    the first query at the top, hover showing ``tooltips``."""
    from bokeh.models import FixedTicker, HoverTool, Range1d
    from bokeh.plotting import figure

    fig = figure(
        width=width,
        height=height,
        tools="",
        toolbar_location=None,
        x_range=Range1d(-0.5, 0.5),
        y_range=Range1d(0.5, -0.5),
    )
    cells = fig.rect(
        "x", "y", 1, 1, source=source, line_color=None, fill_color={"field": "w", "transform": mapper}
    )
    fig.add_tools(HoverTool(renderers=[cells], tooltips=tooltips))
    for axis in (fig.xaxis[0], fig.yaxis[0]):
        axis.ticker = FixedTicker(ticks=[])
        axis.major_label_text_font_size = "11px"
        axis.axis_label_text_font_size = "12px"
        axis.axis_label_text_font_style = "normal"
    fig.xaxis[0].major_label_orientation = math.pi / 2
    fig.grid.visible = False
    fig.title.text_font_size = "12px"
    return fig


def _colour_bar(mapper, title: str, height: int = 260):
    """A standalone vertical colour bar (a figure holding nothing else)."""
    from bokeh.models import ColorBar
    from bokeh.plotting import figure

    fig = figure(
        width=90, height=height, tools="", toolbar_location=None, outline_line_color=None, min_border=0
    )
    fig.scatter([0], [0], alpha=0)  # a renderer, so Bokeh draws the (otherwise empty) figure
    fig.axis.visible = fig.grid.visible = False
    bar = ColorBar(
        color_mapper=mapper,
        width=16,
        title=title,
        title_text_font_style="normal",
        major_label_text_font_size="10px",
    )
    fig.add_layout(bar, "right")
    return fig


def _translation_layout(data: dict, heads: int):
    from bokeh.layouts import column, gridplot, row
    from bokeh.models import (
        ColumnDataSource,
        CustomJS,
        Div,
        LinearColorMapper,
        RadioButtonGroup,
        Select,
        Slider,
    )

    epochs = data["epochs"]
    sentences = epochs[0]["sentences"]
    kinds = list(sentences[0]["kinds"])
    mapper = LinearColorMapper(palette=_palette(), low=0.0, high=1.0)
    tooltips = [("query", "@query"), ("key", "@key"), ("weight", "@w{0.0000}")]
    empty = lambda: ColumnDataSource({"x": [], "y": [], "w": [], "key": [], "query": []})
    single_source = empty()
    single = _heatmap(single_source, mapper, 600, 500, tooltips)
    single.name = "single"
    grid_sources = [empty() for _ in range(heads)]
    grid_figs = [_heatmap(s, mapper, 300, 260, tooltips) for s in grid_sources]
    cols = math.ceil(math.sqrt(heads))
    grid = gridplot(grid_figs, ncols=cols, toolbar_location=None)

    header = Div(text="", width=580)
    sentence = Select(
        name="sentence",
        title="sentence",
        value="0",
        width=320,
        options=[(str(i), f"{i}: {s['source'][:60]}") for i, s in enumerate(sentences)],
    )
    shown = next((k for k in ("encoder_decoder", "alignment") if k in kinds), kinds[0])
    kind = Select(name="kind", title="kind", value=shown, options=kinds, width=170)
    layer = Select(name="layer", title="layer", value="last", options=["last"], width=70)  # JS: last
    head = RadioButtonGroup(name="head", labels=["all heads"], active=0)
    last = len(epochs)
    epoch = Slider(
        name="epoch",
        title=epochs[-1]["label"],
        start=1,
        end=max(last, 2),
        value=last,
        step=1,
        width=250,
        visible=last > 1,
        show_value=False,
    )
    widgets = dict(
        header=header,
        sentence=sentence,
        kind=kind,
        layer=layer,
        head=head,
        epoch=epoch,
        single=single,
        single_source=single_source,
        grid=grid,
        grid_figs=grid_figs,
        grid_sources=grid_sources,
    )
    update = CustomJS(args=widgets, code=_js("common.js") + _js("translation.js"))
    for w, prop in (
        (sentence, "value"),
        (kind, "value"),
        (layer, "value"),
        (head, "active"),
        (epoch, "value"),
    ):
        w.js_on_change(prop, update)
    controls = column(header, row(sentence, kind, layer), row(head, epoch))
    page = column(controls, row(single, grid, _colour_bar(mapper, "weight")))
    return page, update


def _nw_layout(data: dict):
    from bokeh.layouts import column, row
    from bokeh.models import ColumnDataSource, CustomJS, Div, LinearColorMapper, Select, Slider, Span
    from bokeh.plotting import figure

    fits, m = data["fits"], len(data["x_test"])
    mapper = LinearColorMapper(palette=_palette(), low=0.0, high=1.0)
    cells = ColumnDataSource({"x": [], "y": [], "w": [], "key": [], "query": []})
    heat = _heatmap(
        cells, mapper, 480, 440, [("test x", "@query"), ("training x_i", "@key"), ("weight", "@w{0.0000}")]
    )
    heat.xaxis.axis_label = "training input x_i (keys, sorted)"
    heat.yaxis.axis_label = "test input x (queries)"
    heat.xaxis[0].major_label_orientation = "horizontal"
    curve = ColumnDataSource({"x": data["x_test"], "y": [0.0] * m})
    fit = figure(width=570, height=280, tools="", toolbar_location=None, title="fit")
    fit.line(data["x_test"], data["y_test"], line_dash="dashed", color="black", legend_label="truth f(x)")
    fit.scatter(
        data["x_train"], data["y_train"], size=5, alpha=0.4, color="gray", legend_label="training data"
    )
    fit.line("x", "y", source=curve, line_width=2, color="#d62728", legend_label="prediction")
    fit.legend.location, fit.legend.label_text_font_size = "top_left", "10px"
    bars = ColumnDataSource({"x": data["x_train"], "w": [0.0] * len(data["x_train"])})
    row_fig = figure(
        width=570,
        height=170,
        tools="",
        toolbar_location=None,
        x_range=fit.x_range,
        title="weights of one test point",
    )
    row_fig.vbar(x="x", top="w", width=0.03, source=bars, color="#d62728")
    row_fig.xaxis.axis_label = "training input x_i"
    marks = [Span(dimension="height", line_dash="dotted", line_color="black", location=0.0) for _ in range(2)]
    fit.add_layout(marks[0])
    row_fig.add_layout(marks[1])
    header = Div(text="", width=570)
    choice = Select(
        name="fit",
        title="fit",
        value="0",
        width=280,
        options=[(str(i), f["name"]) for i, f in enumerate(fits)],
    )
    query = Slider(
        name="query",
        title="test point",
        start=0,
        end=max(m - 1, 1),
        value=m // 2,
        step=1,
        width=270,
        show_value=False,
    )
    update = CustomJS(
        args=dict(
            header=header,
            fit_select=choice,
            query=query,
            heat=heat,
            mapper=mapper,
            cells=cells,
            curve=curve,
            bars=bars,
            marks=marks,
            fit=fit,
        ),
        code=_js("common.js") + _js("nw.js"),
    )
    choice.js_on_change("value", update)
    query.js_on_change("value", update)
    page = column(header, row(choice, query), row(heat, _colour_bar(mapper, "weight")), fit, row_fig)
    return page, update
