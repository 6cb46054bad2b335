"""The attention explorer: attention weights → one self-contained, interactive HTML page.

Drawn with **Bokeh** (``bokeh.resources.INLINE``): its JavaScript is inlined in the page, so
the file opens offline, from disk or inside the MLflow UI's artifact pane (which shows an
``.html`` artifact as a blob URL in an ``<iframe sandbox="allow-scripts">``: scripts run, no
network or same-origin access is needed). Bokeh was chosen over Plotly for three reasons:
its inlined JS (the core and widget bundles, about 1.7 MB) is under half of ``plotly.min.js``
(about 4.7 MB, which the Python package can only inline whole); its widgets (selects, slider,
radio buttons) run with ``CustomJS`` callbacks and no server; and heatmaps with per-cell hover
tooltips and token tick labels are built-in glyphs. The little glue JS below only picks which
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
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import torch

from attnlab.files import write_text_atomic
from attnlab.viz import SentenceMaps

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
    w = (weights.detach().float().cpu().numpy() if isinstance(weights, torch.Tensor)
         else np.asarray(weights, dtype=np.float64))
    if w.size and not (np.isfinite(w).all() and w.min() >= 0.0 and w.max() <= 1.0):
        raise ValueError(f"attention weights must be finite and in [0, 1]; got min {w.min()}, "
                         f"max {w.max()}")
    q = np.rint(w.astype(np.float64) * SCALE).astype("<u2")
    return {"shape": list(w.shape), "data": base64.b64encode(q.tobytes()).decode("ascii")}


def decode_weights(entry: Mapping) -> np.ndarray:
    """The float64 array of an :func:`encode_weights` entry, shaped ``entry["shape"]``."""
    q = np.frombuffer(base64.b64decode(entry["data"]), dtype="<u2")
    return (q.astype(np.float64) / SCALE).reshape(entry["shape"])


def translation_epoch(collected: Sequence[SentenceMaps], epoch: int,
                      label: str | None = None) -> dict:
    """One epoch's maps as the translation page stores them (JSON-ready; a resumed run's
    :class:`attnlab.lit.heatmaps.EpochHeatmaps` reads them back from the page: :func:`read_data`).

    Args:
        collected: :func:`attnlab.viz.collect_translation_maps` of the heatmap sentences.
        epoch: the 1-based epoch number; label: its name on the slider (default ``"epoch N"``).
    Returns:
        ``{"epoch", "label", "sentences": [{"source", "translation", "kinds": {kind: {"keys",
        "queries", "key_axis", "query_axis", "layers": [encode_weights((H, Q, K))]}}}]}``.
    """
    return {"epoch": int(epoch), "label": label or f"epoch {epoch}", "sentences": [
        {"source": s.sentence, "translation": s.translation,
         "kinds": {kind: {"keys": list(k.keys), "queries": list(k.queries), "key_axis": k.key_axis,
                          "query_axis": k.query_axis,
                          "layers": [encode_weights(w) for w in k.layers]}
                   for kind, k in s.kinds.items()}}
        for s in collected]}


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
    heads = max(k["layers"][0]["shape"][0] for e in epochs for s in e["sentences"]
                for k in s["kinds"].values())
    data = {"task": "translation", "title": title, "epochs": epochs}
    return _page(title, data, *_translation_layout(data, heads))


def nw_explorer(x_train, y_train, x_test, y_test, fits: Mapping[str, Mapping], title: str) -> str:
    """The Nadaraya–Watson page (D2L 11.2): choose a fit (kernel and width); see its test ×
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
    xs = [np.asarray(torch.as_tensor(v).detach().float().cpu(), dtype=np.float64)
          for v in (x_train, y_train, x_test, y_test)]
    n, m = len(xs[0]), len(xs[2])
    if not fits:
        raise ValueError("the explorer needs at least one fit")
    out = []
    for name, fit in fits.items():
        w, pred = torch.as_tensor(fit["weights"]), torch.as_tensor(fit["prediction"])
        if tuple(w.shape) != (m, n) or tuple(pred.shape) != (m,):
            raise ValueError(f"fit {name!r}: weights {tuple(w.shape)} and prediction "
                             f"{tuple(pred.shape)} do not match {m} test and {n} training points "
                             "((m, n) and (m,))")
        out.append({"name": name, "prediction": _floats(pred), "weights": encode_weights(w)})
    data = {"task": "nw", "title": title, "x_train": _floats(xs[0]), "y_train": _floats(xs[1]),
            "x_test": _floats(xs[2]), "y_test": _floats(xs[3]), "fits": out}
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
    template = ('{% block postamble %}<style>body { font-family: sans-serif; margin: 8px; }'
                '</style><script type="application/json" id="' + DATA_ID + '">{{ explorer_data }}'
                '</script>{% endblock %}')
    return file_html(doc, INLINE, title, template=template,
                     template_variables={"explorer_data": text})


