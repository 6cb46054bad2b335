"""DVC stage `download`: every raw corpus file, checksum-verified, into data/raw/.

python src/download.py                         # canonical URLs
ATTNLAB_DATA_MIRROR=../shared/data python src/download.py   # offline mirror
"""

from pathlib import Path

import hydra
from omegaconf import DictConfig

from attnlab.console import logs, summaries
from attnlab.console.errors import user_errors
from attnlab.data.download import fetch


@hydra.main(version_base="1.3", config_path="../conf", config_name="download")
@user_errors("download")
def main(cfg: DictConfig) -> None:
    logs.setup(mlflow=False)
    raw, files = Path(cfg.paths.raw), []
    for relpath, src in cfg.sources.items():
        url = src.get("url") or f"{cfg.multi30k_url}/{Path(relpath).name}"
        digests = {k: list(v) for k, v in src.items() if k in ("sha256", "sha1")}
        fetched = fetch(relpath, url, digests, raw, mirror=cfg.mirror or "")
        files.append((relpath, fetched.downloaded))
    print(summaries.download_summary(raw, files, f"mirror {cfg.mirror}" if cfg.mirror else "canonical URLs"))


if __name__ == "__main__":
    main()
