"""The one device a stage that does not train (evaluate) runs on, chosen as Lightning chooses it."""
from __future__ import annotations

import torch
from omegaconf import DictConfig


class DeviceUnavailableError(RuntimeError):
    """``device.accelerator`` names an accelerator this machine does not have."""


def single_device(device: DictConfig) -> torch.device:
    """The device Lightning's Trainer would run one process on for ``device`` (conf/device/*.yaml).

    ``device.accelerator`` is read as ``pytorch_lightning.Trainer`` reads it (``auto``: a
    GPU or MPS device when there is one, else the CPU); ``devices``, ``strategy`` and
    ``num_nodes`` are ignored: evaluation decodes in one process on the first device.

    Raises:
        DeviceUnavailableError: the accelerator is not available here (names it and the fix).
    """
    import pytorch_lightning as pl
    from lightning_fabric.utilities.exceptions import MisconfigurationException

    try:
        trainer = pl.Trainer(accelerator=device.accelerator, devices=1, num_nodes=1, logger=False,
                             enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False)
    except (MisconfigurationException, RuntimeError, ValueError) as e:
        raise DeviceUnavailableError(
            f"device.accelerator={device.accelerator} cannot run here ({e}); choose device=cpu, "
            "or device=auto to take whatever this machine has") from None
    return trainer.strategy.root_device