def _palette() -> list[str]:
    """White (weight 0) to dark red (weight 1), like the PNGs' ``Reds``."""
    from bokeh.palettes import Reds256

    return list(reversed(Reds256))


def _heatmap(source, mapper, width: int, height: int, tooltips):
    """A figure with one rect per (query, key) cell, integer tick positions (labels set by JS),
    the first query at the top, hover showing ``tooltips``."""
    from bokeh.models import FixedTicker, HoverTool, Range1d
    from bokeh.plotting import figure

    fig = figure(width=width, height=height, tools="", toolbar_location=None,
                 x_range=Range1d(-0.5, 0.5), y_range=Range1d(0.5, -0.5))
    cells = fig.rect("x", "y", 1, 1, source=source, line_color=None,
                     fill_color={"field": "w", "transform": mapper})
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

    fig = figure(width=90, height=height, tools="", toolbar_location=None, outline_line_color=None,
                 min_border=0)
    fig.scatter([0], [0], alpha=0)  # a renderer, so Bokeh draws the (otherwise empty) figure
    fig.axis.visible = fig.grid.visible = False
    bar = ColorBar(color_mapper=mapper, width=16, title=title, title_text_font_style="normal",
                   major_label_text_font_size="10px")
    fig.add_layout(bar, "right")
    return fig


def _translation_layout(data: dict, heads: int):
    from bokeh.layouts import column, gridplot, row
    from bokeh.models import (ColumnDataSource, CustomJS, Div, LinearColorMapper, RadioButtonGroup,
                              Select, Slider)

    epochs = data["epochs"]
    sentences = epochs[0]["sentences"]
    kinds = list(sentences[0]["kinds"])
    mapper = LinearColorMapper(palette=_palette(), low=0.0, high=1.0)
    tooltips = [("query", "@query"), ("key", "@key"), ("weight", "@w{0.0000}")]
    empty = lambda: ColumnDataSource({"x": [], "y": [], "w": [], "key": [], "query": []})  # noqa: E731
    single_source = empty()
    single = _heatmap(single_source, mapper, 600, 500, tooltips)
    single.name = "single"
    grid_sources = [empty() for _ in range(heads)]
    grid_figs = [_heatmap(s, mapper, 300, 260, tooltips) for s in grid_sources]
    cols = math.ceil(math.sqrt(heads))
    grid = gridplot(grid_figs, ncols=cols, toolbar_location=None)

    header = Div(text="", width=580)
    sentence = Select(name="sentence", title="sentence", value="0", width=320, options=[
        (str(i), f"{i}: {s['source'][:60]}") for i, s in enumerate(sentences)])
    shown = next((k for k in ("encoder_decoder", "alignment") if k in kinds), kinds[0])
    kind = Select(name="kind", title="kind", value=shown, options=kinds, width=170)
    layer = Select(name="layer", title="layer", value="last", options=["last"], width=70)  # JS: last
    head = RadioButtonGroup(name="head", labels=["all heads"], active=0)
    last = len(epochs)
    epoch = Slider(name="epoch", title=epochs[-1]["label"], start=1, end=max(last, 2), value=last,
                   step=1, width=250, visible=last > 1, show_value=False)
    widgets = dict(header=header, sentence=sentence, kind=kind, layer=layer, head=head,
                   epoch=epoch, single=single, single_source=single_source, grid=grid,
                   grid_figs=grid_figs, grid_sources=grid_sources)
    update = CustomJS(args=widgets, code=_JS_COMMON + _JS_TRANSLATION)
    for w, prop in ((sentence, "value"), (kind, "value"), (layer, "value"), (head, "active"),
                    (epoch, "value")):
        w.js_on_change(prop, update)
    controls = column(header, row(sentence, kind, layer), row(head, epoch))
    page = column(controls, row(single, grid, _colour_bar(mapper, "weight")))
    return page, update


