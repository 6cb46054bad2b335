"""DVC stage `tokenize`: corpus text → a tokenizer and token-id arrays.

Sentencepiece corpora (data=multi30k, data=fra_eng, data=parallel) write to
data/tokenized/<corpus>-<src>-<tgt>/: spm.model, spm.vocab, the token ids of train, val, test and
any further test split of data.splits (Multi30k: test_2017) as <split>.{src,tgt}.ids.npy (int32)
and <split>.{src,tgt}.offsets.npy (int64, N+1), which training memory-maps,
<split>.{src,tgt}.txt (normalized text) for all but train, and stats.json. The corpus is
streamed (attnlab.data.tokenizer.tokenize_sentencepiece): memory does not grow with its size.
Training pairs with an empty side, or with data.max_len or more tokens on a
side, are dropped (attnlab.data.tokenizer.filter_pairs); val and the test splits keep every
pair so they stay aligned with their references. stats.json and the printout
(one line per split, then a summary) give the counts.
data=fra_eng_d2l writes D2L's fixed-length arrays instead (see attnlab.data.d2l):
vocab.json, {train,val}.npz, val.{src,tgt}.txt (D2L-preprocessed text), stats.json.

conf/data/<corpus>.yaml names the function that tokenizes it (`tokenize`:
attnlab.data.tokenizer.tokenize_sentencepiece, attnlab.data.d2l.tokenize_d2l); data=synthetic
has none (`tokenize: null`). The output folder is built beside the target and renamed into
place at the end (attnlab.files.staged_dir): a failed run leaves the previous output as it
was, and no partial one.
    python src/tokenize_data.py data=multi30k data.tgt_lang=de
    python src/tokenize_data.py data=fra_eng_d2l
"""

from pathlib import Path

import hydra
from hydra.utils import get_method
from omegaconf import DictConfig

from attnlab.console import logs, summaries
from attnlab.console.errors import user_errors
from attnlab.errors import ConfigError


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
@user_errors("tokenize")
def main(cfg: DictConfig) -> None:
    logs.setup(mlflow=False)
    if "tokenize" not in cfg.data:
        raise ConfigError(
            f"data={cfg.data.name} names no tokenize function; add one to its config, e.g. "
            "`tokenize: attnlab.data.tokenizer.tokenize_sentencepiece` (joint BPE)"
        )
    if cfg.data.tokenize is None:
        raise ConfigError(
            f"data={cfg.data.name} needs no tokenizer; choose data=multi30k, data=fra_eng or data=parallel"
        )
    tokenize = get_method(cfg.data.tokenize)
    out = Path(cfg.paths.tokenized)
    report = tokenize(cfg, out)
    for line in report.lines:
        print(line)
    print(summaries.tokenize_summary(report.corpus, out, report.splits, report.vocabulary))


if __name__ == "__main__":
    main()
