"""DVC stage `export@<model>`: best checkpoint → self-contained folder models/<model>/.

The folder loads with torch and sentencepiece alone (see attnlab.export);
`python src/translate.py model=<model>` uses it. A translation model is also
logged to its training run as an MLflow pyfunc model and registered as
`attnlab-<model>` (a new version each run, which gets the alias `champion`); the
summary at the end prints the `mlflow models serve -m models:/attnlab-<model>@champion`
command. Sentences longer than `serving.max_input_chars`
characters (conf/config.yaml, default 500; `serving.max_input_chars=N` to change) are refused,
and so are requests to the served model over `serving.max_request_sentences` (32),
`serving.max_request_chars` (4,000) or `serving.max_request_tokens` (1,000).
    python src/export.py model=transformer
"""
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from attnlab.console import logs, summaries
from attnlab.checkpoint import load_net
from attnlab.export.registry import log_served_model, serve_command
from attnlab.export.trace import export_regression, export_translation
from attnlab.models.nadaraya_watson import synthetic_from_config
from attnlab.tracking import prepare_store, read_run_record


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    logs.setup()
    name = cfg.model.name
    if cfg.data.get("tokenizer") == "d2l_words":
        raise SystemExit(f"export needs a sentencepiece corpus; data={cfg.data.name} uses D2L's "
                         "word vocabularies (train and score it with scripts/reproduce_d2l.sh)")
    record = read_run_record(Path(cfg.paths.runs) / f"{name}.json", name)
    prepare_store(record["tracking_uri"], cfg.mlflow.artifact_location)
    net = load_net(record["checkpoint"], expected_kind=name)
    out_dir = Path(cfg.paths.models) / name
    facts = {"model": name, "mlflow_run_id": record["run_id"],
             "model_config": OmegaConf.to_container(cfg.model, resolve=True),
             "data": OmegaConf.to_container(cfg.data, resolve=True)}
    if cfg.model.task == "regression":
        data = synthetic_from_config(cfg.data, cfg.seed)
        export_regression(net, data["x_train"], data["y_train"], out_dir, facts)
        print(summaries.export_summary(name, out_dir, record))
        return
    if "decoding" in cfg.model:  # the beam settings evaluate uses; the served model uses them too
        facts["decoding"] = OmegaConf.to_container(cfg.model.decoding, resolve=True)
    export_translation(net, Path(cfg.paths.tokenized) / "spm.model", out_dir, facts,
                       cfg.serving.max_input_chars, cfg.serving.max_request_sentences,
                       cfg.serving.max_request_chars, cfg.serving.max_request_tokens)
    with logs.hide_mlflow_prints():  # "Successfully registered model ...": the summary says it
        registered, version = log_served_model(out_dir, name, record["run_id"], record["tracking_uri"])
    print(summaries.export_summary(name, out_dir, record, registered, version,
                                   serve_command(registered, record["tracking_uri"])))


if __name__ == "__main__":
    main()