def _nw_layout(data: dict):
    from bokeh.layouts import column, row
    from bokeh.models import (ColumnDataSource, CustomJS, Div, LinearColorMapper, Select, Slider,
                              Span)
    from bokeh.plotting import figure

    fits, m = data["fits"], len(data["x_test"])
    mapper = LinearColorMapper(palette=_palette(), low=0.0, high=1.0)
    cells = ColumnDataSource({"x": [], "y": [], "w": [], "key": [], "query": []})
    heat = _heatmap(cells, mapper, 480, 440, [("test x", "@query"), ("training x_i", "@key"),
                                               ("weight", "@w{0.0000}")])
    heat.xaxis.axis_label = "training input x_i (keys, sorted)"
    heat.yaxis.axis_label = "test input x (queries)"
    heat.xaxis[0].major_label_orientation = "horizontal"
    curve = ColumnDataSource({"x": data["x_test"], "y": [0.0] * m})
    fit = figure(width=570, height=280, tools="", toolbar_location=None, title="fit")
    fit.line(data["x_test"], data["y_test"], line_dash="dashed", color="black",
             legend_label="truth f(x)")
    fit.scatter(data["x_train"], data["y_train"], size=5, alpha=0.4, color="gray",
                legend_label="training data")
    fit.line("x", "y", source=curve, line_width=2, color="#d62728", legend_label="prediction")
    fit.legend.location, fit.legend.label_text_font_size = "top_left", "10px"
    bars = ColumnDataSource({"x": data["x_train"], "w": [0.0] * len(data["x_train"])})
    row_fig = figure(width=570, height=170, tools="", toolbar_location=None, x_range=fit.x_range,
                     title="weights of one test point")
    row_fig.vbar(x="x", top="w", width=0.03, source=bars, color="#d62728")
    row_fig.xaxis.axis_label = "training input x_i"
    marks = [Span(dimension="height", line_dash="dotted", line_color="black", location=0.0)
             for _ in range(2)]
    fit.add_layout(marks[0])
    row_fig.add_layout(marks[1])
    header = Div(text="", width=570)
    choice = Select(name="fit", title="fit", value="0", width=280,
                    options=[(str(i), f["name"]) for i, f in enumerate(fits)])
    query = Slider(name="query", title="test point", start=0, end=max(m - 1, 1), value=m // 2,
                   step=1, width=270, show_value=False)
    update = CustomJS(args=dict(header=header, fit_select=choice, query=query, heat=heat,
                                mapper=mapper, cells=cells, curve=curve, bars=bars, marks=marks,
                                fit=fit),
                      code=_JS_COMMON + _JS_NW)
    choice.js_on_change("value", update)
    query.js_on_change("value", update)
    page = column(header, row(choice, query), row(heat, _colour_bar(mapper, "weight")), fit,
                  row_fig)
    return page, update


# --- glue JS (runs in the page; Bokeh passes the widgets as named arguments) -------------------

