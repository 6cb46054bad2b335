"""The attention explorer (:mod:`attnlab.analysis.explorer`): one self-contained HTML page per run.

Unit part: the page needs nothing from the network, and the weights it embeds are the ones
``net.attention_maps`` gives for a tiny random Transformer and Bahdanau model on a tiny
sentencepiece model (each row summing to 1), with the tokens on its axes; the per-epoch callback
keeps every epoch across a restart; the NW page holds the trained model's kernel weights.

Browser part: a tiny Transformer trained by the real ``src/train.py`` (2 epochs) logs the page;
``mlflow ui`` serves it, and headless Chromium (driven over the DevTools protocol: real time,
console levels) opens the run's artifact page, where the MLflow UI shows it in a sandboxed
iframe. There a head and an epoch are chosen through the page's own widgets, and the pictures
must change; hovering a cell shows its tokens and weight; the page logs no error and requests
nothing from the network. Opened on its own, it takes its first state from the URL fragment.
"""

from __future__ import annotations

import html.parser
import json
import re
import time
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from attnlab.analysis import explorer
from attnlab.analysis.viz import collect_translation_maps
from attnlab.data.tokenizer import BOS_ID, EOS_ID, load_sentencepiece, train_sentencepiece
from attnlab.inference.decoding import translate
from attnlab.lit.heatmaps import EpochHeatmaps
from attnlab.models.bahdanau import Bahdanau
from attnlab.models.transformer import Transformer
from helpers.corpus_fixture import sentences

HALF_STEP = 0.5 / explorer.SCALE  # the page's rounding: uint16 fixed point
SOURCES = [e for e, _, _ in sentences()[:3]]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    """A tiny sentencepiece model (vocabulary 120) of the test corpus, as in test_models.py."""
    text = [s for e, f, _ in sentences() for s in (e, f)]
    folder = tmp_path_factory.mktemp("spm")
    train_sentencepiece(text, folder / "spm", vocab_size=120)
    return load_sentencepiece(folder / "spm.model")


