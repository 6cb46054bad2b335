"""LightningModule for Nadaraya–Watson regression on D2L's synthetic data (D2L 11.2 (zh 10.2)).

``conf/model/nw.yaml`` names it as its ``task.module`` (see :mod:`attnlab.lit.translation`).
"""

from __future__ import annotations

from pathlib import Path

import pytorch_lightning as pl
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from torch.utils.data import DataLoader, Sampler, TensorDataset
from torchmetrics import MeanSquaredError

from attnlab.analysis.explorer import nw_explorer, write_explorer
from attnlab.analysis.viz import nw_figures
from attnlab.data.synthetic import synthetic_from_config
from attnlab.lit.shards import RankShard
from attnlab.models.nadaraya_watson import (
    NadarayaWatson,
    check_kernel,
    check_width,
    leave_one_out,
    nw_evaluation,
)


class RegressionModule(pl.LightningModule):
    """Trains the parametric NW model's ``w`` by MSE with leave-one-out keys (D2L zh 10.2.4).

    The trained model is the Gaussian kernel with w = 1/σ (``attnlab.checkpoint``
    rebuilds NW checkpoints as such); the other kernels of D2L 11.2 (zh 10.2) are
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
        self.figure_settings: dict = {"kernels": (), "width": 1.0, "width_sweep": ()}
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

    # --- what train.py asks of its task (conf/model/nw.yaml: task.module) ----------------------

    @classmethod
    def from_config(cls, cfg: DictConfig) -> tuple[RegressionModule, tuple[DataLoader, DataLoader]]:
        """(module, (train loader, val loader)) for ``trainer.fit(module, *loaders)``: D2L's
        synthetic data (``conf/data/synthetic.yaml``, drawn with ``seed``), each a single batch.

        Raises:
            ValueError: an unknown kernel or a width σ ≤ 0 in ``model.kernels``/``model.width``/
                ``model.width_sweep`` (before any training); data other than ``synthetic``.
        """
        m = cfg.model
        kernels = [check_kernel(k) for k in m.kernels]  # a typo fails here, not after training
        widths = [check_width(w) for w in (m.width, *m.width_sweep)]
        data = synthetic_from_config(cfg.data, cfg.seed)
        module = cls(optimizer=OmegaConf.to_container(cfg.optimizer, resolve=True), init_w=m.init_w)
        module.data = data
        module.figure_settings = {"kernels": kernels, "width": widths[0], "width_sweep": widths[1:]}
        return module, (
            full_batch_loader(data["x_train"], data["y_train"]),
            full_batch_loader(data["x_test"], data["y_test"], sampler=RankShard(len(data["x_test"]))),
        )

    @staticmethod
    def run_tags(cfg: DictConfig) -> dict[str, str]:
        """Nothing beyond the model and data tags every run has."""
        return {}

    def epoch_callbacks(self, cfg: DictConfig, folder: Path, logger) -> list[pl.Callback]:
        """None: the fit is drawn once, at the end."""
        return []

    def figures(self, net: NadarayaWatson, folder: Path) -> list[Path]:
        """The figures of D2L 11.2 (zh 10.2) for the trained ``net`` (fit, weights, each kernel, the
        width sweep: :func:`attnlab.analysis.viz.nw_figures`) in ``<folder>/attention``, and the
        attention explorer of the same fits (:func:`attnlab.analysis.explorer.nw_explorer`) in
        ``<folder>/explorer.html``."""
        out_dir = Path(folder) / "attention"
        s, d = self.figure_settings, self.data
        ev = nw_evaluation(d, float(net.w.detach()), s["kernels"], s["width"], s["width_sweep"])
        paths = nw_figures(
            d["x_train"],
            d["y_train"],
            d["x_test"],
            d["y_test"],
            ev["predictions"],
            ev["weights"],
            out_dir,
            kernels=ev["kernels"],
            width=s["width"],
            width_sweep=ev["width_sweep"],
            trained_w=ev["w"],
        )
        w = ev["w"]
        trained = f"trained Gaussian: w = {w:.2f}, σ = {1 / abs(w) if w else float('inf'):.2f}"
        fits = {
            trained: {
                "weights": ev["weights"],
                "prediction": ev["weights"] @ d["y_train"],
            },  # f(x) = Σ_i α_i(x) y_i
            **{f"{k.capitalize()} kernel, σ = {s['width']:g}": f for k, f in ev["kernels"].items()},
            **{f"Gaussian kernel, σ = {sigma:g}": f for sigma, f in ev["width_sweep"].items()},
        }
        page = nw_explorer(
            d["x_train"],
            d["y_train"],
            d["x_test"],
            d["y_test"],
            fits,
            "Nadaraya–Watson regression (D2L 11.2 (zh 10.2)): attention weights and fits",
        )
        return [*paths, write_explorer(Path(folder) / "explorer.html", page)]


def full_batch_loader(x: torch.Tensor, y: torch.Tensor, sampler: Sampler | None = None) -> DataLoader:
    """One batch holding all of (x, y), in order (or all that ``sampler`` gives: under DDP, the
    rank's share of the validation points, :class:`~attnlab.lit.shards.RankShard`)."""
    return DataLoader(TensorDataset(x, y), batch_size=len(x), sampler=sampler)
