"""Positional encodings (D2L 11.6.3 (zh 10.6.3) "Positional Encoding"; Vaswani et al. 2017, 3.5).

:class:`PositionalEncoding` is the book's sinusoidal table; :class:`LearnedPositionalEncoding`
and :class:`NoPositionalEncoding` are the alternatives of ``model.net.positional_encoding``
(:func:`build_positional_encoding` builds one by name). All three add a table ``P`` (1, max_len,
d_model) to their input, so the decoders, exports and checks that read ``P`` treat them alike.
"""

from __future__ import annotations

import torch
from torch import nn

KINDS = ("sinusoidal", "learned", "none")


class _TableEncoding(nn.Module):
    """X + P[:, :T] then dropout; subclasses set ``P`` (1, max_len, d_model)."""

    P: torch.Tensor

    def __init__(self, d_model: int, dropout: float, max_len: int):
        super().__init__()
        if d_model < 1:
            raise ValueError(f"d_model must be ≥ 1, got {d_model}")
        if max_len < 1:
            raise ValueError(f"max_len must be ≥ 1, got {max_len}")
        self.dropout = nn.Dropout(dropout)

    def at(self, X: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """One step of an incremental decoder: X (B, 1, d_model) + P[positions], positions (B,) int64."""
        return self.dropout(X + self.P[0, positions].unsqueeze(1).to(X.dtype))

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        if X.shape[1] > self.P.shape[1]:
            raise ValueError(
                f"sequence length {X.shape[1]} exceeds {type(self).__name__} max_len "
                f"{self.P.shape[1]}; raise max_len"
            )
        return self.dropout(X + self.P[:, : X.shape[1], :].to(X.dtype))


class PositionalEncoding(_TableEncoding):
    """Sinusoidal positional encoding (D2L 11.6.3 (zh 10.6.3); Vaswani et al. 3.5).

    P[i, 2j] = sin(i / 10000^(2j/d)), P[i, 2j+1] = cos(i / 10000^(2j/d)).
    An odd ``d_model`` works: sin fills the even columns, cos the odd ones.

    Args:
        d_model: feature size d.
        dropout: dropout probability applied after adding P.
        max_len: longest sequence supported.
    Shapes: X (B, T, d_model) float → X + P[:T], same shape and dtype.
    Raises:
        ValueError: if T > max_len, d_model < 1 or max_len < 1.
    """

    def __init__(self, d_model: int, dropout: float = 0.0, max_len: int = 1000):
        super().__init__(d_model, dropout, max_len)
        position = torch.arange(max_len, dtype=torch.float32)[:, None]
        div = torch.pow(10000.0, torch.arange(0, d_model, 2, dtype=torch.float32) / d_model)
        angles = position / div  # (max_len, ceil(d/2))
        P = torch.zeros(1, max_len, d_model)
        P[0, :, 0::2] = torch.sin(angles)
        P[0, :, 1::2] = torch.cos(angles[:, : d_model // 2])
        self.register_buffer("P", P, persistent=False)


class LearnedPositionalEncoding(_TableEncoding):
    """Learned absolute positions: P is a parameter (1, max_len, d_model), initialized
    N(0, d_model^-1/2) as fairseq's ``LearnedPositionalEmbedding`` (Gehring et al. 2017;
    Vaswani et al. 3.5 report it on par with the sinusoid). Same contract as
    :class:`PositionalEncoding`; a model with it cannot read past ``max_len``.
    """

    def __init__(self, d_model: int, dropout: float = 0.0, max_len: int = 1000):
        super().__init__(d_model, dropout, max_len)
        self.P = nn.Parameter(torch.empty(1, max_len, d_model))
        nn.init.normal_(self.P, std=d_model**-0.5)


class NoPositionalEncoding(_TableEncoding):
    """No position information: P is all zeros, so the output is dropout(X) and self-attention
    over it is permutation-equivariant (the reason for positions in D2L 11.6.3 (zh 10.6.3)). Keeps ``max_len``
    (and the contract of :class:`PositionalEncoding`) so that every model has one input limit.
    """

    def __init__(self, d_model: int, dropout: float = 0.0, max_len: int = 1000):
        super().__init__(d_model, dropout, max_len)
        self.register_buffer("P", torch.zeros(1, max_len, d_model), persistent=False)


def max_positions(net: nn.Module) -> int | None:
    """How many positions ``net`` has for one sequence: the length of its positional table
    ``net.pos_encoding.P`` (the Transformer's ``max_len``), or ``None`` for a net without one
    (the GRU models, which read any length).

    A source of n tokens takes n + 1 positions (its <eos>), a teacher-forced target n + 1
    (its <bos>), and decoding one position per token fed back.
    """
    table = getattr(getattr(net, "pos_encoding", None), "P", None)
    return None if table is None else int(table.shape[1])


def build_positional_encoding(
    kind: str, d_model: int, dropout: float = 0.0, max_len: int = 1000
) -> _TableEncoding:
    """The positional encoding named ``kind``: ``sinusoidal`` (:class:`PositionalEncoding`),
    ``learned`` (:class:`LearnedPositionalEncoding`) or ``none`` (:class:`NoPositionalEncoding`).

    Raises:
        ValueError: an unknown ``kind``.
    """
    classes = {
        "sinusoidal": PositionalEncoding,
        "learned": LearnedPositionalEncoding,
        "none": NoPositionalEncoding,
    }
    if kind not in classes:
        raise ValueError(
            f"positional_encoding={kind!r} is not one of {', '.join(KINDS)}; "
            "set model.net.positional_encoding to one of them"
        )
    return classes[kind](d_model, dropout, max_len)
