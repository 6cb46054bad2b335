
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
