"""What the export stage writes, one function per task.

``conf/model/<model>.yaml`` names its function as ``task.export``; ``src/export.py`` calls it
with the composed config, the kept checkpoint's net, the run record (``runs/<model>.json``) and
the folder, and prints the summary from what it returns.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from torch import nn

from attnlab.data.synthetic import synthetic_from_config
from attnlab.errors import ConfigError, MissingFileError
from attnlab.export.trace import export_regression, export_translation
from attnlab.serving.registry import log_served_model, serve_command


def _facts(cfg: DictConfig, record: dict) -> dict:
    """What ``config.json`` records of the model: name, MLflow run, model and data config."""
    return {
        "model": cfg.model.name,
        "mlflow_run_id": record["run_id"],
        "model_config": OmegaConf.to_container(cfg.model, resolve=True),
        "data": OmegaConf.to_container(cfg.data, resolve=True),
    }


def export_translation_model(cfg: DictConfig, net: nn.Module, record: dict, out_dir: Path) -> dict:
    """The traced translator and its sentencepiece model in ``out_dir``
    (:func:`attnlab.export.trace.export_translation`, with ``model.decoding``, the ``serving``
    limits and, for a Transformer, the CTranslate2 models of ``export.ctranslate2`` and, with
    ``export.compile``, its AOTInductor step), logged to the training run as an MLflow pyfunc model
    and registered as ``attnlab-<model>`` with the alias ``champion``.

    Returns:
        ``registered`` (name), ``version`` and ``serve`` (the ``mlflow models serve`` command).
    Raises:
        MissingFileError: the corpus has no sentencepiece model (D2L's word vocabularies,
            ``data=fra_eng_d2l``): names how that setup is trained and scored instead.
        ConfigError: ``model.decoding.ensemble`` is set (only evaluate decodes ensembles).
    """
    spm_model = Path(cfg.paths.tokenized) / "spm.model"
    if not spm_model.exists():
        raise MissingFileError(
            f"export needs a sentencepiece corpus; {spm_model} does not exist (data={cfg.data.name}"
            + (
                " uses D2L's word vocabularies: train and score it with scripts/reproduce_d2l.sh)"
                if (spm_model.parent / "vocab.json").exists()
                else "): export reads the tokenized corpus of the data settings it is given, so give "
                "it those the model trained with (e.g. `python src/export.py model=transformer "
                "data=parallel data.src_lang=zh data.tgt_lang=en`), or run `dvc repro tokenize`"
            )
        )
    if cfg.model.decoding.get("ensemble"):
        raise ConfigError(
            "model.decoding.ensemble is evaluate's: export writes the one net it trained; "
            "drop +model.decoding.ensemble (score an ensemble with src/evaluate.py)"
        )
    facts = _facts(cfg, record)
    facts["decoding"] = OmegaConf.to_container(cfg.model.decoding, resolve=True)  # beam, as evaluate
    s = cfg.serving
    export_translation(
        net,
        spm_model,
        out_dir,
        facts,
        s.max_input_chars,
        s.max_request_sentences,
        s.max_request_chars,
        s.max_request_tokens,
        list(cfg.export.ctranslate2),
        compile=bool(cfg.export.compile),
    )
    registered, version = log_served_model(out_dir, cfg.model.name, record["run_id"], record["tracking_uri"])
    return {
        "registered": registered,
        "version": version,
        "serve": serve_command(registered, record["tracking_uri"]),
    }


def export_regression_model(cfg: DictConfig, net: nn.Module, record: dict, out_dir: Path) -> dict:
    """The traced NW model with its training points (keys and values) in ``out_dir``
    (:func:`attnlab.export.trace.export_regression`); nothing is registered.

    Returns:
        ``{}`` (the summary names the folder and the run).
    """
    data = synthetic_from_config(cfg.data, cfg.seed)
    export_regression(net, data["x_train"], data["y_train"], out_dir, _facts(cfg, record))
    return {}