_JS_COMMON = r"""
const A = window.attnlabExplorer || (window.attnlabExplorer = (() => {
  const data = JSON.parse(document.getElementById("attnlab-explorer-data").textContent);
  const hash = new URLSearchParams(window.location.hash.replace(/^#/, ""));
  return {data, hash, cache: new Map(), busy: false, first: true, drawn: null};
})());
function weights(entry) {  // uint16 fixed point, little-endian → Float64Array
  let w = A.cache.get(entry.data);
  if (w === undefined) {
    const bin = atob(entry.data), n = bin.length >> 1;
    w = new Float64Array(n);
    for (let i = 0; i < n; i++) {
      w[i] = (bin.charCodeAt(2 * i) | (bin.charCodeAt(2 * i + 1) << 8)) / 65535;
    }
    A.cache.set(entry.data, w);
  }
  return w;
}
function rectCells(w, offset, Q, K, keys, queries) {  // one (Q, K) block as rect columns
  const x = [], y = [], v = [], key = [], query = [];
  for (let q = 0; q < Q; q++) for (let k = 0; k < K; k++) {
    x.push(k); y.push(q); v.push(w[offset + q * K + k]); key.push(keys[k]); query.push(queries[q]);
  }
  return {x, y, w: v, key, query};
}
// A label is plain text: break Bokeh's TeX delimiters ($$, \[, \() with a zero-width space, so
// that no token is typeset (which would fetch MathJax from the network).
const plain = (s) => s.replace(/\$\$/g, "$\u200b$").replace(/\\([[(])/g, "\\\u200b$1");
function axes(fig, keys, queries, every) {  // tick labels (every n-th), ranges
  const tick = (labels) => labels.map((_, i) => i).filter((i) => i % every === 0);
  const x = fig.below[0], y = fig.left[0];
  x.ticker.ticks = tick(keys); y.ticker.ticks = tick(queries);
  x.major_label_overrides = new Map(keys.map((s, i) => [i, plain(s)]));
  y.major_label_overrides = new Map(queries.map((s, i) => [i, plain(s)]));
  fig.x_range.setv({start: -0.5, end: keys.length - 0.5});
  fig.y_range.setv({start: queries.length - 0.5, end: -0.5});
}
function drawn(state) {  // said by release(), once Bokeh has taken the changes
  A.drawn = state;
}
// The end of a draw. Bokeh runs the callbacks of the changes a draw makes to its own widgets
// (layer.options, head.active, ...) after the draw returns (CustomJS.execute is async: they are
// microtasks), so A.busy turns them away until a task later; then the state drawn is said (Bokeh
// paints at its next frame).
function release() {
  setTimeout(() => {
    A.busy = false;
    if (A.drawn) {
      document.documentElement.dataset.explorer = A.drawn;
      console.log("attnlab-explorer: drawn " + A.drawn);
      A.drawn = null;
    }
  }, 0);
}
function escapeHtml(s) {
  const entities = {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"};
  return String(s).replace(/[&<>"]/g, (c) => entities[c]);
}
"""

_JS_TRANSLATION = r"""
if (A.busy) return;
A.busy = true;
try {
  const D = A.data, E = D.epochs;
  const asked = A.first ? A.hash : new URLSearchParams();  // the URL fragment, at the start only
  A.first = false;
  if (asked.has("epoch")) {
    const i = E.findIndex((e) => String(e.epoch) === asked.get("epoch"));
    if (i < 0) throw new Error("no epoch " + asked.get("epoch") + " in this explorer");
    epoch.value = i + 1;
  }
  if (asked.has("sentence")) sentence.value = asked.get("sentence");
  if (asked.has("kind")) kind.value = asked.get("kind");
  const ep = E[epoch.value - 1];
  const s = ep.sentences[Number(sentence.value)];
  if (s === undefined) throw new Error("no sentence " + sentence.value);
  const km = s.kinds[kind.value];
  if (km === undefined) throw new Error("no attention kind " + kind.value);
  const L = km.layers.length;
  layer.options = Array.from({length: L}, (_, i) => String(i + 1));
  if (asked.has("layer")) layer.value = asked.get("layer");
  if (!(Number(layer.value) >= 1 && Number(layer.value) <= L)) layer.value = String(L);
  const entry = km.layers[Number(layer.value) - 1];
  const [H, Q, K] = entry.shape;
  head.labels = ["all heads", ...Array.from({length: H}, (_, i) => "head " + (i + 1))];
  if (asked.has("head")) head.active = asked.get("head") === "all" ? 0 : Number(asked.get("head"));
  if (!(head.active >= 0 && head.active <= H)) head.active = 0;
  const w = weights(entry);
  epoch.title = ep.label + " (" + epoch.value + " of " + E.length + ")";
  header.text = "<b>" + escapeHtml(D.title) + "</b><br>" + escapeHtml(ep.label) + ": <i>" +
      escapeHtml(s.source) + "</i> → <i>" + escapeHtml(s.translation) + "</i>";
  const label = kind.value + " layer " + layer.value;
  const every = Math.max(1, Math.ceil(Math.max(Q, K) / 60));
  if (head.active === 0 && H > 1) {
    const cell = Math.max(8, Math.min(22, Math.floor(260 / Math.max(Q, K))));
    for (let h = 0; h < grid_figs.length; h++) {
      const f = grid_figs[h];
      f.visible = h < H;
      if (h >= H) continue;
      grid_sources[h].data = rectCells(w, h * Q * K, Q, K, km.keys, km.queries);
      axes(f, km.keys, km.queries, every);
      f.title.text = "head " + (h + 1);
      f.width = Math.max(200, K * cell + 100); f.height = Q * cell + 130;
      f.below[0].axis_label = h >= H - Math.ceil(Math.sqrt(H)) ? km.key_axis : "";
      f.left[0].axis_label = km.query_axis;
    }
    single.visible = false; grid.visible = true;
  } else {
    const h = Math.max(0, head.active - 1);
    const cell = Math.max(12, Math.min(28, Math.floor(560 / Math.max(Q, K))));
    single_source.data = rectCells(w, h * Q * K, Q, K, km.keys, km.queries);
    axes(single, km.keys, km.queries, every);
    single.title.text = label + (H > 1 ? ", head " + (h + 1) : "");
    single.below[0].axis_label = km.key_axis; single.left[0].axis_label = km.query_axis;
    single.width = Math.max(360, K * cell + 130); single.height = Q * cell + 150;
    single.visible = true; grid.visible = false;
  }
  drawn("sentence=" + sentence.value + "&kind=" + kind.value + "&layer=" + layer.value +
        "&head=" + (head.active === 0 ? "all" : head.active) + "&epoch=" + ep.epoch);
} catch (err) {
  header.text = "<b>attnlab explorer: " + escapeHtml(err.message) + "</b>";
  throw err;
} finally {
  release();
}
"""

