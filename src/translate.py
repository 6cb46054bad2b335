"""Translate with an exported model (models/<model>/): torch + sentencepiece, no checkpoint.

    python src/translate.py model=transformer +text="A man rides a bike."
    printf 'A dog runs.\nTwo girls sing.\n' | python src/translate.py model=bahdanau
    python src/translate.py model=transformer model.decoding.beam_size=1 +text="…"   # greedy
"""
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from attnlab.decoding import translate_text
from attnlab.export import load_translator


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    init_state, step, tokenizer, _ = load_translator(Path(cfg.paths.models) / cfg.model.name)
    text = cfg.get("text")
    sentences = [str(text)] if text is not None else [line.rstrip("\n") for line in sys.stdin]
    dec = cfg.model.decoding  # the same beam settings as evaluate
    for line in translate_text(init_state, step, tokenizer, sentences,
                               beam_size=dec.beam_size, alpha=dec.alpha):
        print(line)


if __name__ == "__main__":
    main()
