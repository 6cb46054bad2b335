"""train.py's callbacks come from config (conf/callbacks/default.yaml, Hydra's instantiate):
one added on the command line is built and changes the run."""

import csv

from helpers.tiny_train import make_project, train


def test_a_lightning_callback_added_on_the_command_line_runs(tmp_path):
    """EarlyStopping on val_loss with min_delta 1e9 and patience 0: the first validation improves
    on +inf, the second cannot improve by 1e9, so training stops after epoch 2 of 5."""
    root = make_project(tmp_path / "project")
    early = (
        "+callbacks.early_stopping={_target_: pytorch_lightning.callbacks.EarlyStopping, "
        "monitor: val_loss, patience: 0, min_delta: 1.0e9}"
    )
    result = train(root, "trainer.max_epochs=5", early)
    assert result.returncode == 0, result.stderr[-3000:]
    with open(root / "plots/transformer/history.csv", newline="") as f:
        epochs = [int(row["epoch"]) for row in csv.DictReader(f)]
    assert epochs == [1, 2]
    assert "trained 2 epochs" in result.stdout

    result = train(root, "trainer.max_epochs=3")  # without it: every epoch
    with open(root / "plots/transformer/history.csv", newline="") as f:
        assert [int(row["epoch"]) for row in csv.DictReader(f)] == [1, 2, 3]
