"""The summaries that end the stages: a title and ``  key : value`` lines, at most about 15.

:func:`block` lays one out; ``*_summary`` build each stage's (train, evaluate, export,
tokenize, download). The MLflow reads they need are in :mod:`attnlab.console.runs`; none of
them fails a finished stage: a failed read becomes a note line.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from attnlab.console.epoch_table import EPOCH_COLUMNS, VAL_KEYS, as_float, counted
from attnlab.console.runs import best_epoch, mlflow_client, mlflow_links


def block(title: str, rows: Iterable[tuple[str, object]], notes: Iterable[str] = ()) -> str:
    """``title`` then one ``  key : value`` line per row (keys padded to one width), then
    ``notes`` unindented. Rows whose value is ``None`` are left out."""
    rows = [(k, str(v)) for k, v in rows if v is not None]
    width = max((len(k) for k, _ in rows), default=0)
    return "\n".join([title, *(f"  {k:<{width}} : {v}" for k, v in rows), *notes])


def _brief(e: Exception) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"


def _val_rows(values: dict) -> list[tuple[str, str]]:
    fmt = dict((k, f) for k, _, f in EPOCH_COLUMNS)
    return [(k, f"{values[k]:{fmt[k]}}") for k in VAL_KEYS if k in values]


def train_summary(cfg, trainer, logger, checkpoint: str | Path, averaged: Iterable[int] = ()) -> str:
    """The end-of-training summary: the kept checkpoint's epoch and val metrics, where it is,
    the MLflow run (id, name, artifact location) and how to open it.

    Args:
        cfg: the composed config (``model.name``, ``checkpoint.monitor``/``mode``,
            ``mlflow.tracking_uri``).
        trainer: the Trainer after ``fit`` (epochs and steps done; last metrics if offline).
        logger: the run's :class:`attnlab.lit.logger.ResilientMLFlowLogger`. When its
            ``offline_reason`` is set MLflow is not queried: the values are the last epoch's.
        checkpoint: the kept checkpoint file.
        averaged: the epochs (1-based) whose weights the kept checkpoint averages
            (``checkpoint.average_last``); empty: it is the best (or last) epoch's.
    Returns:
        At most ~12 ASCII lines (no trailing newline). Never raises for MLflow trouble: a
        failed read becomes a note line.
    """
    name, uri, run_id = cfg.model.name, cfg.mlflow.tracking_uri, logger.run_id
    title = f"{name}: trained {counted(trainer.current_epoch, 'epoch')} ({trainer.global_step} steps)"
    rows: list[tuple[str, object]] = []
    notes: list[str] = []
    run = None
    averaged = list(averaged)
    if averaged:
        span = f"epochs {averaged[0]}-{averaged[-1]}" if len(averaged) > 1 else f"epoch {averaged[0]}"
        rows.append(
            (
                "kept",
                f"mean of the weights after {span} (checkpoint.average_last={cfg.checkpoint.average_last})",
            )
        )
        try:
            run = mlflow_client(uri).get_run(run_id) if logger.offline_reason is None else None
        except Exception as e:  # noqa: BLE001 - a summary must not fail a finished run
            notes.append(f"{name}: could not read the run back from MLflow ({_brief(e)})")
    elif logger.offline_reason is None:
        try:
            client = mlflow_client(uri)
            run = client.get_run(run_id)
            best = best_epoch(client, run_id, cfg.checkpoint.monitor, cfg.checkpoint.mode)
        except Exception as e:  # noqa: BLE001 - a summary must not fail a finished run
            best = None
            notes.append(f"{name}: could not read the run back from MLflow ({_brief(e)})")
        if best is not None:
            how = (
                f"{'lowest' if cfg.checkpoint.mode == 'min' else 'highest'} {best['by']}"
                if best["by"]
                else "last epoch"
            )
            rows.append(("best epoch", f"{best['epoch']} of {trainer.current_epoch} ({how})"))
            rows += _val_rows(best)
    else:
        last = {k: as_float(v) for k, v in trainer.callback_metrics.items() if k in VAL_KEYS}
        rows.append(("last epoch", f"{trainer.current_epoch} (MLflow offline: best epoch unknown)"))
        rows += _val_rows(last)
    rows.append(("checkpoint", checkpoint))
    rows.append(("MLflow run", f"{run_id} ({run.info.run_name})" if run else run_id))
    if run is not None:
        rows.append(("artifacts", run.info.artifact_uri))
    rows.append(("tracking", uri))
    rows += mlflow_links(uri, run.info.experiment_id if run else None, run_id)
    if logger.offline_reason:
        notes.append(
            f"{name}: MLflow tracking stopped during the run ({logger.offline_reason}); "
            "metrics after that point were not logged"
        )
    return block(title, rows, notes)


def _run_rows(record: dict, logged: Iterable[str] = ()) -> tuple[list[tuple[str, object]], list[str]]:
    """MLflow run id (+ what was logged) and its links, from a ``runs/<model>.json`` record."""
    uri, run_id = record["tracking_uri"], record["run_id"]
    what = f" (logged {', '.join(logged)})" if logged else ""
    try:
        experiment_id = mlflow_client(uri).get_run(run_id).info.experiment_id
    except Exception as e:  # noqa: BLE001 - the summary notes an unreadable run and goes on
        return [("MLflow run", run_id + what)], [f"could not read run {run_id} from {uri} ({_brief(e)})"]
    return [("MLflow run", run_id + what), *mlflow_links(uri, experiment_id, run_id)], []


def _bleu_settings(scores: dict) -> str:
    """``"cased, <tokenizer>"`` from the sacreBLEU signature of ``scores["bleu"]``
    (``nrefs:1|case:mixed|eff:no|tok:zh|...`` → ``cased, zh``); ``"cased"`` without one."""
    fields = dict(
        f.split(":", 1) for f in str(scores.get("signature", {}).get("bleu", "")).split("|") if ":" in f
    )
    return f"cased, {fields['tok']}" if "tok" in fields else "cased"


def evaluate_summary(
    name: str,
    scores: dict,
    metrics_path: Path,
    record: dict,
    hypotheses: Path | None = None,
    logged: Iterable[str] = (),
) -> str:
    """The end-of-evaluation summary.

    Args:
        name: model name.
        scores: what ``metrics/<model>.json`` holds: seq2seq ``bleu``, ``bleu_lc``, ``chrf``
            (sacreBLEU, 0-100; the tokenizer shown is the ``tok`` of ``signature.bleu``),
            ``bleu_tok_lc`` (shown when present) and
            ``num_sentences`` (the same of each further test set in
            ``more_test_sets``: a row ``also`` each); NW ``mse``, ``mse_nonparametric``,
            ``mse_average_pooling``, ``w``, ``mse_<kernel>``, ``kernel_width``.
        metrics_path: the metrics JSON file.
        record: the ``runs/<model>.json`` record (``run_id``, ``tracking_uri``).
        hypotheses: the translations file (seq2seq).
        logged: the MLflow metric names added to the run.
    """
    if "bleu" in scores:
        title = f"{name}: {scores.get('num_sentences', '?')} test sentences scored"
        rows = [
            ("test_bleu", f"{scores['bleu']:.2f} (sacreBLEU, {_bleu_settings(scores)})"),
            ("bleu_lc", f"{scores['bleu_lc']:.2f}"),
            ("chrF", f"{scores['chrf']:.2f}"),
        ]
        if "bleu_tok_lc" in scores:  # the papers' BLEU: lowercased, Moses-tokenized
            rows.append(("bleu_tok_lc", f"{scores['bleu_tok_lc']:.2f} (as Multi30k papers score)"))
        more = scores.get("more_test_sets", {})
        rows += [
            (
                "also",
                f"{test_set}: BLEU {s['bleu']:.2f}, bleu_lc {s['bleu_lc']:.2f}, chrF {s['chrf']:.2f}"
                + (f", bleu_tok_lc {s['bleu_tok_lc']:.2f}" if "bleu_tok_lc" in s else "")
                + f" ({s['num_sentences']} sentences)",
            )
            for test_set, s in more.items()
        ]
        # test_bleu/<name>, test_bleu_lc/<name>, ...: named once, not once per score
        logged = [k for k in logged if "/" not in k] + [f"test_*/{name}" for name in more]
    else:
        title = f"{name}: test MSE"
        rows = [
            ("test MSE", f"{scores['mse']:.4f} (learned w {scores['w']:.4f})"),
            ("non-parametric", f"{scores['mse_nonparametric']:.4f} (gaussian, w 1)"),
            ("average pooling", f"{scores['mse_average_pooling']:.4f}"),
        ]
        width = scores.get("kernel_width")
        rows += [
            (k[4:], f"{v:.4f} (width {width})")
            for k, v in scores.items()
            if k.startswith("mse_") and k not in ("mse_nonparametric", "mse_average_pooling")
        ]
    rows += [("metrics", metrics_path), ("hypotheses", hypotheses)]
    run_rows, notes = _run_rows(record, logged)
    return block(title, rows + run_rows, notes)


def export_summary(
    name: str,
    folder: Path,
    record: dict,
    registered: str | None = None,
    version: int | str | None = None,
    serve: str | None = None,
) -> str:
    """The end-of-export summary: the folder, the registered MLflow model (name, the new
    version, which now has the alias ``champion``), the run it was logged to, and the
    commands that serve (``serve``, from :func:`attnlab.serving.registry.serve_command`) and use it."""
    rows = [
        ("folder", folder),
        ("registered", f"{registered} version {version} (alias champion)" if registered else None),
    ]
    run_rows, notes = _run_rows(record)
    rows += [r for r in run_rows if r[0] == "MLflow run"]
    rows += [
        ("serve", serve),
        ("translate", f'python src/translate.py model={name} +text="A dog runs."' if registered else None),
    ]
    return block(f"{name}: exported", rows, notes)


def tokenize_summary(corpus: str, out: Path, splits: dict[str, str], vocabulary: str) -> str:
    """The end-of-tokenize summary: output folder, vocabulary, pairs per split, stats file.

    Args:
        corpus: e.g. ``multi30k en-fr``.
        out: the tokenized folder.
        splits: split name -> its pair count as text, e.g. ``{"train": "40 of 46"}``.
        vocabulary: e.g. ``8000 pieces``.
    """
    rows = [
        ("output", out),
        ("vocabulary", vocabulary),
        ("pairs", ", ".join(f"{k} {v}" for k, v in splits.items())),
        ("counts", out / "stats.json"),
    ]
    return block(f"tokenize: {corpus}", rows)


def download_summary(folder: Path, files: list[tuple[str, bool]], source: str) -> str:
    """The end-of-download summary.

    Args:
        folder: the raw-data folder.
        files: (path relative to ``folder``, fetched now) per file, every one checksum-verified.
        source: ``mirror <folder>`` or ``canonical URLs``.
    """
    fetched = [f for f, new in files if new]
    names = ", ".join(fetched[:3]) + (f", +{len(fetched) - 3} more" if len(fetched) > 3 else "")
    size = sum((Path(folder) / f).stat().st_size for f, _ in files)
    rows = [
        ("folder", folder),
        ("source", source),
        ("fetched", f"{len(fetched)} ({names})" if fetched else "0 (all present and verified)"),
        ("size", f"{size / 1e6:.1f} MB"),
    ]
    return block(f"download: {len(files)} files, checksums verified", rows)
