"""Translate with an exported model (models/<model>/): torch + sentencepiece, no checkpoint.

    python src/translate.py model=transformer +text="A man rides a bike."
    printf 'A dog runs.\nTwo girls sing.\n' | python src/translate.py model=bahdanau
    python src/translate.py model=transformer model.decoding.beam_size=1 +text="…"   # greedy

An empty line translates to an empty line; a sentence longer than the export's
limit (config.json → serving.max_input_chars) is an error, as in the served model.
"""
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from attnlab.export import Translator


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    dec = cfg.model.decoding  # the same beam settings as evaluate
    translator = Translator(Path(cfg.paths.models) / cfg.model.name,
                            beam_size=dec.beam_size, alpha=dec.alpha)
    text = cfg.get("text")
    sentences = [str(text)] if text is not None else [line.rstrip("\n") for line in sys.stdin]
    for line in translator(sentences):
        print(line)


if __name__ == "__main__":
    main()
