"""The output layer and the label-smoothed cross-entropy in one chunked pass.

A translation model's last step maps N target states to V logits and takes a
cross-entropy over them. Written the obvious way (``F.cross_entropy(linear(h))``)
that materializes four or five (N, V) float32 tensors per step: logits, log-probs
and their gradients, 77 MB each for a 2,400-token batch over 8,000 pieces. On a
CPU most of that time is spent faulting in fresh pages, not computing.
:func:`linear_cross_entropy` walks the N rows in chunks, computing each chunk's
logits, loss and gradients while they are in cache, so the largest temporary is
(``chunk_size``, V). Same value and gradients as the obvious way (tested against
it to float32 rounding); the gradients are computed in the forward pass, as in
Liger-Kernel's fused linear cross-entropy.

Label smoothing as in Szegedy et al. 2016 (section 7) and PyTorch's
``F.cross_entropy(label_smoothing=ε)``: the target distribution puts 1 − ε on the
reference token and ε/V on every token, so per token

    loss = logsumexp(z) − (1 − ε)·z_y − (ε/V)·Σ_j z_j,   z = h Wᵀ + b,

averaged over the N tokens; the gradient with respect to z is softmax(z) − (1 − ε)·onehot(y) − ε/V.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from attnlab.data.special_tokens import PAD_ID
from attnlab.errors import ConfigError, UserError


class NonFiniteLossError(UserError, FloatingPointError):
    """The training loss became NaN or ±inf; raised before the bad step updates any weight."""


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, weight, bias, target, smoothing, chunk_size, needs):
        # ``needs``: which of h, weight, bias want a gradient, decided by the caller (inside
        # forward grad mode is off, and needs_input_grad stays True under no_grad/inference).
        N, V = h.shape[0], weight.shape[0]
        grad_h = torch.empty_like(h) if needs[0] else None
        grad_w = torch.zeros_like(weight) if needs[1] else None
        grad_b = torch.zeros_like(bias) if needs[2] else None
        need_grad = any(needs)
        total = torch.zeros((), dtype=torch.float64, device=h.device)
        # One (chunk, V) buffer, reused: every step below works in place, so no (chunk, V)
        # temporary is allocated (on a CPU, fresh pages of that size cost more than the math).
        buffer = h.new_empty(min(chunk_size, N), V)
        for start in range(0, N, chunk_size):
            hc, yc = h[start : start + chunk_size], target[start : start + chunk_size]
            z = buffer[: hc.shape[0]]
            if bias is None:
                torch.mm(hc, weight.T, out=z)  # logits (c, V)
            else:
                torch.addmm(bias, hc, weight.T, out=z)
            z_y, z_sum = z.gather(1, yc[:, None]).squeeze(1), z.sum(dim=1)
            z_max = z.amax(dim=1, keepdim=True)
            denom = z.sub_(z_max).exp_().sum(dim=1, keepdim=True)  # z now holds exp(z − max)
            lse = (z_max + denom.log()).squeeze(1)
            loss = lse - (1.0 - smoothing) * z_y - (smoothing / V) * z_sum
            total += loss.sum(dtype=torch.float64)
            if need_grad:
                g = z.div_(denom).sub_(smoothing / V)  # softmax − ε/V
                g.scatter_add_(1, yc[:, None], torch.full_like(z_y[:, None], smoothing - 1.0))
                if grad_h is not None:
                    torch.mm(g, weight, out=grad_h[start : start + chunk_size])
                if grad_w is not None:
                    grad_w.addmm_(g.T, hc)
                if grad_b is not None:
                    grad_b += g.sum(dim=0)
        ctx.save_for_backward(grad_h, grad_w, grad_b)
        ctx.n = N
        return (total / N).to(h.dtype)

    @staticmethod
    @once_differentiable  # the gradients were computed in forward: no double backward
    def backward(ctx, grad_out):
        grads = ctx.saved_tensors
        scale = grad_out / max(ctx.n, 1)  # N = 0: zero gradients (and a NaN loss), as F.cross_entropy
        return (*(None if g is None else g * scale for g in grads), None, None, None, None)


def linear_cross_entropy(
    h: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    target: torch.Tensor,
    label_smoothing: float = 0.0,
    chunk_size: int = 512,
) -> torch.Tensor:
    """Mean label-smoothed cross-entropy of the logits ``h @ weight.T + bias`` against ``target``.

    Equals ``F.cross_entropy(F.linear(h, weight, bias), target, label_smoothing=ε)``
    without ever holding all (N, V) logits; see the module docstring.

    Args:
        h: (N, d) float states of the tokens to score (padding already removed).
        weight: (V, d) output projection (a tied embedding works: its gradient adds up).
        bias: (V,) or ``None``.
        target: (N,) int64 token ids in [0, V).
        label_smoothing: ε in [0, 1).
        chunk_size: rows per chunk (the largest temporary is chunk_size × V floats).
    Returns:
        A 0-dim float32 tensor; NaN when N = 0 (with zero gradients), as
        ``F.cross_entropy``'s mean. The arithmetic, the output projection's matmuls
        included, runs in float32 with autocast off: under bf16-mixed this layer does
        not get bf16 matrix speed. Gradients are computed in the forward pass (and only
        for inputs that need them, none under ``no_grad``); no double backward.
    Raises:
        ValueError: shapes that do not match, ε outside [0, 1), or chunk_size < 1.
    """
    if h.dim() != 2 or weight.dim() != 2 or h.shape[1] != weight.shape[1] or target.shape != h.shape[:1]:
        raise ValueError(
            f"linear_cross_entropy needs h (N, d), weight (V, d), target (N,); got "
            f"{tuple(h.shape)}, {tuple(weight.shape)}, {tuple(target.shape)}"
        )
    if not 0.0 <= label_smoothing < 1.0:
        raise ConfigError(f"label_smoothing must be in [0, 1), got {label_smoothing}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be ≥ 1, got {chunk_size}")
    grad = torch.is_grad_enabled()
    needs = tuple(grad and t is not None and t.requires_grad for t in (h, weight, bias))
    with torch.autocast(h.device.type, enabled=False):
        return _LinearCrossEntropy.apply(
            h.float(),
            weight.float(),
            None if bias is None else bias.float(),
            target,
            float(label_smoothing),
            int(chunk_size),
            needs,
        )


def sequence_loss(net, batch: dict, label_smoothing: float = 0.0, chunk_size: int = 512) -> torch.Tensor:
    """Mean cross-entropy per target token of a teacher-forced batch, padding excluded.

    Args:
        net: a translation model (``attnlab.models``) with ``features(src, src_valid_lens,
            tgt_in)`` → (B, T, d) and ``output_layer`` (``nn.Linear`` d → V).
        batch: ``src`` (B, S), ``src_valid_lens`` (B,), ``tgt_in`` and ``tgt_out`` (B, T),
            all int64; positions where ``tgt_out`` is the padding id are not scored.
        label_smoothing, chunk_size: as in :func:`linear_cross_entropy`.
    Returns:
        0-dim float32: ``F.cross_entropy(net(...).flatten(0, 1), tgt_out.flatten(),
        ignore_index=PAD_ID, label_smoothing=ε)``, computed in chunks.
    """
    h = net.features(batch["src"], batch["src_valid_lens"], batch["tgt_in"])  # (B, T, d)
    keep = batch["tgt_out"] != PAD_ID
    layer = net.output_layer
    return linear_cross_entropy(
        h[keep], layer.weight, layer.bias, batch["tgt_out"][keep], label_smoothing, chunk_size
    )


def symmetric_kl(log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """KL(P‖Q) + KL(Q‖P) per row, from log-probabilities (N, V) → (N,):
    Σ_v (p_v − q_v)(log p_v − log q_v) (Liang et al. 2021, eq. 2, before its ½)."""
    return ((log_p.exp() - log_q.exp()) * (log_p - log_q)).sum(dim=-1)


def rdrop_loss(net, batch: dict, label_smoothing: float, alpha: float) -> tuple[torch.Tensor, torch.Tensor]:
    """R-Drop (Liang et al. 2021, eq. 3, halved): each pair goes through the net twice with
    different dropout masks (one pass of the batch stacked on itself) and the two predicted
    distributions are pulled together,

        loss = ½(CE₁ + CE₂) + (α/4)·(KL(P₁‖P₂) + KL(P₂‖P₁)),

    every term a mean per scored target token (the paper sums per sentence; dividing its
    L = NLL₁ + NLL₂ + (α/2)(KL + KL) by 2 gives this, so its α carries over).

    Args:
        net, batch: as :func:`sequence_loss`.
        label_smoothing: ε of the cross-entropy in [0, 1). alpha: α ≥ 0.
    Returns:
        (loss, ce): 0-dim float32 tensors; ``ce`` is ½(CE₁ + CE₂), the label-smoothed
        cross-entropy to log beside other runs' training loss. The logits (2N, V) are
        materialized in float32 with autocast off, unlike :func:`sequence_loss`'s chunks.
    Raises:
        ConfigError: α < 0 or ε outside [0, 1).
    """
    if alpha < 0 or not 0.0 <= label_smoothing < 1.0:
        raise ConfigError(
            f"R-Drop needs alpha ≥ 0 and label_smoothing in [0, 1); got alpha={alpha}, "
            f"label_smoothing={label_smoothing}"
        )
    twice = {k: torch.cat([batch[k], batch[k]]) for k in ("src", "src_valid_lens", "tgt_in", "tgt_out")}
    h = net.features(twice["src"], twice["src_valid_lens"], twice["tgt_in"])  # (2B, T, d)
    keep = twice["tgt_out"] != PAD_ID  # the first copy's tokens, then the second's, in one order
    layer = net.output_layer
    with torch.autocast(h.device.type, enabled=False):
        bias = None if layer.bias is None else layer.bias.float()
        logits = torch.nn.functional.linear(h[keep].float(), layer.weight.float(), bias)  # (2N, V)
        target = twice["tgt_out"][keep]
        ce = torch.nn.functional.cross_entropy(logits, target, label_smoothing=label_smoothing)
        first, second = logits.log_softmax(dim=-1).chunk(2)
        kl = symmetric_kl(first, second).mean()
    return ce + (alpha / 4) * kl, ce
