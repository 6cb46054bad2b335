"""Integration: the real `dvc repro` on a tiny corpus the test writes (no network, no shared mirror).

The project's conf/, src/, dvc.yaml and params.yaml are copied into a temporary
folder, shrunk (tiny models, few epochs), pointed at a mirror folder holding the
tiny corpus, and run end to end with DVC; then the outputs, the MLflow store,
DVC's change tracking and the exported models are checked.
"""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from corpus_fixture import write_mirror

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("nw", "bahdanau", "transformer")
SEQ2SEQ = ("bahdanau", "transformer")


def _env(mirror: Path) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k != "MLFLOW_TRACKING_URI"}
    env["ATTNLAB_DATA_MIRROR"] = str(mirror)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def _edit(path: Path, **updates) -> None:
    cfg = OmegaConf.load(path)
    for key, value in updates.items():
        OmegaConf.update(cfg, key, value, force_add=True)
    OmegaConf.save(cfg, path)


def dvc(project: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dvc", *args], cwd=project, env=project.env,
                          capture_output=True, text=True, timeout=600)


class Project(type(Path())):
    env: dict


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    base = tmp_path_factory.mktemp("pipeline")
    root = Project(base / "project")
    root.mkdir()
    for name in ("conf", "src", "dvc.yaml", "params.yaml"):
        src = ROOT / name
        (shutil.copytree(src, root / name, ignore=shutil.ignore_patterns("__pycache__"))
         if src.is_dir() else shutil.copy(src, root / name))
    digests = write_mirror(base / "mirror")
    download = OmegaConf.load(root / "conf/download.yaml")
    download.sources = {rel: {"sha256": [d]} for rel, d in digests.items()}
    OmegaConf.save(download, root / "conf/download.yaml")
    _edit(root / "conf/data/multi30k.yaml", vocab_size=150, val_bleu_sentences=4)
    _edit(root / "conf/model/transformer.yaml", **{"net.d_model": 32, "net.ffn_hidden": 64,
                                                   "batch_size": 8, "warmup_steps": 5})
    _edit(root / "conf/model/bahdanau.yaml", **{"net.embed_size": 16, "net.num_hiddens": 32,
                                                "batch_size": 8})
    _edit(root / "params.yaml", **{"models.bahdanau.max_epochs": 2,
                                   "models.transformer.max_epochs": 2, "models.nw.max_epochs": 3,
                                   "device": "cpu"})
    root.env = _env(base / "mirror")
    subprocess.run([sys.executable, "-m", "dvc", "init", "--no-scm", "-q"], cwd=root, check=True)
    result = dvc(root, "repro")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return root


def test_every_stage_wrote_its_outputs(project):
    assert (project / "data/raw/multi30k/train.en.gz").exists()
    assert (project / "data/raw/fra-eng.zip").exists()
    tok = project / "data/tokenized/multi30k-en-fr"
    for f in ("spm.model", "train.npz", "val.npz", "test.npz", "test.src.txt", "test.tgt.txt"):
        assert (tok / f).exists(), f
    for m in MODELS:
        assert (project / f"checkpoints/{m}/best.ckpt").exists()
        assert json.loads((project / f"models/{m}/config.json").read_text())["model"] == m
    nw = json.loads((project / "metrics/nw.json").read_text())
    assert nw["mse"] < nw["mse_average_pooling"]
    assert nw["mse_constant"] == pytest.approx(nw["mse_average_pooling"])  # constant kernel = mean
    assert nw["mse_gaussian"] == pytest.approx(nw["mse_nonparametric"])  # both σ = 1
    assert {"mse_boxcar", "mse_epanechnikov"} <= set(nw)
    for m in SEQ2SEQ:
        scores = json.loads((project / f"metrics/{m}.json").read_text())
        assert scores["num_sentences"] == 4
        assert 0.0 <= scores["bleu"] <= 100.0 and 0.0 <= scores["chrf"] <= 100.0


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
        losses = [h.value for h in client.get_metric_history(run.info.run_id, "train_loss")]
        assert losses[-1] < losses[0]
        assert any(f.startswith("attention/sent0_") for f in artifacts(run.info.run_id))
    layers = [f for f in artifacts(runs["transformer"].info.run_id) if "sent0_" in f]
    for kind in ("encoder_self", "decoder_self", "encoder_decoder"):
        assert sum(kind in f for f in layers) == 2  # one figure per layer
    nw_pngs = {f for f in artifacts(runs["nw"].info.run_id) if f.startswith("attention/")}
    assert {f"attention/nw_{k}.png" for k in ("gaussian", "boxcar", "constant", "epanechnikov")} <= nw_pngs
    assert runs["nw"].data.metrics["test_mse"] == pytest.approx(
        json.loads((project / "metrics/nw.json").read_text())["mse"])


def test_second_repro_has_nothing_to_do(project):
    status = dvc(project, "status")
    assert "up to date" in status.stdout, status.stdout


def test_model_config_edit_invalidates_only_that_model(project):
    path = project / "conf/model/transformer.yaml"
    original = path.read_text()
    try:
        path.write_text(original.replace("dropout: 0.1", "dropout: 0.2"))
        changed = json.loads(dvc(project, "status", "--json").stdout)
        assert set(changed) == {"train@transformer"}
    finally:
        path.write_text(original)
    assert "up to date" in dvc(project, "status").stdout


def test_export_decodes_like_the_checkpoint(project):
    from attnlab.data.tokenizer import load_sentencepiece
    from attnlab.decoding import translate
    from attnlab.export import load_translator
    from attnlab.lit.translation import TranslationModule

    tok_dir = project / "data/tokenized/multi30k-en-fr"
    sources = (tok_dir / "test.src.txt").read_text().splitlines()
    sp = load_sentencepiece(tok_dir / "spm.model")
    for m in SEQ2SEQ:
        ckpt = TranslationModule.load_from_checkpoint(project / f"checkpoints/{m}/best.ckpt",
                                                      map_location="cpu", weights_only=True)
        ckpt.net.eval()
        init_state, step, tok, _ = load_translator(project / f"models/{m}")
        exported = translate(init_state, step, tok, sources)
        assert exported == translate(ckpt.net.init_state, ckpt.net.step, sp, sources)
    hyps = (project / "metrics/transformer.hyp.txt").read_text().splitlines()
    out = subprocess.run([sys.executable, "src/translate.py", "model=transformer"], cwd=project,
                         env=project.env, input="\n".join(sources) + "\n", capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines() == hyps


def test_nw_export_predicts_like_the_model(project):
    from attnlab.models.nadaraya_watson import synthetic_regression

    predictor = torch.jit.load(str(project / "models/nw/model.pt"))
    x = torch.tensor([0.5, 2.5])
    w = predictor.net.w.item()
    d = synthetic_regression(seed=0)
    expected = torch.softmax(-((x[:, None] - d["x_train"]) * w) ** 2 / 2, dim=1) @ d["y_train"]
    assert torch.allclose(predictor(x), expected, atol=1e-5)
