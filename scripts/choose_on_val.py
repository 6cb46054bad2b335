"""Choose checkpoint averaging and the length penalty on the validation split, never on test.

    python scripts/choose_on_val.py outputs/epochs-en-de \
        --tokenized data/tokenized/multi30k-en-de --last 1 3 5 8 10 --alpha 1.0 0.6 0.8 1.2 \
        --out outputs/val_choice.json --write outputs/chosen.ckpt

Input: the weights a translation model's run (Transformer or Bahdanau) kept at the end of every
epoch, one Lightning checkpoint
each. A run keeps them with a second ``ModelCheckpoint`` (docs/how-to/full-profile.md), in a
folder of its own outside ``checkpoints/`` (a DVC output) and outside other runs' folders:

    python src/train.py +experiment=full data.tgt_lang=de '+callbacks.every_epoch={_target_:
        pytorch_lightning.callbacks.ModelCheckpoint, dirpath: outputs/epochs-en-de,
        filename: "e{epoch:02d}", monitor: step, mode: max, save_top_k: -1,
        save_weights_only: true, auto_insert_metric_name: false}'

Step 1: for each N of ``--last``, the mean of the last N epochs' weights (the same float64 mean
as ``checkpoint.average_last=N``, :class:`attnlab.lit.averaging.WeightAveraging`; Vaswani et al.
2017, 6.1) decodes the whole validation split with beam search at the first ``--alpha`` given
as the reference α (default 1.0, evaluate's) and is scored with sacreBLEU (cased 13a, as
evaluate). Step 2: the best N decodes the validation split again at each α of ``--alpha``
(length penalty ((5 + |Y|) / 6)^α, Wu et al. 2016, eq. 14). The best by BLEU wins each step;
ties go to the smaller N and to α = the reference.

Output: a table on stdout, and with ``--out`` the same as JSON (every candidate's BLEU,
lowercased BLEU, chrF and seconds, and the choice). ``--write PATH`` saves the chosen average
as a checkpoint that :func:`attnlab.checkpoint.load_net` reads (the newest epoch's file with its
weights replaced), atomically: an interrupted write leaves the old file. ``src/evaluate.py``
scores the checkpoint that ``runs/<model>.json`` names (the train stage's ``best.ckpt``, a DVC
output), so to score the chosen one copy it there yourself and pass the chosen α as
``model.decoding.alpha``; the MLflow run still records what training kept.

An ensemble (``--ensemble``, the chosen averages of runs from other seeds, written with
``--write``): each candidate decodes together with those checkpoints, the mean of their
next-token probabilities (:class:`attnlab.inference.ensemble.Ensemble`), so N and α are chosen
for the ensemble. To score it on test, pass the same checkpoints to ``src/evaluate.py`` as
``'+model.decoding.ensemble=[...]'``.

Decoding runs on the CPU (``OMP_NUM_THREADS`` threads), about 25 s per candidate for the full
profile's net on one thread of a 2-core EPYC.

Raises (as SystemExit with the fix): the folder holds no epoch checkpoint, or two for one epoch
(a second run or a resume into the same folder), or its epochs are not consecutive; an N of
``--last`` is under 1 or over the number of epochs kept; the tokenized folder lacks
``spm.model``, ``val.src.txt`` or ``val.tgt.txt``; an ``--ensemble`` checkpoint that ``load_net`` refuses
(missing, damaged, another model or another corpus: its message).
"""

from __future__ import annotations

import argparse
import io
import tempfile
import time
from pathlib import Path

import torch

from attnlab.checkpoint import load_net
from attnlab.data.corpora import read_lines
from attnlab.data.tokenizer import load_sentencepiece
from attnlab.errors import UserError
from attnlab.files import write_bytes_atomic, write_json_atomic
from attnlab.inference.decoding import translate_text
from attnlab.inference.ensemble import Ensemble
from attnlab.lit.averaging import WeightAveraging
from attnlab.metrics import corpus_scores


