"""Greedy decoding over the models' shared step interface, and text-in/text-out translation.

A translation model exposes (see :mod:`attnlab.models`):
``init_state(src (B, S), src_valid_lens (B,)) -> state`` (a tuple of tensors) and
``step(ys (B, T), *state) -> (logits (B, V), *state)``.
The exported artifacts (``src/export.py``) expose the same two functions, so
the checkpoint and the export run the very same loop below.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch

from attnlab.data.tokenizer import BOS_ID, EOS_ID, PAD_ID


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
              batch_size: int = 128, device: torch.device | str = "cpu") -> list[list[int]]:
    """Greedy-decode ``sentences`` in batches of similar length; ids per sentence, input order.

    Returns one list of generated token ids (specials stripped) per sentence;
    detokenize with ``tokenizer.decode``. An empty sentence decodes like any other.
    """
    order = sorted(range(len(sentences)), key=lambda i: len(sentences[i]))
    out: list[list[int]] = [[] for _ in sentences]
    for b in range(0, len(order), batch_size):
        idx = order[b : b + batch_size]
        src, valid = encode_sources(tokenizer, [sentences[i] for i in idx])
        ys = greedy_decode(init_state, step, src.to(device), valid.to(device),
                           max_output_len(src.shape[1]))
        for i, row in zip(idx, ys.tolist()):
            out[i] = strip_special(row)
    return out


def translate_text(init_state: Callable, step: Callable, tokenizer, sentences: Sequence[str],
                   batch_size: int = 128, device: torch.device | str = "cpu") -> list[str]:
    """:func:`translate`, detokenized: one translation string per sentence, input order."""
    return [tokenizer.decode(ids)
            for ids in translate(init_state, step, tokenizer, sentences, batch_size, device)]
