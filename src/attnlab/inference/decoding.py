"""Greedy and beam-search decoding over the models' shared step interface; text in, text out.

A translation model exposes (see :mod:`attnlab.models`):
``init_state(src (B, S), src_valid_lens (B,)) -> state`` (a tuple of tensors,
each with the batch on dim 0) and ``step(ys (B, T), *state) -> (logits (B, V), *state)``.
The state is the model's cache (the Transformer's keys and values, the GRU's
hidden state), so a step computes only the newest position. ``step`` returns one row of
logits and state per row of ``ys``, each computed from its own row alone, and never changes a
state tensor in place (it returns a new one). Beam search reorders the state tensors along
dim 0 when beams are re-ranked, except those ``step`` has always handed back untouched (the
very objects it was given), and both loops drop ended sentences' rows from the state (beam
search as soon as a sentence is done, greedy once the ended ones are a quarter of the rows).
The exported artifacts (``src/export.py``) expose the same two functions, so
the checkpoint and the export run the very same loops below.
"""

from __future__ import annotations

import contextlib
import unicodedata
from collections.abc import Callable, Sequence

import torch

from attnlab.config import has_bf16_units
from attnlab.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from attnlab.errors import ConfigError, UserError

# What evaluate reports of its decoding (metrics/<model>.json → decoding).
MAX_OUTPUT_LEN = "min(1.5 * source tokens + 10, 256) per sentence, source <eos> and output <eos> included"
LENGTH_PENALTY = "log P(Y) / ((5 + |Y|) / 6) ** alpha, |Y| with <eos> (Wu et al. 2016, eq. 14)"


def max_output_len(
    src_len: int | torch.Tensor, a: float = 1.5, b: int = 10, cap: int = 256
) -> int | torch.Tensor:
    """Decoding length limit for a source of ``src_len`` tokens: ⌊a·src_len + b⌋, at most ``cap``.

    ``src_len`` is an int, or a (B,) int64 tensor of each sentence's own length (its
    ``src_valid_lens``): then the limits are a (B,) int64 tensor, one per sentence.
    """
    if isinstance(src_len, torch.Tensor):
        return torch.floor(a * src_len.double() + b).long().clamp(max=cap)
    return min(int(a * src_len + b), cap)