def _net(kind: str, vocab: int, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    net = (
        Transformer(vocab, d_model=16, num_heads=2, num_layers=2, ffn_hidden=32, dropout=0.0)
        if kind == "transformer"
        else Bahdanau(vocab, embed_size=8, num_hiddens=16, num_layers=2, dropout=0.0)
    )
    return net.eval()


@pytest.fixture(scope="module", params=["transformer", "bahdanau"])
def page(request, tokenizer):
    """(kind, {epoch: net}, html): two "epochs" (two random models) of the 3 sentences."""
    V = tokenizer.get_piece_size()
    nets = {epoch: _net(request.param, V, seed=epoch) for epoch in (1, 2)}
    epochs = [
        explorer.translation_epoch(collect_translation_maps(net, tokenizer, SOURCES), epoch)
        for epoch, net in nets.items()
    ]
    return request.param, nets, explorer.translation_explorer(epochs, f"tiny {request.param}")


class _Tags(html.parser.HTMLParser):
    """The page's elements and attributes (script and style bodies are text, not markup)."""

    def __init__(self):
        super().__init__()
        self.tags, self.styles, self._in_style = [], [], False

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        self._in_style = tag == "style"

    def handle_endtag(self, tag):
        self._in_style = False

    def handle_data(self, data):
        if self._in_style:
            self.styles.append(data)


def test_the_page_loads_no_script_style_or_font_from_anywhere(page):
    _, _, text = page
    tags = _Tags()
    tags.feed(text)
    linked = [
        (tag, attrs) for tag, attrs in tags.tags if {"src", "href", "data"} & set(attrs) or tag == "link"
    ]
    assert linked == []  # every script and style is inline
    scripts = [attrs for tag, attrs in tags.tags if tag == "script"]
    assert len(scripts) >= 4  # Bokeh, its widgets, the data, the document and its glue
    assert not [s for s in tags.styles if re.search(r"@import|@font-face|url\(", s)]
    # (Bokeh's JS names CDNs for models this page does not use, MathJax and an icon font: the
    # browser test checks that the page, shown, requests nothing)
    assert len(text.encode()) < 2_500_000  # Bokeh's two inlined bundles are about 1.7 MB


def _independent_maps(net, tokenizer, sentence):
    """What the page should show for ``sentence``, computed here: greedy output, then one
    teacher-forced pass with the weights recorded; the tokens of the axes."""
    out = translate(net.init_state, net.step, tokenizer, [sentence])[0]
    src, valid = tokenizer.encode_sources([sentence])
    tgt_in = torch.tensor([[BOS_ID] + out])
    with torch.no_grad():
        maps = net.attention_maps(src, valid, tgt_in)
    source = [tokenizer.source_id_to_piece(int(i)) for i in src[0]]
    target_out = [tokenizer.id_to_piece(i) for i in out + [EOS_ID]]
    target_in = [tokenizer.id_to_piece(int(i)) for i in tgt_in[0]]
    axes = {
        "encoder_self": (source, source),
        "decoder_self": (target_in, target_out),
        "encoder_decoder": (source, target_out),
        "alignment": (source, target_out),
    }
    return tokenizer.decode(out), maps, axes


def test_the_page_embeds_the_weights_and_tokens_of_attention_maps(page, tokenizer):
    kind, nets, text = page
    data = explorer.read_data(text)
    assert data["task"] == "translation"
    assert [e["epoch"] for e in data["epochs"]] == [1, 2]
    checked = 0
    for epoch in data["epochs"]:
        net = nets[epoch["epoch"]]
        assert [s["source"] for s in epoch["sentences"]] == SOURCES
        for shown in epoch["sentences"]:
            translation, maps, axes = _independent_maps(net, tokenizer, shown["source"])
            assert shown["translation"] == translation
            assert (
                list(shown["kinds"])
                == list(maps)
                == (
                    ["alignment"]
                    if kind == "bahdanau"
                    else ["encoder_self", "decoder_self", "encoder_decoder"]
                )
            )
            for name, layers in maps.items():
                km = shown["kinds"][name]
                keys, queries = axes[name]
                assert (km["keys"], km["queries"]) == (keys, queries)
                assert len(km["layers"]) == len(layers) == (1 if kind == "bahdanau" else 2)
                for entry, w in zip(km["layers"], layers):
                    got = explorer.decode_weights(entry)  # (H, Q, K)
                    want = w[0].double().numpy()
                    assert got.shape == want.shape == (w.shape[1], len(queries), len(keys))
                    assert np.abs(got - want).max() <= HALF_STEP + 1e-7
                    # each query's weights over the keys sum to 1, up to K roundings
                    assert np.abs(got.sum(-1) - 1).max() <= got.shape[-1] * HALF_STEP + 1e-6
                    checked += 1
    assert checked == (2 * 3 * 1 if kind == "bahdanau" else 2 * 3 * 3 * 2)
    # the tokens are in the page as text (tick labels and hover of both axes); "<" and ">" of
    # "</s>" are JSON-escaped there, so that no "</script>" can end the data early
    tokens = {t for name, (keys, queries) in axes.items() if name in maps for t in keys + queries}
    assert "</s>" in tokens and "\\u003c/s\\u003e" in text
    assert all(json.dumps(t, ensure_ascii=False) in text for t in tokens if not set(t) & set("<>&"))


def test_weights_outside_0_1_are_refused():
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        explorer.encode_weights(torch.tensor([0.5, 1.5]))
    with pytest.raises(ValueError, match="finite"):
        explorer.encode_weights(torch.tensor([float("nan")]))
    entry = explorer.encode_weights(torch.tensor([[0.0, 1.0, 1 / 3]]))
    assert entry["shape"] == [1, 3]
    assert explorer.decode_weights(entry).tolist() == [[0.0, 1.0, 21845 / 65535]]


def test_epochs_with_other_sentences_are_refused(tokenizer):
    net = _net("bahdanau", tokenizer.get_piece_size(), 0)
    one = explorer.translation_epoch(collect_translation_maps(net, tokenizer, SOURCES[:1]), 1)
    two = explorer.translation_epoch(collect_translation_maps(net, tokenizer, SOURCES[1:2]), 2)
    with pytest.raises(ValueError, match="epoch 2 has other sentences"):
        explorer.translation_explorer([one, two], "mixed")
    with pytest.raises(ValueError, match="at least one epoch"):
        explorer.translation_explorer([], "empty")
    with pytest.raises(ValueError, match="not an attnlab explorer"):
        explorer.read_data("<html></html>")


class _Logger:
    def __init__(self):
        self.logged = []

    def log_artifact(self, local_path, artifact_path=None):
        self.logged.append((Path(local_path).name, artifact_path))

    def log_artifacts(self, local_dir, artifact_path=None):
        self.logged += [(p.name, artifact_path) for p in sorted(Path(local_dir).iterdir())]


def _validate(callback, net, tokenizer, epoch: int) -> None:
    """What Lightning does at the end of validation epoch ``epoch`` (1-based), on rank 0."""
    trainer = types.SimpleNamespace(sanity_checking=False, is_global_zero=True, current_epoch=epoch - 1)
    module = types.SimpleNamespace(net=net, tokenizer=tokenizer, device="cpu")
    callback.on_validation_epoch_end(trainer, module)


def test_a_resumed_run_keeps_the_earlier_epochs_in_its_explorer(tokenizer, tmp_path):
    """Epochs 1-2 by one callback (the killed run), epoch 3 by a new one on the same folder (the
    resumed run): its page has all three, each with its own model's weights."""
    V = tokenizer.get_piece_size()
    nets = {e: _net("transformer", V, seed=e) for e in (1, 2, 3)}
    _validate(EpochHeatmaps(SOURCES[:1], [], tmp_path, _Logger()), nets[1], tokenizer, 1)
    assert list(tmp_path.iterdir()) == []  # heatmaps.epoch_kinds=[]: no per-epoch maps at all
    first, logger = EpochHeatmaps(SOURCES[:1], ["encoder_decoder"], tmp_path, _Logger()), _Logger()
    for e in (1, 2):
        _validate(first, nets[e], tokenizer, e)
    resumed = EpochHeatmaps(SOURCES[:1], ["alignment"], tmp_path, logger)  # no PNG: not a Transformer kind
    _validate(resumed, nets[3], tokenizer, 3)
    data = explorer.read_data((tmp_path / "explorer.html").read_text(encoding="utf-8"))
    assert [e["epoch"] for e in data["epochs"]] == [1, 2, 3]
    for shown in data["epochs"]:
        _, maps, _ = _independent_maps(nets[shown["epoch"]], tokenizer, SOURCES[0])
        got = explorer.decode_weights(shown["sentences"][0]["kinds"]["encoder_decoder"]["layers"][1])
        assert np.abs(got - maps["encoder_decoder"][1][0].double().numpy()).max() <= HALF_STEP + 1e-7
    # PNGs of epoch_kinds only (none the Transformer has in the resumed run); the page replaces itself
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.png")) == [
        f"epochs/epoch0{e}/sent0_encoder_decoder_layer{layer}.png" for e in (1, 2) for layer in (1, 2)
    ]
    assert logger.logged == [("explorer.html", "attention")]
    # resumed with other heatmap sentences: the killed run's epochs do not fit, the page starts anew
    _validate(EpochHeatmaps(SOURCES[1:2], ["alignment"], tmp_path, None), nets[3], tokenizer, 4)
    data = explorer.read_data((tmp_path / "explorer.html").read_text(encoding="utf-8"))
    assert [(e["epoch"], e["sentences"][0]["source"]) for e in data["epochs"]] == [(4, SOURCES[1])]


