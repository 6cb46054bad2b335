"""DVC stage `download`: every raw corpus file, checksum-verified, into data/raw/.

    python src/download.py                         # canonical URLs
    ATTNLAB_DATA_MIRROR=../shared/data python src/download.py   # offline mirror
"""
from pathlib import Path

import hydra
from omegaconf import DictConfig

from attnlab.data.download import DownloadError, fetch


@hydra.main(version_base="1.3", config_path="../conf", config_name="download")
def main(cfg: DictConfig) -> None:
    for relpath, src in cfg.sources.items():
        url = src.get("url") or f"{cfg.multi30k_url}/{Path(relpath).name}"
        digests = {k: list(v) for k, v in src.items() if k in ("sha256", "sha1")}
        try:
            path = fetch(relpath, url, digests, Path(cfg.paths.raw), mirror=cfg.mirror or "")
        except DownloadError as e:
            raise SystemExit(f"download failed: {e}") from None
        print(f"ok  {path}")


if __name__ == "__main__":
    main()