def epoch_checkpoints(folder: Path) -> list[tuple[int, Path]]:
    """``(epoch (1-based), path)`` of each ``*.ckpt`` in ``folder``, oldest first, by the epoch the
    checkpoint itself records (Lightning's 0-based ``epoch`` + 1), not by its name."""
    found: dict[int, list[Path]] = {}
    for path in sorted(folder.glob("*.ckpt")):
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)  # reads only "epoch"
        found.setdefault(int(ckpt["epoch"]) + 1, []).append(path)
    if not found:
        raise SystemExit(
            f"{folder} holds no *.ckpt; train with the per-epoch ModelCheckpoint of this "
            "script's docstring (docs/how-to/full-profile.md)"
        )
    twice = {epoch: paths for epoch, paths in found.items() if len(paths) > 1}
    if twice:
        epoch, paths = min(twice.items())
        raise SystemExit(
            f"{folder} holds {len(paths)} checkpoints of epoch {epoch} "
            f"({', '.join(p.name for p in paths)}): more than one run wrote there; give each "
            "run a folder of its own (the ModelCheckpoint's dirpath)"
        )
    epochs = sorted(found)
    if epochs != list(range(epochs[0], epochs[-1] + 1)):
        missing = sorted(set(range(epochs[0], epochs[-1] + 1)) - set(epochs))
        raise SystemExit(
            f"{folder} lacks the checkpoints of epochs {missing}: the last N epochs would "
            "not be consecutive; keep every epoch (every_n_epochs: 1, save_top_k: -1)"
        )
    return [(epoch, found[epoch][0]) for epoch in epochs]


def average_last(checkpoints: list[tuple[int, Path]], n: int) -> dict:
    """The newest epoch's checkpoint dict with its ``state_dict`` replaced by the mean of the last
    ``n`` epochs' (:meth:`WeightAveraging.average`: float64 mean, integer buffers the newest's).

    Raises:
        ValueError: ``n`` is not between 1 and the number of checkpoints."""
    if not 1 <= n <= len(checkpoints):
        raise ValueError(f"cannot average the last {n} of {len(checkpoints)} epochs")
    averaging = WeightAveraging(n)
    newest = None
    for epoch, path in checkpoints[-n:]:
        newest = torch.load(path, map_location="cpu", weights_only=True)
        averaging.snapshots[epoch - 1] = newest["state_dict"]
    return {**newest, "state_dict": averaging.average()}


TRANSLATION_MODELS = ("transformer", "bahdanau", "seq2seq")


def load_averaged(ckpt: dict, tmp_dir: Path) -> torch.nn.Module:
    """The net of ``ckpt`` through :func:`attnlab.checkpoint.load_net` (the evaluate stage's
    loader); SystemExit if it is not a translation model (:data:`TRANSLATION_MODELS`)."""
    path = tmp_dir / "candidate.ckpt"
    torch.save(ckpt, path)
    net = load_net(path)
    if net.kind not in TRANSLATION_MODELS:
        raise SystemExit(
            f"the checkpoints hold a {net.kind} model; choose_on_val decodes translation models "
            f"({', '.join(TRANSLATION_MODELS)})"
        )
    return net


def score_val(net, tokenizer, sources, references, beam_size: int, alpha: float, members=()) -> dict:
    """Beam search over the validation sources, detokenized, scored with sacreBLEU (as evaluate);
    with ``members`` (further nets), their ensemble with ``net``."""
    start = time.perf_counter()
    decoder = Ensemble([(m.init_state, m.step) for m in (net, *members)])
    hypotheses = translate_text(
        decoder.init_state,
        decoder.step,
        tokenizer,
        sources,
        batch_size=128,
        device="cpu",
        beam_size=beam_size,
        alpha=alpha,
    )
    return {**corpus_scores(hypotheses, references), "seconds": round(time.perf_counter() - start, 1)}


def row_line(row: dict) -> str:
    """One printed line of the table."""
    return (
        f"mean of the last {row['last']:>2}  α {row['alpha']:<4}  BLEU {row['bleu']:6.2f}  "
        f"lc {row['bleu_lc']:6.2f}  chrF {row['chrf']:6.2f}  ({row['seconds']} s)"
    )


def best(rows: list[dict], prefer) -> dict:
    """The row with the highest BLEU; ties go to ``prefer`` (a function of the row, higher wins)."""
    return max(rows, key=lambda row: (round(row["bleu"], 6), prefer(row)))


