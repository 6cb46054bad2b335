"""DVC stage `export@<model>`: best checkpoint → self-contained folder models/<model>/.

What is written is the model's task's (conf/model/<model>.yaml `task.export`, in
attnlab.export.tasks). The folder loads with torch and sentencepiece alone (see attnlab.export);
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
from hydra.utils import get_method
from omegaconf import DictConfig

from attnlab.checkpoint import load_net
from attnlab.console import logs, summaries
from attnlab.console.errors import user_errors
from attnlab.tracking.store import prepare_store, read_run_record


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
@user_errors("export")
def main(cfg: DictConfig) -> None:
    logs.setup()
    name = cfg.model.name
    export = get_method(cfg.model.task.export)  # the model's task: attnlab.export.tasks
    record = read_run_record(Path(cfg.paths.runs) / f"{name}.json", name)
    prepare_store(record["tracking_uri"], cfg.mlflow.artifact_location)
    load = get_method(cfg.model.task.load) if cfg.model.task.get("load") else load_net  # image models
    # the export carries the tokenizer: it must be the one the model trained with (checked as it loads)
    net = load(record["checkpoint"], expected_kind=name, tokenized_dir=cfg.paths.tokenized)
    out_dir = Path(cfg.paths.models) / name
    with logs.hide_mlflow_prints():  # "Successfully registered model ...": the summary says it
        registered = export(cfg, net, record, out_dir)
    print(summaries.export_summary(name, out_dir, record, **registered))


if __name__ == "__main__":
    main()