def _limits(max_len: int | torch.Tensor, src: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each sentence's limit, ``max_len`` as a (B,) int64 tensor, and the output both loops fill:
    (B, longest limit) int64, all <pad> (no column for limits ≤ 0).

    Raises:
        ValueError: ``max_len`` is a tensor of another shape than (B,).
    """
    B, dev = src.shape[0], src.device
    if isinstance(max_len, torch.Tensor):
        if tuple(max_len.shape) != (B,):
            raise ValueError(
                f"max_len must be an int or a ({B},) tensor, one limit per sentence "
                f"of src; got shape {tuple(max_len.shape)}"
            )
        caps = max_len.to(device=dev, dtype=torch.long)
    else:
        caps = torch.full((B,), int(max_len), dtype=torch.long, device=dev)
    width = max(int(caps.max()), 0) if B else 0
    return caps, torch.full((B, width), PAD_ID, dtype=torch.long, device=dev)


# Greedy decoding drops ended sentences from the batch once they are this fraction of its rows
# (:func:`greedy_decode`).
COMPACT_FRACTION = 0.25


def _select(state: Sequence[torch.Tensor], rows: torch.Tensor) -> list[torch.Tensor]:
    """Every state tensor at ``rows`` (dim 0)."""
    return [s.index_select(0, rows) for s in state]


@torch.no_grad()
def greedy_decode(
    init_state: Callable,
    step: Callable,
    src: torch.Tensor,
    src_valid_lens: torch.Tensor,
    max_len: int | torch.Tensor,
) -> torch.Tensor:
    """Greedy (arg-max) decoding of a batch.

    A sentence that has ended (<eos>, or its own limit) stops being written at once, and leaves
    the batch with the others that ended since the last time, once they are
    :data:`COMPACT_FRACTION` of its rows: until then its row is computed and thrown away,
    because copying every state tensor at every end costs more than a few extra rows. Neither
    changes another row: a sentence's row depends on that sentence alone, not on its batch-mates.
    The arg-max is the first maximum (as ``torch.argmax``), taken with ``max``, which is
    several times faster on a CPU.

    Args:
        init_state, step: the model's decoding interface (module docstring).
        src: (B, S) int64 source ids ending in <eos>, padded with <pad>.
        src_valid_lens: (B,) int64.
        max_len: most tokens to generate per sentence (the <eos> included): an int for
            every sentence, or a (B,) int64 tensor with each sentence's own limit.
    Returns:
        (B, T) int64 generated ids without <bos>; after a sentence's <eos>, or past its
        limit, every position is <pad>. T is the number of steps taken: decoding stops once
        every sentence has ended.
    Raises:
        ValueError: a ``max_len`` tensor of another shape than (B,).
    """
    B, dev = src.shape[0], src.device
    caps, out = _limits(max_len, src)
    rows = (caps > 0).nonzero()[:, 0]  # row i of the state decodes sentence rows[i] of src
    if len(rows) == 0:
        return out[:, :0]
    state = init_state(src, src_valid_lens)
    if len(rows) < B:
        state = _select(state, rows)
    row_caps = caps.index_select(0, rows)
    alive = torch.ones(len(rows), dtype=torch.bool, device=dev)  # not ended yet
    ys = torch.full((len(rows), 1), BOS_ID, dtype=torch.long, device=dev)
    t, n_alive = 0, len(rows)
    while n_alive:
        logits, *state = step(ys, *state)
        nxt = logits.max(-1).indices  # (b,)
        out[rows, t] = torch.where(alive, nxt, PAD_ID)  # an ended row is <pad> from its end on
        t += 1
        alive = alive & (nxt != EOS_ID) & (row_caps > t)
        ys = torch.cat([ys, nxt[:, None]], dim=1)
        n_alive = int(alive.sum())
        if n_alive and len(rows) - n_alive >= COMPACT_FRACTION * len(rows):
            keep = alive.nonzero()[:, 0]
            rows, ys, row_caps, state = (
                rows.index_select(0, keep),
                ys.index_select(0, keep),
                row_caps.index_select(0, keep),
                _select(state, keep),
            )
            alive = alive.index_select(0, keep)
    return out[:, :t]


@torch.no_grad()
def beam_search(
    init_state: Callable,
    step: Callable,
    src: torch.Tensor,
    src_valid_lens: torch.Tensor,
    max_len: int | torch.Tensor,
    beam_size: int = 5,
    alpha: float = 0.0,
) -> torch.Tensor:
    """Beam search, batched over sentences (Sutskever et al. 2014; D2L 10.8.3 (zh 9.8.3)).

    Each sentence keeps ``beam_size`` hypotheses ranked by summed log-probability.
    A hypothesis that emits <eos> is finished: it keeps its score and is
    extended by <pad> at no cost, so it stays in the beam while it beats the
    open ones. A sentence is done when all its hypotheses are finished, or when it reaches
    its own limit (its open hypotheses then end as if at <eos>, with the length they have);
    a done sentence leaves the batch, so it ends exactly as it would alone and later steps
    compute only the open sentences. The answer is the hypothesis with
    the best length-normalized score log P(Y) / lp(Y), lp(Y) = ((5 + |Y|) / 6)^α
    (Wu et al. 2016, eq. 14; |Y| counts the <eos>); ``alpha=0`` means no
    normalization. ``beam_size=1`` is greedy decoding.

    Re-ranking gathers the state of the surviving hypotheses (fairseq's ``reorder_incremental_state``),
    except for the state tensors ``step`` has returned unchanged at every step so far (the very
    objects it was given, such as the Transformer's encoder keys and values): every hypothesis of
    a sentence still holds the copy ``init_state`` gave it, so re-ranking cannot change them. Once
    ``step`` returns a new tensor in a position, that position is gathered from then on.

    Args:
        init_state, step: the model's decoding interface (module docstring).
        src: (B, S) int64 source ids ending in <eos>; src_valid_lens: (B,) int64.
        max_len: most tokens to generate per sentence (the <eos> included): an int for
            every sentence, or a (B,) int64 tensor with each sentence's own limit.
        beam_size: hypotheses kept per sentence, ≥ 1. alpha: length penalty α ≥ 0.
    Returns:
        (B, T) int64 best hypothesis per sentence without <bos>, <pad> after <eos>; T is the
        number of steps taken. A sentence's row depends on that sentence alone, not on its
        batch-mates.
    Raises:
        ValueError: if beam_size < 1 or alpha < 0, or a ``max_len`` tensor of another shape
            than (B,).
    """
    if beam_size < 1 or alpha < 0:
        raise ConfigError(f"need beam_size ≥ 1 and alpha ≥ 0; got beam_size={beam_size}, alpha={alpha}")
    B, K, dev = src.shape[0], beam_size, src.device
    caps, out = _limits(max_len, src)
    if B == 0 or not bool((caps > 0).any()):
        return out[:, :0]
    state = _select(init_state(src, src_valid_lens), torch.arange(B, device=dev).repeat_interleave(K))
    beams = torch.arange(K, device=dev)
    open_ = torch.arange(B, device=dev)  # the sentences still decoding; hypothesis b·K + k is open_[b]'s k-th
    first = open_[:, None] * K  # (b, 1): each open sentence's first hypothesis row
    hyp_caps = caps.repeat_interleave(K)  # (b·K,): each hypothesis's sentence's limit
    ys = torch.full((B * K, 1), BOS_ID, dtype=torch.long, device=dev)
    scores = torch.full((B, K), float("-inf"), device=dev)
    scores[:, 0] = 0.0  # all beams start identical: expand only the first
    finished = torch.zeros(B * K, dtype=torch.bool, device=dev)
    lengths = torch.zeros(B * K, device=dev)
    shared = [True] * len(state)  # still init_state's tensor, the same in every hypothesis of a sentence
    t = 0
    while True:
        finished = finished | (hyp_caps <= t)  # frozen at its limit
        done = finished.view(-1, K).all(1)
        if bool(done.any()):  # pick each done sentence's answer, then drop it from the batch
            ended = done.nonzero()[:, 0]
            normalized = scores[ended] / ((5.0 + lengths.view(-1, K)[ended]) / 6.0) ** alpha
            best = ended * K + normalized.argmax(-1)
            out[open_.index_select(0, ended), :t] = ys.index_select(0, best)[:, 1:]
            keep = (~done).nonzero()[:, 0]
            if len(keep) == 0:
                return out[:, :t]
            rows = (keep[:, None] * K + beams).reshape(-1)
            open_, scores, first = (
                open_.index_select(0, keep),
                scores.index_select(0, keep),
                first[: len(keep)],
            )
            ys, finished, lengths = (
                ys.index_select(0, rows),
                finished.index_select(0, rows),
                lengths.index_select(0, rows),
            )
            hyp_caps, state = hyp_caps.index_select(0, rows), _select(state, rows)
        logits, *new_state = step(ys, *state)
        logp = torch.log_softmax(logits.float(), dim=-1)  # (b·K, V), a fresh tensor: updated in place
        V = logp.shape[-1]
        ended_rows = finished.nonzero()[:, 0]
        if len(ended_rows):  # a finished hypothesis can only be extended by <pad>, at no cost
            logp.index_fill_(0, ended_rows, float("-inf"))
            logp[ended_rows, PAD_ID] = 0.0
        top, flat = logp.add_(scores.reshape(-1, 1)).reshape(-1, K * V).topk(K, dim=-1)  # (b, K)
        src_rows = (first + flat // V).reshape(-1)
        tokens = (flat % V).reshape(-1, 1)
        ys = torch.cat([ys.index_select(0, src_rows), tokens], dim=1)
        shared = [same and new is old for same, new, old in zip(shared, new_state, state)]
        state = [new if same else new.index_select(0, src_rows) for same, new in zip(shared, new_state)]
        was_finished = finished.index_select(0, src_rows)
        lengths = lengths.index_select(0, src_rows) + (~was_finished).float()
        finished = was_finished | (tokens[:, 0] == EOS_ID)
        scores = top
        t += 1


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


def has_text(sentence: str) -> bool:
    """Whether ``sentence`` has a character to translate: anything but whitespace and
    separators (Unicode Z*), control characters (Cc) and invisible format characters
    (Cf: zero-width spaces and joiners, byte-order marks, direction marks, soft hyphens)."""
    return any(unicodedata.category(ch) not in ("Cc", "Cf", "Zs", "Zl", "Zp") for ch in sentence)


def decodable(sentences: Sequence[str], src_valid_lens: torch.Tensor) -> torch.Tensor:
    """Which of ``sentences`` :func:`translate` decodes: (B,) bool. The others translate to
    ``[]`` without being decoded: no character to translate (:func:`has_text`), or no source
    token but the <eos> (``src_valid_lens`` (B,) int64, the <eos> counted, as
    ``tokenizer.encode_sources`` gives them)."""
    text = torch.tensor([has_text(s) for s in sentences], dtype=torch.bool)
    return text & (src_valid_lens.cpu() > 1)


class Bf16UnitsError(UserError, ValueError):
    """bf16 decoding asked of a device without bf16 matrix units (:func:`require_bf16_units`)."""


def require_bf16_units(device_type: str) -> None:
    """Refuse bf16 decoding where ``device_type`` ("cpu", "cuda") has no bf16 matrix units
    (:func:`attnlab.config.has_bf16_units`): there bf16 matmuls fall back to slow conversions,
    far slower than float32.

    Raises:
        Bf16UnitsError: no bf16 units; the message names the fix (decode in float32).
    """
    if not has_bf16_units(device_type):
        raise Bf16UnitsError(
            f"bf16 decoding (model.decoding.bf16=true) needs bf16 matrix units, and this "
            f"{device_type} has none (a CPU needs avx512_bf16 or amx_bf16, a GPU Ampere or "
            "newer); decode in float32 (model.decoding.bf16=false)"
        )


def translate(
    init_state: Callable,
    step: Callable,
    tokenizer,
    sentences: Sequence[str],
    batch_size: int = 128,
    device: torch.device | str = "cpu",
    beam_size: int = 1,
    alpha: float = 0.0,
    bf16: bool = False,
) -> list[list[int]]:
    """Decode ``sentences`` in batches of similar length; ids per sentence, input order.

    Greedy with ``beam_size=1``, else :func:`beam_search` with length penalty
    ``alpha``; each sentence at most :func:`max_output_len` of its own length.
    Returns one list of generated token ids (specials stripped) per sentence;
    detokenize with ``tokenizer.decode``. Every per-sentence quantity (length limit,
    length penalty, end of sentence) comes from that sentence alone, so a sentence
    gets the same ids alone as in any batch, in any order. A sentence with nothing
    to translate gets ``[]`` without being decoded (:func:`decodable`): no character but
    whitespace, control and invisible format characters (:func:`has_text`: empty, spaces, a
    zero-width space, a byte-order mark, direction marks, DEL), or no token from
    the tokenizer.

    ``bf16=True`` (opt-in) runs the model under bf16 autocast (``torch.autocast``: matmuls in
    bfloat16, each weight cast once per call, layer norms and the beam scores in float32). It is
    faster where the device has bf16 matrix units, but its tokens can differ from float32's
    (arg-max ties and near-ties among bf16 logits): evaluate and the exports decode in float32.

    Raises:
        Bf16UnitsError: ``bf16=True`` on a device without bf16 units (:func:`require_bf16_units`).
    """
    device = torch.device(device)
    if bf16:
        require_bf16_units(device.type)
    # bf16=False leaves the caller's autocast as it is (Lightning's bf16-mixed validation keeps it).
    with torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext():
        return _translate_batches(
            init_state, step, tokenizer, sentences, batch_size, device, beam_size, alpha
        )


def _translate_batches(
    init_state, step, tokenizer, sentences, batch_size, device, beam_size, alpha
) -> list[list[int]]:
    """:func:`translate`'s batches, decoded as the caller's autocast setting says."""
    order = sorted(range(len(sentences)), key=lambda i: len(sentences[i]))
    out: list[list[int]] = [[] for _ in sentences]
    for b in range(0, len(order), batch_size):
        idx = order[b : b + batch_size]
        src, valid = tokenizer.encode_sources([sentences[i] for i in idx])
        rows = decodable([sentences[i] for i in idx], valid).nonzero()[:, 0]
        if len(rows) == 0:
            continue
        src, valid = src[rows].to(device), valid[rows].to(device)
        limits = max_output_len(valid)  # each sentence's own, from its own length
        if beam_size == 1:
            ys = greedy_decode(init_state, step, src, valid, limits)
        else:
            ys = beam_search(init_state, step, src, valid, limits, beam_size, alpha)
        for i, row in zip(rows.tolist(), ys.tolist()):
            out[idx[i]] = strip_special(row)
    return out


def translate_text(
    init_state: Callable,
    step: Callable,
    tokenizer,
    sentences: Sequence[str],
    batch_size: int = 128,
    device: torch.device | str = "cpu",
    beam_size: int = 1,
    alpha: float = 0.0,
    bf16: bool = False,
) -> list[str]:
    """:func:`translate`, detokenized: one translation string per sentence, input order."""
    return [
        tokenizer.decode(ids)
        for ids in translate(
            init_state, step, tokenizer, sentences, batch_size, device, beam_size, alpha, bf16
        )
    ]
