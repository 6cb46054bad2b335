"""The one device a stage that does not train (evaluate, export) runs on: torch alone, no Lightning.

Below both training (:mod:`attnlab.lit`) and inference (:mod:`attnlab.inference`), so that
inference never imports a trainer.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from attnlab.errors import UserError


class DeviceUnavailableError(UserError, RuntimeError):
    """``device.accelerator`` names an accelerator this machine does not have."""


def _has_mps() -> bool:
    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())


def single_device(device: Mapping) -> torch.device:
    """The device Lightning's Trainer would run one process on for ``device`` (conf/device/*.yaml).

    ``device.accelerator`` is read as ``lightning.pytorch.Trainer`` reads it for one device:
    ``auto`` takes the first CUDA GPU, else Apple's MPS, else the CPU; ``gpu`` takes CUDA or
    MPS; ``cuda``, ``mps`` and ``cpu`` take that one. ``devices``, ``strategy`` and
    ``num_nodes`` are ignored: evaluation decodes in one process on the first device.

    Raises:
        DeviceUnavailableError: the accelerator is unknown or not available here (names it
            and the fix).
    """
    name = str(device["accelerator"]).lower()
    cuda = torch.cuda.is_available()
    choice = {
        "auto": "cuda" if cuda else "mps" if _has_mps() else "cpu",
        "cpu": "cpu",
        "gpu": "cuda" if cuda else "mps" if _has_mps() else None,
        "cuda": "cuda" if cuda else None,
        "mps": "mps" if _has_mps() else None,
    }
    if choice.get(name) is None:
        why = "it is not one of auto, cpu, gpu, cuda, mps" if name not in choice else "none is available"
        raise DeviceUnavailableError(
            f"device.accelerator={device['accelerator']} cannot run here ({why}); choose device=cpu, "
            "or device=auto to take whatever this machine has"
        )
    return torch.device(f"{choice[name]}:0" if choice[name] == "cuda" else choice[name])
