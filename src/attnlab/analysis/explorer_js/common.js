
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
