"""Decoding: beam search against hand-computed sequence probabilities; the Transformer's
KV-cached step against the full-prefix recomputation; beam 1 against greedy."""

import contextlib
import math
import re

import pytest
import torch

from attnlab.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from attnlab.inference.decoding import beam_search, greedy_decode
from attnlab.models.bahdanau import Bahdanau
from attnlab.models.transformer import Transformer

pytestmark = pytest.mark.usefixtures("one_torch_thread")

A, C = 4, 5  # two ordinary tokens; vocabulary 0..5


class TableModel:
    """Next-token probabilities looked up by the generated prefix (without <bos>)."""

    def __init__(self, table, vocab=6):
        self.table, self.vocab = table, vocab

    def init_state(self, src, valid):
        return (valid,)

    def step(self, ys, valid):
        logits = torch.full((ys.shape[0], self.vocab), -30.0)
        for r, row in enumerate(ys.tolist()):
            prefix = tuple(t for t in row[1:] if t != PAD_ID)
            for tok, p in self.table.get(prefix, {EOS_ID: 1.0}).items():
                logits[r, tok] = math.log(p)
        return logits, valid


def _decode(model, max_len, **kw):
    src, valid = torch.zeros(1, 2, dtype=torch.long), torch.tensor([2])
    if kw.get("beam_size", 1) == 1 and not kw:
        return greedy_decode(model.init_state, model.step, src, valid, max_len)[0].tolist()
    return beam_search(model.init_state, model.step, src, valid, max_len, **kw)[0].tolist()


def test_beam_finds_the_more_probable_sequence_greedy_misses():
    # P(A)=0.6, P(C)=0.4; after A the best is A again (0.35); after C, <eos> (0.9).
    # Greedy: A A (0.6·0.35 = 0.21). Best of length ≤ 2: C <eos> (0.4·0.9 = 0.36).
    table = {(): {A: 0.6, C: 0.4}, (A,): {A: 0.35, C: 0.34, EOS_ID: 0.31}, (C,): {EOS_ID: 0.9, A: 0.1}}
    m = TableModel(table)
    assert _decode(m, 2) == [A, A]
    assert _decode(m, 2, beam_size=2) == [C, EOS_ID]
    assert _decode(m, 2, beam_size=1) == [A, A]  # beam 1 is greedy


def test_length_penalty_alpha_changes_the_winner_as_computed_by_hand():
    # short: <eos> with P 0.5; long: A A <eos> with P 0.5·0.9·0.9.
    table = {(): {EOS_ID: 0.5, A: 0.5}, (A,): {A: 0.9, EOS_ID: 0.1}, (A, A): {EOS_ID: 0.9, A: 0.1}}
    m = TableModel(table)
    short, long = math.log(0.5), math.log(0.5 * 0.9 * 0.9)

    def lp(n, alpha):
        return ((5 + n) / 6) ** alpha

    for alpha in (0.0, 0.6, 1.0, 2.0):
        expect_long = long / lp(3, alpha) > short / lp(1, alpha)
        out = _decode(m, 5, beam_size=2, alpha=alpha)
        assert out[: 3 if expect_long else 1] == ([A, A, EOS_ID] if expect_long else [EOS_ID]), alpha
    assert _decode(m, 5, beam_size=2, alpha=0.0)[0] == EOS_ID  # no normalization: short wins
    assert _decode(m, 5, beam_size=2, alpha=1.0)[:3] == [A, A, EOS_ID]  # 1.0: long wins


def test_greedy_takes_the_first_of_tied_maxima_as_argmax_does():
    """P(A) = P(C) = 0.5 at the first step: greedy takes A, the lower id (torch.argmax's rule,
    which greedy_decode keeps while taking the maximum with the faster ``max``)."""
    m = TableModel({(): {C: 0.5, A: 0.5}, (A,): {EOS_ID: 1.0}, (C,): {EOS_ID: 1.0}})
    assert _decode(m, 3) == [A, EOS_ID]


def test_beam_pads_after_eos_and_stops_when_all_beams_end():
    m = TableModel({(): {A: 0.7, C: 0.3}})  # then <eos> everywhere
    out = _decode(m, 10, beam_size=3)
    assert out == [A, EOS_ID]  # stopped after two steps although max_len is 10


