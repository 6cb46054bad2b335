"""Attention heads, measured: what each head attends to, and how much each one matters.

* :func:`row_statistics` and :func:`diagonal_offset`: the mean entropy and confidence of a
  head's attention rows (Voita et al. 2019, "Analyzing Multi-Head Self-Attention", section 4:
  confidence is the mean of each row's largest weight), and how far its arg-max source position
  lies from the diagonal; :func:`head_statistics` gives them for every layer and head of a
  model on one batch, as metric names that line up across runs.
* :func:`head_importance`: BLEU with each head masked alone, and with heads pruned in order of
  importance (Michel et al. 2019, "Are Sixteen Heads Really Better than One?", sections 3-4),
  through the head masks of :class:`attnlab.models.attention.MultiHeadAttention`.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch

from attnlab.data.special_tokens import PAD_ID


def _valid(lens: torch.Tensor, size: int) -> torch.Tensor:
    """(B, size) bool: position < length, per sample."""
    return torch.arange(size, device=lens.device)[None] < lens[:, None]


def row_statistics(weights: torch.Tensor, query_lens: torch.Tensor,
                   key_lens: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
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
    lens = {"encoder_self": (src_lens, src_lens), "decoder_self": (tgt_lens, None),
            "encoder_decoder": (tgt_lens, src_lens), "alignment": (tgt_lens, src_lens)}
    out = {}
    for kind, layers in maps.items():
        queries, keys = lens[kind]
        for layer, w in enumerate(layers, 1):
            stats = {"entropy": None, "confidence": None}
            stats["entropy"], stats["confidence"] = row_statistics(w, queries, keys)
            if kind in ("encoder_decoder", "alignment"):
                stats["diagonal_offset"] = diagonal_offset(w, queries, keys)
            for name, values in stats.items():
                for head, value in enumerate(values.tolist(), 1):
                    out[f"{name}/{kind}/layer{layer}/head{head}"] = value
    return out


def head_names(net) -> list[tuple[str, int, int]]:
    """(kind, layer, head) of every multi-head attention head of ``net`` (layers and heads from 0),
    in the order of ``net.attention_layers()``; empty for a model without multi-head attention."""
    return [(kind, layer, head) for kind, attentions in net.attention_layers().items()
            for layer, attention in enumerate(attentions) for head in range(attention.num_heads)]


def _apply_masks(net, pruned: set[tuple[str, int, int]]) -> None:
    """Set every multi-head attention's mask: 0 for the heads in ``pruned``, none elsewhere."""
    for kind, attentions in net.attention_layers().items():
        for layer, attention in enumerate(attentions):
            heads = [h for (k, l, h) in pruned if (k, l) == (kind, layer)]
            mask = None
            if heads:
                mask = torch.ones(attention.num_heads)
                mask[heads] = 0.0
            attention.set_head_mask(mask)


@torch.no_grad()
def head_importance(net, score: Callable[[], float]) -> dict:
    """Michel et al. 2019: each head's importance as the score lost when it alone is masked, and
    the score as heads are pruned one by one, least important first.

    Args:
        net: a model with ``attention_layers()`` (:meth:`attnlab.models.transformer.Transformer.attention_layers`).
        score: the score of ``net`` as it is masked now (e.g. validation BLEU, higher is better).
    Returns:
        ``score`` (unmasked); ``heads``: per head {kind, layer, head (from 1), score (alone masked),
        importance (score − that)}; ``pruning``: [{pruned: n, score, head: the n-th pruned head's
        name or None}] for n = 0 … all heads. The masks are removed at the end, also on error.
    Raises:
        ValueError: ``net`` has no multi-head attention (Bahdanau's additive attention has one
            head: there is nothing to mask).
    """
    names = head_names(net)
    if not names:
        raise ValueError(f"{type(net).__name__} has no multi-head attention: nothing to mask "
                         "(head importance is for the Transformer)")
    try:
        _apply_masks(net, set())
        base = score()
        heads = []
        for name in names:
            _apply_masks(net, {name})
            masked = score()
            heads.append({"kind": name[0], "layer": name[1] + 1, "head": name[2] + 1,
                          "score": masked, "importance": base - masked})
        order = sorted(range(len(names)), key=lambda i: heads[i]["importance"])  # least first
        pruning, pruned = [{"pruned": 0, "score": base, "head": None}], set()
        for n, i in enumerate(order, 1):
            pruned.add(names[i])
            _apply_masks(net, pruned)
            h = heads[i]
            pruning.append({"pruned": n, "score": score(),
                            "head": f"{h['kind']}/layer{h['layer']}/head{h['head']}"})
    finally:
        _apply_masks(net, set())
    return {"score": base, "heads": heads, "pruning": pruning}


def importance_grid(result: dict, kinds: Sequence[str]) -> dict[str, list[list[float]]]:
    """``head_importance``'s heads as one (layers × heads) grid of importances per kind."""
    grid = {}
    for kind in kinds:
        rows = [h for h in result["heads"] if h["kind"] == kind]
        layers, heads = max(h["layer"] for h in rows), max(h["head"] for h in rows)
        g = [[0.0] * heads for _ in range(layers)]
        for h in rows:
            g[h["layer"] - 1][h["head"] - 1] = h["importance"]
        grid[kind] = g
    return grid
