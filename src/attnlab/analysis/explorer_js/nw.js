
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
