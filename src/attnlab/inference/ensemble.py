"""Several trained nets decoding as one, through the shared step interface.

An :class:`Ensemble` has the ``init_state`` and ``step`` of a single model (see
:mod:`attnlab.inference.decoding`), so greedy decoding and beam search run it unchanged. Each
step every member scores the same prefixes and the ensemble returns the log of the mean of their
next-token probabilities, log((1/M) Σ_m p_m(y | prefix)), as fairseq's ``EnsembleModel``
(``avg_probs``) and the ensembles of Sutskever et al. 2014 (section 3.6). One member decodes
exactly as alone: its step output is handed back as it is (logits, not log-probabilities).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch


class Ensemble:
    """The members' averaged next-token distribution, as one model's decoding interface.

    Args:
        members: ``(init_state, step)`` pairs of M ≥ 1 translation nets that share one target
            vocabulary (the same sentencepiece model), e.g. ``(net.init_state, net.step)`` of
            checkpoints trained from different seeds.
    Raises:
        ValueError: no member; from :meth:`step`, members whose logits differ in vocabulary size.
    """

    def __init__(self, members: Sequence[tuple[Callable, Callable]]):
        if not members:
            raise ValueError("an ensemble needs at least one member (init_state, step)")
        self.members = list(members)
        self._sizes: list[int] = []  # state tensors per member, set by init_state

    def init_state(self, src: torch.Tensor, src_valid_lens: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Every member's state, concatenated in member order (each tensor batch-first, as
        the members give them): src (B, S) int64, src_valid_lens (B,) int64."""
        states = [tuple(init(src, src_valid_lens)) for init, _ in self.members]
        self._sizes = [len(s) for s in states]
        return tuple(t for s in states for t in s)

    def step(self, ys: torch.Tensor, *state: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(log of the mean probability (B, V) float32, then every member's new state); a
        single member's step output as it is.

        ``ys`` (B, T) int64 is the prefix each member extends. A member that hands back a state
        tensor unchanged (the very object) is passed through as that object, so beam search keeps
        sharing it. With two or more members the output is a log-probability (``log_softmax`` of
        it is itself); with one, the member's own logits.
        """
        if sum(self._sizes) != len(state):
            raise ValueError(
                f"the ensemble's state has {len(state)} tensors, its members' init_state gave "
                f"{sum(self._sizes)}; call init_state first"
            )
        if len(self.members) == 1:  # one member decodes exactly as alone
            return tuple(self.members[0][1](ys, *state))
        log_probs, new_state, start = [], [], 0
        for (_, step), size in zip(self.members, self._sizes):
            logits, *member_state = step(ys, *state[start : start + size])
            start += size
            log_probs.append(torch.log_softmax(logits.float(), dim=-1))
            new_state += member_state
        sizes = {lp.shape[-1] for lp in log_probs}
        if len(sizes) > 1:
            raise ValueError(
                f"the ensemble's members score vocabularies of different sizes ({sorted(sizes)}); "
                "ensemble only nets trained on the same tokenized corpus (one spm.model)"
            )
        mean = torch.logsumexp(torch.stack(log_probs), dim=0) - math.log(len(log_probs))
        return (mean, *new_state)
