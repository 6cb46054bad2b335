"""Checkpoint averaging (`checkpoint.average_last=N`, attnlab.lit.averaging).

Unit tests feed hand-set weights to the callback; the integration test trains the
tiny Transformer for real: the kept checkpoint of a 2-epoch run with
``average_last=2``, killed in epoch 2 and resumed, must equal the mean of the
epoch-1 and epoch-2 weights of separate uninterrupted runs.
"""

import subprocess
import time

import pytest
import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import ModelCheckpoint
from pytorch_lightning.demos.boring_classes import BoringModel, RandomDataset
from torch import nn
from torch.utils.data import DataLoader

from attnlab.lit.averaging import WeightAveraging
from attnlab.models.transformer import Transformer
from helpers.tiny_train import ROOT, STEPS_PER_EPOCH, copy_project, env, make_project, train, train_cmd


class _Module(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(2, 1)
        self.register_buffer("count", torch.tensor(0))


def _end_epoch(cb, module, epoch, value):
    with torch.no_grad():
        module.linear.weight.fill_(value)
        module.linear.bias.fill_(-value)
        module.count.fill_(int(value))
    cb._snapshot(epoch, module)


def test_average_of_the_last_n_epochs_by_hand():
    cb, m = WeightAveraging(2), _Module()
    for epoch, value in enumerate((1.0, 2.0, 4.0)):
        _end_epoch(cb, m, epoch, value)
    assert cb.epochs == [2, 3]  # epoch 1 dropped
    avg = cb.average()
    assert avg["linear.weight"].tolist() == [[3.0, 3.0]]  # (2 + 4) / 2
    assert avg["linear.bias"].tolist() == [-3.0]
    assert avg["linear.weight"].dtype == torch.float32
    assert avg["count"].item() == 4  # integer buffers: the newest value, not a mean


def test_a_hook_firing_twice_for_an_epoch_keeps_one_snapshot():
    cb, m = WeightAveraging(3), _Module()
    _end_epoch(cb, m, 0, 1.0)
    _end_epoch(cb, m, 1, 5.0)
    _end_epoch(cb, m, 1, 3.0)  # the same epoch again (a resume): replaces, does not add
    assert cb.epochs == [1, 2]
    assert cb.average()["linear.weight"].tolist() == [[2.0, 2.0]]


def test_snapshots_survive_a_checkpoint_round_trip():
    cb, m = WeightAveraging(3), _Module()
    for epoch, value in enumerate((1.0, 2.0)):
        _end_epoch(cb, m, epoch, value)
    restored = WeightAveraging(3)
    restored.load_state_dict(cb.state_dict())
    _end_epoch(restored, m, 2, 6.0)
    assert restored.average()["linear.weight"].tolist() == [[3.0, 3.0]]  # (1 + 2 + 6) / 3
    assert restored.apply(m) == [1, 2, 3]
    assert m.linear.weight.tolist() == [[3.0, 3.0]] and restored.snapshots == {}


def test_tied_weights_are_copied_once():
    net = Transformer(30, d_model=8, num_heads=2, num_layers=1, ffn_hidden=16)
    cb = WeightAveraging(1)
    cb._snapshot(0, net)
    snap = cb.snapshots[0]
    assert snap["src_embedding.weight"] is snap["output.weight"] is snap["tgt_embedding.weight"]
    assert snap["src_embedding.weight"].data_ptr() != net.src_embedding.weight.data_ptr()  # a copy


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="average_last must be ≥ 1"):
        WeightAveraging(0)
    with pytest.raises(RuntimeError, match="no epoch ended"):
        WeightAveraging(2).average()


class _Spy(pl.Callback):
    """The weights at every epoch end, taken independently of WeightAveraging."""

    def __init__(self):
        self.weights = []

    def on_train_epoch_end(self, trainer, pl_module):
        self.weights.append({k: v.detach().clone() for k, v in pl_module.state_dict().items()})


class _Boring(BoringModel):
    def train_dataloader(self):  # 4 batches per epoch
        return DataLoader(RandomDataset(32, 16), batch_size=4)

    def val_dataloader(self):
        return DataLoader(RandomDataset(32, 8), batch_size=4)


