"""The learning-rate schedules of the translation models (``model.warmup_steps``, ``model.lr_decay``):
their factors by hand, their refusals, and the LR each optimizer step of a real Lightning fit uses."""

from __future__ import annotations

import math

import pytest
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader

from attnlab.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from attnlab.lit.translation import TranslationModule, inverse_sqrt_warmup, linear_warmup_decay


def test_inverse_sqrt_warms_up_linearly_then_decays_as_one_over_the_root_of_the_step():
    f = inverse_sqrt_warmup(4)
    assert [f(k) for k in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert f(8) == pytest.approx(math.sqrt(4 / 9)) and f(99) == pytest.approx(0.2)
    assert [inverse_sqrt_warmup(0)(k) for k in (0, 10)] == [1.0, 1.0]  # no warm-up: constant


def test_linear_decay_reaches_zero_just_after_the_last_step():
    f = linear_warmup_decay(2, 6)  # steps 0..5: warm-up 0.5, 1; decay 4/4, 3/4, 2/4, 1/4
    assert [f(k) for k in range(7)] == [0.5, 1.0, 1.0, 0.75, 0.5, 0.25, 0.0]
    assert [linear_warmup_decay(0, 4)(k) for k in range(4)] == [1.0, 0.75, 0.5, 0.25]


@pytest.mark.parametrize("warmup, total", [(5, 5), (5, 3), (0, 0)])
def test_linear_decay_needs_more_steps_than_warm_up(warmup, total):
    with pytest.raises(
        ValueError,
        match=rf"lr_decay=linear needs more steps than warm-up: {total} "
        rf"step\(s\) planned \(trainer.max_epochs / max_steps\), warmup_steps={warmup}; "
        r"raise trainer.max_epochs or lower model.warmup_steps",
    ):
        linear_warmup_decay(warmup, total)


NET = {
    "_target_": "attnlab.models.transformer.Transformer",
    "d_model": 8,
    "num_heads": 2,
    "num_layers": 1,
    "ffn_hidden": 16,
    "dropout": 0.0,
}
OPT = {"_target_": "torch.optim.SGD", "_partial_": True, "lr": 0.1}


def test_an_unknown_schedule_is_refused():
    with pytest.raises(
        ValueError,
        match=r"model.lr_decay='cosine' is not a schedule; choose one of "
        r"inverse_sqrt, linear",
    ):
        TranslationModule(NET, OPT, vocab_size=12, lr_decay="cosine")


class _LRs(pl.Callback):
    def __init__(self):
        self.seen = []

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self.seen.append(trainer.optimizers[0].param_groups[0]["lr"])


@pytest.mark.parametrize(
    "lr_decay, factors",
    [
        ("linear", [1 / 3, 2 / 3, 1.0, 1.0, 2 / 3, 1 / 3]),  # 6 steps planned, the last at 1/3
        ("inverse_sqrt", [1 / 3, 2 / 3, 1.0, math.sqrt(3 / 4), math.sqrt(3 / 5), math.sqrt(3 / 6)]),
    ],
)
@pytest.mark.filterwarnings("ignore::lightning_fabric.utilities.warnings.PossibleUserWarning")  # no val loop
def test_each_step_of_a_fit_uses_the_schedules_lr(lr_decay, factors):
    """A real Lightning fit of 2 epochs × 3 batches, warm-up 3: the linear decay plans Lightning's
    ``estimated_stepping_batches`` (6) steps."""
    torch.manual_seed(0)
    batch = {
        "src": torch.tensor([[4, 5, EOS_ID], [6, EOS_ID, PAD_ID]]),
        "src_valid_lens": torch.tensor([3, 2]),
        "tgt_in": torch.tensor([[BOS_ID, 7, 8], [BOS_ID, 9, PAD_ID]]),
        "tgt_out": torch.tensor([[7, 8, EOS_ID], [9, EOS_ID, PAD_ID]]),
    }
    module = TranslationModule(NET, OPT, vocab_size=12, warmup_steps=3, lr_decay=lr_decay)
    lrs = _LRs()
    trainer = pl.Trainer(
        max_epochs=2,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[lrs],
        accelerator="cpu",
    )
    trainer.fit(module, train_dataloaders=DataLoader([batch] * 3, batch_size=None))
    assert trainer.global_step == 6
    assert lrs.seen == pytest.approx([0.1 * f for f in factors])
