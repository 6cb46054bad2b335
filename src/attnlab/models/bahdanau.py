"""GRU encoder–decoder with Bahdanau (additive) attention (D2L 11.4 (zh 10.4); Bahdanau et al. 2015).

The decoder is D2L's ``Seq2SeqAttentionDecoder``: at step t the query is the
top-layer hidden state s_{t-1}, the context c_t = Σ α(s_{t-1}, h_j) h_j comes
from :class:`attnlab.models.attention.AdditiveAttention` over the encoder states, and
[c_t; embed(y_{t-1})] is the GRU input. Training uses teacher forcing.
The key projection W_k h_j is computed once per sentence (it is part of the
decoding state), not once per step.

Two switches change the attention (both default to D2L's model, bitwise): ``scoring="dot"``
scores with :class:`attnlab.models.attention.DotProductAttention` (s_{t-1}ᵀ h_j / √h, D2L 11.3.3
(zh 10.3.3)), and ``attention="hard_reinforce"`` or ``"hard_gumbel"`` makes c_t one encoder
state h_s̃ at a sampled location, trained by REINFORCE or the straight-through Gumbel-softmax
(:mod:`attnlab.models.hard_attention`, Xu et al. 2015, sec. 4.1), the arg-max location at inference.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from attnlab.models.attention import AdditiveAttention, DotProductAttention, masked_hardmax
from attnlab.models.hard_attention import (
    LocationSample,
    MovingAverageBaseline,
    sample_location,
    score_function_loss,
    sentence_log_likelihood,
    straight_through_gumbel,
)

SCORINGS = ("additive", "dot")
ATTENTIONS = ("soft", "hard_reinforce", "hard_gumbel")


class Seq2SeqEncoder(nn.Module):
    """Embedding + multi-layer GRU (D2L 10.7.2 (zh 9.7.1)).

    src (B, S) int64, valid_lens (B,) int64 → outputs (B, S, h) (zero past each
    valid length), state (L, B, h) taken at each sentence's last valid token.
    Unlike D2L's encoder, which runs on through the padding, the GRU sees
    packed sequences, so a sentence encodes the same whatever it is batched with.
    """

    def __init__(self, vocab_size, embed_size, num_hiddens, num_layers, dropout, pad_id):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embed_size, padding_idx=pad_id)
        self.rnn = nn.GRU(embed_size, num_hiddens, num_layers, dropout=dropout, batch_first=True)

    def forward(self, src, valid_lens):
        packed = nn.utils.rnn.pack_padded_sequence(
            self.embedding(src), valid_lens.cpu().clamp_min(1), batch_first=True, enforce_sorted=False
        )
        outputs, state = self.rnn(packed)
        outputs, _ = nn.utils.rnn.pad_packed_sequence(outputs, batch_first=True, total_length=src.shape[1])
        return outputs, state


class Bahdanau(nn.Module):
    """Seq2seq with additive attention.

    Args:
        vocab_size: joint vocabulary size V (the target vocabulary when
            ``src_vocab_size`` is given).
        embed_size: token embedding size.
        num_hiddens: GRU hidden size h (also the attention MLP size, as in D2L).
        num_layers: GRU layers in encoder and decoder.
        dropout: dropout between GRU layers and on embeddings.
            The defaults of embed_size, num_hiddens, num_layers and dropout are
            conf/model/bahdanau.yaml's (``model.net``), the one place they are set;
            tests/test_config.py checks they agree.
        pad_id: padding token id.
        src_vocab_size: size of a separate source vocabulary (D2L's setting,
            ``data=fra_eng_d2l``); ``None`` means the joint vocabulary of size V.
        scoring: ``"additive"`` (D2L's :class:`~attnlab.models.attention.AdditiveAttention`)
            or ``"dot"`` (:class:`~attnlab.models.attention.DotProductAttention`, scaled by √h;
            no attention parameters: query s_{t-1} and keys h_j are both h wide).
        attention: ``"soft"`` (the weighted mean of the encoder states), ``"hard_reinforce"``
            (training: the state at a location sampled from the attention distribution, trained
            by REINFORCE with a moving-average baseline and an entropy bonus:
            :meth:`score_function_loss`) or ``"hard_gumbel"`` (training: straight-through
            Gumbel-softmax). Both hard kinds attend to the arg-max location in eval mode
            (:func:`~attnlab.models.attention.masked_hardmax`), so decoding is deterministic.
        reinforce_weight: λ_r of ``hard_reinforce`` (Xu et al. 2015, sec. 4.1), ≥ 0.
        entropy_weight: λ_e of ``hard_reinforce``, the entropy bonus, ≥ 0.
        gumbel_tau: τ > 0 of ``hard_gumbel``'s backward softmax.
            The last three are read only by the attention they name.
    Raises:
        ValueError: a ``scoring`` or ``attention`` not listed above, or a λ < 0 or τ ≤ 0.
    """

    kind = "bahdanau"

    def __init__(
        self,
        vocab_size: int,
        embed_size: int = 256,
        num_hiddens: int = 256,
        num_layers: int = 1,
        dropout: float = 0.0,
        pad_id: int = 0,
        src_vocab_size: int | None = None,
        *,
        scoring: str = "additive",
        attention: str = "soft",
        reinforce_weight: float = 1.0,
        entropy_weight: float = 0.01,
        gumbel_tau: float = 1.0,
    ):
        if scoring not in SCORINGS:
            raise ValueError(
                f"model.net.scoring={scoring!r} is not a scoring; choose one of {', '.join(SCORINGS)}"
            )
        if attention not in ATTENTIONS:
            raise ValueError(
                f"model.net.attention={attention!r} is not an attention; "
                f"choose one of {', '.join(ATTENTIONS)}"
            )
        for key, value in (("reinforce_weight", reinforce_weight), ("entropy_weight", entropy_weight)):
            if not value >= 0:
                raise ValueError(f"model.net.{key} must be ≥ 0, got {value}")
        if not gumbel_tau > 0:
            raise ValueError(f"model.net.gumbel_tau must be > 0, got {gumbel_tau}")
        super().__init__()
        self.encoder = Seq2SeqEncoder(
            src_vocab_size or vocab_size, embed_size, num_hiddens, num_layers, dropout, pad_id
        )
        self.attention: AdditiveAttention | DotProductAttention = (
            AdditiveAttention(num_hiddens, num_hiddens, num_hiddens, 0.0)
            if scoring == "additive"
            else DotProductAttention(0.0)
        )
        self.embedding = nn.Embedding(vocab_size, embed_size, padding_idx=pad_id)
        self.rnn = nn.GRU(
            embed_size + num_hiddens, num_hiddens, num_layers, dropout=dropout, batch_first=True
        )
        self.dropout = nn.Dropout(dropout)
        self.dense = nn.Linear(num_hiddens, vocab_size)
        self.scoring, self.attention_kind, self.pad_id = scoring, attention, pad_id
        self.reinforce_weight, self.entropy_weight, self.gumbel_tau = (
            reinforce_weight,
            entropy_weight,
            gumbel_tau,
        )
        if attention == "hard_reinforce":  # a buffer, no parameter: the init stays D2L's
            self.baseline = MovingAverageBaseline(0.9)
        # The last training pass's sampled locations and output-layer inputs, for
        # score_function_loss (hard_reinforce only; consumed by it).
        self.sampled_pass: tuple[torch.Tensor, LocationSample] | None = None

    def init_state(self, src, src_valid_lens):
        """State, batch-first: (encoder outputs (B, S, h), valid lens (B,),
        decoder hidden state (B, L, h), keys (B, S, h): W_k·h_j for additive scoring, the
        encoder outputs h_j themselves for dot scoring)."""
        enc_outputs, hidden = self.encoder(src, src_valid_lens)
        keys = (
            self.attention.project_keys(enc_outputs)
            if isinstance(self.attention, AdditiveAttention)
            else enc_outputs  # (B, S, h): dot scoring has no key projection
        )
        return (enc_outputs, src_valid_lens, hidden.transpose(0, 1), keys)

    def _scores(self, query, keys):
        """Attention scores (B, 1, S) of query (B, 1, h) over keys (B, S, h) (projected for
        additive scoring): the same operations as the attention modules' own."""
        if self.scoring == "dot":
            return torch.bmm(query, keys.transpose(1, 2)) / math.sqrt(query.shape[-1])
        a = self.attention
        assert isinstance(a, AdditiveAttention)
        return a.w_v(torch.tanh(a.W_q(query).unsqueeze(2) + keys.unsqueeze(1))).squeeze(-1)

    def _attend(self, query, enc_outputs, src_valid_lens, keys):
        """Context (B, 1, h) of query (B, 1, h), and the sampled locations (hard_reinforce in
        training) or None. Sets ``self.attention.attention_weights`` (B, 1, S)."""
        if self.attention_kind == "soft":
            if self.scoring == "additive":
                return self.attention(
                    query, enc_outputs, enc_outputs, src_valid_lens, projected_keys=keys
                ), None
            return self.attention(query, keys, enc_outputs, src_valid_lens), None
        scores = self._scores(query, keys)  # (B, 1, S)
        sample = None
        if not self.training:
            weights = masked_hardmax(scores, src_valid_lens)
        elif self.attention_kind == "hard_gumbel":
            weights = straight_through_gumbel(scores, src_valid_lens, self.gumbel_tau)
        else:
            sample = sample_location(scores, src_valid_lens)
            weights = sample.weights
        self.attention.attention_weights = weights
        return torch.bmm(weights, enc_outputs), sample  # (B, 1, h)

    def _decode(self, tgt_in, enc_outputs, src_valid_lens, hidden, keys, record=False):
        """Run the decoder over tgt_in (B, T); returns the output layer's inputs (B, T, h)
        (after dropout), hidden, weights (B, T, S) and the sampled locations (hard_reinforce in
        training, else None)."""
        X = self.dropout(self.embedding(tgt_in))  # (B, T, e)
        outputs: list[torch.Tensor] = []
        weights: list[torch.Tensor] = []
        samples: list[LocationSample] = []
        for t in range(X.shape[1]):
            query = hidden[-1].unsqueeze(1)  # (B, 1, h)
            context, sample = self._attend(query, enc_outputs, src_valid_lens, keys)  # (B, 1, h)
            x = torch.cat((context, X[:, t : t + 1]), dim=-1)  # (B, 1, h + e)
            out, hidden = self.rnn(x, hidden)  # out (B, 1, h)
            outputs.append(out)
            if sample is not None:
                samples.append(sample)
            if record:
                assert self.attention.attention_weights is not None  # (B, 1, S), set by the call above
                weights.append(self.attention.attention_weights)
        features = self.dropout(torch.cat(outputs, dim=1))  # (B, T, h)
        sampled = LocationSample.cat(samples) if samples else None
        return features, hidden, (torch.cat(weights, dim=1) if record else None), sampled

    def _start(self, src, src_valid_lens) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """init_state with the hidden state in the GRU's (L, B, h) layout."""
        enc_outputs, valid, hidden, keys = self.init_state(src, src_valid_lens)
        return enc_outputs, valid, hidden.transpose(0, 1).contiguous(), keys

    def features(self, src, src_valid_lens, tgt_in):
        """Teacher-forced inputs of the output layer (B, T, h): ``forward`` is
        ``self.output_layer(features(...))`` (see :func:`attnlab.loss.linear_cross_entropy`).
        With ``attention="hard_reinforce"`` in training, also keeps them and the sampled
        locations in ``self.sampled_pass`` for :meth:`score_function_loss`."""
        features, _, _, sampled = self._decode(tgt_in, *self._start(src, src_valid_lens))
        self.sampled_pass = None if sampled is None else (features, sampled)
        return features

    def score_function_loss(self, tgt_out) -> tuple[torch.Tensor, dict[str, torch.Tensor]] | None:
        """REINFORCE's surrogate for the last training :meth:`features` pass, or None.

        None unless ``attention="hard_reinforce"`` and a training pass sampled locations (the
        pass is consumed). Otherwise :func:`attnlab.models.hard_attention.score_function_loss`
        (surrogate, metrics) with r_n = log p(yⁿ | s̃ⁿ, a) of the pass's own output-layer inputs
        (:func:`~attnlab.models.hard_attention.sentence_log_likelihood`, no label smoothing),
        λ_r = ``reinforce_weight``, λ_e = ``entropy_weight`` and N_tok the non-padding tokens of
        ``tgt_out`` (B, T) int64; the baseline ``self.baseline`` is updated. Add the surrogate to
        the token-mean cross-entropy of the same pass.
        """
        if self.sampled_pass is None:
            return None
        (features, sample), self.sampled_pass = self.sampled_pass, None
        keep = tgt_out != self.pad_id  # (B, T)
        reward = sentence_log_likelihood(features, self.dense, tgt_out, keep)  # (B,)
        return score_function_loss(
            reward, sample, keep, self.baseline, self.reinforce_weight, self.entropy_weight, keep.sum()
        )

    @property
    def output_layer(self) -> nn.Linear:
        """The output projection h → V."""
        return self.dense

    def forward(self, src, src_valid_lens, tgt_in):
        """Teacher-forced logits (B, T, V) for source (B, S) and shifted target (B, T)."""
        return self.dense(self.features(src, src_valid_lens, tgt_in))

    def step(self, ys, enc_outputs, src_valid_lens, hidden, keys):
        """Logits (B, V) of the next token after prefix ``ys`` (B, T) and the new state.

        The GRU state is the cache: only ``ys[:, -1]`` is computed.
        """
        features, hidden, _, _ = self._decode(
            ys[:, -1:], enc_outputs, src_valid_lens, hidden.transpose(0, 1).contiguous(), keys
        )
        return (self.dense(features[:, -1]), enc_outputs, src_valid_lens, hidden.transpose(0, 1), keys)

    def attention_layers(self) -> dict:
        """None: the additive attention has one head, there is no multi-head attention to mask
        (the Transformer's :meth:`~attnlab.models.transformer.Transformer.attention_layers`)."""
        return {}

    def attention_maps(self, src, src_valid_lens, tgt_in):
        """Target-by-source alignment of a teacher-forced pass: {"alignment": [(B, 1, T, S)]}
        (one-hot rows for hard attention)."""
        _, _, weights, _ = self._decode(tgt_in, *self._start(src, src_valid_lens), record=True)
        return {"alignment": [weights.unsqueeze(1)]}