def test_nw_figures_include_the_explorer_of_the_trained_kernel_weights(tmp_path):
    from attnlab.data.synthetic import synthetic_regression
    from attnlab.lit.regression import RegressionModule
    from attnlab.models.nadaraya_watson import nw_evaluation

    module = RegressionModule(
        optimizer={"_target_": "torch.optim.SGD", "_partial_": True, "lr": 0.1}, init_w=2.5
    )
    module.data = d = synthetic_regression(seed=0)
    module.figure_settings = {"kernels": ["gaussian", "boxcar"], "width": 1.0, "width_sweep": [0.1]}
    paths = module.figures(module.net, tmp_path)
    assert paths[-1] == tmp_path / "explorer.html"
    data = explorer.read_data(paths[-1].read_text(encoding="utf-8"))
    assert [f["name"] for f in data["fits"]] == [
        "trained Gaussian: w = 2.50, σ = 0.40",
        "Gaussian kernel, σ = 1",
        "Boxcar kernel, σ = 1",
        "Gaussian kernel, σ = 0.1",
    ]
    ev = nw_evaluation(d, 2.5, ["gaussian", "boxcar"], 1.0, [0.1])
    trained = explorer.decode_weights(data["fits"][0]["weights"])  # (m test, n training) points
    assert trained.shape == (len(d["x_test"]), len(d["x_train"]))
    assert np.abs(trained - ev["weights"].double().numpy()).max() <= HALF_STEP + 1e-7
    assert np.abs(trained.sum(1) - 1).max() <= trained.shape[1] * HALF_STEP + 1e-6
    assert np.allclose(data["fits"][0]["prediction"], (ev["weights"] @ d["y_train"]).numpy(), atol=1e-5)
    assert np.allclose(data["x_train"], d["x_train"].numpy(), atol=1e-6)


