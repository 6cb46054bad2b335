"""EpochHistoryLogger: one CSV row per epoch from Lightning's separate metric calls, kept on resume."""

import csv

from attnlab.lit.history import EpochHistoryLogger


def _rows(path):
    return list(csv.DictReader(path.open()))


def test_validation_and_training_calls_merge_into_one_row_per_epoch(tmp_path):
    path = tmp_path / "plots/transformer/history.csv"
    log = EpochHistoryLogger(path)
    # What Lightning sends at the end of epochs 0 and 1 of an 8-step epoch: validation first.
    log.log_metrics({"val_loss": 4.5, "val_bleu": 0.25, "epoch": 0.0}, step=7)
    log.log_metrics({"train_loss": 5.125, "tokens_per_sec": 1500.0, "epoch": 0.0}, step=7)
    log.log_metrics({"val_loss": 4.0, "val_bleu": 1.5, "epoch": 1.0}, step=15)
    log.log_metrics({"train_loss": 4.625, "tokens_per_sec": 2000.0, "epoch": 1.0}, step=15)
    log.log_metrics({"loss": 9.0}, step=3)  # no epoch: not an epoch row
    assert path.read_text().splitlines() == [
        "epoch,step,train_loss,val_loss,val_bleu,tokens_per_sec",
        "1,7,5.125,4.5,0.25,1500.0",
        "2,15,4.625,4.0,1.5,2000.0",
    ]
    assert not list(path.parent.glob(".*.tmp"))  # written via a temp file, renamed


def test_a_resumed_run_keeps_earlier_epochs_and_replaces_the_relogged_one(tmp_path):
    path = tmp_path / "history.csv"
    first = EpochHistoryLogger(path)
    first.log_metrics({"val_loss": 4.5, "epoch": 0.0}, step=7)
    first.log_metrics({"train_loss": 5.0, "epoch": 0.0}, step=7)
    first.log_metrics({"val_loss": 4.25, "epoch": 1.0}, step=15)  # killed before train_loss
    resumed = EpochHistoryLogger(path, resume=True)  # the run resumes epoch 1 (0-based)
    resumed.log_metrics({"val_loss": 4.0, "epoch": 1.0}, step=15)
    resumed.log_metrics({"train_loss": 4.5, "epoch": 1.0}, step=15)
    assert [(r["epoch"], r["step"], r["train_loss"], r["val_loss"]) for r in _rows(path)] == [
        ("1", "7", "5.0", "4.5"),
        ("2", "15", "4.5", "4.0"),
    ]
    fresh = EpochHistoryLogger(path)  # not resuming: starts empty
    fresh.log_metrics({"val_loss": 3.0, "epoch": 0.0}, step=7)
    assert [(r["epoch"], r["val_loss"]) for r in _rows(path)] == [("1", "3.0")]
    assert list(_rows(path)[0]) == ["epoch", "step", "val_loss"]