def test_beam_rejects_bad_arguments():
    m = TableModel({})
    with pytest.raises(ValueError, match="beam_size"):
        _decode(m, 3, beam_size=0)
    with pytest.raises(ValueError, match="alpha"):
        _decode(m, 3, beam_size=2, alpha=-1.0)


def _nets(vocab=40):
    torch.manual_seed(0)
    return {
        "transformer": Transformer(
            vocab, d_model=32, num_heads=4, num_layers=2, ffn_hidden=64, dropout=0.0, tie_embeddings=False
        ).eval(),
        "bahdanau": Bahdanau(vocab, embed_size=16, num_hiddens=32, num_layers=2, dropout=0.0).eval(),
    }


class _Ids:
    """A tokenizer whose "sentences" are space-separated ids, padded as sentencepiece's."""

    def encode_sources(self, sentences):
        from attnlab.data.tokenizer import pad_sources

        return pad_sources([[int(t) for t in s.split()] for s in sentences])


def _batch(seed=1):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, 40, (5, 7), generator=g)
    valid = torch.tensor([7, 5, 3, 1, 6])
    src[torch.arange(7)[None, :] >= valid[:, None]] = PAD_ID
    return src, valid


def test_cached_step_equals_full_prefix_recomputation():
    """The KV cache changes only the cost: logits at every step match the uncached decoder
    (1e-5) and greedy / beam tokens are identical."""
    net = _nets()["transformer"]
    src, valid = _batch()
    cached = net.init_state(src, valid)
    full = net.init_state_uncached(src, valid)
    ys = torch.full((5, 1), BOS_ID)
    for _ in range(12):
        lc, *cached = net.step(ys, *cached)
        lf, *full = net.step_uncached(ys, *full)
        torch.testing.assert_close(lc, lf, atol=1e-5, rtol=1e-5)
        ys = torch.cat([ys, lf.argmax(-1, keepdim=True)], 1)
    for decode in (
        lambda i, s: greedy_decode(i, s, src, valid, 20),
        lambda i, s: beam_search(i, s, src, valid, 20, beam_size=4, alpha=0.6),
    ):
        assert torch.equal(
            decode(net.init_state, net.step), decode(net.init_state_uncached, net.step_uncached)
        )


@pytest.mark.parametrize("kind", ["transformer", "bahdanau"])
def test_beam_one_is_greedy_and_batching_changes_nothing(kind):
    net = _nets()[kind]
    src, valid = _batch(2)
    greedy = greedy_decode(net.init_state, net.step, src, valid, 15)
    assert torch.equal(beam_search(net.init_state, net.step, src, valid, 15, beam_size=1), greedy)
    batched = beam_search(net.init_state, net.step, src, valid, 15, beam_size=4)
    for i in range(5):  # the same sentence alone, at its own padded length
        n = int(valid[i])
        alone = beam_search(net.init_state, net.step, src[i : i + 1, :n], valid[i : i + 1], 15, beam_size=4)
        row = batched[i, : alone.shape[1]]
        assert torch.equal(row, alone[0]), i
        assert torch.all(batched[i, alone.shape[1] :] == PAD_ID)


@pytest.mark.parametrize("kind", ["transformer", "bahdanau"])
def test_beam_result_scores_at_least_the_greedy_sequence(kind):
    """With α = 0 the returned hypothesis has log P ≥ the greedy one's (teacher-forced scores)."""
    net = _nets()[kind]
    src, valid = _batch(3)

    def logprob(ys):
        tgt_in = torch.cat([torch.full((ys.shape[0], 1), BOS_ID), ys[:, :-1]], 1)
        logp = torch.log_softmax(net(src, valid, tgt_in), -1).gather(-1, ys[..., None])[..., 0]
        ended = torch.cumsum((ys == EOS_ID).long(), 1) - (ys == EOS_ID).long()  # after the <eos>
        return (logp * (ended == 0)).sum(1)

    greedy = greedy_decode(net.init_state, net.step, src, valid, 15)
    beam = beam_search(net.init_state, net.step, src, valid, 15, beam_size=5)
    T = max(greedy.shape[1], beam.shape[1])
    pad = lambda y: torch.nn.functional.pad(y, (0, T - y.shape[1]), value=PAD_ID)
    assert torch.all(logprob(pad(beam)) >= logprob(pad(greedy)) - 1e-5)


# --- a sentence's output depends on that sentence alone ------------------------------------


