"""DVC stage `export@<model>`: best checkpoint → self-contained folder models/<model>/.

The folder loads with torch and sentencepiece alone (see attnlab.export);
`python src/translate.py model=<model>` uses it.
    python src/export.py model=transformer
"""
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from attnlab.export import export_regression, export_translation
from attnlab.lit.regression import RegressionModule
from attnlab.lit.setup import regression_data
from attnlab.lit.translation import TranslationModule
from attnlab.tracking import read_run_record


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    name = cfg.model.name
    record = read_run_record(Path(cfg.paths.runs) / f"{name}.json", name)
    out_dir = Path(cfg.paths.models) / name
    facts = {"model": name, "mlflow_run_id": record["run_id"],
             "model_config": OmegaConf.to_container(cfg.model, resolve=True)}
    if cfg.model.task == "regression":
        module = RegressionModule.load_from_checkpoint(record["checkpoint"], map_location="cpu",
                                                       weights_only=True)
        data = regression_data(cfg)
        export_regression(module.net, data["x_train"], data["y_train"], out_dir, facts)
    else:
        module = TranslationModule.load_from_checkpoint(record["checkpoint"], map_location="cpu",
                                                        weights_only=True)
        facts["data"] = OmegaConf.to_container(cfg.data, resolve=True)
        export_translation(module.net, Path(cfg.paths.tokenized) / "spm.model", out_dir, facts)
    print(f"{name}: exported → {out_dir}")


if __name__ == "__main__":
    main()
