"""data=fra_eng_d2l reproduces MTFraEng (D2L 10.5 (zh 9.5)); the four-sentence table
(D2L 11.4.3 (zh 10.4.3), 11.7.6 (zh 10.7.6)).

Known values are the book's printed outputs (D2L 10.5 (zh 9.5): the preprocessed text,
the first six token lists, ``data.build(['hi .'], ['salut .'])``) and
hand-worked examples of its rules.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attnlab.data import d2l
from attnlab.data.datamodule import TranslationDataModule
from attnlab.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, load_tokenizer

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def fra_text(fra_eng_zip):
    return d2l.read_fra_txt(fra_eng_zip)


@pytest.fixture(scope="module")
def mt(fra_text):
    return d2l.mt_fra_eng(fra_text)


def test_preprocess_rules_by_hand():
    assert d2l.preprocess("Go.") == "go ."
    assert d2l.preprocess("Hello,world!") == "hello ,world !"
    assert d2l.preprocess("Already spaced .") == "already spaced ."
    # U+202F / U+00A0 become plain spaces, so no second space is inserted
    assert d2l.preprocess("Cours\u202f!\tQui\xa0?") == "cours !\tqui ?"
    assert d2l.preprocess(".Start") == ".start"  # position 0 never gets a space


def test_preprocessed_corpus_starts_as_printed_in_d2l(fra_text):
    # D2L 10.5.1 (zh 9.5.1) prints text[:80] of the preprocessed corpus
    assert d2l.preprocess(fra_text)[:80] == (
        "go .\tva !\nhi .\tsalut !\nrun !\tcours !\nrun !\tcourez !\nwho ?\tqui ?\nwow !\tça alors !"
    )


def test_first_token_lists_are_d2ls(fra_text):
    src, tgt = d2l.tokenize(d2l.preprocess(fra_text))
    assert src[:6] == [
        ["go", ".", "<eos>"],
        ["hi", ".", "<eos>"],
        ["run", "!", "<eos>"],
        ["run", "!", "<eos>"],
        ["who", "?", "<eos>"],
        ["wow", "!", "<eos>"],
    ]
    assert tgt[:6] == [
        ["va", "!", "<eos>"],
        ["salut", "!", "<eos>"],
        ["cours", "!", "<eos>"],
        ["courez", "!", "<eos>"],
        ["qui", "?", "<eos>"],
        ["ça", "alors", "!", "<eos>"],
    ]


def test_max_examples_reads_one_line_more_and_skips_malformed_lines():
    text = "a .\tb .\nno tab\nc\td\ne\tf\tg\nh\ti\nj\tk"
    src, tgt = d2l.tokenize(text, max_examples=4)  # lines 0..4; lines 1 and 3 are malformed
    assert src == [["a", ".", "<eos>"], ["c", "<eos>"], ["h", "<eos>"]]
    assert tgt == [["b", ".", "<eos>"], ["d", "<eos>"], ["i", "<eos>"]]


def test_pad_or_trim():
    assert d2l.pad_or_trim(["a", "b"], 4) == ["a", "b", "<pad>", "<pad>"]
    assert d2l.pad_or_trim(list("abcdef"), 4) == list("abcd")


def test_vocab_min_freq_sorted_words_after_specials():
    v = d2l.Vocab([["b", "a", "<eos>"], ["a", "c", "<eos>"], ["c", "<pad>"]], min_freq=2)
    assert v.idx_to_token == ["<pad>", "<unk>", "<bos>", "<eos>", "a", "c"]
    assert v.ids(["a", "b", "c", "<eos>"]) == [4, UNK_ID, 5, EOS_ID]
    assert v.to_tokens([5, 4, 0]) == ["c", "a", "<pad>"]
    with pytest.raises(ValueError, match="must start with"):
        d2l.Vocab(tokens=["a", "<pad>", "<unk>", "<bos>", "<eos>"])


def test_build_arrays_by_hand():
    src_v = d2l.Vocab(tokens=[*d2l.SPECIALS, "go", "."])
    tgt_v = d2l.Vocab(tokens=[*d2l.SPECIALS, "!", "va"])
    a = d2l.build_arrays(
        [["go", ".", "<eos>"], list("xxxxx")],
        [["va", "!", "<eos>"], ["va"] * 6],
        num_steps=4,
        src_vocab=src_v,
        tgt_vocab=tgt_v,
    )
    assert a["src"].tolist() == [[4, 5, EOS_ID, PAD_ID], [UNK_ID] * 4]
    assert a["src_valid_lens"].tolist() == [3, 4]
    assert a["tgt_in"].tolist() == [[BOS_ID, 5, 4, EOS_ID], [BOS_ID, 5, 5, 5]]
    assert a["tgt_out"].tolist() == [[5, 4, EOS_ID, PAD_ID], [5, 5, 5, 5]]  # trimmed: no <eos>


def test_mt_fra_eng_has_d2ls_example_count_and_shapes(mt):
    train, val, tok, (src, tgt) = mt
    assert len(src) == 641  # D2L reads lines 0..640 for num_train + num_val = 640
    assert train["src"].shape == (512, 9) and val["src"].shape == (129, 9)
    for part in (train, val):
        assert part["tgt_in"].shape == part["tgt_out"].shape == part["src"].shape
        assert torch.equal(part["src_valid_lens"], (part["src"] != PAD_ID).sum(1))
        assert torch.all(part["tgt_in"][:, 0] == BOS_ID)
        assert torch.equal(part["tgt_in"][:, 1:], part["tgt_out"][:, :-1])  # shifted by one
    assert tok.src_vocab.to_tokens(train["src"][0]) == ["go", ".", "<eos>"] + ["<pad>"] * 6
    assert tok.tgt_vocab.to_tokens(train["tgt_out"][0]) == ["va", "!", "<eos>"] + ["<pad>"] * 6


def test_vocabularies_hold_exactly_the_tokens_seen_twice(mt):
    _, _, tok, (src, tgt) = mt
    from collections import Counter

    for vocab, seqs, extra in ((tok.src_vocab, src, []), (tok.tgt_vocab, tgt, ["<bos>"])):
        counts = Counter(t for s in seqs for t in extra + d2l.pad_or_trim(s, 9))
        expected = {t for t, n in counts.items() if n >= 2} | set(d2l.SPECIALS)
        assert set(vocab.idx_to_token) == expected
        assert len(vocab.idx_to_token) == len(expected)


def test_build_matches_d2ls_printed_example(mt):
    # D2L 10.5.4 (zh 9.5.5): data.build(['hi .'], ['salut .'])
    _, _, tok, _ = mt
    a = d2l.build_arrays([["hi", ".", "<eos>"]], [["salut", ".", "<eos>"]], 9, tok.src_vocab, tok.tgt_vocab)
    assert tok.src_vocab.to_tokens(a["src"][0]) == ["hi", ".", "<eos>"] + ["<pad>"] * 6
    assert (
        tok.tgt_vocab.to_tokens(torch.cat([a["tgt_in"][0], a["tgt_out"][0, -1:]]))
        == ["<bos>", "salut", ".", "<eos>"] + ["<pad>"] * 6
    )
    src, valid = tok.encode_sources(["Hi."])  # the same through the pipeline's entry point
    assert torch.equal(src, a["src"]) and valid.tolist() == [3]


def test_d2l_encode_sources_by_hand():
    """D2L's preprocessing, word ids (<unk> for unknown words), <eos>, then trimmed or padded to
    num_steps; valid lengths count the tokens before the padding."""
    src_vocab = d2l.Vocab(tokens=[*d2l.SPECIALS, "!", ".", "go", "hi"])  # ids 4 5 6 7
    tok = d2l.D2LTokenizer(src_vocab, d2l.Vocab(tokens=list(d2l.SPECIALS)), num_steps=5)
    assert tok.fixed_length is True and tok.source_vocab_size() == 8 and tok.source_id_to_piece(7) == "hi"
    src, valid = tok.encode_sources(["Hi.", "Go away!", "hi hi hi hi hi hi"])
    assert src.dtype == valid.dtype == torch.int64
    assert src.tolist() == [
        [7, 5, EOS_ID, PAD_ID, PAD_ID],  # "hi ." <eos>
        [6, UNK_ID, 4, EOS_ID, PAD_ID],  # "go away !" <eos>
        [7, 7, 7, 7, 7],
    ]  # trimmed: its <eos> cut off
    assert valid.tolist() == [3, 4, 5]
    for i, sentence in enumerate(["Hi.", "Go away!", "hi hi hi hi hi hi"]):  # alone as in the batch
        one, n = tok.encode_sources([sentence])
        assert torch.equal(one[0], src[i]) and n.tolist() == [int(valid[i])]


def test_tokenizer_round_trip_and_datamodule(mt, tmp_path):
    train, val, tok, _ = mt
    tok.save(tmp_path / d2l.VOCAB_FILE)
    d2l.save_arrays(train, tmp_path / "train.npz")
    d2l.save_arrays(val, tmp_path / "val.npz")
    loaded = load_tokenizer(tmp_path)
    assert loaded.src_vocab.idx_to_token == tok.src_vocab.idx_to_token
    assert loaded.tgt_vocab.idx_to_token == tok.tgt_vocab.idx_to_token and loaded.num_steps == 9
    assert (
        loaded.decode(tok.tgt_vocab.ids(["je", "suis", "chez", "moi", ".", "<eos>"])) == "je suis chez moi ."
    )
    assert loaded.decode([BOS_ID, UNK_ID, tok.tgt_vocab["."], EOS_ID, PAD_ID]) == "<unk> ."
    dm = TranslationDataModule(tmp_path, batch_size=128, seed=0)
    assert dm.fixed_length and (dm.vocab_size, dm.src_vocab_size) == (len(tok.tgt_vocab), len(tok.src_vocab))
    batches = list(dm.train_dataloader())
    assert [b["src"].shape[0] for b in batches] == [128] * 4
    rows = torch.cat([b["src"] for b in batches])
    assert sorted(map(tuple, rows.tolist())) == sorted(map(tuple, train["src"].tolist()))  # a permutation
    first = next(iter(dm.val_dataloader()))
    assert torch.equal(first["tgt_out"], val["tgt_out"][:128])  # val is not shuffled
    assert first["counted"].all()


def test_d2l_val_rows_are_counted_once_over_ranks(mt, tmp_path):
    """Under DDP the fixed-length val rows are dealt out in batches like the pairs, the batch
    that pads a short rank marked not counted: the counted rows of all ranks are the split's rows,
    each once (a stand-in for the attached Trainer gives world size and rank)."""
    from types import SimpleNamespace

    _, val, tok, _ = mt
    tok.save(tmp_path / d2l.VOCAB_FILE)
    d2l.save_arrays(val, tmp_path / "val.npz")
    dm = TranslationDataModule(tmp_path, batch_size=16, seed=0)
    n = len(val["src"])
    batches = -(-n // 16)
    world = next(w for w in (3, 4, 5, 7) if batches % w)  # some rank is padded
    read, counted = 0, []
    for rank in range(world):
        dm.trainer = SimpleNamespace(world_size=world, global_rank=rank)
        loader = list(dm.val_dataloader())
        assert len(loader) == -(-batches // world)
        for b in loader:
            read += len(b["src"])
            counted += [tuple(r) for r in torch.cat([b["src"], b["tgt_out"]], 1)[b["counted"]].tolist()]
    assert read > n
    assert sorted(counted) == sorted(tuple(r) for r in torch.cat([val["src"], val["tgt_out"]], 1).tolist())


def test_tied_embeddings_need_a_joint_vocabulary():
    from attnlab.models.transformer import Transformer

    with pytest.raises(ValueError, match="tie_embeddings=false"):
        Transformer(20, d_model=8, num_heads=2, num_layers=1, ffn_hidden=8, src_vocab_size=10)
    net = Transformer(
        20, d_model=8, num_heads=2, num_layers=1, ffn_hidden=8, src_vocab_size=10, tie_embeddings=False
    )
    assert net.src_embedding.num_embeddings == 10 and net.output.out_features == 20


@pytest.mark.slow
def test_reproduce_d2l_script_matches_the_books_results(fra_eng_zip, tmp_path):
    """scripts/reproduce_d2l.sh trains both models with D2L's settings on CPU and prints
    D2L's table; the book gets BLEU 1.000 on ≥ 3 of the 4 sentences with each model."""
    raw = tmp_path / "data" / "raw"
    raw.mkdir(parents=True)
    os.symlink(fra_eng_zip, raw / "fra-eng.zip")
    env = {**os.environ, "PYTHON": sys.executable, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db"}
    r = subprocess.run(
        [
            "scripts/reproduce_d2l.sh",
            f"paths.root={tmp_path}",
            "heatmaps.sentences=[0]",
            f"hydra.run.dir={tmp_path}/outputs",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    print(r.stdout)
    assert r.returncode == 0, r.stderr[-3000:]
    for model in ("bahdanau", "transformer"):
        table = json.loads((tmp_path / "d2l" / "metrics" / f"d2l_{model}.json").read_text())
        rows = table["rows"]
        assert [row["source"] for row in rows] == ["go .", "i lost .", "he's calm .", "i'm home ."]
        for row in rows:  # the table line is D2L's format with D2L's bleu(k=2)
            assert f"{row['source']} => {row['translation']}, bleu,{row['bleu']:.3f}" in r.stdout
        assert table["num_perfect"] == sum(row["bleu"] == 1.0 for row in rows) >= 3, r.stdout
        assert f"{model}: BLEU 1.000 on {table['num_perfect']} of 4 sentences" in r.stdout
    # the default pipeline's outputs stay untouched
    assert not (tmp_path / "checkpoints").exists() and not (tmp_path / "plots").exists()
    for model in ("bahdanau", "transformer"):
        history = (tmp_path / "d2l" / "plots" / model / "history.csv").read_text().splitlines()
        assert history[-1].startswith("30,"), history[-1]  # one row per epoch, the last is 30
        assert not (tmp_path / "d2l" / "plots" / model / "attention" / "epochs").exists()  # profile: off
    # heatmaps with D2L's word labels, in the store under paths.root (not the working directory)
    for name in ("sent0_alignment_layer1.png", "sent0_encoder_decoder_layer2.png"):
        found = list((tmp_path / "mlruns").rglob(name))
        assert found and found[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
