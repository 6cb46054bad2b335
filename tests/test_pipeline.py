"""Integration: the real `dvc repro` on a tiny corpus the test writes (no network, no shared mirror).

The project's conf/, src/, dvc.yaml and params.yaml are copied into a temporary
folder, shrunk (tiny models, few epochs), pointed at a mirror folder holding the
tiny corpus, and run end to end with DVC; then the outputs, the MLflow store,
DVC's change tracking and the exported models are checked. The finished project
then plays two more parts: a workspace where two `dvc repro` run at once, and the
machine that `dvc push`es its results for a fresh `git clone` + `dvc pull`. Last,
`mlflow ui` serves its MLflow store to the UI's own REST endpoints and to headless Chromium.
"""

import contextlib
import hashlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import pytest
import sacrebleu
import sacremoses
import torch
import yaml
from omegaconf import OmegaConf

from helpers.browser import PNG_MAGIC, WINDOW
from helpers.browser import chromium as _chromium
from helpers.browser import find_browser as _browser
from helpers.browser import http as _http
from helpers.browser import mlflow_ui as _mlflow_ui
from helpers.corpus_fixture import write_mirror

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("nw", "bahdanau", "transformer")
SEQ2SEQ = ("bahdanau", "transformer")
HEATMAP_SENTENCES = [0, 1]  # validation sentences whose attention maps are drawn


