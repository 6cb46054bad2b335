"""Hydra composition of the real conf/: groups, errors a user sees, resolved paths."""
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException, MissingConfigException

CONF = str(Path(__file__).resolve().parents[1] / "conf")


def _compose(overrides, monkeypatch, root="/tmp/attnlab-root", uri=None):
    overrides = [f"paths.root={root}", *overrides]  # the apps default it to the working directory
    if uri is None:
        monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    else:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


def test_readme_override_line_composes(monkeypatch):
    cfg = _compose(["model=transformer", "optimizer=adamw", "device=cpu", "trainer.max_epochs=1"],
                   monkeypatch)
    assert cfg.model.net._target_ == "attnlab.models.transformer.Transformer"
    assert cfg.optimizer._target_ == "torch.optim.AdamW"
    assert cfg.device.accelerator == "cpu" and cfg.trainer.max_epochs == 1
    assert set(cfg.model.net) >= {"d_model", "num_heads", "num_layers", "ffn_hidden", "dropout"}


def test_unknown_model_lists_valid_choices(monkeypatch):
    with pytest.raises(MissingConfigException) as e:
        _compose(["model=foo"], monkeypatch)
    for choice in ("bahdanau", "nw", "transformer"):
        assert choice in str(e.value)


def test_unknown_key_is_rejected(monkeypatch):
    with pytest.raises(ConfigCompositionException, match="d_modle"):
        _compose(["model.net.d_modle=3"], monkeypatch)


def test_nw_brings_its_own_data_and_optimizer(monkeypatch):
    cfg = _compose(["model=nw"], monkeypatch)
    assert cfg.data.name == "synthetic" and cfg.optimizer._target_ == "torch.optim.SGD"


def test_mlflow_store_is_absolute_sqlite_at_root(monkeypatch):
    cfg = _compose([], monkeypatch, root="/srv/lab")
    assert cfg.mlflow.tracking_uri == "sqlite:////srv/lab/mlflow.db"
    assert cfg.paths.tokenized == "/srv/lab/data/tokenized/multi30k-en-fr"
    cfg = _compose([], monkeypatch, uri="http://127.0.0.1:5000")
    assert cfg.mlflow.tracking_uri == "http://127.0.0.1:5000"


def test_translation_model_on_synthetic_data_is_a_clear_error(monkeypatch):
    from attnlab.lit.setup import build_task
    cfg = _compose(["model=transformer", "data=synthetic"], monkeypatch)
    with pytest.raises(ValueError, match="choose data=multi30k or data=fra_eng"):
        build_task(cfg)
