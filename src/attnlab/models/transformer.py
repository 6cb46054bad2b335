"""Transformer encoder–decoder (D2L 11.7 (zh 10.7); Vaswani et al. 2017, section 3).

Post-norm blocks (or pre-norm, ``norm_first=True``) built from
:mod:`attnlab.models.attention` (multi-head attention), :mod:`attnlab.models.positional_encoding`
and, as in D2L 11.7.2 (zh 10.7.2) and 11.7.3 (zh 10.7.3), the position-wise FFN and add & norm
defined here. Token ids are int64,
``valid_lens`` int64 (B,). A joint source/target vocabulary lets the source
embedding, target embedding and output projection share one matrix
(Press & Wolf 2017; Vaswani et al. 3.4).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import cast

import torch
from torch import nn

from attnlab.models.attention import MultiHeadAttention
from attnlab.models.positional_encoding import build_positional_encoding


class PositionWiseFFN(nn.Module):
    """Position-wise feed-forward network: W₂ ReLU(W₁ x + b₁) + b₂ (D2L 11.7.2 (zh 10.7.2);
    Vaswani et al. eq. 2).

    Shapes: X (B, T, d_model) → (B, T, d_model); the hidden layer has ``ffn_hidden`` units.
    """

    def __init__(self, d_model: int, ffn_hidden: int):
        super().__init__()
        self.dense1 = nn.Linear(d_model, ffn_hidden)
        self.relu = nn.ReLU()
        self.dense2 = nn.Linear(ffn_hidden, d_model)

    def forward(self, X):
        return self.dense2(self.relu(self.dense1(X)))


class AddNorm(nn.Module):
    """Residual connection and layer norm around a sublayer (D2L 11.7.3 (zh 10.7.3)).

    Post-norm (``norm_first=False``, D2L's and Vaswani et al.'s): ``forward(X, Y)`` is
    LayerNorm(X + Dropout(Y)), with Y = sublayer(X). Pre-norm (``norm_first=True``; Xiong et al.
    2020, "On Layer Normalization in the Transformer Architecture"): the sublayer reads
    ``norm_input(X)`` = LayerNorm(X) and ``forward(X, Y)`` is X + Dropout(Y).

    Shapes: X, Y (B, T, d_model) → (B, T, d_model).
    """

    def __init__(self, d_model: int, dropout: float = 0.0, norm_first: bool = False):
        super().__init__()
        self.norm_first = norm_first
        self.dropout = nn.Dropout(dropout)
        self.ln = nn.LayerNorm(d_model)

    def norm_input(self, X):
        """What the sublayer reads: LayerNorm(X) in pre-norm, X itself in post-norm."""
        return self.ln(X) if self.norm_first else X

    def forward(self, X, Y):
        if self.norm_first:
            return X + self.dropout(Y)
        return self.ln(self.dropout(Y) + X)


class TransformerEncoderBlock(nn.Module):
    """Self-attention → add & norm → FFN → add & norm (D2L 11.7.4 (zh 10.7.4)); pre-norm with
    ``norm_first``, unscaled dot products with ``scaled=False`` (:class:`Transformer`)."""

    attention: MultiHeadAttention

    def __init__(self, d_model, num_heads, ffn_hidden, dropout, norm_first=False, scaled=True):
        super().__init__()
        self.attention = MultiHeadAttention(d_model, num_heads, dropout, scaled=scaled)
        self.addnorm1 = AddNorm(d_model, dropout, norm_first)
        self.ffn = PositionWiseFFN(d_model, ffn_hidden)
        self.addnorm2 = AddNorm(d_model, dropout, norm_first)

    def forward(self, X, valid_lens, need_weights=False):  # X: (B, S, d_model)
        Xn = self.addnorm1.norm_input(X)
        Y = self.addnorm1(X, self.attention(Xn, Xn, Xn, valid_lens, need_weights=need_weights))
        return self.addnorm2(Y, self.ffn(self.addnorm2.norm_input(Y)))


class TransformerDecoderBlock(nn.Module):
    """Causal self-attention, encoder–decoder attention, FFN, each with add & norm
    (D2L 11.7.5 (zh 10.7.5))."""

    attention1: MultiHeadAttention
    attention2: MultiHeadAttention

    def __init__(self, d_model, num_heads, ffn_hidden, dropout, norm_first=False, scaled=True):
        super().__init__()
        self.attention1 = MultiHeadAttention(d_model, num_heads, dropout, scaled=scaled)
        self.addnorm1 = AddNorm(d_model, dropout, norm_first)
        self.attention2 = MultiHeadAttention(d_model, num_heads, dropout, scaled=scaled)
        self.addnorm2 = AddNorm(d_model, dropout, norm_first)
        self.ffn = PositionWiseFFN(d_model, ffn_hidden)
        self.addnorm3 = AddNorm(d_model, dropout, norm_first)

    def forward(self, X, enc_outputs, enc_valid_lens, need_weights=False):
        # Causal self-attention: query t sees keys 0..t (D2L passes valid lengths 1..T).
        Xn = self.addnorm1.norm_input(X)
        Y = self.addnorm1(X, self.attention1(Xn, Xn, Xn, need_weights=need_weights, is_causal=True))
        Yn = self.addnorm2.norm_input(Y)
        Y2 = self.attention2(Yn, enc_outputs, enc_outputs, enc_valid_lens, need_weights=need_weights)
        Z = self.addnorm2(Y, Y2)
        return self.addnorm3(Z, self.ffn(self.addnorm3.norm_input(Z)))

    def step(self, X, enc_k, enc_v, enc_valid_lens, self_k, self_v):
        """One incremental decoding step (Vaswani et al. 3.2.3, cached keys and values).

        X (B, 1, d_model) is the newest position; enc_k/enc_v (B, H, S, d) the
        projected encoder outputs; self_k/self_v (B, H, t, d) the projected
        earlier positions. Returns (output (B, 1, d_model), self_k, self_v with
        t + 1 positions). Equals :meth:`forward` at the last position.
        """
        Xn = self.addnorm1.norm_input(X)
        k, v = self.attention1.project_kv(Xn, Xn)
        self_k, self_v = torch.cat([self_k, k], dim=2), torch.cat([self_v, v], dim=2)
        Y = self.addnorm1(X, self.attention1.attend(Xn, self_k, self_v))  # sees all earlier positions
        Z = self.addnorm2(
            Y, self.attention2.attend(self.addnorm2.norm_input(Y), enc_k, enc_v, enc_valid_lens)
        )
        return self.addnorm3(Z, self.ffn(self.addnorm3.norm_input(Z))), self_k, self_v


class Transformer(nn.Module):
    """Encoder–decoder Transformer for translation.

    Args:
        vocab_size: joint vocabulary size V (the target vocabulary when
            ``src_vocab_size`` is given).
        d_model, num_heads, num_layers, ffn_hidden, dropout: as in Vaswani et al.
            (D2L: num_hiddens, num_heads, num_blks, ffn_num_hiddens, dropout).
            The defaults of these and ``tie_embeddings`` are conf/model/transformer.yaml's
            (``model.net``), the one place they are set; tests/test_config.py checks they agree.
        pad_id: id of the padding token (its embedding row stays zero).
        tie_embeddings: share source/target embeddings and the output projection.
        max_len: longest sequence the positional encoding supports.
        src_vocab_size: size of a separate source vocabulary (D2L's setting,
            ``data=fra_eng_d2l``); ``None`` means the joint vocabulary of size V.
        scaled: divide the dot products by √d (per head); ``False`` is the ablation of
            the scaling of D2L 11.3.3 (zh 10.3.3) (``model.net.scaled``).
        positional_encoding: ``sinusoidal`` (D2L 11.6.3 (zh 10.6.3)), ``learned`` or ``none``
            (:func:`attnlab.models.positional_encoding.build_positional_encoding`).
        norm_first: pre-norm blocks, with a final layer norm after each stack (Xiong et al.
            2020), instead of D2L's post-norm (``False``).
            The three switches' defaults build today's model bitwise (tests/test_switches.py).
    Raises:
        ValueError: ``tie_embeddings`` with a separate source vocabulary, or an unknown
            ``positional_encoding``.
    """

    kind = "transformer"

    def __init__(
        self,
        vocab_size: int,
        d_model: int = 256,
        num_heads: int = 4,
        num_layers: int = 2,
        ffn_hidden: int = 512,
        dropout: float = 0.1,
        pad_id: int = 0,
        tie_embeddings: bool = True,
        max_len: int = 512,
        src_vocab_size: int | None = None,
        scaled: bool = True,
        positional_encoding: str = "sinusoidal",
        norm_first: bool = False,
    ):
        super().__init__()
        if tie_embeddings and src_vocab_size is not None:
            raise ValueError(
                "tie_embeddings needs one joint vocabulary, but this corpus has a "
                "separate source vocabulary; set model.net.tie_embeddings=false"
            )
        self.d_model = d_model
        self.src_embedding = nn.Embedding(src_vocab_size or vocab_size, d_model, padding_idx=pad_id)
        self.tgt_embedding = (
            self.src_embedding if tie_embeddings else nn.Embedding(vocab_size, d_model, padding_idx=pad_id)
        )
        self.pos_encoding = build_positional_encoding(positional_encoding, d_model, dropout, max_len)
        block = dict(d_model=d_model, num_heads=num_heads, ffn_hidden=ffn_hidden, dropout=dropout)
        block.update(norm_first=norm_first, scaled=scaled)
        self.encoder_blocks = nn.ModuleList(TransformerEncoderBlock(**block) for _ in range(num_layers))
        self.decoder_blocks = nn.ModuleList(TransformerDecoderBlock(**block) for _ in range(num_layers))
        # pre-norm leaves each stack's output unnormalized: one last layer norm per stack
        self.norm_first = norm_first
        self.encoder_norm = nn.LayerNorm(d_model) if norm_first else nn.Identity()
        self.decoder_norm = nn.LayerNorm(d_model) if norm_first else nn.Identity()
        self.output = nn.Linear(d_model, vocab_size, bias=False)
        for emb in [self.src_embedding] + ([] if tie_embeddings else [self.tgt_embedding]):
            nn.init.normal_(emb.weight, std=d_model**-0.5)
            with torch.no_grad():
                emb.weight[pad_id].zero_()
        if tie_embeddings:
            self.output.weight = self.tgt_embedding.weight

    def _embed(self, embedding, tokens):
        return self.pos_encoding(embedding(tokens) * math.sqrt(self.d_model))

    def encode(self, src, src_valid_lens, need_weights=False):
        """src (B, S) int64, src_valid_lens (B,) → encoder outputs (B, S, d_model)."""
        X = self._embed(self.src_embedding, src)
        for blk in self._encoders():
            X = blk(X, src_valid_lens, need_weights)
        return self.encoder_norm(X)

    def decoder_states(self, tgt_in, enc_outputs, src_valid_lens, need_weights=False):
        """tgt_in (B, T) int64 (starts with <bos>) → top decoder states (B, T, d_model)."""
        X = self._embed(self.tgt_embedding, tgt_in)
        for blk in self._decoders():
            X = blk(X, enc_outputs, src_valid_lens, need_weights)
        return self.decoder_norm(X)

    def decode(self, tgt_in, enc_outputs, src_valid_lens, need_weights=False):
        """tgt_in (B, T) int64 (starts with <bos>) → logits (B, T, V), teacher forcing."""
        return self.output(self.decoder_states(tgt_in, enc_outputs, src_valid_lens, need_weights))

    def features(self, src, src_valid_lens, tgt_in):
        """Teacher-forced inputs of the output layer (B, T, d_model): ``forward`` is
        ``self.output_layer(features(...))``; training scores them with
        :func:`attnlab.loss.linear_cross_entropy` without materializing all logits."""
        return self.decoder_states(tgt_in, self.encode(src, src_valid_lens), src_valid_lens)

    @property
    def output_layer(self) -> nn.Linear:
        """The output projection d_model → V (its weight is the tied embedding)."""
        return self.output

    def forward(self, src, src_valid_lens, tgt_in):
        """Teacher-forced logits (B, T, V) for source (B, S) and shifted target (B, T)."""
        return self.output(self.features(src, src_valid_lens, tgt_in))

    # --- decoding interface shared with Bahdanau (see attnlab.inference.decoding) ---
    def _encoders(self) -> Iterator[TransformerEncoderBlock]:
        """The encoder blocks, bottom first (typed: an ``nn.ModuleList`` yields ``nn.Module``)."""
        return cast("Iterator[TransformerEncoderBlock]", iter(self.encoder_blocks))

    def _decoders(self) -> Iterator[TransformerDecoderBlock]:
        """The decoder blocks, bottom first (typed: an ``nn.ModuleList`` yields ``nn.Module``)."""
        return cast("Iterator[TransformerDecoderBlock]", iter(self.decoder_blocks))

    def init_state(self, src, src_valid_lens):
        """Incremental decoding state, every tensor batch-first:
        (src_valid_lens (B,), next position (B,), then per decoder layer the
        encoder keys and values (B, H, S, d), then per layer the (empty) cache
        of earlier target positions' keys and values (B, H, 0, d))."""
        enc = self.encode(src, src_valid_lens)
        B = src.shape[0]
        state = [src_valid_lens, torch.zeros(B, dtype=torch.long, device=src.device)]
        for blk in self._decoders():
            state += blk.attention2.project_kv(enc, enc)
        for blk in self._decoders():
            heads = blk.attention1.num_heads
            empty = enc.new_zeros(B, heads, 0, self.d_model // heads)
            state += [empty, empty]
        return tuple(state)

    def step(self, ys, src_valid_lens, pos, *kv):
        """Logits (B, V) of the next token after prefix ``ys`` (B, T), and the new state.

        Only ``ys[:, -1]`` is computed: earlier positions come from the cache, so a
        step costs one position, not the whole prefix (:meth:`step_uncached`).
        """
        L = len(self.decoder_blocks)
        enc_kv, self_kv = kv[: 2 * L], kv[2 * L :]
        X = self.pos_encoding.at(self.tgt_embedding(ys[:, -1:]) * math.sqrt(self.d_model), pos)
        new_self = []
        for i, blk in enumerate(self._decoders()):
            X, k, v = blk.step(
                X, enc_kv[2 * i], enc_kv[2 * i + 1], src_valid_lens, self_kv[2 * i], self_kv[2 * i + 1]
            )
            new_self += [k, v]
        return (self.output(self.decoder_norm(X[:, -1])), src_valid_lens, pos + 1, *enc_kv, *new_self)

    def init_state_uncached(self, src, src_valid_lens):
        """State of the reference decoder without a cache: (encoder outputs, source valid lengths)."""
        return (self.encode(src, src_valid_lens), src_valid_lens)

    def step_uncached(self, ys, enc_outputs, src_valid_lens):
        """Logits (B, V) after prefix ``ys`` (B, T), recomputing the whole prefix; state unchanged."""
        last = self.decoder_states(ys, enc_outputs, src_valid_lens)[:, -1]  # (B, d_model)
        return (self.output(last), enc_outputs, src_valid_lens)

    def attention_layers(self) -> dict[str, list[MultiHeadAttention]]:
        """The multi-head attentions by kind, each a list over layers (bottom first):
        ``encoder_self``, ``decoder_self``, ``encoder_decoder`` (the kinds of :meth:`attention_maps`)."""
        return {
            "encoder_self": [b.attention for b in self._encoders()],
            "decoder_self": [b.attention1 for b in self._decoders()],
            "encoder_decoder": [b.attention2 for b in self._decoders()],
        }

    def set_head_mask(self, masks: dict[str, torch.Tensor] | None) -> None:
        """Mask heads of every layer (Michel et al. 2019): ``masks`` maps a kind of
        :meth:`attention_layers` to an (L, H) tensor (0 removes a head, 1 keeps it); kinds
        left out are unmasked. ``None`` removes every mask.

        Raises:
            ValueError: an unknown kind, or a mask that is not (L, H).
        """
        layers = self.attention_layers()
        unknown = set(masks or {}) - set(layers)
        if unknown:
            raise ValueError(f"no attention kind {sorted(unknown)}; the kinds are {', '.join(layers)}")
        for kind, attentions in layers.items():
            mask = None if masks is None else masks.get(kind)
            if mask is not None and tuple(mask.shape) != (len(attentions), attentions[0].num_heads):
                raise ValueError(
                    f"{kind} head mask of shape {tuple(mask.shape)}; give (layers, heads) = "
                    f"({len(attentions)}, {attentions[0].num_heads})"
                )
            for i, attention in enumerate(attentions):
                attention.set_head_mask(None if mask is None else mask[i])

    def attention_maps(self, src, src_valid_lens, tgt_in):
        """Per-layer, per-head weights of one teacher-forced pass (for heatmaps).

        Returns a dict ``{"encoder_self": [...], "decoder_self": [...],
        "encoder_decoder": [...]}``, each a list over layers of (B, H, Q, K) tensors.
        """
        enc = self.encode(src, src_valid_lens, need_weights=True)
        self.decoder_states(tgt_in, enc, src_valid_lens, need_weights=True)
        return {
            "encoder_self": [b.attention.attention_weights for b in self._encoders()],
            "decoder_self": [b.attention1.attention_weights for b in self._decoders()],
            "encoder_decoder": [b.attention2.attention_weights for b in self._decoders()],
        }
