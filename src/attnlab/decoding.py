"""Greedy and beam-search decoding over the models' shared step interface; text in, text out.

A translation model exposes (see :mod:`attnlab.models`):
``init_state(src (B, S), src_valid_lens (B,)) -> state`` (a tuple of tensors,
each with the batch on dim 0) and ``step(ys (B, T), *state) -> (logits (B, V), *state)``.
The state is the model's cache (the Transformer's keys and values, the GRU's
hidden state), so a step computes only the newest position. Beam search
reorders every state tensor along dim 0 when beams are re-ranked.
The exported artifacts (``src/export.py``) expose the same two functions, so
the checkpoint and the export run the very same loops below.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch

from attnlab.data.tokenizer import BOS_ID, EOS_ID, PAD_ID


# What evaluate reports of its decoding (metrics/<model>.json → decoding).
MAX_OUTPUT_LEN = "min(1.5 * source tokens + 10, 256), <eos> included, per batch of sources"
LENGTH_PENALTY = "log P(Y) / ((5 + |Y|) / 6) ** alpha, |Y| with <eos> (Wu et al. 2016, eq. 14)"


def max_output_len(src_len: int, a: float = 1.5, b: int = 10, cap: int = 256) -> int:
    """Decoding length limit for a source of ``src_len`` tokens: min(a·src_len + b, cap)."""
    return min(int(a * src_len + b), cap)


@torch.no_grad()
def greedy_decode(init_state: Callable, step: Callable, src: torch.Tensor,
                  src_valid_lens: torch.Tensor, max_len: int) -> torch.Tensor:
    """Greedy (arg-max) decoding of a batch.

    Args:
        init_state, step: the model's decoding interface (module docstring).
        src: (B, S) int64 source ids ending in <eos>, padded with <pad>.
        src_valid_lens: (B,) int64.
        max_len: most tokens to generate per sentence (the <eos> included).
    Returns:
        (B, T) int64 generated ids without <bos>; after a sentence's <eos>
        every position is <pad>. Stops early once every sentence has ended.
    """
    state = init_state(src, src_valid_lens)
    B = src.shape[0]
    ys = torch.full((B, 1), BOS_ID, dtype=torch.long, device=src.device)
    done = torch.zeros(B, dtype=torch.bool, device=src.device)
    for _ in range(max_len):
        logits, *state = step(ys, *state)
        nxt = logits.argmax(-1)
        nxt = torch.where(done, torch.full_like(nxt, PAD_ID), nxt)
        ys = torch.cat([ys, nxt[:, None]], dim=1)
        done = done | (nxt == EOS_ID)
        if bool(done.all()):
            break
    return ys[:, 1:]


@torch.no_grad()
def beam_search(init_state: Callable, step: Callable, src: torch.Tensor,
                src_valid_lens: torch.Tensor, max_len: int, beam_size: int = 5,
                alpha: float = 0.0) -> torch.Tensor:
    """Beam search, batched over sentences (Sutskever et al. 2014; D2L 10.8.3).

    Each sentence keeps ``beam_size`` hypotheses ranked by summed log-probability.
    A hypothesis that emits <eos> is finished: it keeps its score and is
    extended by <pad> at no cost, so it stays in the beam while it beats the
    open ones. The search stops when every hypothesis of every sentence is
    finished, or after ``max_len`` tokens. The answer is the hypothesis with
    the best length-normalized score log P(Y) / lp(Y), lp(Y) = ((5 + |Y|) / 6)^α
    (Wu et al. 2016, eq. 14; |Y| counts the <eos>); ``alpha=0`` means no
    normalization. ``beam_size=1`` is greedy decoding.

    Args:
        init_state, step: the model's decoding interface (module docstring).
        src: (B, S) int64 source ids ending in <eos>; src_valid_lens: (B,) int64.
        max_len: most tokens to generate per sentence (the <eos> included).
        beam_size: hypotheses kept per sentence, ≥ 1. alpha: length penalty α ≥ 0.
    Returns:
        (B, T) int64 best hypothesis per sentence without <bos>, <pad> after <eos>.
    Raises:
        ValueError: if beam_size < 1 or alpha < 0.
    """
    if beam_size < 1 or alpha < 0:
        raise ValueError(f"need beam_size ≥ 1 and alpha ≥ 0; got beam_size={beam_size}, alpha={alpha}")
    B, K, dev = src.shape[0], beam_size, src.device
    state = init_state(src, src_valid_lens)
    rows = torch.arange(B, device=dev).repeat_interleave(K)  # beam b·K + k belongs to sentence b
    state = [s.index_select(0, rows) for s in state]
    ys = torch.full((B * K, 1), BOS_ID, dtype=torch.long, device=dev)
    scores = torch.full((B, K), float("-inf"), device=dev)
    scores[:, 0] = 0.0  # all beams start identical: expand only the first
    finished = torch.zeros(B * K, dtype=torch.bool, device=dev)
    lengths = torch.zeros(B * K, device=dev)
    offsets = (torch.arange(B, device=dev) * K)[:, None]  # (B, 1)
    for _ in range(max_len):
        logits, *state = step(ys, *state)
        logp = torch.log_softmax(logits.float(), dim=-1)  # (B·K, V)
        V = logp.shape[-1]
        pad_only = torch.full_like(logp[0], float("-inf"))
        pad_only[PAD_ID] = 0.0
        logp = torch.where(finished[:, None], pad_only, logp)
        top, flat = (scores.reshape(-1, 1) + logp).reshape(B, K * V).topk(K, dim=-1)  # (B, K)
        src_rows = (offsets + flat // V).reshape(-1)  # which beam each survivor extends
        tokens = (flat % V).reshape(-1, 1)
        ys = torch.cat([ys.index_select(0, src_rows), tokens], dim=1)
        state = [s.index_select(0, src_rows) for s in state]
        was_finished = finished.index_select(0, src_rows)
        lengths = lengths.index_select(0, src_rows) + (~was_finished).float()
        finished = was_finished | (tokens[:, 0] == EOS_ID)
        scores = top
        if bool(finished.all()):
            break
    normalized = scores.reshape(-1) / ((5.0 + lengths) / 6.0) ** alpha
    best = offsets[:, 0] + normalized.reshape(B, K).argmax(-1)
    return ys.index_select(0, best)[:, 1:]


def strip_special(ids: Sequence[int]) -> list[int]:
    """Ids up to (excluding) the first <eos>, without <pad>/<bos>."""
    out = []
    for t in ids:
        t = int(t)
        if t == EOS_ID:
            break
        if t not in (PAD_ID, BOS_ID):
            out.append(t)
    return out


def encode_sources(tokenizer, sentences: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Sentences → (src (B, S) with <eos> and <pad>, src_valid_lens (B,)), int64.

    S is the longest sentence + 1, unless the tokenizer has its own
    ``encode_sources`` (D2L's fixed-length sources, :mod:`attnlab.data.d2l`).
    """
    if hasattr(tokenizer, "encode_sources"):
        return tokenizer.encode_sources(sentences)
    seqs = [ids + [EOS_ID] for ids in tokenizer.encode(list(sentences))]
    src = torch.full((len(seqs), max(len(s) for s in seqs)), PAD_ID, dtype=torch.long)
    for i, s in enumerate(seqs):
        src[i, : len(s)] = torch.tensor(s)
    return src, torch.tensor([len(s) for s in seqs], dtype=torch.long)


