"""GRU encoder–decoder with Bahdanau (additive) attention (D2L 11.4; Bahdanau et al. 2015).

The decoder is D2L's ``Seq2SeqAttentionDecoder``: at step t the query is the
top-layer hidden state s_{t-1}, the context c_t = Σ α(s_{t-1}, h_j) h_j comes
from :class:`attnlab.models.attention.AdditiveAttention` over the encoder states, and
[c_t; embed(y_{t-1})] is the GRU input. Training uses teacher forcing.
The key projection W_k h_j is computed once per sentence (it is part of the
decoding state), not once per step.
"""

from __future__ import annotations

import torch
from torch import nn

from attnlab.models.attention import AdditiveAttention


class Seq2SeqEncoder(nn.Module):
    """Embedding + multi-layer GRU (D2L 10.7.2).

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
    ):
        super().__init__()
        self.encoder = Seq2SeqEncoder(
            src_vocab_size or vocab_size, embed_size, num_hiddens, num_layers, dropout, pad_id
        )
        self.attention = AdditiveAttention(num_hiddens, num_hiddens, num_hiddens, 0.0)
        self.embedding = nn.Embedding(vocab_size, embed_size, padding_idx=pad_id)
        self.rnn = nn.GRU(
            embed_size + num_hiddens, num_hiddens, num_layers, dropout=dropout, batch_first=True
        )
        self.dropout = nn.Dropout(dropout)
        self.dense = nn.Linear(num_hiddens, vocab_size)

    def init_state(self, src, src_valid_lens):
        """State, batch-first: (encoder outputs (B, S, h), valid lens (B,),
        decoder hidden state (B, L, h), W_k·keys (B, S, h))."""
        enc_outputs, hidden = self.encoder(src, src_valid_lens)
        return (enc_outputs, src_valid_lens, hidden.transpose(0, 1), self.attention.project_keys(enc_outputs))

    def _decode(self, tgt_in, enc_outputs, src_valid_lens, hidden, proj_keys, record=False):
        """Run the decoder over tgt_in (B, T); returns the output layer's inputs (B, T, h)
        (after dropout), hidden, weights (B, T, S)."""
        X = self.dropout(self.embedding(tgt_in))  # (B, T, e)
        outputs: list[torch.Tensor] = []
        weights: list[torch.Tensor] = []
        for t in range(X.shape[1]):
            query = hidden[-1].unsqueeze(1)  # (B, 1, h)
            context = self.attention(
                query, enc_outputs, enc_outputs, src_valid_lens, projected_keys=proj_keys
            )  # (B, 1, h)
            x = torch.cat((context, X[:, t : t + 1]), dim=-1)  # (B, 1, h + e)
            out, hidden = self.rnn(x, hidden)  # out (B, 1, h)
            outputs.append(out)
            if record:
                assert self.attention.attention_weights is not None  # (B, 1, S), set by the call above
                weights.append(self.attention.attention_weights)
        features = self.dropout(torch.cat(outputs, dim=1))  # (B, T, h)
        return features, hidden, (torch.cat(weights, dim=1) if record else None)

    def _start(self, src, src_valid_lens) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """init_state with the hidden state in the GRU's (L, B, h) layout."""
        enc_outputs, valid, hidden, proj_keys = self.init_state(src, src_valid_lens)
        return enc_outputs, valid, hidden.transpose(0, 1).contiguous(), proj_keys

    def features(self, src, src_valid_lens, tgt_in):
        """Teacher-forced inputs of the output layer (B, T, h): ``forward`` is
        ``self.output_layer(features(...))`` (see :func:`attnlab.loss.linear_cross_entropy`)."""
        return self._decode(tgt_in, *self._start(src, src_valid_lens))[0]

    @property
    def output_layer(self) -> nn.Linear:
        """The output projection h → V."""
        return self.dense

    def forward(self, src, src_valid_lens, tgt_in):
        """Teacher-forced logits (B, T, V) for source (B, S) and shifted target (B, T)."""
        return self.dense(self.features(src, src_valid_lens, tgt_in))

    def step(self, ys, enc_outputs, src_valid_lens, hidden, proj_keys):
        """Logits (B, V) of the next token after prefix ``ys`` (B, T) and the new state.

        The GRU state is the cache: only ``ys[:, -1]`` is computed.
        """
        features, hidden, _ = self._decode(
            ys[:, -1:], enc_outputs, src_valid_lens, hidden.transpose(0, 1).contiguous(), proj_keys
        )
        return (self.dense(features[:, -1]), enc_outputs, src_valid_lens, hidden.transpose(0, 1), proj_keys)

    def attention_layers(self) -> dict:
        """None: the additive attention has one head, there is no multi-head attention to mask
        (the Transformer's :meth:`~attnlab.models.transformer.Transformer.attention_layers`)."""
        return {}

    def attention_maps(self, src, src_valid_lens, tgt_in):
        """Target-by-source alignment of a teacher-forced pass: {"alignment": [(B, 1, T, S)]}."""
        _, _, weights = self._decode(tgt_in, *self._start(src, src_valid_lens), record=True)
        return {"alignment": [weights.unsqueeze(1)]}