# --- in the MLflow UI, in headless Chromium -----------------------------------------------------


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny Transformer trained 2 epochs by the real src/train.py, one heatmap sentence. The
    per-epoch kinds name Bahdanau's only: no per-epoch PNG to draw (a second each), and the
    explorer shows every kind the Transformer has all the same."""
    from helpers.tiny_train import make_project, mlflow_client, runs, train

    root = make_project(tmp_path_factory.mktemp("explorer"))
    done = train(root, "trainer.max_epochs=2", "heatmaps.epoch_kinds=[alignment]")
    assert done.returncode == 0, done.stderr[-3000:]
    [run] = runs(mlflow_client(root))
    return root, run


def _drawn(state: str | None = None):
    """Matches the console message the explorer logs once a state (any, or ``state``) is drawn."""

    def found(event):
        if event.get("method") != "Runtime.consoleAPICalled":
            return False
        text = str(event["params"]["args"][0].get("value", ""))
        return text.startswith("attnlab-explorer: drawn ") and (state is None or text.endswith(" " + state))

    return found


# Where a point of the single-head heatmap is in the page (CSS pixels of the iframe's viewport):
# fractions (left to right, top to bottom) of its plot area.
_CELL_JS = """(() => {
  const view = Bokeh.index.find_one(Bokeh.documents[0].get_model_by_name("single"));
  const area = view.frame.bbox, canvas = view.canvas_view.el.getBoundingClientRect();
  return {x: canvas.left + area.x + area.width * %f, y: canvas.top + area.y + area.height * %f};
})()"""
# The text of Bokeh's hover tooltip (inside its elements' shadow roots).
_TOOLTIP_JS = """(() => {
  const found = [];
  const walk = (root) => root.querySelectorAll("*").forEach((el) => {
    if (el.shadowRoot) walk(el.shadowRoot);
    if (el.classList.contains("bk-tooltip-content")) found.push(el.innerText);
  });
  walk(document);
  return found.join(" ");
})()"""


def _heat(shot: Path, box: tuple[int, int, int, int]) -> np.ndarray:
    """The reddish pixels (heatmap cells and colour bar; not text, lines or widgets) of the
    screenshot inside ``box`` (left, top, right, bottom), others zeroed: (H, W, 3) uint8."""
    from PIL import Image

    with Image.open(shot) as image:
        rgb = np.asarray(image.convert("RGB").crop(box)).astype(int)
    red = (rgb[..., 0] > 120) & (rgb[..., 0] - rgb[..., 1] > 25) & (rgb[..., 0] - rgb[..., 2] > 25)
    return np.where(red[..., None], rgb, 0).astype(np.uint8)


def test_the_explorer_in_the_mlflow_ui_changes_with_the_head_and_the_epoch(trained, tmp_path):
    from helpers.browser import DevTools, find_browser, http, mlflow_ui
    from helpers.tiny_train import env

    browser = find_browser()
    root, run = trained
    local = root / "plots/transformer/explorer.html"
    data = explorer.read_data(local.read_text(encoding="utf-8"))
    assert [e["epoch"] for e in data["epochs"]] == [1, 2]  # every validation epoch
    heads = data["epochs"][0]["sentences"][0]["kinds"]["encoder_decoder"]["layers"][1]["shape"][0]
    assert heads == 4  # conf/model/transformer.yaml
    assert list(data["epochs"][0]["sentences"][0]["kinds"]) == [  # all kinds, not only epoch_kinds
        "encoder_self",
        "decoder_self",
        "encoder_decoder",
    ]
    with mlflow_ui(root / "mlflow.db", tmp_path, env()) as ui:
        served = http(f"{ui}/get-artifact", path="attention/explorer.html", run_uuid=run.info.run_id)
        assert served == local.read_bytes()  # what the UI's artifact view fetches and shows
        page = (
            f"{ui}/#/experiments/{run.info.experiment_id}/runs/{run.info.run_id}"
            "/artifacts/attention/explorer.html"
        )
        with DevTools(browser, tmp_path / "profile") as chrome:
            tab = chrome.open(page)
            event = chrome.wait_for(_drawn(), 90, "the explorer drawn in the MLflow UI")
            frame = event["sessionId"]  # the explorer's iframe (its own session)
            assert frame in chrome.frames and frame != tab
            iframe = chrome.evaluate(
                tab,
                """(() => {
                const f = document.querySelector("iframe.mlflow-html-iframe");
                const r = f.getBoundingClientRect();
                return {sandbox: f.getAttribute("sandbox"), src: f.src,
                        box: [r.left, r.top, r.right, r.bottom].map(Math.round)};})()""",
            )
            assert iframe["sandbox"] == "allow-scripts" and iframe["src"].startswith("blob:")
            box = tuple(iframe["box"])
            assert box[2] - box[0] > 500 and box[3] - box[1] > 300, box

            def show(state: str, choose: str | None, before: np.ndarray | None = None) -> np.ndarray:
                """Choose with the page's widgets (as a click does), wait until the page says it
                drew ``state``; its heatmap pixels, once they differ from ``before`` (Bokeh paints
                at its next frame; AssertionError when they never do)."""
                if choose:
                    chrome.evaluate(
                        frame,
                        f"(() => {{ const m = (n) => "
                        f"Bokeh.documents[0].get_model_by_name(n); {choose}; }})()",
                    )
                try:
                    chrome.wait_for(_drawn(state), 60, state)
                except AssertionError as e:
                    raise AssertionError(f"{e}; the explorer said: {chrome.console(frame)[-5:]}") from e
                for _attempt in range(40):
                    shot = chrome.screenshot(tab, tmp_path / f"{state.replace('&', '_')}.png")
                    heat = _heat(shot, box)
                    if heat.any() and (before is None or not np.array_equal(heat, before)):
                        return heat
                    time.sleep(0.25)
                raise AssertionError(f"the picture did not change for {state} (chose: {choose})")

            base = "sentence=0&kind=encoder_decoder&layer=2"
            grid = show(f"{base}&head=all&epoch=2", None)  # the default: last epoch, all heads
            head3 = show(f"{base}&head=3&epoch=2", 'm("head").active = 3', grid)
            head1 = show(f"{base}&head=1&epoch=2", 'm("head").active = 1', head3)  # another head
            epoch1 = show(f"{base}&head=1&epoch=1", 'm("epoch").value = 1', head1)  # another epoch
            # hovering a cell shows its tokens and weight: the middle cell of head 1, epoch 1
            entry = data["epochs"][0]["sentences"][0]["kinds"]["encoder_decoder"]
            w = explorer.decode_weights(entry["layers"][1])[0]  # (Q, K)
            q, k = w.shape[0] // 2, w.shape[1] // 2
            point = chrome.evaluate(frame, _CELL_JS % ((k + 0.5) / w.shape[1], (q + 0.5) / w.shape[0]))
            chrome.call(
                "Input.dispatchMouseEvent",
                tab,
                type="mouseMoved",
                x=box[0] + point["x"],
                y=box[1] + point["y"],
            )
            tip, deadline = "", time.monotonic() + 10
            while "weight" not in tip and time.monotonic() < deadline:
                time.sleep(0.2)
                tip = chrome.evaluate(frame, _TOOLTIP_JS)
            assert re.sub(r"\s+", " ", tip) == (
                f"query: {entry['queries'][q]} key: {entry['keys'][k]} weight: {w[q, k]:.4f}"
            ), tip
            show(f"{base}&head=all&epoch=1", 'm("head").active = 0', epoch1)  # all heads again
            messages = chrome.console(frame)
            said = [
                text.removeprefix("attnlab-explorer: drawn ")
                for _, text in messages
                if text.startswith("attnlab-explorer: drawn ")
            ]
            assert said == [
                f"{base}&head=all&epoch=2",
                f"{base}&head=3&epoch=2",
                f"{base}&head=1&epoch=2",
                f"{base}&head=1&epoch=1",
                f"{base}&head=all&epoch=1",
            ]  # one draw per choice
            requests = [
                e["params"]["request"]["url"]
                for e in chrome.events
                if e.get("method") == "Network.requestWillBeSent" and e.get("sessionId") == frame
            ]

        # the same page opened on its own, its state from the URL fragment
        with DevTools(browser, tmp_path / "profile2") as chrome:
            tab = chrome.open(f"{local.as_uri()}#sentence=0&kind=decoder_self&layer=1&head=2&epoch=1")
            chrome.wait_for(_drawn("sentence=0&kind=decoder_self&layer=1&head=2&epoch=1"), 60)
            assert chrome.evaluate(tab, "document.documentElement.dataset.explorer") == (
                "sentence=0&kind=decoder_self&layer=1&head=2&epoch=1"
            )
            messages += chrome.console(tab)
    errors = [m for m in messages if m[0] in ("error", "assert", "exception", "warning")]
    assert errors == [], errors
    assert [r for r in requests if not r.startswith(("blob:", "data:"))] == []  # offline
