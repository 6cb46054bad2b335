"""Head statistics (Voita et al. 2019) against values computed by hand, and head masks
(Michel et al. 2019) against an independent computation of what masking a head means."""

import math

import pytest
import torch

from attnlab.analysis.heads import diagonal_offset, head_statistics, row_statistics
from attnlab.analysis.pruning import head_importance, head_names
from attnlab.models.attention import MultiHeadAttention
from attnlab.models.bahdanau import Bahdanau
from attnlab.models.transformer import Transformer

# --- statistics -------------------------------------------------------------------------


def test_a_uniform_row_has_entropy_log_n_and_confidence_one_over_n():
    w = torch.full((1, 1, 1, 5), 0.2, dtype=torch.float64)
    entropy, confidence = row_statistics(w, torch.tensor([1]))
    assert entropy.tolist() == pytest.approx([math.log(5)], abs=1e-12)
    assert confidence.tolist() == pytest.approx([0.2], abs=1e-12)


def test_a_one_hot_row_has_entropy_zero_and_confidence_one():
    w = torch.tensor([0.0, 0.0, 1.0, 0.0]).reshape(1, 1, 1, 4)
    entropy, confidence = row_statistics(w, torch.tensor([1]))
    assert entropy.tolist() == [0.0] and confidence.tolist() == [1.0]


def test_masked_keys_and_padded_queries_are_not_counted():
    """Sample 0: 3 valid keys of 4 and 2 valid queries of 3; sample 1: 4 keys, 1 query.
    The padded rows (garbage on purpose) and the masked key's weight must not count."""
    w = torch.tensor(
        [
            [
                [1 / 3, 1 / 3, 1 / 3, 0.9],  # valid query, uniform over its 3 valid keys (+ a masked key)
                [1.0, 0.0, 0.0, 0.0],  # valid query, one-hot
                [0.1, 0.2, 0.3, 0.4],
            ],  # padded query: not counted
            [
                [0.5, 0.5, 0.0, 0.0],  # valid query: two keys
                [0.25, 0.25, 0.25, 0.25],  # padded
                [0.25, 0.25, 0.25, 0.25],
            ],  # padded
        ],
        dtype=torch.float64,
    )[:, None]  # (2, 1, 3, 4)
    entropy, confidence = row_statistics(w, torch.tensor([2, 1]), torch.tensor([3, 4]))
    by_hand_entropy = (math.log(3) + 0.0 + math.log(2)) / 3
    by_hand_confidence = (1 / 3 + 1.0 + 0.5) / 3
    assert entropy.item() == pytest.approx(by_hand_entropy, abs=1e-12)
    assert confidence.item() == pytest.approx(by_hand_confidence, abs=1e-12)


def test_statistics_are_per_head():
    uniform, one_hot = torch.full((4,), 0.25), torch.tensor([0.0, 1.0, 0.0, 0.0])
    w = torch.stack([uniform, one_hot]).reshape(1, 2, 1, 4)
    entropy, confidence = row_statistics(w, torch.tensor([1]))
    assert entropy.tolist() == pytest.approx([math.log(4), 0.0], abs=1e-12)
    assert confidence.tolist() == pytest.approx([0.25, 1.0], abs=1e-12)


def test_no_valid_query_is_an_error():
    with pytest.raises(ValueError, match="no valid query row"):
        row_statistics(torch.full((1, 1, 2, 2), 0.5), torch.tensor([0]))


def test_diagonal_offset_by_hand():
    """T = 2 target rows over S = 4 source keys. Row 0 peaks at key 0: |0.5/4 − 0.5/2| = 0.125;
    row 1 at key 3: |3.5/4 − 1.5/2| = 0.125. A second head that peaks at key 3 then 0 (reversed):
    |3.5/4 − 0.25| = 0.625 and |0.5/4 − 0.75| = 0.625. Key 3 is masked for sample 1 (S = 3)."""
    diag = torch.tensor([[0.7, 0.1, 0.1, 0.1], [0.1, 0.1, 0.1, 0.7]])
    rev = diag.flip(0)
    w = torch.stack([diag, rev])[None]  # (1, 2, 2, 4)
    assert diagonal_offset(w, torch.tensor([2]), torch.tensor([4])).tolist() == pytest.approx([0.125, 0.625])
    # Sample with 3 source keys: the masked key 3 cannot be the arg-max; row 1's peak is then key 0
    # (0.1 each for keys 0-2: the first) → |0.5/3 − 0.75|.
    masked = diagonal_offset(w[:, :1], torch.tensor([2]), torch.tensor([3]))
    assert masked.item() == pytest.approx((abs(0.5 / 3 - 0.25) + abs(0.5 / 3 - 0.75)) / 2)