def _env(mirror: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env["ATTNLAB_DATA_MIRROR"] = str(mirror)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def _edit(path: Path, **updates) -> None:
    cfg = OmegaConf.load(path)
    for key, value in updates.items():
        OmegaConf.update(cfg, key, value, force_add=True)
    OmegaConf.save(cfg, path)


def _git_show(repo: Path, rev: str, path: str) -> str:
    """The text of ``path`` at ``rev`` (an experiment's commit) in ``repo``."""
    return subprocess.run(
        ["git", "show", f"{rev}:{path}"], cwd=repo, capture_output=True, text=True, check=True
    ).stdout


def dvc(project: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dvc", *args],
        cwd=project,
        env=project.env,
        capture_output=True,
        text=True,
        timeout=600,
    )


class Project(type(Path())):
    env: dict
    rows: dict  # `dvc exp show` of the experiments fixture


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    base = tmp_path_factory.mktemp("pipeline")
    root = Project(base / "project")
    root.mkdir()
    for name in ("conf", "src", "dvc.yaml", "params.yaml"):
        src = ROOT / name
        (
            shutil.copytree(src, root / name, ignore=shutil.ignore_patterns("__pycache__"))
            if src.is_dir()
            else shutil.copy(src, root / name)
        )
    digests = write_mirror(base / "mirror")
    download = OmegaConf.load(root / "conf/download.yaml")
    download.sources = {rel: {"sha256": [d]} for rel, d in digests.items()}
    OmegaConf.save(download, root / "conf/download.yaml")
    _edit(root / "conf/data/multi30k.yaml", vocab_size=150, val_bleu_sentences=4)
    _edit(root / "conf/data/parallel.yaml", vocab_size=300, val_bleu_sentences=4)
    _edit(root / "conf/config.yaml", **{"heatmaps.sentences": HEATMAP_SENTENCES})  # ~1 s per PNG
    _edit(
        root / "conf/model/transformer.yaml",
        **{"net.d_model": 32, "net.ffn_hidden": 64, "batch_size": 8, "warmup_steps": 5},
    )
    _edit(root / "conf/model/bahdanau.yaml", **{"net.embed_size": 16, "net.num_hiddens": 32, "batch_size": 8})
    # 2 epochs, none of the default recipe's overrides (a linear decay after 200 warm-up steps cannot
    # plan a few tiny steps; the experiments below compare against empty overrides)
    _edit(
        root / "params.yaml",
        **{
            "models.bahdanau.max_epochs": 2,
            "models.transformer.max_epochs": 2,
            "nw.max_epochs": 3,
            "models.transformer.overrides": "",
            "models.bahdanau.overrides": "",
            "device": "cpu",
        },
    )
    root.env = _env(base / "mirror")
    subprocess.run([sys.executable, "-m", "dvc", "init", "--no-scm", "-q"], cwd=root, check=True)
    result = dvc(root, "repro")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return root


def test_every_stage_wrote_its_outputs(project):
    from attnlab.checkpoint import load_net
    from attnlab.data.tokenizer import load_sentencepiece
    from attnlab.inference.decoding import translate_text

    assert (project / "data/raw/multi30k/train.en.gz").exists()
    assert (project / "data/raw/fra-eng.zip").exists()
    tok = project / "data/tokenized/multi30k-en-fr"
    for f in (
        "spm.model",
        "train.src.ids.npy",
        "val.src.ids.npy",
        "test.src.ids.npy",
        "test.src.txt",
        "test.tgt.txt",
    ):
        assert (tok / f).exists(), f
    for m in MODELS:
        assert (project / f"checkpoints/{m}/best.ckpt").exists()
        assert json.loads((project / f"models/{m}/config.json").read_text())["model"] == m
    nw = json.loads((project / "metrics/nw.json").read_text())
    assert nw["mse"] < nw["mse_average_pooling"]
    assert nw["mse_constant"] == pytest.approx(nw["mse_average_pooling"])  # constant kernel = mean
    assert nw["mse_gaussian"] == pytest.approx(nw["mse_nonparametric"])  # both σ = 1
    assert {"mse_boxcar", "mse_epanechnikov"} <= set(nw)
    references = _test_references(project, "fr")
    tokenizer = load_sentencepiece(tok / "spm.model")
    for m in SEQ2SEQ:
        scores = json.loads((project / f"metrics/{m}.json").read_text())
        hypotheses = (project / f"metrics/{m}.hyp.txt").read_text().splitlines()
        assert scores["num_sentences"] == len(hypotheses) == len(references) == 4
        # the scores are sacreBLEU's on the hypothesis file and the raw test references
        assert scores["bleu"] == sacrebleu.corpus_bleu(hypotheses, [references]).score
        assert scores["bleu_lc"] == sacrebleu.corpus_bleu(hypotheses, [references], lowercase=True).score
        assert scores["chrf"] == sacrebleu.corpus_chrf(hypotheses, [references]).score
        assert scores["bleu_tok_lc"] == _papers_bleu(hypotheses, references, "fr")
        _assert_says_what_it_measured(scores, "en", "fr")
        # data.more_test_splits: test_2017_flickr, decoded with the same settings into the run
        more = scores["more_test_sets"]["test_2017_flickr"]
        hyps_2017 = _logged_hypotheses(project, m, "test_2017_flickr")
        refs_2017 = _test_references(project, "fr", "test_2017_flickr")
        assert more["num_sentences"] == len(hyps_2017) == len(refs_2017) == 4
        assert more["bleu"] == sacrebleu.corpus_bleu(hyps_2017, [refs_2017]).score
        assert more["bleu_lc"] == sacrebleu.corpus_bleu(hyps_2017, [refs_2017], lowercase=True).score
        assert more["chrf"] == sacrebleu.corpus_chrf(hyps_2017, [refs_2017]).score
        assert more["bleu_tok_lc"] == _papers_bleu(hyps_2017, refs_2017, "fr")
        net = load_net(project / f"checkpoints/{m}/best.ckpt", expected_kind=m).eval()
        sources_2017 = (tok / "test_2017.src.txt").read_text(encoding="utf-8").splitlines()
        assert sources_2017 == _test_references(project, "en", "test_2017_flickr")
        assert hyps_2017 == translate_text(
            net.init_state,
            net.step,
            tokenizer,
            sources_2017,
            beam_size=scores["decoding"]["beam_size"],
            alpha=scores["decoding"]["alpha"],
        )


def test_head_importance_masks_each_head_of_the_trained_transformer(project):
    """The stage's BLEU is greedy sacreBLEU on the val split with the kept checkpoint (recomputed
    here); every one of its 2 × 3 × 4 heads is masked alone, then pruned one by one."""
    from attnlab.checkpoint import load_net
    from attnlab.data.tokenizer import load_sentencepiece
    from attnlab.inference.decoding import translate_text

    result = json.loads((project / "plots/heads/transformer/importance.json").read_text())
    metrics = json.loads((project / "metrics/transformer.heads.json").read_text())
    tok = project / "data/tokenized/multi30k-en-fr"
    sources, references = (
        (tok / "val.src.txt").read_text().splitlines(),
        (tok / "val.tgt.txt").read_text().splitlines(),
    )
    net = load_net(project / "checkpoints/transformer/best.ckpt", expected_kind="transformer").eval()
    hyps = translate_text(net.init_state, net.step, load_sentencepiece(tok / "spm.model"), sources)
    assert result["score"] == metrics["val_bleu"] == sacrebleu.corpus_bleu(hyps, [references]).score
    assert result["num_sentences"] == metrics["num_sentences"] == len(sources)
    assert len(result["heads"]) == metrics["heads"] == 24 and len(result["pruning"]) == 25
    for h in result["heads"]:
        assert h["importance"] == result["score"] - h["score"]
    assert metrics["pruned"] == 12 and metrics["pruned_half_bleu"] == result["pruning"][12]["score"]
    for name in ("importance.png", "pruning.png", "importance.csv", "pruning.csv"):
        assert (project / "plots/heads/transformer" / name).stat().st_size > 0


def _papers_bleu(hypotheses: list[str], references: list[str], lang: str) -> float:
    """BLEU on lowercased, Moses-normalized and -tokenized text: sacremoses' ports of the
    Multi30k scripts, then sacreBLEU with no tokenizer of its own (the papers' metric)."""
    normalizer, tokenizer = sacremoses.MosesPunctNormalizer(lang=lang), sacremoses.MosesTokenizer(lang=lang)

    def tok(lines: list[str]) -> list[str]:
        return [tokenizer.tokenize(normalizer.normalize(x.lower() + "\n"), return_str=True) for x in lines]

    return sacrebleu.corpus_bleu(tok(hypotheses), [tok(references)], tokenize="none", force=True).score


def _test_references(project: Path, lang: str, test_set: str = "test_2016_flickr") -> list[str]:
    """The `test_set` side `lang` of the project's raw Multi30k, as evaluate scores it."""
    import gzip

    raw = project / f"data/raw/multi30k/{test_set}.{lang}.gz"
    return [line.strip() for line in gzip.decompress(raw.read_bytes()).decode().splitlines()]


def _logged_hypotheses(project: Path, model: str, test_set: str) -> list[str]:
    """The translations of `test_set` that evaluate logged to `model`'s MLflow run."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{project}/mlflow.db")
    run_id = json.loads((project / f"runs/{model}.json").read_text())["run_id"]
    local = client.download_artifacts(
        run_id, f"evaluation/{test_set}.hyp.txt", str(project / f"dl-hyp-{model}")
    )
    return Path(local).read_text(encoding="utf-8").splitlines()


def _assert_says_what_it_measured(
    scores: dict, src_lang: str, tgt_lang: str, corpus: str = "multi30k", test_set: str = "test_2016_flickr"
) -> None:
    """metrics/<model>.json names the corpus, pair, test set, decoding and sacreBLEU signatures."""
    assert (scores["corpus"], scores["src_lang"], scores["tgt_lang"], scores["test_set"]) == (
        corpus,
        src_lang,
        tgt_lang,
        test_set,
    )
    assert (scores["decoding"]["beam_size"], scores["decoding"]["alpha"]) == (5, 1.0)
    version = sacrebleu.__version__
    assert scores["signature"] == {
        "bleu": f"nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:{version}",
        "bleu_lc": f"nrefs:1|case:lc|eff:no|tok:13a|smooth:exp|version:{version}",
        "chrf": f"nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:{version}",
        "bleu_tok_lc": f"nrefs:1|case:lc|eff:no|tok:none|smooth:exp|version:{version}"
        f"|pre:lc.norm.tok.{tgt_lang}|sacremoses:{sacremoses.__version__}",
    }


def test_mlflow_store_has_runs_metrics_and_heatmaps(project):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{project}/mlflow.db")
    exp = client.get_experiment_by_name("attnlab")
    runs = {r.data.tags["model"]: r for r in client.search_runs([exp.experiment_id])}
    assert set(runs) == set(MODELS)

    def artifacts(run_id, path=""):
        out = []
        for a in client.list_artifacts(run_id, path):
            out += artifacts(run_id, a.path) if a.is_dir else [a.path]
        return out

    for m, run in runs.items():
        assert run.info.status == "FINISHED"
        files = artifacts(run.info.run_id)
        pngs = [f for f in files if f.startswith("attention/") and f.endswith(".png")]
        assert pngs, files
        assert any(f.endswith(".ckpt") for f in files), files
        assert "config.yaml" in files
        local = client.download_artifacts(run.info.run_id, pngs[0], str(project / f"dl-{m}"))
        assert Path(local).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for m in SEQ2SEQ:
        run = runs[m]
        assert run.data.params["model/name"] == m
        for key in ("train_loss", "val_loss", "val_bleu", "tokens_per_sec"):
            history = client.get_metric_history(run.info.run_id, key)
            assert len(history) == 2, key  # one per epoch
        assert "test_bleu" in run.data.metrics
        scores = json.loads((project / f"metrics/{m}.json").read_text())
        tags = run.data.tags
        assert (tags["corpus"], tags["src_lang"], tags["tgt_lang"], tags["test_set"]) == (
            "multi30k",
            "en",
            "fr",
            "test_2016_flickr",
        )
        assert tags["test_bleu_signature"] == scores["signature"]["bleu"]
        assert json.loads(tags["test_decoding"]) == scores["decoding"]
        assert run.data.metrics["test_bleu"] == scores["bleu"]
        more = scores["more_test_sets"]["test_2017_flickr"]
        assert [
            run.data.metrics[f"{k}/test_2017_flickr"]
            for k in ("test_bleu", "test_bleu_lc", "test_chrf", "test_bleu_tok_lc")
        ] == [more["bleu"], more["bleu_lc"], more["chrf"], more["bleu_tok_lc"]]
        assert run.data.metrics["test_bleu_tok_lc"] == scores["bleu_tok_lc"]
        losses = [h.value for h in client.get_metric_history(run.info.run_id, "train_loss")]
        assert losses[-1] < losses[0]
        assert any(f.startswith("attention/sent0_") for f in artifacts(run.info.run_id))
    layers = [f for f in artifacts(runs["transformer"].info.run_id) if f.startswith("attention/sent0_")]
    for kind in ("encoder_self", "decoder_self", "encoder_decoder"):
        assert sum(kind in f for f in layers) == 2  # one figure per layer
    nw_pngs = {f for f in artifacts(runs["nw"].info.run_id) if f.startswith("attention/")}
    assert {f"attention/nw_{k}.png" for k in ("gaussian", "boxcar", "constant", "epanechnikov")} <= nw_pngs
    assert runs["nw"].data.metrics["test_mse"] == pytest.approx(
        json.loads((project / "metrics/nw.json").read_text())["mse"]
    )


def test_history_csv_and_heatmaps_match_the_mlflow_run(project):
    """plots/<model>/history.csv holds each epoch's logged metrics, and plots/<model>/attention/
    the PNGs of the run's attention/ artifacts: the final maps and, after every validation
    epoch, the cross-attention (Transformer) and alignment (Bahdanau) maps."""
    import csv

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{project}/mlflow.db")
    exp = client.get_experiment_by_name("attnlab")
    runs = {r.data.tags["model"]: r for r in client.search_runs([exp.experiment_id])}
    epoch_kinds = {"bahdanau": ("alignment", 1), "transformer": ("encoder_decoder", 2)}  # layers
    for m in MODELS:
        run_id = runs[m].info.run_id
        rows = list(csv.DictReader((project / f"plots/{m}/history.csv").open()))
        epochs = {"nw": 3, "bahdanau": 2, "transformer": 2}[m]
        assert [int(r["epoch"]) for r in rows] == list(range(1, epochs + 1))
        keys = ("train_loss", "val_loss") + (("val_bleu", "tokens_per_sec") if m in SEQ2SEQ else ())
        heads = {"nw": 0, "bahdanau": 3, "transformer": (2 + 2 + 3) * 2 * 4}[m]  # per-head statistics
        stats = sorted(k for k in rows[0] if k.split("/")[0] in ("entropy", "confidence", "diagonal_offset"))
        assert len(stats) == heads, stats
        keys += tuple(stats[:2]) + tuple(k for k in stats if k.startswith("diagonal_offset"))[:1]
        for key in stats:  # entropy in [0, log K], confidence in [1/K, 1], offset in [0, 1]
            assert all(
                0.0 <= float(r[key]) <= (math.log(100) if key.startswith("entropy") else 1.0) for r in rows
            ), key
        for key in keys:
            logged = client.get_metric_history(run_id, key)
            assert [(int(r["step"]), float(r[key])) for r in rows] == [(h.step, h.value) for h in logged], key
        local = sorted(
            p.relative_to(project / f"plots/{m}").as_posix()
            for p in (project / f"plots/{m}/attention").rglob("*.png")
        )
        final = [a.path for a in client.list_artifacts(run_id, "attention") if not a.is_dir]
        assert [f for f in local if f.count("/") == 1] == sorted(f for f in final if f.endswith(".png"))
        # the explorer (attnlab.analysis.explorer): beside the PNG folder locally, the same bytes in MLflow
        assert "attention/explorer.html" in final
        got = client.download_artifacts(run_id, "attention/explorer.html", str(project / f"dl-explorer-{m}"))
        assert Path(got).read_bytes() == (project / f"plots/{m}/explorer.html").read_bytes()
        if m == "nw":
            assert not (project / "plots/nw/attention/epochs").exists()
            continue
        kind, layers = epoch_kinds[m]
        for epoch in range(1, epochs + 1):
            folder = f"attention/epochs/epoch{epoch:02d}"
            logged = sorted(a.path for a in client.list_artifacts(run_id, folder))
            expected = sorted(
                f"{folder}/sent{i}_{kind}_layer{layer}.png"
                for i in HEATMAP_SENTENCES
                for layer in range(1, layers + 1)
            )
            assert logged == expected and [f for f in local if f.startswith(folder)] == expected
            got = client.download_artifacts(run_id, expected[0], str(project / f"dl-epochs-{m}"))
            assert Path(got).read_bytes() == (project / f"plots/{m}" / expected[0]).read_bytes()


def test_second_repro_has_nothing_to_do(project):
    status = dvc(project, "status")
    assert "up to date" in status.stdout, status.stdout


def test_model_config_edit_invalidates_only_that_model(project):
    path = project / "conf/model/transformer.yaml"
    original = path.read_text()
    try:
        path.write_text(original.replace("dropout: 0.1", "dropout: 0.2"))
        changed = json.loads(dvc(project, "status", "--json").stdout)
        # evaluate and export read the file too (its `decoding` settings), and head_importance
        # (its model); nothing of Bahdanau or NW
        assert set(changed) == {
            "train@transformer",
            "evaluate@transformer",
            "export@transformer",
            "head_importance",
        }
    finally:
        path.write_text(original)
    assert "up to date" in dvc(project, "status").stdout


def test_export_decodes_like_the_checkpoint(project):
    from attnlab.data.tokenizer import load_sentencepiece
    from attnlab.inference.decoding import translate
    from attnlab.lit.translation import TranslationModule
    from attnlab.serving.translator import load_translator

    tok_dir = project / "data/tokenized/multi30k-en-fr"
    sources = (tok_dir / "test.src.txt").read_text().splitlines()
    sp = load_sentencepiece(tok_dir / "spm.model")
    for m in SEQ2SEQ:
        ckpt = TranslationModule.load_from_checkpoint(
            project / f"checkpoints/{m}/best.ckpt", map_location="cpu", weights_only=True
        )
        ckpt.net.eval()
        init_state, step, tok, _ = load_translator(project / f"models/{m}")
        exported = translate(init_state, step, tok, sources)
        assert exported == translate(ckpt.net.init_state, ckpt.net.step, sp, sources)
    hyps = (project / "metrics/transformer.hyp.txt").read_text().splitlines()
    out = subprocess.run(
        [sys.executable, "src/translate.py", "model=transformer"],
        cwd=project,
        env=project.env,
        input="\n".join(sources) + "\n",
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines() == hyps
    assert "Device information mismatch" not in out.stderr  # the AVX2 step, loaded quietly


@pytest.mark.parametrize("model", SEQ2SEQ)
def test_a_real_sentence_translates_the_same_alone_and_in_any_batch(project, mirror_dir, model):
    """The test_2016_flickr sources (real text), decoded greedily and with beam 5: all 1,000 get
    the same ids in evaluate's batches (128, sorted by length) through the checkpoint and the
    export, and in batches of 7 in reverse order; every fourth of them, and the longest and the
    shortest, gets the ids of those batches alone, through the checkpoint and through the export
    (a sentence alone is a batch of one: the whole set alone took 10 minutes per model)."""
    import gzip

    from attnlab.checkpoint import load_net
    from attnlab.data.tokenizer import load_sentencepiece
    from attnlab.inference.decoding import translate
    from attnlab.serving.translator import load_translator

    sources = (
        gzip.decompress((mirror_dir / "multi30k/test_2016_flickr.en.gz").read_bytes()).decode().splitlines()
    )
    sp = load_sentencepiece(project / "data/tokenized/multi30k-en-fr/spm.model")
    net = load_net(project / f"checkpoints/{model}/best.ckpt", expected_kind=model)
    init_state, step, tok, _ = load_translator(project / f"models/{model}")
    by_length = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    alone_sample = sorted({*range(0, len(sources), 4), by_length[0], by_length[-1]})
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: a second thread only waits
    try:
        for beam in ({"beam_size": 1}, {"beam_size": 5, "alpha": 1.0}):
            batched = translate(net.init_state, net.step, sp, sources, batch_size=128, **beam)
            assert translate(init_state, step, tok, sources, batch_size=128, **beam) == batched
            reverse = translate(net.init_state, net.step, sp, sources[::-1], batch_size=7, **beam)
            assert reverse[::-1] == batched, beam
            for engine in ((net.init_state, net.step, sp), (init_state, step, tok)):
                for i in alone_sample:
                    assert translate(*engine, [sources[i]], **beam) == [batched[i]], (beam, i)
    finally:
        torch.set_num_threads(threads)


# What users type: every one must reach the model verbatim (Hydra's override grammar would
# reject or retype many of them: quotes, commas, brackets, true/null, numbers, ${...}).
HOSTILE = [
    "A man's dog runs.",
    'He said "hello" to her.',
    "a = b",
    "red, white, blue",
    "[brackets]",
    "(parentheses)",
    "{braces}",
    "true",
    "null",
    "1e3",
    "42",
    "-x",
    "--help",
    "+text=x",
    "${oc.env:HOME}",
    "'single quotes'",
    "Ελληνικά γράμματα.",
    "中文句子。",
    "   ",
    "\u200b",
    "Deux chiens\u202f!",
    "",
]


@pytest.mark.parametrize("model", SEQ2SEQ)
def test_translate_py_shows_the_attention_of_the_translation_it_printed(project, tmp_path, model):
    """`+show_attention=true` on the pipeline's own export: the printed line is the translation,
    the PNGs and the explorer page hold the weights the checkpoint's own forward pass gives."""
    from attnlab.analysis.explorer import decode_weights, read_data
    from attnlab.data.special_tokens import BOS_ID
    from attnlab.lit.translation import TranslationModule
    from attnlab.serving.translator import Translator

    sentence = (project / "data/tokenized/multi30k-en-fr/test.src.txt").read_text().splitlines()[0]
    run = subprocess.run(
        [
            sys.executable,
            "src/translate.py",
            f"model={model}",
            f"+text={sentence}",
            "+show_attention=true",
            f"hydra.run.dir={tmp_path}",
        ],
        cwd=project,
        env=project.env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    translator = Translator(project / f"models/{model}")
    ((a,),) = [t.alignments for t in translator.align([sentence])]
    assert run.stdout == a.translation + "\n" and f"explorer: {tmp_path / 'attention'}" in run.stderr
    net = TranslationModule.load_from_checkpoint(
        project / f"checkpoints/{model}/best.ckpt", map_location="cpu", weights_only=True
    ).net.eval()
    src, valid = translator.tokenizer.encode_sources([sentence])
    ids = [translator.tokenizer.piece_to_id(t) for t in a.target_tokens]
    maps = net.attention_maps(src, valid, torch.tensor([[BOS_ID] + ids[:-1]]))[a.kind]
    torch.testing.assert_close(a.weights, torch.stack(maps, 1)[0], atol=1e-5, rtol=0)
    assert sorted(p.name for p in (tmp_path / "attention").glob("*.png")) == [
        f"sent0_{a.kind}_layer{layer}.png" for layer in range(1, a.weights.shape[0] + 1)
    ]
    page = read_data((tmp_path / "attention/explorer.html").read_text())
    layers = page["epochs"][0]["sentences"][0]["kinds"][a.kind]["layers"]
    assert max(abs(decode_weights(e) - w.double().numpy()).max() for e, w in zip(layers, a.weights)) < 1e-5


def test_the_transformer_export_holds_its_engines(project):
    """The export stage's Transformer folder: torch.export programs (the step also built with
    AOTInductor where this CPU can), CTranslate2 float32 and int8; Bahdanau: TorchScript, torch."""
    from attnlab.export.program import can_compile

    config = json.loads((project / "models/transformer/config.json").read_text())
    assert config["runtime"]["format"] == "torch.export"
    assert config["runtime"]["compiled"] == ({"step": "step.aoti.pt2"} if can_compile() else {})
    assert config["engines"] == ["torch", "ctranslate2", "ctranslate2_int8"]
    bahdanau = json.loads((project / "models/bahdanau/config.json").read_text())
    assert bahdanau["runtime"]["format"] == "torchscript" and bahdanau["engines"] == ["torch"]


def test_gpu_check_runs_its_code_path_on_the_cpu(project, tmp_path):
    """scripts/gpu_check.py, as scripts/gpu_check.sh runs it on a CUDA machine, but with
    accelerator auto and bf16-mixed autocast on this CPU for 3 steps: it starts, trains, validates
    and reports, in a scratch root that leaves the project's runs alone."""
    before = sorted(p.name for p in (project / "checkpoints/transformer").iterdir())
    run = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts/gpu_check.py"),
            "--steps",
            "3",
            "--accelerator",
            "auto",
            "--precision",
            "bf16-mixed",
            "--project",
            str(project),
            "--root",
            str(tmp_path / "scratch"),
            "model.warmup_steps=1",
        ],  # the profile's 800 warm-up steps outlast 3 steps
        cwd=project,
        env=project.env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["steps"] == 3 and result["precision"] == "bf16-mixed" and result["device"] == "cpu"
    # MFU is against a bf16 matmul rate: meaningful on a GPU, not on a CPU without bf16 units
    assert result["target_tokens_per_s"] > 0 and result["mfu"] > 0 and result["parameters"] > 0
    assert 0 <= result["val_bleu"] <= 100
    assert sorted(p.name for p in (project / "checkpoints/transformer").iterdir()) == before


def test_translate_py_takes_any_sentence_verbatim(project):
    """`+text=…` arguments and stdin lines reach the exported model exactly as typed: the output
    lines equal the export's Translator on the same strings (and "" for those with no text)."""
    from attnlab.serving.translator import Translator

    expected = Translator(project / "models/transformer")(HOSTILE)
    assert expected[HOSTILE.index("   ")] == expected[HOSTILE.index("\u200b")] == ""
    as_args = subprocess.run(
        [sys.executable, "src/translate.py", "model=transformer", *(f"+text={s}" for s in HOSTILE)],
        cwd=project,
        env=project.env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert as_args.returncode == 0, as_args.stderr[-2000:]
    assert as_args.stdout.split("\n")[:-1] == expected
    from_stdin = subprocess.run(
        [sys.executable, "src/translate.py", "model=transformer"],
        cwd=project,
        env=project.env,
        input="".join(s + "\n" for s in HOSTILE),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert from_stdin.returncode == 0, from_stdin.stderr[-2000:]
    assert from_stdin.stdout.split("\n")[:-1] == expected


def test_evaluate_decodes_on_the_device_it_is_given(project):
    """evaluate reads `device` (dvc.yaml passes it): an accelerator this machine lacks is refused
    up front, naming it, and the committed scores stay as they were."""
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: device=gpu would run")
    before = (project / "metrics/transformer.json").read_bytes()
    out = subprocess.run(
        [sys.executable, "src/evaluate.py", "model=transformer", "device=gpu"],
        cwd=project,
        env=project.env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode != 0
    assert "evaluate: device.accelerator=gpu cannot run here" in out.stderr, out.stderr[-2000:]
    assert "choose device=cpu" in out.stderr
    assert (project / "metrics/transformer.json").read_bytes() == before


def test_nw_export_predicts_like_the_model(project):
    from attnlab.data.synthetic import synthetic_regression

    predictor = torch.jit.load(str(project / "models/nw/model.pt"))
    x = torch.tensor([0.5, 2.5])
    w = predictor.net.w.item()
    d = synthetic_regression(seed=0)
    expected = torch.softmax(-(((x[:, None] - d["x_train"]) * w) ** 2) / 2, dim=1) @ d["y_train"]
    assert torch.allclose(predictor(x), expected, atol=1e-5)


# --- two `dvc repro` at once ---------------------------------------------------------------
# DVC holds the repository lock (.dvc/tmp/lock) while it reads the pipeline and records
# results, but releases it while a stage's command runs; the stage's deps and outs are then
# guarded by read/write entries in .dvc/tmp/rwlock, each naming the holder's PID
# (treeverse/dvc#2584). A second `dvc repro` that reaches a guarded path stops with
# "'<path>' is busy, it is being blocked by:\n  (PID <first>): <its command line>"; one that
# arrives while the repository lock is held gives up after 3 s with "Unable to acquire lock".
BLOCKED = "is busy, it is being blocked by:\n  (PID {pid}):"
REPO_LOCKED = "Unable to acquire lock. Most likely another DVC process is running"


def _write_locks(project: Path, pid: int) -> list:
    """Paths that `.dvc/tmp/rwlock` shows process `pid` holding for writing."""
    try:
        held = json.loads((project / ".dvc/tmp/rwlock").read_text())
    except (FileNotFoundError, json.JSONDecodeError):  # not written yet, or being rewritten
        return []
    return [path for path, info in held.get("write", {}).items() if info["pid"] == pid]


def _sha256s(root: Path, rel: str) -> dict:
    """relative path → sha256 of every file at `rel` (a file or a folder) under `root`."""
    path = root / rel
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def test_second_concurrent_repro_stops_on_the_lock_and_the_first_finishes(project, tmp_path):
    # The first forces two cheap stages that leave nothing stale: `download` (its files are
    # verified and kept, same hash) and `export_nw` (a leaf). Two commands give the second
    # two chances to meet a held path; it meets `data/raw` first, `runs/nw.json` otherwise.
    stages = ["download", "export_nw"]
    raw_before = _sha256s(project, "data/raw")
    x = torch.tensor([0.5, 2.5])
    nw_before = torch.jit.load(str(project / "models/nw/model.pt"))(x)
    with open(tmp_path / "first.out", "w") as out, open(tmp_path / "first.err", "w") as err:
        first = subprocess.Popen(
            [sys.executable, "-m", "dvc", "repro", "-f", "-s", *stages],
            cwd=project,
            env=project.env,
            stdout=out,
            stderr=err,
            text=True,
        )
    try:
        deadline = time.monotonic() + 120
        while not (held := _write_locks(project, first.pid)):  # its command is running
            assert first.poll() is None and time.monotonic() < deadline, (
                "the first `dvc repro` never held a stage's outputs: "
                + (tmp_path / "first.err").read_text()[-2000:]
            )
            time.sleep(0.05)
        assert {os.path.relpath(p, project) for p in held} <= {"data/raw", "models/nw"}, held
        second = dvc(project, "repro")
        assert first.wait(timeout=600) == 0, (tmp_path / "first.err").read_text()[-3000:]
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert second.returncode != 0, second.stdout
    assert BLOCKED.format(pid=first.pid) in second.stderr or REPO_LOCKED in second.stderr, second.stderr
    assert "Running stage" not in second.stdout  # it stopped before running anything
    ran = (tmp_path / "first.out").read_text()
    assert all(f"Running stage '{stage}'" in ran for stage in stages), ran
    rwlock = json.loads((project / ".dvc/tmp/rwlock").read_text())
    assert not any(rwlock.get("read", {}).values()) and not rwlock.get("write"), rwlock
    assert dvc(project, "status").stdout.strip() == "Data and pipelines are up to date."
    assert _sha256s(project, "data/raw") == raw_before
    assert torch.equal(torch.jit.load(str(project / "models/nw/model.pt"))(x), nw_before)


# --- results shared through a DVC remote --------------------------------------------------
# What another machine gets: the files git tracks (decided by the repository's own
# .gitignore files, so a product ignored by git but not pushed by DVC shows up here) plus
# what `dvc pull` brings from the remote (the cached outputs).
SHARED_OUTS = {
    "data/raw",
    "data/tokenized/multi30k-en-fr",
    *(f"{d}/{m}" for d in ("checkpoints", "models", "plots") for m in MODELS),
    *(f"{d}/{m}.json" for d in ("runs", "metrics") for m in MODELS),
    *(f"metrics/{m}.hyp.txt" for m in SEQ2SEQ),
    "plots/heads/transformer",
    "metrics/transformer.heads.json",
}


def _lock_outs(project: Path) -> dict:
    """Output path → the stage that writes it, for every output recorded in dvc.lock."""
    lock = yaml.safe_load((project / "dvc.lock").read_text())
    return {out["path"]: stage for stage, entry in lock["stages"].items() for out in entry.get("outs", [])}


@pytest.fixture(scope="module")
def clone(project, tmp_path_factory):
    """The finished project `dvc push`ed to a local-folder remote and committed to git; then
    `git clone`d elsewhere and `dvc pull`ed there."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    base = tmp_path_factory.mktemp("sharing")
    added = dvc(project, "remote", "add", "-d", "storage", str(base / "remote"))
    assert added.returncode == 0, added.stderr
    push = dvc(project, "push")
    assert push.returncode == 0, push.stdout[-3000:] + push.stderr[-3000:]
    assert "files pushed" in push.stdout, push.stdout
    synced = dvc(project, "status", "--cloud")
    assert "Cache and remote 'storage' are in sync." in synced.stdout, synced.stdout
    for name in (".gitignore", ".dvcignore", ".dvc/.gitignore"):
        shutil.copy(ROOT / name, project / name)
    git_env = {
        **project.env,
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "attnlab",
        "GIT_AUTHOR_EMAIL": "attnlab@localhost",
        "GIT_COMMITTER_NAME": "attnlab",
        "GIT_COMMITTER_EMAIL": "attnlab@localhost",
    }
    origin = base / "origin.git"  # kept outside the project: its DVC stays --no-scm
    in_project = {**git_env, "GIT_DIR": str(origin), "GIT_WORK_TREE": str(project)}
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "results"]):
        subprocess.run(["git", *args], cwd=project, env=in_project, check=True, capture_output=True)
    root = Project(base / "clone")
    subprocess.run(
        ["git", "clone", "-q", str(origin), str(root)], env=git_env, check=True, capture_output=True
    )
    root.env = project.env
    # The repository's own .dvc/config does not set no_scm: DVC sees git, as on a user's machine.
    assert dvc(root, "config", "--unset", "core.no_scm").returncode == 0
    pull = dvc(root, "pull")
    assert pull.returncode == 0, pull.stdout[-3000:] + pull.stderr[-3000:]
    return root


def test_pull_on_a_fresh_clone_brings_every_output_byte_for_byte(project, clone):
    outs = _lock_outs(project)
    assert set(outs) == SHARED_OUTS
    missing = sorted(path for path in outs if not (clone / path).exists())
    assert not missing, (
        f"{missing} missing after `git clone` + `dvc pull`: an output with "
        "`cache: false` is not pushed, so git has to carry it (see .gitignore)"
    )
    for path in sorted(outs):
        ours = _sha256s(project, path)
        assert ours and _sha256s(clone, path) == ours, path
    assert (clone / "dvc.lock").read_bytes() == (project / "dvc.lock").read_bytes()


def test_fresh_clone_after_pull_has_nothing_to_reproduce(project, clone):
    status = dvc(clone, "status")
    assert status.stdout.strip() == "Data and pipelines are up to date.", status.stdout
    repro = dvc(clone, "repro")
    assert repro.returncode == 0, repro.stderr[-3000:]
    assert "Running stage" not in repro.stdout, repro.stdout
    stages = set(_lock_outs(project).values())  # every stage has outputs
    assert repro.stdout.count("didn't change, skipping") == len(stages) == 12, repro.stdout
    assert "Data and pipelines are up to date." in repro.stdout
    assert (clone / "dvc.lock").read_bytes() == (project / "dvc.lock").read_bytes()


# --- DVC experiments: `dvc exp run -S`, a queued run, `dvc exp show`, metrics/plots diff ----
# Run in the git clone above, after its checks: `dvc exp run` applies its results there.
# A queued experiment runs in a temporary copy of the repository (<clone>/.dvc/tmp/exps/…),
# deleted afterwards; its MLflow run must still land in the clone's mlflow.db and mlruns/.
EXP_LR = 0.002  # the workspace experiment's learning rate; conf/optimizer/adam.yaml has 0.001
# Hydra overrides of the workspace experiment: two of them, split by the shell as in the README
EXP_OVERRIDES = f"optimizer.lr={EXP_LR} optimizer.weight_decay=0.01"


def _exp_rows(project: Path) -> dict:
    """`dvc exp show --json` → {name: (rev, params.yaml, {metrics file: values})}; the baseline
    commit is under the name "baseline"."""
    shown = json.loads(dvc(project, "exp", "show", "--json").stdout)
    (commit,) = [c for c in shown if c["rev"] != "workspace"]

    def row(entry):
        data = entry["data"]
        return (
            data["rev"],
            data["params"]["params.yaml"]["data"],
            {path: m["data"] for path, m in data["metrics"].items()},
        )

    rows = {"baseline": row(commit)}
    for exp in commit["experiments"] or []:
        for rev in exp["revs"]:
            rows[rev["name"]] = row(rev)
    return rows


def _own_corpus(folder: Path) -> Path:
    """A part of tests/fixtures/zh-en (a user's corpus, outside the project): 2,000 training
    pairs, 20 val, 20 test, in the layout {split}.{zh,en}.gz."""
    import gzip

    from helpers import zh_en_corpus

    for split, pairs in zh_en_corpus.pairs().items():
        pairs = pairs[: 2000 if split == "train" else 20]
        for i, lang in enumerate(("zh", "en")):
            text = "".join(f"{p[i]}\n" for p in pairs).encode()
            (folder / f"{split}.{lang}.gz").write_bytes(gzip.compress(text, mtime=0))
    return folder


@pytest.fixture(scope="module")
def experiments(clone, tmp_path_factory):
    """Three experiments on the clone's commit: two queued, English→German (`-S tgt_lang=de`) and
    Chinese→English on a corpus of one's own (`-S data=parallel -S data_path=...`), run by
    a `dvc queue` worker in a temporary workspace, and one run in the workspace (Transformer for 1
    epoch, and Hydra overrides of the learning rate and weight decay through
    `models.transformer.overrides`)."""
    queued = dvc(clone, "exp", "run", "--queue", "-n", "queued", "-S", "tgt_lang=de")
    assert queued.returncode == 0, queued.stderr[-3000:]
    corpus = _own_corpus(tmp_path_factory.mktemp("own-corpus"))
    own = ("-S", "data=parallel", "-S", f"data_path={corpus}", "-S", "src_lang=zh", "-S", "tgt_lang=en")
    queued = dvc(clone, "exp", "run", "--queue", "-n", "zh-en", *own)
    assert queued.returncode == 0, queued.stderr[-3000:]
    ran = dvc(
        clone,
        "exp",
        "run",
        "-n",
        "lr",
        "-S",
        "models.transformer.max_epochs=1",
        "-S",
        f'models.transformer.overrides="{EXP_OVERRIDES}"',
    )
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    assert "Running stage 'train@bahdanau'" not in ran.stdout  # only the Transformer's stages re-run
    started = dvc(clone, "queue", "start", "-j", "1")
    assert started.returncode == 0, started.stderr[-3000:]
    try:
        deadline = time.monotonic() + 480
        while True:
            status = dvc(clone, "queue", "status").stdout
            if "Queued" not in status and "Running" not in status:
                break
            assert time.monotonic() < deadline, f"queued experiment still not done:\n{status}"
            time.sleep(3)
    finally:
        dvc(clone, "queue", "stop", "--kill")
    logs = dvc(clone, "queue", "logs", "queued").stdout
    assert "Success" in status, status + logs[-3000:]
    assert "Failed" not in status, status + dvc(clone, "queue", "logs", "zh-en").stdout[-3000:]
    clone.own_corpus = corpus
    clone.rows = _exp_rows(clone)
    clone.queued_log = logs
    return clone


def test_exp_show_lists_the_baseline_and_the_experiments_with_their_params(experiments):
    rows = experiments.rows
    assert set(rows) == {"baseline", "lr", "queued", "zh-en"}
    params = {name: row[1] for name, row in rows.items()}
    pairs = {name: (p["data"], p["src_lang"], p["tgt_lang"]) for name, p in params.items()}
    assert pairs == {
        "baseline": ("multi30k", "en", "fr"),
        "lr": ("multi30k", "en", "fr"),
        "queued": ("multi30k", "en", "de"),
        "zh-en": ("parallel", "zh", "en"),
    }
    model = {name: p["models"]["transformer"] for name, p in params.items()}
    assert (model["baseline"]["max_epochs"], model["baseline"]["overrides"]) == (2, "")
    assert (model["queued"]["max_epochs"], model["queued"]["overrides"]) == (2, "")
    assert (model["lr"]["max_epochs"], model["lr"]["overrides"]) == (1, EXP_OVERRIDES)
    for _name, (rev, _, metrics) in rows.items():
        for m in SEQ2SEQ:
            committed = json.loads(
                subprocess.run(
                    ["git", "show", f"{rev}:metrics/{m}.json"],
                    cwd=experiments,
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout
            )
            assert metrics[f"metrics/{m}.json"] == committed
            assert set(committed) >= {"bleu", "bleu_lc", "chrf"}
        # NW reads no corpus: no experiment re-ran it, its scores are the baseline's
        assert metrics["metrics/nw.json"] == rows["baseline"][2]["metrics/nw.json"]
    assert rows["lr"][2]["metrics/bahdanau.json"] == rows["baseline"][2]["metrics/bahdanau.json"]


def test_a_language_experiment_runs_end_to_end_on_its_own_pair(experiments):
    """`-S tgt_lang=de`, queued: tokenize and both translation models re-ran on
    data/tokenized/multi30k-en-de, NW did not, and the metrics name the pair they measured."""
    rev, _, metrics = experiments.rows["queued"]
    log = experiments.queued_log
    for stage in ("tokenize", *(f"{s}@{m}" for s in ("train", "evaluate", "export") for m in SEQ2SEQ)):
        assert f"Running stage '{stage}'" in log, log[-3000:]
    assert "Running stage 'train_nw'" not in log and "Running stage 'evaluate_nw'" not in log
    lock = yaml.safe_load(_git_show(experiments, rev, "dvc.lock"))
    for m in SEQ2SEQ:
        deps = {d["path"] for d in lock["stages"][f"train@{m}"]["deps"]}
        assert "data/tokenized/multi30k-en-de" in deps and "data/tokenized/multi30k-en-fr" not in deps
        _assert_says_what_it_measured(metrics[f"metrics/{m}.json"], "en", "de")
        hyps = _git_show(experiments, rev, f"metrics/{m}.hyp.txt").splitlines()
        assert (
            metrics[f"metrics/{m}.json"]["bleu"]
            == sacrebleu.corpus_bleu(hyps, [_test_references(experiments, "de")]).score
        )


def test_an_own_corpus_experiment_trains_on_it_and_reruns_when_the_corpus_changes(experiments):
    """`-S data=parallel -S data_path=<folder> -S src_lang=zh -S tgt_lang=en`, queued: the
    pipeline ran on the folder (a dependency of tokenize, recorded in dvc.lock), the metrics
    name it; applied to the workspace, editing one line of the corpus marks tokenize (and no other
    stage: the rest follow from its outputs, as the DAG test checks) to re-run."""
    import gzip

    rev, _, metrics = experiments.rows["zh-en"]
    corpus = experiments.own_corpus
    lock = yaml.safe_load(_git_show(experiments, rev, "dvc.lock"))
    assert str(corpus) in {d["path"] for d in lock["stages"]["tokenize"]["deps"]}
    references = gzip.decompress((corpus / "test.en.gz").read_bytes()).decode().splitlines()
    for m in SEQ2SEQ:
        _assert_says_what_it_measured(metrics[f"metrics/{m}.json"], "zh", "en", "parallel", "test")
        hyps = _git_show(experiments, rev, f"metrics/{m}.hyp.txt").splitlines()
        assert len(hyps) == 20
        assert metrics[f"metrics/{m}.json"]["bleu"] == sacrebleu.corpus_bleu(hyps, [references]).score
    applied = dvc(experiments, "exp", "apply", "zh-en")
    assert applied.returncode == 0, applied.stderr[-3000:]
    original = (corpus / "val.en.gz").read_bytes()
    try:
        assert "up to date" in dvc(experiments, "status").stdout
        # the how-to's next command: translate.py with the applied experiment's export
        sources = gzip.decompress((corpus / "test.zh.gz").read_bytes()).decode().splitlines()
        out = subprocess.run(
            [sys.executable, "src/translate.py", "model=transformer"],
            cwd=experiments,
            env=experiments.env,
            input="\n".join([*sources, "我昨天在商店买了三本书。"]) + "\n",
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert out.returncode == 0, out.stderr[-2000:]
        translations = out.stdout.splitlines()  # a test-sized model: maybe empty lines
        assert len(translations) == len(sources) + 1
        applied_hyps = (experiments / "metrics/transformer.hyp.txt").read_text().splitlines()
        assert translations[:-1] == applied_hyps
        lines = gzip.decompress(original).decode().splitlines()
        lines[0] = lines[0].replace(".", "!")
        (corpus / "val.en.gz").write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
        changed = json.loads(dvc(experiments, "status", "--json").stdout)
        assert set(changed) == {"tokenize"}, changed
        assert {"changed deps": {str(corpus): "modified"}} in changed["tokenize"], changed["tokenize"]
    finally:
        (corpus / "val.en.gz").write_bytes(original)
        restored = dvc(experiments, "exp", "apply", "lr")  # the workspace as the fixture left it
        assert restored.returncode == 0, restored.stderr[-3000:]


def test_experiments_reach_hydra_and_log_to_the_projects_mlflow_store(experiments):
    """The -S values reach the Hydra apps (the params and tags of the experiments' MLflow runs),
    and the queued runs, made in DVC's temporary workspace (deleted since), are in the clone's
    own store with their artifacts and test scores."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{experiments}/mlflow.db")
    exp = client.get_experiment_by_name("attnlab")
    found = client.search_runs([exp.experiment_id], "tags.model = 'transformer' and tags.corpus = 'multi30k'")
    runs = {(r.data.tags["tgt_lang"], float(r.data.params["optimizer/lr"])): r for r in found}
    assert set(runs) == {("fr", EXP_LR), ("de", 0.001)}  # the clone's own runs: the two experiments
    rows = experiments.rows
    for key, name, epochs in ((("fr", EXP_LR), "lr", 1), (("de", 0.001), "queued", 2)):
        run = runs[key]
        assert run.info.status == "FINISHED" and run.data.tags["src_lang"] == "en"
        assert run.data.params["data/tgt_lang"] == key[0] and run.data.tags["corpus"] == "multi30k"
        assert run.data.params["trainer/max_epochs"] == str(epochs)
        assert float(run.data.params["optimizer/weight_decay"]) == (0.01 if name == "lr" else 0.0)
        assert len(client.get_metric_history(run.info.run_id, "val_loss")) == epochs
        assert run.data.metrics["test_chrf"] == rows[name][2]["metrics/transformer.json"]["chrf"]
        assert run.info.artifact_uri.startswith(f"{experiments}/mlruns/")
        assert (Path(run.info.artifact_uri) / "checkpoint/best.ckpt").stat().st_size > 0
    [bahdanau] = client.search_runs(
        [exp.experiment_id], "tags.model = 'bahdanau' and tags.corpus = 'multi30k'"
    )
    assert (bahdanau.data.tags["src_lang"], bahdanau.data.tags["tgt_lang"]) == ("en", "de")
    # the own-corpus experiment: both translation models, on the user's folder
    own = client.search_runs([exp.experiment_id], "tags.corpus = 'parallel'")
    assert sorted((r.data.tags["model"], r.data.tags["src_lang"], r.data.tags["tgt_lang"]) for r in own) == [
        ("bahdanau", "zh", "en"),
        ("transformer", "zh", "en"),
    ]
    assert {r.data.tags["corpus_path"] for r in own} == {str(experiments.own_corpus)}  # which folder
    config = client.download_artifacts(
        runs[("de", 0.001)].info.run_id, "config.yaml", str(experiments.parent / "dl-queued")
    )
    ran_in = yaml.safe_load(Path(config).read_text())["paths"]["root"]  # the queued run's root
    assert ran_in.startswith(f"{experiments}/.dvc/tmp/exps/") and not Path(ran_in).exists()


def test_metrics_diff_and_plots_diff_compare_experiments(experiments):
    rows = experiments.rows
    revs = {name: rows[name][0] for name in ("baseline", "lr", "queued")}
    # `metrics diff` lists what changed: the lr experiment re-ran the Transformer alone (tiny
    # models: BLEU is 0 in both, chrF is not)
    diff = json.loads(dvc(experiments, "metrics", "diff", revs["baseline"], revs["lr"], "--json").stdout)
    scores = {name: rows[name][2]["metrics/transformer.json"] for name in ("baseline", "lr")}
    old, new = scores["baseline"]["chrf"], scores["lr"]["chrf"]
    assert old != new
    assert set(diff) == {"metrics/transformer.json"}
    changed = diff["metrics/transformer.json"]
    assert changed["chrf"] == {"old": old, "new": new, "diff": pytest.approx(new - old)}
    # the other scores are listed only where they changed (here: maybe on test_2017_flickr)
    flat = {
        name: {
            **{k: v for k, v in s.items() if isinstance(v, float)},
            **{
                f"more_test_sets.test_2017_flickr.{k}": v
                for k, v in s["more_test_sets"]["test_2017_flickr"].items()
                if isinstance(v, float)
            },
        }
        for name, s in scores.items()
    }
    assert changed == {
        k: {
            "old": flat["baseline"][k],
            "new": flat["lr"][k],
            "diff": pytest.approx(flat["lr"][k] - flat["baseline"][k]),
        }
        for k in flat["baseline"]
        if flat["baseline"][k] != flat["lr"][k]
    }
    shown = dvc(experiments, "plots", "diff", *revs.values(), "--json")
    assert shown.returncode == 0, shown.stderr[-3000:]
    plots = json.loads(shown.stdout)["data"]
    (curve,) = plots["Validation loss per epoch (cross-entropy)"]
    assert curve["revisions"] == list(revs.values())
    points = [v for v in curve["content"]["data"]["values"] if v["filename"] == "transformer/history.csv"]
    epochs = {name: [int(v["epoch"]) for v in points if v["rev"] == rev] for name, rev in revs.items()}
    assert epochs == {"baseline": [1, 2], "lr": [1], "queued": [1, 2]}
    val_loss = {
        name: float(v["val_loss"])
        for name, rev in revs.items()
        for v in points
        if v["rev"] == rev and v["epoch"] == "1"
    }
    assert len(set(val_loss.values())) == 3  # another learning rate, another target language
    epoch1 = "plots/transformer/attention/epochs/epoch01/sent0_encoder_decoder_layer2.png"
    assert [p["revisions"] for p in plots[epoch1]] == [[r] for r in revs.values()]
    epoch2 = epoch1.replace("epoch01", "epoch02")
    assert [p["revisions"] for p in plots[epoch2]] == [[revs["baseline"]], [revs["queued"]]]


# the experiment docs/how-to/ablations.md shows, at test size (one epoch on 64 images per split)
IMAGE_EXP = '+images.vit={data: digits, optimizer: adamw, max_epochs: 1, overrides: "data.subset=64"}'


def test_an_image_model_joins_as_an_experiment_and_runs_alone(experiments):
    """params.yaml's `images` is empty, so `dvc repro` has no image stage; `dvc exp run -S
    '+images.vit={...}'` adds the key (Hydra's `+`), which makes train_image@vit, evaluate_image@vit
    and export_image@vit, and runs those alone: the other outputs are in the cache. Runs last in the
    clone (it applies its results there)."""
    ran = dvc(experiments, "exp", "run", "-n", "vit", "-S", IMAGE_EXP)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    ran_stages = re.findall(r"Running stage '([^']+)'", ran.stdout)
    assert ran_stages == ["train_image@vit", "evaluate_image@vit", "export_image@vit"], ran.stdout
    scores = json.loads((experiments / "metrics" / "vit.json").read_text())
    assert scores["num_images"] == 64
    assert scores["accuracy"] == pytest.approx(1 - scores["errors"] / 64)
    assert (experiments / "models" / "vit" / "model.pt2").is_file()
    pngs = sorted(p.name for p in (experiments / "plots" / "vit" / "attention").glob("*.png"))
    # the class token's attention, one PNG per heatmap image, and the explorer of every head
    assert pngs == [f"image{i}_cls_attention.png" for i in HEATMAP_SENTENCES]
    assert (experiments / "plots" / "vit" / "explorer.html").is_file()
    _, params, metrics = _exp_rows(experiments)["vit"]
    assert params["images"] == {
        "vit": {"data": "digits", "optimizer": "adamw", "max_epochs": 1, "overrides": "data.subset=64"}
    }
    shown = metrics["metrics/vit.json"]  # dvc exp show's numbers (it leaves out the nested config)
    assert (shown["accuracy"], shown["errors"], shown["num_images"]) == (
        scores["accuracy"], scores["errors"], 64,
    )  # fmt: skip


# --- the DVC graph follows params.yaml ----------------------------------------------------
# One value chooses the translation models' corpus and direction; every path is built from it.
# What `dvc exp run -S key=value` does to params.yaml is done here by hand, then undone.
ZH_EN = ROOT / "tests" / "fixtures" / "zh-en"  # a user's own corpus, by an absolute path
DIRECTIONS = {
    "tgt_lang=de": ("multi30k", "en", "de"),
    "data=fra_eng": ("fra_eng", "en", "fr"),
    "src_lang=fr tgt_lang=en": ("multi30k", "fr", "en"),
    f"data=parallel data_path={ZH_EN} src_lang=zh tgt_lang=en": ("parallel", "zh", "en"),
}
TRANSLATION_STAGES = {f"{s}@{m}" for s in ("train", "evaluate", "export") for m in SEQ2SEQ} | {
    "head_importance"
}


@contextlib.contextmanager
def _params(project: Path, settings: str):
    """params.yaml with `settings` ("key=value key=value") applied, restored afterwards."""
    path = project / "params.yaml"
    original = path.read_text()
    try:
        _edit(path, **dict(kv.split("=") for kv in settings.split()))
        yield
    finally:
        path.write_text(original)


def _edges(project: Path, *flags: str) -> set[tuple[str, str]]:
    """The (from, to) edges of `dvc dag --dot` (with --outs: between output paths)."""
    import re

    dot = dvc(project, "dag", "--dot", *flags)
    assert dot.returncode == 0, dot.stderr[-3000:]
    return set(re.findall(r'"([^"]+)" -> "([^"]+)"', dot.stdout))


@pytest.mark.parametrize("settings", DIRECTIONS)
def test_the_dag_connects_tokenize_to_the_translation_models_for_any_direction(project, settings):
    corpus, src, tgt = DIRECTIONS[settings]
    folder = f"data/tokenized/{corpus}-{src}-{tgt}"
    with _params(project, settings):
        stages, outs = _edges(project), _edges(project, "--outs")
        changed = set(json.loads(dvc(project, "status", "--json").stdout))
    for m in SEQ2SEQ:
        assert {
            ("tokenize", f"train@{m}"),
            (f"train@{m}", f"evaluate@{m}"),
            (f"train@{m}", f"export@{m}"),
        } <= stages, stages
        assert (folder, f"checkpoints/{m}") in outs, outs  # trains on the folder tokenize writes
    assert ("download", "tokenize") in stages
    assert not {e for e in stages if "nw" in e[1] and e[0] != "train_nw"}, stages
    # NW reads no corpus: changing the corpus or direction leaves its stages up to date
    assert changed == {"tokenize"} | TRANSLATION_STAGES, changed


def test_a_corpus_without_the_asked_language_is_refused_by_tokenize(project):
    out = subprocess.run(
        [sys.executable, "src/tokenize_data.py", "data=fra_eng", "data.tgt_lang=de"],
        cwd=project,
        env=project.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != 0
    assert "data=fra_eng has the languages en, fr; tgt_lang=de is not one of them" in out.stderr
    assert not (project / "data/tokenized/fra_eng-en-de").exists()


# --- the MLflow UI, through its REST API and in a real browser ------------------------------
# `mlflow ui` serves MLflow's single-page web app and, under /ajax-api/2.0/mlflow/, the REST
# endpoints that app calls. A run whose artifact location is a local folder (here
# <project>/mlruns/…) has its files listed by /ajax-api/…/artifacts/list and sent by
# /get-artifact, both read from that folder. Headless Chromium then loads the app itself.
# (The helpers are in tests/browser.py, shared with tests/test_explorer.py.)
HEATMAP = "attention/sent0_encoder_decoder_layer2.png"  # validation sentence 0, last layer


def test_mlflow_ui_serves_runs_and_heatmaps_and_renders_in_chromium(project, tmp_path):
    from mlflow.tracking import MlflowClient
    from PIL import Image

    browser = _browser()
    client = MlflowClient(tracking_uri=f"sqlite:///{project}/mlflow.db")
    exp = client.get_experiment_by_name("attnlab")
    [run] = client.search_runs([exp.experiment_id], "tags.model = 'transformer'")
    run_id = run.info.run_id
    # What the store holds, read without the UI: the val_bleu history, the heatmap's bytes.
    expected_bleu = [(m.step, m.value, m.timestamp) for m in client.get_metric_history(run_id, "val_bleu")]
    assert len(expected_bleu) == 2  # one per epoch
    artifact_dir = Path(urllib.parse.urlparse(run.info.artifact_uri).path)
    assert artifact_dir.is_relative_to(project / "mlruns"), run.info.artifact_uri
    heatmap = (artifact_dir / HEATMAP).read_bytes()

    with _mlflow_ui(project / "mlflow.db", tmp_path, project.env) as ui:
        api = f"{ui}/ajax-api/2.0/mlflow"
        found = json.loads(_http(f"{api}/experiments/get-by-name", experiment_name="attnlab"))
        assert found["experiment"]["experiment_id"] == exp.experiment_id
        assert found["experiment"]["name"] == "attnlab"

        searched = json.loads(
            _http(
                f"{api}/runs/search",
                {"experiment_ids": [exp.experiment_id], "filter": "tags.model = 'transformer'"},
            )
        )
        assert [r["info"]["run_id"] for r in searched["runs"]] == [run_id]
        assert {"key": "model", "value": "transformer"} in searched["runs"][0]["data"]["tags"]

        history = json.loads(_http(f"{api}/metrics/get-history", run_id=run_id, metric_key="val_bleu"))[
            "metrics"
        ]
        assert [(int(m["step"]), m["value"], int(m["timestamp"])) for m in history] == expected_bleu

        listed = json.loads(_http(f"{api}/artifacts/list", run_id=run_id, path="attention"))
        sizes = {f["path"]: int(f["file_size"]) for f in listed["files"] if not f["is_dir"]}
        assert sizes[HEATMAP] == len(heatmap)
        assert sum(p.startswith("attention/sent0_") for p in sizes) == 6  # 3 kinds × 2 layers
        served = _http(f"{ui}/get-artifact", path=HEATMAP, run_uuid=run_id)
        assert served[:8] == PNG_MAGIC
        assert served == heatmap  # byte for byte the file in <project>/mlruns

        # The page: the HTML the server sends is an empty shell; the experiment's run table
        # appears only once the app's scripts have run in the browser and called the API.
        # (/#/experiments/<id> alone opens MLflow 3's GenAI overview, which lists no runs.)
        page = f"{ui}/#/experiments/{exp.experiment_id}/runs"
        shell = _http(f"{ui}/").decode()
        assert run.info.run_name not in shell and "attnlab" not in shell
        dom = _chromium(browser, page, tmp_path / "profile", "--dump-dom")
        assert dom.returncode == 0, dom.stderr[-3000:]
        assert "attnlab" in dom.stdout, dom.stdout[-3000:]
        assert run.info.run_name in dom.stdout, dom.stdout[-3000:]
        assert f"<strong>{len(MODELS)}</strong> matching runs" in dom.stdout, dom.stdout[-3000:]
        for each in client.search_runs([exp.experiment_id]):  # one row, linking to its run page
            assert f'href="#/experiments/{exp.experiment_id}/runs/{each.info.run_id}"' in dom.stdout

        shot = tmp_path / "ui.png"
        taken = _chromium(browser, page, tmp_path / "profile", f"--screenshot={shot}")
        assert taken.returncode == 0, taken.stderr[-3000:]
    assert shot.read_bytes()[:8] == PNG_MAGIC
    with Image.open(shot) as image:
        assert image.size == WINDOW
        colours = image.convert("RGB").getcolors(maxcolors=WINDOW[0] * WINDOW[1])
    assert len(colours) > 16, colours  # text, lines and widgets, not a blank or one-colour page