class LoopModel:
    """Never ends on its own: after any prefix the next token is A (0.6) or C (0.4), <eos> ≈ 0.

    Its state is each row's source length, so batch-mates with longer sources (and limits)
    are visible to the test but must not change a sentence's own output."""

    def init_state(self, src, valid):
        return (valid,)

    def step(self, ys, valid):
        logits = torch.full((ys.shape[0], 6), -30.0)
        logits[:, A], logits[:, C] = math.log(0.6), math.log(0.4)
        return logits, valid


@pytest.mark.parametrize("beam_size", [1, 3])
def test_each_sentence_stops_at_its_own_limit_in_any_batch(beam_size):
    """Per-sentence limits (a (B,) tensor): a sentence that never emits <eos> gets exactly its
    own limit of tokens, padded after, whatever its batch-mates' limits; alone it is the same."""
    m = LoopModel()
    src, valid = torch.zeros(3, 9, dtype=torch.long), torch.tensor([2, 9, 4])
    limits = torch.tensor([3, 8, 5])
    decode = greedy_decode if beam_size == 1 else (lambda *a: beam_search(*a, beam_size=beam_size, alpha=1.0))
    batched = decode(m.init_state, m.step, src, valid, limits)
    assert batched.shape == (3, 8)
    for i, n in enumerate(limits.tolist()):
        assert batched[i, :n].tolist() == [A] * n  # A is every step's most probable token
        assert batched[i, n:].tolist() == [PAD_ID] * (8 - n)
        alone = decode(m.init_state, m.step, src[i : i + 1], valid[i : i + 1], int(n))
        assert alone[0].tolist() == [A] * n


class Recorded:
    """A model whose ``step`` records, per step, how many rows it was given and whether its state
    tensor is the very object the previous step returned (not gathered in between)."""

    def __init__(self, model):
        self.model, self.rows, self.kept, self._last = model, [], [], None

    def init_state(self, src, valid):
        return self.model.init_state(src, valid)

    def step(self, ys, state):
        self.rows.append(ys.shape[0])
        self.kept.append(state is self._last)
        logits, self._last = self.model.step(ys, state)
        return logits, self._last


@pytest.mark.parametrize("beam_size", [1, 3])
def test_a_sentence_that_has_ended_leaves_the_batch(beam_size):
    """Limits 1, 3 and 5 tokens, no <eos>: the steps see 3, 2, 2, 1, 1 sentences (× beam_size
    hypotheses), and then decoding stops. The state the step returns unchanged is handed back as
    is while no sentence leaves; beam re-ranking does not gather it (every hypothesis of a
    sentence holds the same copy)."""
    m = Recorded(LoopModel())
    src, valid = torch.zeros(3, 4, dtype=torch.long), torch.tensor([4, 4, 4])
    limits = torch.tensor([1, 3, 5])
    if beam_size == 1:
        out = greedy_decode(m.init_state, m.step, src, valid, limits)
    else:
        out = beam_search(m.init_state, m.step, src, valid, limits, beam_size=beam_size)
    assert m.rows == [beam_size * n for n in (3, 2, 2, 1, 1)]
    # after a step that ended a sentence (steps 1 and 3) the state is selected anew; else kept
    assert m.kept == [False, False, True, False, True]
    assert out.tolist() == [[A] + [PAD_ID] * 4, [A] * 3 + [PAD_ID] * 2, [A] * 5]


def test_ended_sentences_leave_the_greedy_batch_once_they_are_a_quarter_of_its_rows():
    """Greedy keeps an ended sentence's row (computed, never written) until the ended ones are
    COMPACT_FRACTION = 1/4 of the rows. Limits 1, 1, 2 and five of 5, no <eos>: after step 1 two
    of 8 rows have ended (1/4: dropped, 6 left); after step 2 one of 6 (< 1/4: kept) and no other
    ends before all do at step 5. So the steps see 8, 6, 6, 6, 6 rows, and each sentence still
    gets exactly its own limit of tokens."""
    from attnlab.inference import decoding

    assert decoding.COMPACT_FRACTION == 0.25
    m = Recorded(LoopModel())
    src, valid = torch.zeros(8, 4, dtype=torch.long), torch.full((8,), 4)
    limits = torch.tensor([1, 1, 2, 5, 5, 5, 5, 5])
    out = greedy_decode(m.init_state, m.step, src, valid, limits)
    assert m.rows == [8, 6, 6, 6, 6]
    assert m.kept == [False, False, True, True, True]
    assert out.tolist() == [[A] * n + [PAD_ID] * (5 - n) for n in limits.tolist()]