def _tiny_transformer(seed=0):
    torch.manual_seed(seed)
    return Transformer(
        vocab_size=20, d_model=16, num_heads=4, num_layers=2, ffn_hidden=32, dropout=0.0
    ).eval()


def _batch():
    from attnlab.data.batching import collate

    return collate([([5, 6, 7], [8, 9]), ([5, 6, 7, 10, 11], [8, 9, 12, 13])])


def test_head_statistics_names_every_layer_and_head_and_matches_the_maps():
    net, batch = _tiny_transformer(), _batch()
    stats = head_statistics(net, batch)
    kinds = {"encoder_self": 2, "decoder_self": 2, "encoder_decoder": 3}  # statistics per head
    assert len(stats) == sum(n * 2 * 4 for n in kinds.values())
    maps = net.attention_maps(batch["src"], batch["src_valid_lens"], batch["tgt_in"])
    tgt_lens = (batch["tgt_out"] != 0).sum(1)
    entropy, confidence = row_statistics(maps["encoder_decoder"][1], tgt_lens, batch["src_valid_lens"])
    assert stats["entropy/encoder_decoder/layer2/head3"] == entropy[2].item()
    assert stats["confidence/encoder_decoder/layer2/head3"] == confidence[2].item()
    assert 0 <= stats["diagonal_offset/encoder_decoder/layer1/head1"] <= 1
    assert "diagonal_offset/encoder_self/layer1/head1" not in stats


def test_head_statistics_of_bahdanau_is_its_one_alignment_head():
    torch.manual_seed(0)
    net = Bahdanau(vocab_size=20, embed_size=8, num_hiddens=16, num_layers=1, dropout=0.0).eval()
    assert set(head_statistics(net, _batch())) == {
        f"{s}/alignment/layer1/head1" for s in ("entropy", "confidence", "diagonal_offset")
    }


# --- head masks ---------------------------------------------------------------------------


def _mha_inputs(seed=1):
    g = torch.Generator().manual_seed(seed)
    q, kv = torch.randn(2, 3, 16, generator=g), torch.randn(2, 5, 16, generator=g)
    return q, kv, torch.tensor([5, 2])


@pytest.mark.parametrize("need_weights", [True, False])
def test_an_all_ones_mask_is_bitwise_no_mask(need_weights):
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4).eval()
    q, kv, lens = _mha_inputs()
    plain = mha(q, kv, kv, lens, need_weights=need_weights)
    mha.set_head_mask(torch.ones(4))
    assert torch.equal(mha(q, kv, kv, lens, need_weights=need_weights), plain)