def _fit(tmp_path, callbacks, ckpt_path=None, epochs=3):
    pl.seed_everything(0)
    model = _Boring()
    trainer = pl.Trainer(
        max_epochs=epochs,
        callbacks=callbacks,
        default_root_dir=tmp_path,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        deterministic=True,
    )
    trainer.fit(model, ckpt_path=ckpt_path)
    return model


def test_lightning_resume_from_the_last_batch_checkpoint_keeps_that_epoch(tmp_path):
    """A step checkpoint written at an epoch's last batch comes before on_train_epoch_end; a run
    resumed from it never re-runs that hook, so the snapshot must already be in the checkpoint."""
    spy, averaging = _Spy(), WeightAveraging(3)
    steps = ModelCheckpoint(
        dirpath=tmp_path / "ckpt", filename="{step}", every_n_train_steps=4, save_top_k=-1
    )
    _fit(tmp_path / "a", [spy, averaging, steps])
    want = {k: sum(w[k] for w in spy.weights) / 3 for k in spy.weights[0]}
    got = averaging.average()
    assert averaging.epochs == [1, 2, 3]
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=0, atol=1e-7)
    assert not torch.equal(spy.weights[0]["layer.weight"], spy.weights[2]["layer.weight"])

    at_end_of_epoch1 = tmp_path / "ckpt" / "step=4.ckpt"
    saved = torch.load(at_end_of_epoch1, map_location="cpu", weights_only=False)
    assert list(saved["callbacks"]["WeightAveraging"]["snapshots"]) == [0]  # epoch 1's, already there
    resumed = WeightAveraging(3)
    _fit(tmp_path / "b", [resumed], ckpt_path=at_end_of_epoch1)
    assert resumed.epochs == [1, 2, 3]
    again = resumed.average()
    for k in want:
        torch.testing.assert_close(again[k], want[k], rtol=0, atol=1e-6)


def _kept(root):
    return torch.load(root / "checkpoints/transformer/best.ckpt", map_location="cpu", weights_only=True)


def test_kept_checkpoint_is_the_mean_of_the_last_epochs_even_after_a_kill(tmp_path):
    base = make_project(tmp_path / "base")
    for epochs in (1, 2):  # average_last=1 keeps exactly the final epoch's weights
        root = copy_project(base, tmp_path / f"e{epochs}")
        result = train(root, f"trainer.max_epochs={epochs}", "checkpoint.average_last=1")
        assert result.returncode == 0, result.stderr[-3000:]
    e1, e2 = (_kept(tmp_path / f"e{n}")["state_dict"] for n in (1, 2))

    root = copy_project(base, tmp_path / "avg")
    args = ("trainer.max_epochs=2", "checkpoint.average_last=2", "checkpoint.every_n_train_steps=3")
    last = root / "checkpoints/transformer/last.ckpt"
    proc = subprocess.Popen(
        train_cmd(root, *args), cwd=ROOT, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline, step = time.time() + 240, 0
    while step <= STEPS_PER_EPOCH and proc.poll() is None and time.time() < deadline:
        try:  # kill once a checkpoint inside epoch 2 exists (it holds epoch 1's snapshot)
            step = torch.load(last, map_location="cpu", weights_only=True)["global_step"]
        except Exception:  # noqa: BLE001 - not written yet, or half written: torch.load fails in many ways
            time.sleep(0.05)
    proc.kill()
    assert proc.wait(timeout=120) != 0, "the run finished before it could be killed"
    killed = torch.load(last, map_location="cpu", weights_only=True)
    assert STEPS_PER_EPOCH < killed["global_step"] < 2 * STEPS_PER_EPOCH
    assert list(killed["callbacks"]["WeightAveraging"]["snapshots"]) == [0]  # epoch 1's

    resumed = train(root, *args)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from" in resumed.stdout
    assert "mean of the weights after epochs 1-2 (checkpoint.average_last=2)" in resumed.stdout
    kept = _kept(root)
    assert kept["callbacks"]["WeightAveraging"]["snapshots"] == {}  # not carried into best.ckpt
    weights = kept["state_dict"]
    assert weights.keys() == e2.keys()
    moved = 0
    for k in weights:
        want = ((e1[k].double() + e2[k].double()) / 2).to(e2[k].dtype)
        torch.testing.assert_close(weights[k], want, rtol=0, atol=1e-6, msg=k)
        moved += not torch.equal(e1[k], e2[k])
    assert moved > 10  # the epochs differ, so the mean is neither of them