class DivergingModel:
    """Its state is replaced once, at the second step, by each row's first token (so the
    hypotheses of a sentence then differ), and handed back untouched after that; the next token's
    probabilities depend on it."""

    def init_state(self, src, valid):
        return (torch.zeros(src.shape[0]),)

    def step(self, ys, first):
        if ys.shape[1] == 2:
            first = ys[:, 1].float()  # a new tensor, different in each hypothesis
        logits = torch.full((ys.shape[0], 6), -30.0)  # <eos> ≈ 0: the limit ends it
        after_a = first == A
        logits[:, A] = torch.where(after_a, math.log(0.3), math.log(0.6))
        logits[:, C] = torch.where(after_a, math.log(0.7), math.log(0.4))
        return logits, first


def test_state_a_step_has_replaced_is_gathered_on_every_later_step():
    """The state is replaced at step 2 and then returned untouched: beam search keeps gathering
    it (steps 3 to 6 get a gathered copy, not the tensor the step returned; before step 2 it is
    init_state's own, never gathered), and gives what it gives when every step returns new
    tensors (which are always gathered)."""
    model = DivergingModel()

    def fresh(ys, first):
        logits, first = model.step(ys, first)
        return logits, first.clone()

    src, valid = torch.zeros(1, 4, dtype=torch.long), torch.tensor([4])
    for beam_size in (2, 3):
        m = Recorded(model)
        kept = beam_search(m.init_state, m.step, src, valid, 6, beam_size=beam_size, alpha=0.5)
        assert m.kept == [False, True, False, False, False, False]
        gathered = beam_search(model.init_state, fresh, src, valid, 6, beam_size=beam_size, alpha=0.5)
        assert kept.tolist() == gathered.tolist()


@pytest.mark.parametrize("beam_size", [1, 3])
def test_no_tokens_for_a_limit_of_zero_or_less(beam_size):
    """A limit ≤ 0 gives no tokens: (B, 0) when every limit is, <pad> rows among others."""
    m = LoopModel()
    src, valid = torch.zeros(3, 4, dtype=torch.long), torch.tensor([4, 4, 4])
    decode = greedy_decode if beam_size == 1 else (lambda *a: beam_search(*a, beam_size=beam_size))
    for limit in (0, -3, torch.tensor([-1, 0, -2])):
        assert decode(m.init_state, m.step, src, valid, limit).shape == (3, 0)
    out = decode(m.init_state, m.step, src, valid, torch.tensor([-1, 2, 0]))
    assert out.tolist() == [[PAD_ID] * 2, [A] * 2, [PAD_ID] * 2]


@pytest.mark.parametrize("beam_size", [1, 3])
@pytest.mark.parametrize("limits", [torch.tensor([5, 5]), torch.tensor(5), torch.tensor([[5], [5], [5]])])
def test_a_limit_tensor_must_give_one_limit_per_sentence(beam_size, limits):
    m = LoopModel()
    src, valid = torch.zeros(3, 4, dtype=torch.long), torch.tensor([4, 4, 4])
    decode = greedy_decode if beam_size == 1 else (lambda *a: beam_search(*a, beam_size=beam_size))
    with pytest.raises(
        ValueError,
        match=r"max_len must be an int or a \(3,\) tensor, one limit per "
        rf"sentence of src; got shape {re.escape(str(tuple(limits.shape)))}",
    ):
        decode(m.init_state, m.step, src, valid, limits)


def test_the_length_limit_is_each_sentences_own():
    """⌊1.5·n + 10⌋ tokens for a source of n tokens (its <eos> counted), at most 256."""
    from attnlab.inference.decoding import max_output_len

    lens = torch.tensor([1, 2, 7, 20, 200])
    assert max_output_len(lens).tolist() == [11, 13, 20, 40, 256]
    assert [max_output_len(int(n)) for n in lens] == [11, 13, 20, 40, 256]


