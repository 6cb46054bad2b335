"""Checkpoint averaging (`checkpoint.average_last=N`, attnlab.lit.averaging).

Unit tests feed hand-set weights to the callback; the integration test trains the
tiny Transformer for real: the kept checkpoint of a 3-epoch run with
``average_last=2``, killed in epoch 3 and resumed, must equal the mean of the
epoch-2 and epoch-3 weights of separate uninterrupted runs.
"""
import subprocess
import time

import pytest
import torch
from torch import nn

from attnlab.lit.averaging import WeightAveraging

from tiny_train import ROOT, STEPS_PER_EPOCH, copy_project, env, make_project, train, train_cmd


class _Module(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(2, 1)
        self.register_buffer("count", torch.tensor(0))


def _end_epoch(cb, module, value):
    with torch.no_grad():
        module.linear.weight.fill_(value)
        module.linear.bias.fill_(-value)
        module.count.fill_(int(value))
    cb.on_train_epoch_end(None, module)


def test_average_of_the_last_n_epochs_by_hand():
    cb, m = WeightAveraging(2), _Module()
    for value in (1.0, 2.0, 4.0):
        _end_epoch(cb, m, value)
    assert len(cb.snapshots) == 2  # epoch 1 dropped
    avg = cb.average()
    assert avg["linear.weight"].tolist() == [[3.0, 3.0]]  # (2 + 4) / 2
    assert avg["linear.bias"].tolist() == [-3.0]
    assert avg["linear.weight"].dtype == torch.float32
    assert avg["count"].item() == 4  # integer buffers: the newest value, not a mean


def test_snapshots_survive_a_checkpoint_round_trip():
    cb, m = WeightAveraging(3), _Module()
    for value in (1.0, 2.0):
        _end_epoch(cb, m, value)
    restored = WeightAveraging(3)
    restored.load_state_dict(cb.state_dict())
    _end_epoch(restored, m, 6.0)
    assert restored.average()["linear.weight"].tolist() == [[3.0, 3.0]]  # (1 + 2 + 6) / 3
    assert restored.apply(m) == 3
    assert m.linear.weight.tolist() == [[3.0, 3.0]] and restored.snapshots == []


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="average_last must be ≥ 1"):
        WeightAveraging(0)
    with pytest.raises(RuntimeError, match="no epoch ended"):
        WeightAveraging(2).average()


def _kept(root):
    return torch.load(root / "checkpoints/transformer/best.ckpt", map_location="cpu", weights_only=True)


def test_kept_checkpoint_is_the_mean_of_the_last_epochs_even_after_a_kill(tmp_path):
    base = make_project(tmp_path / "base")
    for epochs in (2, 3):  # average_last=1 keeps exactly the final epoch's weights
        root = copy_project(base, tmp_path / f"e{epochs}")
        result = train(root, f"trainer.max_epochs={epochs}", "checkpoint.average_last=1")
        assert result.returncode == 0, result.stderr[-3000:]
    e2, e3 = (_kept(tmp_path / f"e{n}")["state_dict"] for n in (2, 3))

    root = copy_project(base, tmp_path / "avg")
    args = ("trainer.max_epochs=3", "checkpoint.average_last=2", "checkpoint.every_n_train_steps=3")
    last = root / "checkpoints/transformer/last.ckpt"
    proc = subprocess.Popen(train_cmd(root, *args), cwd=ROOT, env=env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline, step = time.time() + 240, 0
    while step <= STEPS_PER_EPOCH and proc.poll() is None and time.time() < deadline:
        try:  # kill once a checkpoint after epoch 1 exists (it holds epoch 1's snapshot)
            step = torch.load(last, map_location="cpu", weights_only=True)["global_step"]
        except Exception:  # not written yet, or being written
            time.sleep(0.05)
    proc.kill()
    assert proc.wait(timeout=120) != 0, "the run finished before it could be killed"
    killed = torch.load(last, map_location="cpu", weights_only=True)
    assert STEPS_PER_EPOCH < killed["global_step"] < 3 * STEPS_PER_EPOCH
    snapshots = killed["callbacks"]["WeightAveraging"]["snapshots"]
    assert len(snapshots) == min(2, killed["global_step"] // STEPS_PER_EPOCH)

    resumed = train(root, *args)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from" in resumed.stdout
    assert "mean of the weights after epochs 2-3 (checkpoint.average_last=2)" in resumed.stdout
    kept = _kept(root)
    assert kept["callbacks"]["WeightAveraging"]["snapshots"] == []  # not carried into best.ckpt
    weights = kept["state_dict"]
    assert weights.keys() == e3.keys()
    moved = 0
    for k in weights:
        want = ((e2[k].double() + e3[k].double()) / 2).to(e3[k].dtype)
        torch.testing.assert_close(weights[k], want, rtol=0, atol=1e-6, msg=k)
        moved += not torch.equal(e2[k], e3[k])
    assert moved > 10  # the epochs differ, so the mean is neither of them
