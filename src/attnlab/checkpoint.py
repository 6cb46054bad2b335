"""Rebuild a trained model from a training checkpoint with torch and Hydra only.

``train.py`` saves Lightning checkpoints whose ``hyper_parameters`` are plain
containers (so ``torch.load(weights_only=True)`` works) and whose
``state_dict`` keys start with ``net.``. Evaluation and export read them here
without importing Lightning, which keeps those stages quick to start.
"""
from __future__ import annotations

from pathlib import Path

import torch
from hydra.utils import instantiate
from torch import nn

from attnlab.data.tokenizer import PAD_ID
from attnlab.models.nadaraya_watson import NadarayaWatson


class CheckpointError(ValueError):
    """The checkpoint is missing or was not written by attnlab's train.py."""


def load_net(path: Path, expected_kind: str | None = None) -> nn.Module:
    """The checkpoint's model (``attnlab.models``) in eval mode on the CPU.

    Args:
        path: the checkpoint train.py kept (``checkpoints/<model>/best.ckpt``, or
            ``last.ckpt`` with ``checkpoint.monitor=null``).
        expected_kind: ``nw``, ``bahdanau`` or ``transformer``; checked against the checkpoint.
    Raises:
        CheckpointError: missing file, foreign checkpoint, or a model of another kind.
    """
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path} not found; train first (`dvc repro` or `python src/train.py`)")
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    hp = ckpt.get("hyper_parameters", {})
    if "net" in hp:
        extra = {"src_vocab_size": hp["src_vocab_size"]} if hp.get("src_vocab_size") else {}
        net = instantiate(hp["net"], vocab_size=hp["vocab_size"], pad_id=PAD_ID, **extra)
    elif "init_w" in hp:
        net = NadarayaWatson(parametric=True, init_w=hp["init_w"])
    else:
        raise CheckpointError(f"{path} was not written by attnlab's src/train.py")
    if expected_kind is not None and net.kind != expected_kind:
        raise CheckpointError(f"{path} holds a {net.kind} model, not {expected_kind}")
    net.load_state_dict({k[len("net."):]: v for k, v in ckpt["state_dict"].items()
                         if k.startswith("net.")})
    return net.eval()