def write_checkpoint(ckpt: dict, path: Path) -> None:
    """``torch.save`` of ``ckpt`` to ``path`` atomically (:func:`attnlab.files.write_bytes_atomic`)."""
    buffer = io.BytesIO()
    torch.save(ckpt, buffer)
    write_bytes_atomic(path, buffer.getvalue())


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("epochs", type=Path, help="folder of per-epoch checkpoints")
    parser.add_argument(
        "--tokenized",
        type=Path,
        required=True,
        help="data/tokenized/<data>-<src>-<tgt> (spm.model, val.src.txt, val.tgt.txt)",
    )
    parser.add_argument("--last", type=int, nargs="+", default=[1, 3, 5, 8, 10])
    parser.add_argument(
        "--alpha",
        type=float,
        nargs="+",
        default=[1.0, 0.6, 0.8, 1.2],
        help="length penalties; the first is the reference α of step 1",
    )
    parser.add_argument("--beam-size", type=int, default=5)
    parser.add_argument(
        "--ensemble",
        type=Path,
        nargs="+",
        default=[],
        help="checkpoints decoded together with each candidate (other seeds' --write files)",
    )
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    parser.add_argument("--write", type=Path, help="save the chosen average as a checkpoint here")
    args = parser.parse_args(argv)

    missing = [f for f in ("spm.model", "val.src.txt", "val.tgt.txt") if not (args.tokenized / f).is_file()]
    if missing:
        raise SystemExit(
            f"{args.tokenized} lacks {', '.join(missing)}; run the tokenize stage "
            "(`dvc repro tokenize` or `python src/tokenize_data.py`) for this direction"
        )
    checkpoints = epoch_checkpoints(args.epochs)
    for n in args.last:
        if not 1 <= n <= len(checkpoints):
            raise SystemExit(
                f"--last {n}: {args.epochs} keeps {len(checkpoints)} epochs; give N from 1 "
                f"to {len(checkpoints)}"
            )
    try:  # the evaluate stage's loader, checked against this tokenized corpus
        members = [load_net(path, tokenized_dir=args.tokenized) for path in args.ensemble]
    except UserError as e:
        raise SystemExit(f"--ensemble: {e}") from None
    tokenizer = load_sentencepiece(args.tokenized / "spm.model")
    sources = read_lines(args.tokenized / "val.src.txt")
    references = read_lines(args.tokenized / "val.tgt.txt")
    ref_alpha = args.alpha[0]
    print(
        f"{len(checkpoints)} epochs kept ({checkpoints[0][0]}–{checkpoints[-1][0]}); validation: "
        f"{len(sources)} sentences, beam {args.beam_size}"
        + (f", each candidate with {', '.join(map(str, args.ensemble))}" if members else ""),
        flush=True,
    )

    with tempfile.TemporaryDirectory() as tmp:
        averages, kept = [], {}  # kept: N → (averaged checkpoint, its net), for step 2 and --write
        for n in sorted(set(args.last)):
            ckpt = average_last(checkpoints, n)
            net = load_averaged(ckpt, Path(tmp))
            other = [(p, m.kind) for p, m in zip(args.ensemble, members) if m.kind != net.kind]
            if other:
                raise SystemExit(
                    f"--ensemble: {other[0][0]} holds a {other[0][1]} model, the epochs a "
                    f"{net.kind}; ensemble checkpoints of one model (e.g. {net.kind} runs of other seeds)"
                )
            kept[n] = ckpt, net
            row = {
                "last": n,
                "epochs": [e for e, _ in checkpoints[-n:]],
                "alpha": ref_alpha,
                **score_val(net, tokenizer, sources, references, args.beam_size, ref_alpha, members),
            }
            averages.append(row)
            print(row_line(row), flush=True)
        chosen_n = best(averages, lambda row: -row["last"])["last"]
        chosen_ckpt, net = kept.pop(chosen_n)
        kept.clear()  # the other averages' weights are no longer needed
        alphas = [next(row for row in averages if row["last"] == chosen_n)]
        for alpha in args.alpha[1:]:
            row = {
                "last": chosen_n,
                "alpha": alpha,
                **score_val(net, tokenizer, sources, references, args.beam_size, alpha, members),
            }
            alphas.append(row)
            print(row_line(row), flush=True)
    chosen = best(alphas, lambda row: row["alpha"] == ref_alpha)
    result = {
        "epochs_kept": [e for e, _ in checkpoints],
        "beam_size": args.beam_size,
        "val_sentences": len(sources),
        "ensemble": [str(path) for path in args.ensemble],
        "averaging": averages,
        "length_penalty": alphas,
        "chosen": {"last": chosen_n, "alpha": chosen["alpha"], "bleu": chosen["bleu"]},
    }
    print(
        f"chosen on validation: mean of the last {chosen_n} epochs, α {chosen['alpha']} "
        f"(BLEU {chosen['bleu']:.2f})"
    )
    if args.out:
        write_json_atomic(args.out, result)
    if args.write:
        write_checkpoint(chosen_ckpt, args.write)
        print(
            f"wrote {args.write} (checkpoint.average_last={chosen_n}; decode with "
            f"model.decoding.alpha={chosen['alpha']})"
        )
    return result


if __name__ == "__main__":
    main()
