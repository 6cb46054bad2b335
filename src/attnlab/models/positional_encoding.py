"""Sinusoidal positional encoding (D2L 11.6.3 "Positional Encoding"; Vaswani et al. 2017, 3.5)."""

from __future__ import annotations

import torch
from torch import nn


class PositionalEncoding(nn.Module):
    """Sinusoidal positional encoding (D2L 11.6.3; Vaswani et al. 3.5).

    P[i, 2j] = sin(i / 10000^(2j/d)), P[i, 2j+1] = cos(i / 10000^(2j/d)).
    An odd ``d_model`` works: sin fills the even columns, cos the odd ones.

    Args:
        d_model: feature size d.
        dropout: dropout probability applied after adding P.
        max_len: longest sequence supported.
    Shapes: X (B, T, d_model) float → X + P[:T], same shape and dtype.
    Raises:
        ValueError: if T > max_len or d_model < 1.
    """

    P: torch.Tensor  # (1, max_len, d_model), a buffer

    def __init__(self, d_model: int, dropout: float = 0.0, max_len: int = 1000):
        super().__init__()
        if d_model < 1:
            raise ValueError(f"d_model must be ≥ 1, got {d_model}")
        self.dropout = nn.Dropout(dropout)
        position = torch.arange(max_len, dtype=torch.float32)[:, None]
        div = torch.pow(10000.0, torch.arange(0, d_model, 2, dtype=torch.float32) / d_model)
        angles = position / div  # (max_len, ceil(d/2))
        P = torch.zeros(1, max_len, d_model)
        P[0, :, 0::2] = torch.sin(angles)
        P[0, :, 1::2] = torch.cos(angles[:, : d_model // 2])
        self.register_buffer("P", P, persistent=False)

    def at(self, X: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """One step of an incremental decoder: X (B, 1, d_model) + P[positions], positions (B,) int64."""
        return self.dropout(X + self.P[0, positions].unsqueeze(1).to(X.dtype))

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        if X.shape[1] > self.P.shape[1]:
            raise ValueError(
                f"sequence length {X.shape[1]} exceeds PositionalEncoding max_len "
                f"{self.P.shape[1]}; raise max_len"
            )
        return self.dropout(X + self.P[:, : X.shape[1], :].to(X.dtype))
