"""Attention building blocks with D2L's names, semantics and shapes.

Source: Dive into Deep Learning (D2L), chapter 11 "Attention Mechanisms and
Transformers": 11.3 (masked softmax, additive and scaled dot-product scoring),
11.5 (multi-head attention); 11.6's positional encoding is in
:mod:`attnlab.models.positional_encoding`, 11.7's position-wise FFN and add & norm in
:mod:`attnlab.models.transformer`. Paper: Vaswani et al. 2017, "Attention Is All You Need",
eq. (1) and section 3.2-3.5; Bahdanau et al. 2015, eq. (6) (additive score);
Xu et al. 2015, "Show, Attend and Tell", section 4.1 (hard attention, see
:func:`masked_hardmax`).

Shape letters used throughout: B batch, Q queries, K key-value pairs, D/d
feature sizes, H heads.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

__all__ = [
    "masked_softmax",
    "masked_hardmax",
    "AdditiveAttention",
    "DotProductAttention",
    "MultiHeadAttention",
    "transpose_qkv",
    "transpose_output",
]


def _key_mask(valid_lens: torch.Tensor, num_queries: int, num_keys: int) -> torch.Tensor:
    """Boolean mask (B, Q, K): True where key k is valid for query q.

    ``valid_lens`` is (B,) (same length for every query of a sample) or
    (B, Q) (one length per query, e.g. a causal mask).
    """
    if valid_lens.dim() == 1:
        valid_lens = valid_lens[:, None].expand(-1, num_queries)
    elif valid_lens.dim() != 2:
        raise ValueError(f"valid_lens must have shape (B,) or (B, Q); got {tuple(valid_lens.shape)}")
    positions = torch.arange(num_keys, device=valid_lens.device)
    return positions[None, None, :] < valid_lens[:, :, None]


def masked_softmax(X: torch.Tensor, valid_lens: torch.Tensor | None) -> torch.Tensor:
    """Softmax over the last axis that ignores keys past each valid length (D2L 11.3.2.1 (zh 10.3.1)).

    Args:
        X: scores, float tensor of shape (B, Q, K).
        valid_lens: ``None`` (all keys valid), int tensor (B,) or (B, Q).
    Returns:
        Weights of X's shape and dtype. Masked keys get exactly 0. A query
        whose valid length is 0 gets all-zero weights (never NaN); D2L's own
        version returns uniform weights there, which would attend to padding.
    Raises:
        ValueError: if ``valid_lens`` is neither (B,) nor (B, Q).
    """
    if valid_lens is None:
        return F.softmax(X, dim=-1)
    mask = _key_mask(valid_lens, X.shape[-2], X.shape[-1])
    scores = X.masked_fill(~mask, float("-inf"))
    # A row with no valid key is all -inf; softmax would give NaN. Zero it.
    weights = F.softmax(scores, dim=-1)
    return torch.where(mask, weights, torch.zeros((), dtype=weights.dtype, device=weights.device))


def masked_hardmax(X: torch.Tensor, valid_lens: torch.Tensor | None) -> torch.Tensor:
    """Hard attention: one-hot weights on the best-scoring valid key (Xu et al. 2015, sec. 4.1).

    Same contract as :func:`masked_softmax`, but instead of a softmax each
    query puts weight exactly 1 on the arg-max of its valid scores and 0
    elsewhere. This is the deterministic ("arg-max") form of the hard
    attention of Xu et al. 2015, "Show, Attend and Tell", section 4.1 (which
    samples the location; D2L 11.1 (zh 10.1) contrasts such hard selection with soft,
    differentiable weighting).

    Args:
        X: scores, float tensor of shape (B, Q, K); must not contain NaN
            at valid keys (``argmax`` would pick the NaN).
        valid_lens: ``None`` (all keys valid), int tensor (B,) or (B, Q).
    Returns:
        Weights of X's shape and dtype, each value exactly 0 or 1. Ties go to
        the lowest key index; masked keys are never chosen; a query whose
        valid length is 0 gets all-zero weights, as in :func:`masked_softmax`.
    Gradient:
        None. The weights are built from an ``argmax`` outside the autograd
        graph, so they carry no ``grad_fn``: the scores (and any parameter
        that only feeds them) receive no gradient. In ``weights @ values`` the
        gradient reaches only the value vector of the chosen key.
    Raises:
        ValueError: if ``valid_lens`` is neither (B,) nor (B, Q).
    """
    scores = X.detach()
    mask = None
    if valid_lens is not None:
        mask = _key_mask(valid_lens, X.shape[-2], X.shape[-1])  # (B, Q, K)
        scores = scores.masked_fill(~mask, float("-inf"))
    # argmax returns the first maximal index, so ties go to the lowest key.
    # Keys are valid as a prefix, so key 0 is valid whenever any key is.
    best = scores.argmax(dim=-1, keepdim=True)  # (B, Q, 1)
    weights = torch.zeros_like(scores).scatter_(-1, best, 1.0)  # (B, Q, K)
    if mask is not None:  # a query with no valid key gets all-zero weights
        weights = weights.masked_fill(~mask.any(-1, keepdim=True), 0.0)
    return weights


class AdditiveAttention(nn.Module):
    """Additive (Bahdanau) attention: a(q, k) = w_vᵀ tanh(W_q q + W_k k) (D2L eq. 11.3.7).

    Args:
        key_size: d_k; query_size: d_q.
        num_hiddens: size h of the hidden layer of the scoring MLP.
        dropout: dropout probability on the attention weights.
        hard: if True, use :func:`masked_hardmax` (one-hot weights on the
            best-scoring valid key; no gradient to the scoring MLP) instead
            of :func:`masked_softmax`.
    Shapes:
        queries (B, Q, d_q), keys (B, K, d_k), values (B, K, d_v),
        valid_lens None, (B,) or (B, Q) → output (B, Q, d_v).
        ``self.attention_weights`` holds the last weights, (B, Q, K).
    """

    def __init__(
        self, key_size: int, query_size: int, num_hiddens: int, dropout: float = 0.0, hard: bool = False
    ):
        super().__init__()
        self.hard = hard
        self.W_k = nn.Linear(key_size, num_hiddens, bias=False)
        self.W_q = nn.Linear(query_size, num_hiddens, bias=False)
        self.w_v = nn.Linear(num_hiddens, 1, bias=False)
        self.dropout = nn.Dropout(dropout)
        self.attention_weights: torch.Tensor | None = None

    def project_keys(self, keys: torch.Tensor) -> torch.Tensor:
        """W_k k for every key, (B, K, h); lets a decoder compute it once per sequence."""
        return self.W_k(keys)

    def forward(self, queries, keys, values, valid_lens=None, projected_keys=None):
        keys_h = self.W_k(keys) if projected_keys is None else projected_keys  # (B, K, h)
        queries_h = self.W_q(queries)  # (B, Q, h)
        features = torch.tanh(queries_h.unsqueeze(2) + keys_h.unsqueeze(1))  # (B, Q, K, h)
        scores = self.w_v(features).squeeze(-1)  # (B, Q, K)
        normalize = masked_hardmax if self.hard else masked_softmax
        self.attention_weights = normalize(scores, valid_lens)
        return torch.bmm(self.dropout(self.attention_weights), values)  # (B, Q, d_v)


class DotProductAttention(nn.Module):
    """Scaled dot-product attention: softmax(Q Kᵀ / √d) V (D2L eq. 11.3.6; Vaswani et al. eq. 1).

    Args:
        dropout: dropout probability on the attention weights.
        hard: if True, use :func:`masked_hardmax` (one-hot weights on the
            best-scoring valid key; no gradient to queries or keys) instead
            of :func:`masked_softmax`.
        scaled: if False, the scores are the raw dot products Q Kᵀ (no 1/√d): the
            ablation ``model.net.scaled=false`` (why √d: the tutorial "Scoring functions").
    Shapes:
        queries (B, Q, d), keys (B, K, d), values (B, K, d_v),
        valid_lens None, (B,) or (B, Q) → output (B, Q, d_v), same dtype.
        ``self.attention_weights`` holds the last weights, (B, Q, K).
    """

    def __init__(self, dropout: float = 0.0, hard: bool = False, scaled: bool = True):
        super().__init__()
        self.hard = hard
        self.scaled = scaled
        self.dropout = nn.Dropout(dropout)
        self.attention_weights: torch.Tensor | None = None

    def forward(self, queries, keys, values, valid_lens=None):
        scores = torch.bmm(queries, keys.transpose(1, 2))  # (B, Q, K)
        if self.scaled:
            scores = scores / math.sqrt(queries.shape[-1])
        normalize = masked_hardmax if self.hard else masked_softmax
        self.attention_weights = normalize(scores, valid_lens)
        return torch.bmm(self.dropout(self.attention_weights), values)


def transpose_qkv(X: torch.Tensor, num_heads: int) -> torch.Tensor:
    """(B, T, H·d) → (B·H, T, d), heads folded into the batch (D2L 11.5.2 (zh 10.5.2))."""
    X = X.reshape(X.shape[0], X.shape[1], num_heads, -1)  # (B, T, H, d)
    X = X.permute(0, 2, 1, 3)  # (B, H, T, d)
    return X.reshape(-1, X.shape[2], X.shape[3])  # (B·H, T, d)


def transpose_output(X: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Inverse of :func:`transpose_qkv`: (B·H, T, d) → (B, T, H·d)."""
    X = X.reshape(-1, num_heads, X.shape[1], X.shape[2])  # (B, H, T, d)
    X = X.permute(0, 2, 1, 3)  # (B, T, H, d)
    return X.reshape(X.shape[0], X.shape[1], -1)