@pytest.mark.parametrize("kind", ["transformer", "bahdanau"])
@pytest.mark.parametrize("beam_size", [1, 5])
def test_translate_gives_each_sentence_the_same_ids_alone_and_in_any_batch(kind, beam_size):
    """A short and a much longer sentence (random weights: no <eos> soon, so the limit decides),
    translated alone, together in both orders and in batches of 1, 2 and 3."""
    from attnlab.inference.decoding import translate

    net = _nets()[kind]
    sentences = ["7 8 9", " ".join(["6"] * 40), "9 9 8 7 6 5 4 8 9 7 6 5"]
    alone = [
        translate(net.init_state, net.step, _Ids(), [s], beam_size=beam_size, alpha=1.0)[0] for s in sentences
    ]
    # the short one stops at its own limit, ⌊1.5 · 4 + 10⌋ = 16 (3 ids and the <eos>): a limit
    # taken from the batch (the long one's is 71) would let it run on
    assert len(alone[0]) == 16
    for order in ([0, 1, 2], [2, 1, 0], [1, 0, 2]):
        for batch_size in (1, 2, 3):
            got = translate(
                net.init_state,
                net.step,
                _Ids(),
                [sentences[i] for i in order],
                batch_size=batch_size,
                beam_size=beam_size,
                alpha=1.0,
            )
            assert got == [alone[i] for i in order], (order, batch_size)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   ",
        "\t\u3000",
        "\u200b",
        "\ufeff",
        "\u200e\u200f",
        "\x7f",
        "\u2060",
        "\u00ad",
        "\u200d\u202e",
        "\x00",
        "\u2028",
    ],
)
def test_a_sentence_with_nothing_to_translate_is_not_decoded(text):
    """Whitespace, control and invisible format characters alone translate to nothing, and no
    step runs for them: whether sentencepiece drops them (zero-width space, BOM, direction
    marks, DEL) or keeps them as <unk> (word joiner, soft hyphen, ZWJ, NUL)."""
    import tempfile
    from pathlib import Path

    from attnlab.data.tokenizer import train_sentencepiece
    from attnlab.inference.decoding import max_output_len, translate
    from helpers.corpus_fixture import sentences

    with tempfile.TemporaryDirectory() as tmp:
        sp = train_sentencepiece([s for t in sentences() for s in t[:2]], Path(tmp) / "spm", 60)
    calls = []

    def init_state(src, valid):
        calls.append(src.shape[0])
        return (valid,)

    out = translate(init_state, LoopModel().step, sp, [text, "A dog.", text], beam_size=2)
    n = len(sp.encode("A dog.")) + 1  # with its <eos>
    assert out[0] == out[2] == [] and out[1] == [A] * max_output_len(n)
    assert calls == [1]  # one batch, holding the one sentence with tokens


def _logit_dtypes(bf16, outer_autocast=False):
    """The dtypes of the logits the Transformer's step returns while ``translate`` decodes."""
    from attnlab.inference.decoding import translate

    net, seen = _nets()["transformer"], []

    def step(ys, *state):
        logits, *state = net.step(ys, *state)
        seen.append(logits.dtype)
        return (logits, *state)

    outer = torch.autocast("cpu", dtype=torch.bfloat16) if outer_autocast else contextlib.nullcontext()
    with outer:
        translate(net.init_state, step, _Ids(), ["7 8 9"], beam_size=1, bf16=bf16)
    return set(seen)


def test_bf16_decoding_runs_the_model_under_bf16_autocast(monkeypatch):
    """bf16=True: the step's matmuls run in bfloat16 (its logits come out bf16); the default
    leaves them float32, and leaves a caller's own autocast on (Lightning's bf16-mixed validation)."""
    from attnlab import config

    monkeypatch.setattr(config, "cpu_flags", lambda: {"amx_bf16"})  # functionally bf16 runs anywhere
    assert _logit_dtypes(bf16=True) == {torch.bfloat16}
    assert _logit_dtypes(bf16=False) == {torch.float32}
    assert _logit_dtypes(bf16=False, outer_autocast=True) == {torch.bfloat16}


def test_bf16_decoding_is_refused_without_bf16_units(monkeypatch):
    from attnlab import config
    from attnlab.inference.decoding import Bf16UnitsError, translate

    monkeypatch.setattr(config, "cpu_flags", lambda: {"avx2", "avx512f"})
    net = _nets()["transformer"]
    with pytest.raises(
        Bf16UnitsError,
        match=r"bf16 decoding \(model.decoding.bf16=true\) needs bf16 "
        r"matrix units, and this cpu has none .*decode in float32 "
        r"\(model.decoding.bf16=false\)",
    ):
        translate(net.init_state, net.step, _Ids(), ["7 8 9"], bf16=True)
