#!/usr/bin/env python
"""BLEU by source length: does a fixed context vector lose long sentences (D2L 10.7 (zh 9.7))?

Splits the test set by the number of words (whitespace tokens) of each English source into
buckets, and scores each model's hypotheses in each bucket with sacreBLEU (cased, 13a, as
evaluate does). Bahdanau et al. 2015 (figure 2) show the attention-free encoder–decoder's BLEU
falling with sentence length while the attention model's holds.

Usage::

    python scripts/bleu_by_length.py --source data/tokenized/multi30k-en-fr/test.src.txt \\
        --reference data/tokenized/multi30k-en-fr/test.tgt.txt \\
        --hypotheses seq2seq=metrics/seq2seq.hyp.txt bahdanau=metrics/bahdanau.hyp.txt \\
        --out results/bleu_by_length.csv --note "commit, runs ..."

Writes one CSV row per (model, bucket): model, bucket, words_min, words_max, sentences, bleu,
note. Raises ``SystemExit`` naming the file when the line counts differ.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import sacrebleu

# word-count buckets of Multi30k's test_2016_flickr (sources of 4 to 40 words, median about 12)
EDGES = (1, 9, 13, 17, 10_000)


def bucket_of(words: int, edges: tuple[int, ...] = EDGES) -> int:
    """The index i with edges[i] <= words < edges[i + 1]. Raises ValueError outside the edges."""
    for i in range(len(edges) - 1):
        if edges[i] <= words < edges[i + 1]:
            return i
    raise ValueError(f"{words} words is outside the buckets {edges}")


def bleu_by_length(
    sources: list[str], references: list[str], hypotheses: list[str], edges: tuple[int, ...] = EDGES
) -> list[tuple[int, int, float]]:
    """(bucket, sentences, corpus BLEU) for each non-empty bucket, by the sources' word counts."""
    groups: dict[int, list[int]] = {}
    for i, source in enumerate(sources):
        groups.setdefault(bucket_of(len(source.split()), edges), []).append(i)
    out = []
    for b in sorted(groups):
        idx = groups[b]
        score = sacrebleu.corpus_bleu([hypotheses[i] for i in idx], [[references[i] for i in idx]])
        out.append((b, len(idx), score.score))
    return out


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", type=Path, required=True)
    parser.add_argument("--reference", type=Path, required=True)
    parser.add_argument("--hypotheses", nargs="+", required=True, metavar="MODEL=PATH")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--note", default="")
    args = parser.parse_args(argv)
    sources, references = _lines(args.source), _lines(args.reference)
    if len(sources) != len(references):
        raise SystemExit(f"{args.source} has {len(sources)} lines but {args.reference} {len(references)}")
    rows = []
    for item in args.hypotheses:
        model, _, path = item.partition("=")
        hypotheses = _lines(Path(path))
        if len(hypotheses) != len(sources):
            raise SystemExit(f"{path} has {len(hypotheses)} lines, the test set {len(sources)}")
        for b, n, bleu in bleu_by_length(sources, references, hypotheses):
            high = EDGES[b + 1] - 1
            rows.append([model, b, EDGES[b], "" if high >= 9_999 else high, n, f"{bleu:.2f}", args.note])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["model", "bucket", "words_min", "words_max", "sentences", "bleu", "note"])
        writer.writerows(rows)
    for row in rows:
        print(*row[:6], sep="\t")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