@pytest.mark.parametrize("need_weights", [True, False])
def test_masking_a_head_equals_zeroing_its_output_before_w_o(need_weights):
    """Computed independently: the heads' outputs softmax(q kᵀ/√d) v by hand, head 2 zeroed,
    concatenated, times W_o."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4).eval()
    q, kv, lens = _mha_inputs()
    mha.set_head_mask(torch.tensor([1.0, 1.0, 0.0, 1.0]))
    out = mha(q, kv, kv, lens, need_weights=need_weights)

    def heads(x, W):  # (B, T, 16) → (B, 4, T, 4)
        return (x @ W.weight.T).reshape(x.shape[0], x.shape[1], 4, 4).transpose(1, 2)

    Qh, Kh, Vh = heads(q, mha.W_q), heads(kv, mha.W_k), heads(kv, mha.W_v)
    scores = Qh @ Kh.transpose(-1, -2) / 2.0  # √d = 2
    keep = torch.arange(5)[None, :] < lens[:, None]  # (B, K)
    scores = scores.masked_fill(~keep[:, None, None, :], float("-inf"))
    per_head = torch.softmax(scores, -1) @ Vh  # (B, 4, Q, 4)
    per_head[:, 2] = 0.0
    expected = per_head.transpose(1, 2).reshape(2, 3, 16) @ mha.W_o.weight.T
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)


def test_a_masked_head_gets_no_gradient():
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4)
    q, kv, lens = _mha_inputs()
    mha.set_head_mask(torch.tensor([0.0, 1.0, 1.0, 1.0]))
    mha(q, kv, kv, lens).square().sum().backward()
    rows = slice(0, 4)  # head 0's rows of W_q, W_k, W_v and its columns of W_o
    for W in (mha.W_q, mha.W_k, mha.W_v):
        assert torch.count_nonzero(W.weight.grad[rows]) == 0
        assert torch.count_nonzero(W.weight.grad[4:]) > 0
    assert torch.count_nonzero(mha.W_o.weight.grad[:, rows]) == 0


def test_a_mask_reaches_incremental_decoding_and_the_model_level_mask_is_per_layer():
    """Transformer.set_head_mask((L, H) per kind) masks the same heads in teacher forcing and in
    cached step-by-step decoding: the logits agree."""
    net, batch = _tiny_transformer(), _batch()
    mask = torch.ones(2, 4)
    mask[1, 0] = mask[0, 3] = 0.0
    plain = net(batch["src"], batch["src_valid_lens"], batch["tgt_in"])
    net.set_head_mask({"encoder_decoder": mask, "encoder_self": mask})
    forced = net(batch["src"], batch["src_valid_lens"], batch["tgt_in"])
    assert not torch.allclose(forced, plain)
    state = net.init_state(batch["src"], batch["src_valid_lens"])
    for t in range(batch["tgt_in"].shape[1]):
        logits, *state = net.step(batch["tgt_in"][:, : t + 1], *state)
        torch.testing.assert_close(logits, forced[:, t], rtol=1e-4, atol=1e-5)
    net.set_head_mask(None)
    assert torch.equal(net(batch["src"], batch["src_valid_lens"], batch["tgt_in"]), plain)


def test_bad_masks_are_named():
    net = _tiny_transformer()
    with pytest.raises(ValueError, match=r"give \(layers, heads\) = \(2, 4\)"):
        net.set_head_mask({"encoder_self": torch.ones(4)})
    with pytest.raises(ValueError, match="no attention kind"):
        net.set_head_mask({"cross": torch.ones(2, 4)})
    with pytest.raises(ValueError, match=r"give a \(4,\) mask"):
        MultiHeadAttention(16, 4).set_head_mask(torch.ones(3))


# --- importance -----------------------------------------------------------------------------


def test_importance_masks_each_head_alone_then_prunes_least_important_first():
    """A score that counts the masked heads' (kind, layer, head) in a fixed way shows which masks
    were applied when: head i of 24 costs i + 1 points when masked."""
    net = _tiny_transformer()
    names = head_names(net)
    assert len(names) == 24
    cost = {name: i + 1 for i, name in enumerate(names)}

    def score():
        masked = [
            name
            for name in names
            if (m := net.attention_layers()[name[0]][name[1]].head_mask) is not None and m[name[2]] == 0
        ]
        return 100.0 - sum(cost[n] for n in masked)

    result = head_importance(net, score)
    assert result["score"] == 100.0
    assert [h["importance"] for h in result["heads"]] == [float(i + 1) for i in range(24)]
    assert [p["score"] for p in result["pruning"]] == [100.0 - n * (n + 1) / 2 for n in range(25)]
    assert result["pruning"][1]["head"] == "encoder_self/layer1/head1"
    assert all(a.head_mask is None for layers in net.attention_layers().values() for a in layers)


def test_importance_of_a_model_without_multi_head_attention_is_an_error():
    net = Bahdanau(vocab_size=20, embed_size=8, num_hiddens=16, num_layers=1, dropout=0.0)
    with pytest.raises(ValueError, match="no multi-head attention"):
        head_importance(net, lambda: 0.0)