class MultiHeadAttention(nn.Module):
    """Multi-head attention with scaled dot-product heads (D2L 11.5 (zh 10.5); Vaswani et al. 3.2.2).

    Args:
        d_model: model width; must be divisible by ``num_heads``.
        num_heads: number of heads H.
        dropout: dropout probability on the attention weights.
        bias: whether the four projections have biases.
        hard: if True, every head uses hard (arg-max) attention, see
            :func:`masked_hardmax`; W_q and W_k then get no gradient.
        scaled: if False, every head scores with the raw dot product (no 1/√d, see
            :class:`DotProductAttention`).
    Shapes:
        queries (B, Q, d_model), keys and values (B, K, d_model),
        valid_lens None, (B,) or (B, Q) → output (B, Q, d_model).
        After a call with ``need_weights=True`` (the default, as in D2L),
        ``self.attention_weights`` is (B, H, Q, K); with ``need_weights=False``
        the fused ``scaled_dot_product_attention`` kernel is used and no
        weights are kept. With ``hard=True`` the explicit-weights path is
        always used (the fused kernel has no hard mode) and the weights are
        kept whatever ``need_weights`` says.
    Head mask (Michel et al. 2019, "Are Sixteen Heads Really Better than One?", eq. 2):
        ``self.head_mask``, ``None`` (the default: no mask) or a float (H,) tensor set with
        :meth:`set_head_mask`, multiplies each head's output before the output projection
        W_o in every call (training, teacher forcing and incremental decoding alike): 0 removes
        the head, 1 keeps it unchanged (an all-ones mask gives bitwise the unmasked outputs).
        A masked head's projections receive no gradient.
    Raises:
        ValueError: if ``d_model`` is not divisible by ``num_heads``.
    """

    attention: DotProductAttention

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        dropout: float = 0.0,
        bias: bool = False,
        hard: bool = False,
        scaled: bool = True,
    ):
        super().__init__()
        if d_model % num_heads:
            raise ValueError(
                f"d_model={d_model} is not divisible by num_heads={num_heads}; "
                "pick num_heads that divides d_model"
            )
        self.num_heads = num_heads
        self.dropout_p = dropout
        self.hard = hard
        self.scaled = scaled
        self.attention = DotProductAttention(dropout, hard=hard, scaled=scaled)
        self.W_q = nn.Linear(d_model, d_model, bias=bias)
        self.W_k = nn.Linear(d_model, d_model, bias=bias)
        self.W_v = nn.Linear(d_model, d_model, bias=bias)
        self.W_o = nn.Linear(d_model, d_model, bias=bias)
        self.attention_weights: torch.Tensor | None = None
        self.head_mask: torch.Tensor | None = None

    def set_head_mask(self, mask: torch.Tensor | None) -> None:
        """Mask heads from now on: ``mask`` (H,) (any real dtype, kept as float32 on the
        module's device; 0 removes a head, 1 keeps it), or ``None`` to remove the mask.

        Raises:
            ValueError: ``mask`` is not of shape (H,).
        """
        if mask is not None:
            mask = torch.as_tensor(mask, dtype=torch.float32, device=self.W_q.weight.device)
            if mask.shape != (self.num_heads,):
                raise ValueError(
                    f"head mask of shape {tuple(mask.shape)}; this attention has "
                    f"{self.num_heads} heads: give a ({self.num_heads},) mask"
                )
        self.head_mask = mask

    def _mask_heads(self, out: torch.Tensor) -> torch.Tensor:
        """Per-head outputs (B, H, Q, d) times the head mask (none: unchanged)."""
        return out if self.head_mask is None else out * self.head_mask.to(out.dtype)[:, None, None]

    def forward(
        self, queries, keys, values, valid_lens=None, need_weights: bool = True, is_causal: bool = False
    ):
        """Multi-head attention of ``queries`` over ``keys``/``values``.

        ``is_causal=True`` (self-attention only, with ``valid_lens=None``) lets
        query t see keys 0..t; it equals ``valid_lens = [1, 2, …, T]`` per sample
        and lets the fused kernel skip building a mask.
        """
        if is_causal:
            if valid_lens is not None:
                raise ValueError("give either is_causal=True or valid_lens, not both")
            if need_weights or self.hard:  # the explicit path takes the causal mask as lengths
                valid_lens = torch.arange(1, queries.shape[1] + 1, device=queries.device)
                valid_lens = valid_lens.expand(queries.shape[0], -1)
        B, Q, K = queries.shape[0], queries.shape[1], keys.shape[1]
        if need_weights or self.hard:
            q = transpose_qkv(self.W_q(queries), self.num_heads)  # (B·H, Q, d)
            k = transpose_qkv(self.W_k(keys), self.num_heads)  # (B·H, K, d)
            v = transpose_qkv(self.W_v(values), self.num_heads)  # (B·H, K, d)
            if valid_lens is not None:  # one copy per head, sample-major like q/k/v
                valid_lens = torch.repeat_interleave(valid_lens, self.num_heads, dim=0)
            out = self.attention(q, k, v, valid_lens)  # (B·H, Q, d)
            weights = self.attention.attention_weights  # (B·H, Q, K), set by the call above
            assert weights is not None
            self.attention_weights = weights.reshape(B, self.num_heads, Q, K)
            if self.head_mask is not None:
                out = self._mask_heads(out.reshape(B, self.num_heads, Q, -1)).reshape(
                    B * self.num_heads, Q, -1
                )
            return self.W_o(transpose_output(out, self.num_heads))  # (B, Q, d_model)
        self.attention_weights = None
        k, v = self.project_kv(keys, values)  # (B, H, K, d)
        return self.attend(queries, k, v, valid_lens, is_causal)

    def split_heads(self, X: torch.Tensor) -> torch.Tensor:
        """(B, T, H·d) → (B, H, T, d), the layout of the fused kernel and of a KV cache."""
        return X.reshape(X.shape[0], X.shape[1], self.num_heads, -1).transpose(1, 2)

    def project_kv(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """W_k keys and W_v values split into heads: two (B, H, K, d) tensors.

        What an incremental decoder caches: computed once per source sentence
        for encoder–decoder attention, once per new token for self-attention.
        """
        return self.split_heads(self.W_k(keys)), self.split_heads(self.W_v(values))

    def attend(
        self,
        queries: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        valid_lens: torch.Tensor | None = None,
        is_causal: bool = False,
    ) -> torch.Tensor:
        """Fused attention of ``queries`` (B, Q, d_model) over projected heads k, v (B, H, K, d).

        ``valid_lens`` None, (B,) or (B, Q) as in :meth:`forward`; returns
        (B, Q, d_model). Uses ``scaled_dot_product_attention``; keeps no weights.
        """
        q = self.split_heads(self.W_q(queries))  # (B, H, Q, d)
        B, Q, K = q.shape[0], q.shape[2], k.shape[2]
        mask = empty = None
        if valid_lens is not None:
            mask = _key_mask(valid_lens, Q, K)[:, None]  # (B, 1, Q, K), broadcast over heads
            empty = ~mask.any(-1, keepdim=True)  # (B, 1, Q, 1): queries with no valid key
            # torch < 2.5 returns NaN for a fully masked row (pytorch PR #133882) and its
            # backward then spreads NaN into q, k, v: let such rows see every key
            # (finite, any version), then zero their output below.
            mask = mask | empty
        p = self.dropout_p if self.training else 0.0
        out = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            dropout_p=p,
            is_causal=is_causal and mask is None,
            scale=None if self.scaled else 1.0,  # None: the kernel's own 1/√d
        )
        if empty is not None:  # rows with no valid key: zero, as masked_softmax does
            out = out.masked_fill(empty, 0.0)
        out = self._mask_heads(out).transpose(1, 2).reshape(B, Q, -1)  # (B, Q, H·d)
        return self.W_o(out)  # (B, Q, d_model)