def translate(init_state: Callable, step: Callable, tokenizer, sentences: Sequence[str],
              batch_size: int = 128, device: torch.device | str = "cpu",
              beam_size: int = 1, alpha: float = 0.0) -> list[list[int]]:
    """Decode ``sentences`` in batches of similar length; ids per sentence, input order.

    Greedy with ``beam_size=1``, else :func:`beam_search` with length penalty
    ``alpha``; at most :func:`max_output_len` tokens per batch. Returns one list
    of generated token ids (specials stripped) per sentence; detokenize with
    ``tokenizer.decode``. An empty sentence decodes like any other.
    """
    order = sorted(range(len(sentences)), key=lambda i: len(sentences[i]))
    out: list[list[int]] = [[] for _ in sentences]
    for b in range(0, len(order), batch_size):
        idx = order[b : b + batch_size]
        src, valid = encode_sources(tokenizer, [sentences[i] for i in idx])
        src, valid, limit = src.to(device), valid.to(device), max_output_len(src.shape[1])
        if beam_size == 1:
            ys = greedy_decode(init_state, step, src, valid, limit)
        else:
            ys = beam_search(init_state, step, src, valid, limit, beam_size, alpha)
        for i, row in zip(idx, ys.tolist()):
            out[i] = strip_special(row)
    return out


def translate_text(init_state: Callable, step: Callable, tokenizer, sentences: Sequence[str],
                   batch_size: int = 128, device: torch.device | str = "cpu",
                   beam_size: int = 1, alpha: float = 0.0) -> list[str]:
    """:func:`translate`, detokenized: one translation string per sentence, input order."""
    return [tokenizer.decode(ids) for ids in translate(
        init_state, step, tokenizer, sentences, batch_size, device, beam_size, alpha)]
