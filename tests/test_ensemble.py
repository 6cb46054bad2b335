"""attnlab.inference.ensemble: several nets decoding as one through the step interface.

The ensemble's step must be the log of the mean of its members' probabilities (by hand on
fixed distributions, and against a reference computed from two real nets' logits), pass
through the state tensors a member keeps (beam search shares them), and decode with the
same loops as one net: a single member exactly as alone, a sentence alone as in a batch.
"""

from __future__ import annotations

import math

import pytest
import torch

from attnlab.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from attnlab.inference.decoding import beam_search, greedy_decode
from attnlab.inference.ensemble import Ensemble
from attnlab.models.transformer import Transformer

V = 23


def _fixed(probs: list[float]):
    """A member whose next-token distribution is ``probs`` whatever the prefix; its state is the
    source lengths, handed back untouched."""

    def init_state(src, src_valid_lens):
        return (src_valid_lens,)

    def step(ys, valid):
        logits = torch.tensor(probs).log().expand(ys.shape[0], -1) + 3.0  # logits, not log-probs
        return (logits, valid)

    return init_state, step


def test_the_step_is_the_log_of_the_mean_probability_by_hand():
    a, b = _fixed([0.7, 0.2, 0.1]), _fixed([0.3, 0.5, 0.2])
    ensemble = Ensemble([a, b])
    src, valid = torch.ones(2, 4, dtype=torch.long), torch.tensor([4, 3])
    state = ensemble.init_state(src, valid)
    assert len(state) == 2 and state[0] is valid and state[1] is valid
    out, *new = ensemble.step(torch.full((2, 1), BOS_ID), *state)
    # (0.7 + 0.3) / 2, (0.2 + 0.5) / 2, (0.1 + 0.2) / 2
    want = torch.tensor([[math.log(0.5), math.log(0.35), math.log(0.15)]] * 2)
    torch.testing.assert_close(out, want, rtol=0, atol=1e-6)
    assert new[0] is valid and new[1] is valid  # kept state passes through as the same objects


def _net(seed: int) -> Transformer:
    torch.manual_seed(seed)
    net = Transformer(vocab_size=V, d_model=16, num_heads=2, num_layers=2, ffn_hidden=32, dropout=0.0)
    return net.eval()


def _batch():
    torch.manual_seed(5)
    src = torch.randint(4, V, (3, 6))
    valid = torch.tensor([6, 4, 2])
    src[:, -1] = PAD_ID
    for row, n in enumerate(valid.tolist()):
        src[row, n - 1] = EOS_ID
        src[row, n:] = PAD_ID
    return src, valid


def test_two_real_nets_against_the_mean_of_their_softmaxes():
    first, second = _net(0), _net(1)
    src, valid = _batch()
    ensemble = Ensemble([(first.init_state, first.step), (second.init_state, second.step)])
    with torch.no_grad():
        state = initial = ensemble.init_state(src, valid)
        s1, s2 = first.init_state(src, valid), second.init_state(src, valid)
        ys = torch.full((3, 1), BOS_ID)
        for token in (7, 9):  # two steps along one prefix, the caches growing
            out, *state = ensemble.step(ys, *state)
            l1, *s1 = first.step(ys, *s1)
            l2, *s2 = second.step(ys, *s2)
            reference = ((l1.softmax(-1) + l2.softmax(-1)) / 2).log()
            torch.testing.assert_close(out, reference, rtol=1e-5, atol=1e-6)
            assert out.logsumexp(-1).abs().max() < 1e-5  # a distribution: its own log_softmax
            ys = torch.cat([ys, torch.full((3, 1), token)], dim=1)
    # each member's encoder keys and values (after src_valid_lens and the position, 2 per
    # layer) came back as the very objects init_state gave: beam search keeps sharing them
    n, layers = len(s1), len(first.decoder_blocks)
    assert len(state) == 2 * n
    for offset in (0, n):
        for i in range(offset + 2, offset + 2 + 2 * layers):
            assert state[i] is initial[i]
        assert state[offset + 1] is not initial[offset + 1]  # the position moved on


def _decodes_as(ensemble: Ensemble, net: Transformer, src, valid) -> None:
    """The ensemble's greedy and beam-search tokens are the net's, exactly."""
    for decode, extra in ((greedy_decode, ()), (beam_search, (3, 1.0))):
        assert torch.equal(
            decode(ensemble.init_state, ensemble.step, src, valid, 12, *extra),
            decode(net.init_state, net.step, src, valid, 12, *extra),
        )


def test_one_member_decodes_exactly_as_the_net_alone():
    net = _net(2)
    src, valid = _batch()
    _decodes_as(Ensemble([(net.init_state, net.step)]), net, src, valid)


def test_a_net_twice_decodes_as_the_net_alone():
    """Two copies of one net: the mean of two equal distributions is that distribution, so the
    averaging path (logsumexp, two members' states, each shared tensor passed through) gives
    the net's own tokens, greedy and beam."""
    net = _net(5)
    src, valid = _batch()
    twice = Ensemble([(net.init_state, net.step), (net.init_state, net.step)])
    with torch.no_grad():
        state = twice.init_state(src, valid)
        out, *_ = twice.step(torch.full((3, 1), BOS_ID), *state)
        logits, *_ = net.step(torch.full((3, 1), BOS_ID), *net.init_state(src, valid))
    torch.testing.assert_close(out, logits.log_softmax(-1), rtol=0, atol=1e-6)
    _decodes_as(twice, net, src, valid)


def test_an_ensemble_decodes_a_sentence_alone_as_in_its_batch():
    first, second = _net(3), _net(4)
    ensemble = Ensemble([(first.init_state, first.step), (second.init_state, second.step)])
    src, valid = _batch()
    batch = beam_search(ensemble.init_state, ensemble.step, src, valid, 12, beam_size=3, alpha=1.0)
    for row in range(3):
        alone = beam_search(
            ensemble.init_state, ensemble.step, src[row : row + 1], valid[row : row + 1], 12, 3, 1.0
        )
        width = alone.shape[1]
        assert torch.equal(alone[0], batch[row, :width])
        assert (batch[row, width:] == PAD_ID).all()


def test_bad_members_are_refused():
    with pytest.raises(ValueError, match="needs at least one member"):
        Ensemble([])
    small, large = _fixed([0.5, 0.5]), _fixed([0.2, 0.3, 0.5])
    ensemble = Ensemble([small, large])
    state = ensemble.init_state(torch.ones(1, 2, dtype=torch.long), torch.tensor([2]))
    with pytest.raises(ValueError, match=r"vocabularies of different sizes \(\[2, 3\]\).*one spm.model"):
        ensemble.step(torch.full((1, 1), BOS_ID), *state)
    with pytest.raises(
        ValueError, match="the ensemble's state has 1 tensors, its members' init_state gave 2"
    ):
        ensemble.step(torch.full((1, 1), BOS_ID), state[0])
