"""LightningModule for Nadaraya–Watson regression on D2L's synthetic data (D2L 11.2)."""
from __future__ import annotations

import pytorch_lightning as pl
import torch
from hydra.utils import instantiate
from torch.utils.data import DataLoader, TensorDataset
from torchmetrics import MeanSquaredError

from attnlab.models.nadaraya_watson import NadarayaWatson, leave_one_out


class RegressionModule(pl.LightningModule):
    """Trains the parametric NW model's ``w`` by MSE with leave-one-out keys (D2L 11.2.4).

    The trained model is the Gaussian kernel with w = 1/σ (``attnlab.checkpoint``
    rebuilds NW checkpoints as such); the other kernels of D2L 11.2 are
    non-parametric and evaluated beside it (``nw_evaluation``).

    The training batch is the whole training set (queries x_i, keys/values the
    other n-1 points); validation is MSE on the noise-free test points with all
    training points as keys. Logged: ``train_loss``, ``val_loss`` (test MSE, a torchmetrics
    ``MeanSquaredError`` over all test points).
    """

    def __init__(self, optimizer: dict, init_w: float = 1.0):
        super().__init__()
        self.save_hyperparameters(logger=False)
        self.net = NadarayaWatson(parametric=True, init_w=init_w)
        self.data: dict[str, torch.Tensor] | None = None
        self.val_mse = MeanSquaredError()  # state not saved in checkpoints

    def training_step(self, batch, batch_idx):
        x, y = batch
        keys, values = leave_one_out(x, y)
        loss = ((self.net(x, keys, values) - y) ** 2).mean()
        self.log("train_loss", loss, on_step=False, on_epoch=True, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x_test, y_test = batch
        pred = self.net(x_test, self.data["x_train"], self.data["y_train"])
        self.val_mse.update(pred, y_test)
        self.log("val_loss", self.val_mse, prog_bar=True)

    def configure_optimizers(self):
        return instantiate(self.hparams.optimizer)(params=self.parameters())


def full_batch_loader(x: torch.Tensor, y: torch.Tensor) -> DataLoader:
    """One batch holding all of (x, y), in order."""
    return DataLoader(TensorDataset(x, y), batch_size=len(x), shuffle=False)