_JS_NW = r"""
if (A.busy) return;
A.busy = true;
try {
  const D = A.data, m = D.x_test.length, n = D.x_train.length;
  if (A.first) {
    A.first = false;
    if (A.hash.has("fit")) fit_select.value = A.hash.get("fit");
    if (A.hash.has("query")) query.value = Number(A.hash.get("query"));
  }
  const f = D.fits[Number(fit_select.value)];
  if (f === undefined) throw new Error("no fit " + fit_select.value);
  const w = weights(f.weights), q = Math.min(Math.max(0, query.value), m - 1);
  const fmt = (v) => v.toFixed(2);
  cells.data = cells_of(w);
  mapper.high = Math.max(1e-6, ...w);  // each fit on its own scale: NW weights are small
  function cells_of(w) {
    const c = {x: [], y: [], w: [], key: [], query: []};
    for (let i = 0; i < m; i++) for (let j = 0; j < n; j++) {
      c.x.push(j); c.y.push(i); c.w.push(w[i * n + j]);
      c.key.push(fmt(D.x_train[j])); c.query.push(fmt(D.x_test[i]));
    }
    return c;
  }
  const every = Math.max(1, Math.ceil(Math.max(m, n) / 10));
  axes(heat, D.x_train.map(fmt), D.x_test.map(fmt), every);
  heat.title.text = "attention weights: " + f.name;
  curve.data = {x: D.x_test, y: f.prediction};
  bars.data = {x: D.x_train, w: Array.from(w.subarray(q * n, (q + 1) * n))};
  for (const s of marks) s.location = D.x_test[q];
  let mse = 0;
  for (let i = 0; i < m; i++) mse += (f.prediction[i] - D.y_test[i]) ** 2 / m;
  fit.title.text = "fit: " + f.name + ", test MSE " + mse.toFixed(3);
  query.title = "test point x = " + fmt(D.x_test[q]) + " (" + (q + 1) + " of " + m + ")";
  header.text = "<b>" + escapeHtml(D.title) + "</b>";
  drawn("fit=" + fit_select.value + "&query=" + q);
} catch (err) {
  header.text = "<b>attnlab explorer: " + escapeHtml(err.message) + "</b>";
  throw err;
} finally {
  release();
}
"""
