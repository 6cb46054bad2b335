"""GRU encoder–decoder without attention (D2L 10.7 (zh 9.7); Sutskever et al. 2014, Cho et al. 2014).

The baseline of D2L 11.4 (zh 10.4): the decoder is D2L's ``Seq2SeqDecoder``. The whole source
reaches it through one fixed context vector c, the encoder's final top-layer hidden state (at
each sentence's last valid token: :class:`attnlab.models.bahdanau.Seq2SeqEncoder` packs the
padding away). At every step the GRU input is [embed(y_{t-1}); c], and the decoder's initial
hidden state is the encoder's final state, every layer. Training uses teacher forcing.
"""

from __future__ import annotations

import torch
from torch import nn

from attnlab.models.bahdanau import Seq2SeqEncoder


class Seq2Seq(nn.Module):
    """Seq2seq with a fixed context vector, no attention (D2L 10.7 (zh 9.7)).

    Shapes: src (B, S) int64, src_valid_lens (B,) int64, tgt_in (B, T) int64 → logits
    (B, T, V) float32. The decoding state (:mod:`attnlab.inference.decoding`), batch-first, is
    (context (B, h), decoder hidden state (B, L, h)); ``step`` hands the context back untouched.

    Args:
        vocab_size: joint vocabulary size V (the target vocabulary when
            ``src_vocab_size`` is given).
        embed_size: token embedding size e.
        num_hiddens: GRU hidden size h (encoder and decoder; the context has size h).
        num_layers: GRU layers L in encoder and decoder.
        dropout: dropout between GRU layers, on the decoder's embeddings and on its outputs.
            The defaults of embed_size, num_hiddens, num_layers and dropout are
            conf/model/seq2seq.yaml's (``model.net``), Bahdanau's sizes, so the two compare
            with and without attention.
        pad_id: padding token id.
        src_vocab_size: size of a separate source vocabulary (``data=fra_eng_d2l``); ``None``
            means the joint vocabulary of size V.

    Unlike D2L, whose encoder runs on through the padding and whose context is the top layer's
    output at the last (possibly padded) position, a sentence encodes the same alone or in a
    padded batch. Weights keep torch's default initialization (as :class:`Bahdanau`), not
    D2L's Xavier ``init_seq2seq``.
    """

    kind = "seq2seq"

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
        self.embedding = nn.Embedding(vocab_size, embed_size, padding_idx=pad_id)
        self.rnn = nn.GRU(
            embed_size + num_hiddens, num_hiddens, num_layers, dropout=dropout, batch_first=True
        )
        self.dropout = nn.Dropout(dropout)
        self.dense = nn.Linear(num_hiddens, vocab_size)

    def init_state(self, src, src_valid_lens):
        """State, batch-first: (context (B, h): the encoder's top-layer final state,
        decoder hidden state (B, L, h): the encoder's final state)."""
        _, hidden = self.encoder(src, src_valid_lens)  # (L, B, h)
        return hidden[-1], hidden.transpose(0, 1)

    def _decode(self, tgt_in, context, hidden):
        """Run the decoder over tgt_in (B, T) from hidden (L, B, h); returns the output layer's
        inputs (B, T, h) (after dropout) and the new hidden (L, B, h)."""
        X = self.dropout(self.embedding(tgt_in))  # (B, T, e)
        c = context.unsqueeze(1).expand(-1, X.shape[1], -1)  # (B, T, h): the same c every step
        out, hidden = self.rnn(torch.cat((X, c), dim=-1), hidden)  # out (B, T, h)
        return self.dropout(out), hidden

    def features(self, src, src_valid_lens, tgt_in):
        """Teacher-forced inputs of the output layer (B, T, h): ``forward`` is
        ``self.output_layer(features(...))`` (see :func:`attnlab.loss.linear_cross_entropy`)."""
        context, hidden = self.init_state(src, src_valid_lens)
        return self._decode(tgt_in, context, hidden.transpose(0, 1).contiguous())[0]

    @property
    def output_layer(self) -> nn.Linear:
        """The output projection h → V."""
        return self.dense

    def forward(self, src, src_valid_lens, tgt_in):
        """Teacher-forced logits (B, T, V) for source (B, S) and shifted target (B, T)."""
        return self.dense(self.features(src, src_valid_lens, tgt_in))

    def step(self, ys, context, hidden):
        """Logits (B, V) of the next token after prefix ``ys`` (B, T) and the new state
        (context, the same object; hidden (B, L, h)). The GRU state is the cache: only
        ``ys[:, -1]`` is computed."""
        features, hidden = self._decode(ys[:, -1:], context, hidden.transpose(0, 1).contiguous())
        return self.dense(features[:, -1]), context, hidden.transpose(0, 1)

    def attention_layers(self) -> dict:
        """None: the model has no attention."""
        return {}

    def attention_maps(self, src, src_valid_lens, tgt_in) -> dict:
        """None: the model has no attention (``{}``), so no heatmap, head statistic or alignment."""
        return {}
