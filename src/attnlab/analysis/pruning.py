"""How much each attention head matters: Michel et al. 2019, "Are Sixteen Heads Really Better
than One?" (sections 3-4). The score with each head masked alone, and with heads pruned in order
of importance, through the head masks of :class:`attnlab.models.attention.MultiHeadAttention`
(:meth:`attnlab.models.transformer.Transformer.set_head_mask`). ``src/head_importance.py`` runs it
on a trained model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from attnlab.errors import ConfigError


def head_names(net) -> list[tuple[str, int, int]]:
    """(kind, layer, head) of every multi-head attention head of ``net`` (layers and heads from 0),
    in the order of ``net.attention_layers()``; empty for a model without multi-head attention."""
    return [
        (kind, layer, head)
        for kind, attentions in net.attention_layers().items()
        for layer, attention in enumerate(attentions)
        for head in range(attention.num_heads)
    ]


def _apply_masks(net, pruned: set[tuple[str, int, int]]) -> None:
    """Mask the heads in ``pruned`` (0) through ``net.set_head_mask``, one (layers × heads) mask
    per kind that has a pruned head; every other attention unmasked."""
    masks = {}
    for kind, layer, head in pruned:
        if kind not in masks:
            attentions = net.attention_layers()[kind]
            masks[kind] = torch.ones(len(attentions), attentions[0].num_heads)
        masks[kind][layer, head] = 0.0
    net.set_head_mask(masks or None)


@torch.no_grad()
def head_importance(net, score: Callable[[], float]) -> dict:
    """Michel et al. 2019: each head's importance as the score lost when it alone is masked, and
    the score as heads are pruned one by one, least important first.

    Args:
        net: a model with ``attention_layers()``
            (:meth:`attnlab.models.transformer.Transformer.attention_layers`).
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
        raise ConfigError(
            f"{type(net).__name__} has no multi-head attention: nothing to mask "
            "(head importance is for the Transformer)"
        )
    try:
        _apply_masks(net, set())
        base = score()
        heads = []
        for name in names:
            _apply_masks(net, {name})
            masked = score()
            heads.append(
                {
                    "kind": name[0],
                    "layer": name[1] + 1,
                    "head": name[2] + 1,
                    "score": masked,
                    "importance": base - masked,
                }
            )
        order = sorted(range(len(names)), key=lambda i: heads[i]["importance"])  # least first
        pruning, pruned = [{"pruned": 0, "score": base, "head": None}], set()
        for n, i in enumerate(order, 1):
            pruned.add(names[i])
            _apply_masks(net, pruned)
            h = heads[i]
            pruning.append(
                {"pruned": n, "score": score(), "head": f"{h['kind']}/layer{h['layer']}/head{h['head']}"}
            )
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
