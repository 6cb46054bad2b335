"""Attention heads, measured: what each head attends to (logged after every validation epoch).

:func:`row_statistics` and :func:`diagonal_offset`: the mean entropy and confidence of a head's
attention rows (Voita et al. 2019, "Analyzing Multi-Head Self-Attention", section 4: confidence
is the mean of each row's largest weight), and how far its arg-max source position lies from
the diagonal; :func:`head_statistics` gives them for every layer and head of a model on one
batch, as metric names that line up across runs. How much each head matters is
:mod:`attnlab.analysis.pruning`'s (an analysis of a trained model, not part of training).
"""

from __future__ import annotations

import torch

from attnlab.data.special_tokens import PAD_ID


def _valid(lens: torch.Tensor, size: int) -> torch.Tensor:
    """(B, size) bool: position < length, per sample."""
    return torch.arange(size, device=lens.device)[None] < lens[:, None]


def row_statistics(
    weights: torch.Tensor, query_lens: torch.Tensor, key_lens: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean entropy and mean confidence of each head's attention rows.

    Args:
        weights: (B, H, Q, K) float, each row a distribution over keys.
        query_lens: (B,) int: rows q ≥ ``query_lens[b]`` are padded queries and not counted.
        key_lens: (B,) int, or ``None``: keys k ≥ ``key_lens[b]`` are masked and not counted
            (their weights are 0 after a masked softmax anyway; causal masking needs nothing).
    Returns:
        (entropy, confidence), each (H,) float64: entropy −Σ_k w log w in nats (0 log 0 = 0) and
        confidence max_k w, averaged over the valid rows of every sample. A uniform row over n
        keys gives log n and 1/n; a one-hot row 0 and 1.
    Raises:
        ValueError: no valid row (every query padded).
    """
    B, H, Q, K = weights.shape
    rows = _valid(query_lens, Q)  # (B, Q)
    if not rows.any():
        raise ValueError("no valid query row: every query_lens is 0")
    w = weights.double()
    if key_lens is not None:
        w = w * _valid(key_lens, K)[:, None, None, :]
    entropy = -torch.where(w > 0, w * w.log(), torch.zeros_like(w)).sum(-1)  # (B, H, Q)
    confidence = w.amax(-1)  # (B, H, Q)
    keep, n = rows[:, None, :].double(), rows.sum()
    return (entropy * keep).sum((0, 2)) / n, (confidence * keep).sum((0, 2)) / n


def diagonal_offset(weights: torch.Tensor, query_lens: torch.Tensor, key_lens: torch.Tensor) -> torch.Tensor:
    """How far each head's strongest source position is from the diagonal.

    For target position t of T and its arg-max key s* of S: |(s* + ½)/S − (t + ½)/T|, the distance
    from the diagonal as a fraction of the sentence (0: a monotone, length-proportional alignment;
    at most 1), averaged over the valid rows.

    Args:
        weights: (B, H, T, S) float, encoder–decoder attention (target queries, source keys).
        query_lens: (B,) int target lengths; key_lens: (B,) int source lengths.
    Returns:
        (H,) float64.
    """
    B, H, T, S = weights.shape
    masked = weights.masked_fill(~_valid(key_lens, S)[:, None, None, :], -1.0)
    best = masked.argmax(-1).double()  # (B, H, T)
    t = torch.arange(T, device=weights.device, dtype=torch.float64)
    offset = ((best + 0.5) / key_lens[:, None, None] - (t + 0.5) / query_lens[:, None, None]).abs()
    rows = _valid(query_lens, T)[:, None, :].double()
    return (offset * rows).sum((0, 2)) / rows.sum((0, 2))


@torch.no_grad()
def head_statistics(net, batch: dict[str, torch.Tensor]) -> dict[str, float]:
    """Every layer's and head's statistics on one teacher-forced batch, as MLflow metric names.

    ``entropy/<kind>/layer<l>/head<h>`` and ``confidence/<kind>/layer<l>/head<h>`` for every kind
    of ``net.attention_maps`` (Transformer: encoder_self, decoder_self, encoder_decoder; Bahdanau:
    alignment, one head), and ``diagonal_offset/<kind>/layer<l>/head<h>`` for the kinds that attend
    from target to source. Layers and heads count from 1.

    Args:
        net: a translation model with ``attention_maps(src, src_valid_lens, tgt_in)``, in eval mode.
        batch: :func:`attnlab.data.batching.collate`'s dict (``src``, ``src_valid_lens``,
            ``tgt_in``, ``tgt_out``) on the net's device.
    """
    src_lens = batch["src_valid_lens"]
    tgt_lens = (batch["tgt_out"] != PAD_ID).sum(1)
    maps = net.attention_maps(batch["src"], src_lens, batch["tgt_in"])
    lens = {
        "encoder_self": (src_lens, src_lens),
        "decoder_self": (tgt_lens, None),
        "encoder_decoder": (tgt_lens, src_lens),
        "alignment": (tgt_lens, src_lens),
    }
    out = {}
    for kind, layers in maps.items():
        queries, keys = lens[kind]
        for layer, w in enumerate(layers, 1):
            entropy, confidence = row_statistics(w, queries, keys)
            stats = {"entropy": entropy, "confidence": confidence}
            if kind in ("encoder_decoder", "alignment"):
                stats["diagonal_offset"] = diagonal_offset(w, queries, keys)
            for name, values in stats.items():
                for head, value in enumerate(values.tolist(), 1):
                    out[f"{name}/{kind}/layer{layer}/head{head}"] = value
    return out
