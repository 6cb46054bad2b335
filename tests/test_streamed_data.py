"""Tokenizing streamed and training from memory-mapped arrays (``attnlab.data.corpora``,
``attnlab.data.tokenizer``, ``attnlab.data.batching``) give what reading whole files into lists
gave: the same sentencepiece model bytes, the same ids per sentence, the same held-out splits
in the same order, the same batches. The list-based code they replaced is kept here, as the
reference each test compares with: ``_reference_*`` below.

Also: the readers' errors when streamed (the error that reading the whole file would have
raised first), the ``.npy`` layout and memory-mapped reading.
"""

import gzip
import importlib.util
import io
import json
import pickle
import random
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import sentencepiece as spm
import torch
from hydra import compose, initialize_config_dir

from attnlab.data import batching
from attnlab.data.corpora import (
    CorpusError,
    heldout_order,
    iter_fra_eng,
    iter_lines,
    iter_parallel,
    iter_tsv,
    normalize,
    split_heldout,
)
from attnlab.data.datamodule import TranslationDataModule
from attnlab.data.special_tokens import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from attnlab.data.tokenizer import (
    NpyWriter,
    filter_mask,
    filter_pairs,
    load_split,
    split_files,
)
from helpers import zh_en_corpus
from helpers.corpus_fixture import sentences

ROOT = Path(__file__).resolve().parents[1]


# --- the reference: today's list-based code, kept to compare with ----------------------------

_SPACES = re.compile(r"[\s\u202f\u00a0]+")


def _reference_normalize(line: str) -> str:
    return _SPACES.sub(" ", line).strip()


def _reference_lines(path: Path) -> list[str]:
    """A whole file read, decoded, split on newlines and normalized (the old read_lines)."""
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    lines = raw.decode("utf-8").split("\n")
    if lines[-1] == "":
        lines.pop()
    return [_reference_normalize(line) for line in lines]


def _reference_pairs(src: Path, tgt: Path) -> list[tuple[str, str]]:
    return list(zip(_reference_lines(src), _reference_lines(tgt), strict=True))


def _reference_fra_eng(zip_path: Path) -> list[tuple[str, str]]:
    with zipfile.ZipFile(zip_path) as zf:
        text = zf.read("fra-eng/fra.txt").decode("utf-8")
    pairs = []
    for line in text.split("\n"):
        if line.strip():
            cols = line.split("\t")
            pairs.append((_reference_normalize(cols[0]), _reference_normalize(cols[1])))
    return pairs


def _reference_tokenize(
    splits: dict, vocab_size: int, max_len: int, sample: int = 0, coverage: float = 1.0
) -> tuple[bytes, dict]:
    """The old tokenize stage on lists: (spm.model bytes, split → {"src.ids": …, …} arrays)."""
    from sentencepiece import sentencepiece_model_pb2

    usable = [(s, t) for s, t in splits["train"] if s and t]
    text = [x for pair in usable for x in pair]
    options = {}
    if sample:
        spm.set_random_generator_seed(0)
        options = {"input_sentence_size": sample, "shuffle_input_sentence": True}
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(text), model_writer=model, vocab_size=vocab_size, model_type="bpe",
        character_coverage=coverage, pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID,
        hard_vocab_limit=False, seed_sentencepiece_size=1_000_000, num_threads=1, minloglevel=2, **options,
    )  # fmt: skip
    proto = sentencepiece_model_pb2.ModelProto.FromString(model.getvalue())
    proto.trainer_spec.ClearField("num_threads")
    sp = spm.SentencePieceProcessor(model_proto=proto.SerializeToString())
    arrays = {}
    for name, pairs in splits.items():
        src, tgt = sp.encode([s for s, _ in pairs]), sp.encode([t for _, t in pairs])
        if name == "train":
            keep = [i for i in range(len(src)) if 0 < len(src[i]) < max_len and 0 < len(tgt[i]) < max_len]
            src, tgt = [src[i] for i in keep], [tgt[i] for i in keep]
        arrays[name] = {}
        for side, seqs in (("src", src), ("tgt", tgt)):
            offsets = np.zeros(len(seqs) + 1, dtype=np.int64)
            offsets[1:] = np.cumsum([len(s) for s in seqs])
            ids = np.fromiter((t for s in seqs for t in s), dtype=np.int32, count=int(offsets[-1]))
            arrays[name][f"{side}.ids"], arrays[name][f"{side}.offsets"] = ids, offsets
    return proto.SerializeToString(), arrays


def _assert_same_as_reference(out: Path, model: bytes, arrays: dict) -> None:
    assert (out / "spm.model").read_bytes() == model
    assert sorted(p.name for p in out.glob("*.npy")) == sorted(
        p.name for name in arrays for p in split_files(out / name).values()
    )
    for name, expected in arrays.items():
        for key, path in split_files(out / name).items():
            got = np.load(path, mmap_mode="r")
            assert got.dtype == expected[key].dtype and np.array_equal(got, expected[key]), f"{name} {key}"


def _tokenize(root: Path, *overrides):
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"paths.root={root}", *overrides])
    spec = importlib.util.spec_from_file_location("tokenize_data_app", ROOT / "src" / "tokenize_data.py")
    app = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(app)
    app.main(cfg)
    return Path(cfg.paths.tokenized)


def _gz(path: Path, lines) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress("".join(f"{s}\n" for s in lines).encode(), mtime=0))
    return path


# --- byte-identical: the tiny corpus, the real Multi30k and fra_eng, held-out splits ----------


def test_tiny_multi30k_with_empty_and_long_lines_gives_the_lists_bytes(tmp_path):
    long = " ".join(["a dog sees the sea"] * 10)
    train = [(e, f) for e, f, _ in sentences()[:40]]
    train[5:5] = [("", "Un chien."), ("A dog.", " \u00a0 "), (long, "Un chien."), ("\u202f", "")]
    splits = {
        "train": train,
        "val": [(e, f) for e, f, _ in sentences()[40:44]] + [("", "Rien."), (long, "Long.")],
        "test": [(e, f) for e, f, _ in sentences()[44:]],
        "test_2017": [("A cat.", ""), ("Two  cats\u202f!", "Deux chats !")],
    }
    stems = {"train": "train", "val": "val", "test": "test_2016_flickr", "test_2017": "test_2017_flickr"}
    raw = tmp_path / "data/raw/multi30k"
    for name, pairs in splits.items():
        _gz(raw / f"{stems[name]}.en.gz", [s for s, _ in pairs])
        _gz(raw / f"{stems[name]}.fr.gz", [t for _, t in pairs])
    out = _tokenize(tmp_path, "data=multi30k", "data.max_len=45", "data.vocab_size=300")
    read = {
        k: list(zip(*(_reference_lines(raw / f"{stems[k]}.{lang}.gz") for lang in ("en", "fr"))))
        for k in stems
    }
    _assert_same_as_reference(out, *_reference_tokenize(read, 300, 45))
    assert json.loads((out / "stats.json").read_text())["splits"]["train"] == {
        "pairs": 44, "empty": 3, "too_long": 1, "kept": 40,
    }  # fmt: skip
    assert (out / "test_2017.src.txt").read_text() == "A cat.\nTwo cats !\n"


def test_real_multi30k_gives_the_lists_model_and_ids(tmp_path, mirror_dir):
    (tmp_path / "data/raw").mkdir(parents=True)
    (tmp_path / "data/raw/multi30k").symlink_to(mirror_dir / "multi30k")
    out = _tokenize(tmp_path, "data=multi30k")  # conf/data/multi30k.yaml: en→fr, 5000 pieces, max_len 100
    m30k = mirror_dir / "multi30k"
    stems = {"train": "train", "val": "val", "test": "test_2016_flickr", "test_2017": "test_2017_flickr"}
    read = {k: _reference_pairs(m30k / f"{stem}.en.gz", m30k / f"{stem}.fr.gz") for k, stem in stems.items()}
    _assert_same_as_reference(out, *_reference_tokenize(read, 5000, 100))


def test_real_fra_eng_held_out_splits_and_training_order_are_the_lists(tmp_path, fra_eng_zip):
    (tmp_path / "data/raw").mkdir(parents=True)
    (tmp_path / "data/raw/fra-eng.zip").symlink_to(fra_eng_zip)
    out = _tokenize(tmp_path, "data=fra_eng")  # 167,130 pairs; val and test 2000 each, seed 0
    read = split_heldout(_reference_fra_eng(fra_eng_zip), 2000, 2000, 0)
    _assert_same_as_reference(out, *_reference_tokenize(read, 8000, 60))
    assert _reference_lines(out / "val.tgt.txt") == [t for _, t in read["val"]]


def test_parallel_corpus_with_held_out_val_and_test_is_the_lists(tmp_path):
    folder = tmp_path / "corpus"
    zh_en_corpus.write(folder)
    for p in folder.glob("[vt][ae]*.gz"):  # val and test files gone: both held out of train
        p.unlink()
    out = _tokenize(
        tmp_path, "data=parallel", f"data.path={folder}", "data.src_lang=zh", "data.tgt_lang=en",
        "data.vocab_size=500", "data.heldout.num_val=300", "data.heldout.num_test=200",
    )  # fmt: skip
    train = _reference_pairs(folder / "train.zh.gz", folder / "train.en.gz")
    read = split_heldout(train, 300, 200, 0)
    # conf/data/parallel.yaml samples 1,000,000 sentences: all 31,000 here, sentencepiece's option as
    # ever; Chinese text: character_coverage 0.9995
    model, arrays = _reference_tokenize(read, 500, 100, sample=1_000_000, coverage=0.9995)
    _assert_same_as_reference(out, model, arrays)


@pytest.mark.parametrize(
    "n, num_val, num_test", [(0, 2, 3), (1, 0, 1), (7, 2, 3), (1000, 100, 50), (30, 20, 20)]
)
@pytest.mark.parametrize("seed", [0, 5])
def test_heldout_order_is_split_heldouts_shuffle(n, num_val, num_test, seed):
    expected = split_heldout(list(range(n)), num_val, num_test, seed)
    got = heldout_order(n, num_val, num_test, seed)
    assert {k: v.tolist() for k, v in got.items()} == expected
    assert got["train"].dtype == np.uint32  # 4 bytes a pair


def test_normalize_is_the_regex_on_every_code_point():
    for c in map(chr, range(0x110000)):
        if not 0xD800 <= ord(c) <= 0xDFFF:
            for s in (c, f"a{c}{c}b ", f" x{c}"):
                assert normalize(s) == _reference_normalize(s), hex(ord(c))


def test_the_filter_on_token_counts_is_the_rule_of_filter_pairs():
    rng = np.random.default_rng(0)
    ls, lt = rng.integers(0, 12, 2000), rng.integers(0, 12, 2000)
    keep, counts = filter_mask(ls, lt, 10)
    assert (np.flatnonzero(keep).tolist(), counts) == filter_pairs(
        [[1] * k for k in ls], [[1] * k for k in lt], 10
    )


def test_a_sentence_sample_is_the_same_in_a_fresh_process(tmp_path):
    """sentencepiece's own sampling (shuffle_input_sentence) draws another sample in every
    process whatever set_random_generator_seed says; ours is drawn by random.Random(0)."""
    code = (
        "import hashlib, sys; sys.path.insert(0, 'tests'); from helpers import zh_en_corpus; "
        "from attnlab.data.tokenizer import train_sentencepiece; "
        "text = [s for p in zh_en_corpus.pairs()['train'][:2000] for s in p]; "
        f"train_sentencepiece(text, {str(tmp_path)!r} + '/' + sys.argv[1], 300, input_sentence_size=200)"
    )
    for name in ("a", "b"):
        subprocess.run([sys.executable, "-c", code, name], cwd=ROOT, check=True)
    assert (tmp_path / "a.model").read_bytes() == (tmp_path / "b.model").read_bytes()


# --- the streamed readers: the error that reading the whole file raised first ------------------


def test_a_truncated_gzip_is_reported_before_an_earlier_bad_byte(tmp_path):
    data = gzip.compress(
        b"fine\nbad \xff byte\n" + "".join(f"line {i}\n" for i in range(9000)).encode(), mtime=0
    )
    path = tmp_path / "train.en.gz"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CorpusError, match=r"train\.en\.gz is truncated or corrupt \(EOFError"):
        list(iter_lines(path))


def test_a_bad_byte_far_into_a_file_names_its_line(tmp_path):
    path = tmp_path / "train.fr"
    path.write_bytes(b"un\n" * 9000 + "caf\u00e9\n".encode("latin-1") + b"deux\n")
    with pytest.raises(
        CorpusError, match=r"train\.fr: line 9001 is not valid UTF-8 \(invalid continuation byte\)"
    ):
        list(iter_lines(path))


def test_the_source_files_error_comes_before_the_targets(tmp_path):
    src, tgt = tmp_path / "train.en", tmp_path / "train.fr"
    src.write_bytes(b"a\n" * 6000 + b"\xff\n")
    tgt.write_bytes(b"\xff\n" + b"b\n" * 6000)
    with pytest.raises(CorpusError, match=r"train\.en: line 6001 is not valid UTF-8"):
        list(iter_parallel(src, tgt))
    src.write_bytes(b"a\n" * 6001)
    with pytest.raises(CorpusError, match=r"train\.fr: line 1 is not valid UTF-8"):
        list(iter_parallel(src, tgt))


@pytest.mark.parametrize("n_src, n_tgt", [(5000, 4000), (4000, 9000), (4096, 4097), (4097, 4096), (0, 3)])
def test_unequal_line_counts_name_both_full_counts(tmp_path, n_src, n_tgt):
    src, tgt = tmp_path / "train.en", tmp_path / "train.fr"
    src.write_text("a\n" * n_src)
    tgt.write_text("b\n" * n_tgt)
    with pytest.raises(CorpusError, match=rf"train\.en has {n_src} lines, .*train\.fr has {n_tgt}; "):
        list(iter_parallel(src, tgt))


def test_a_bad_byte_after_a_missing_tab_is_the_error(tmp_path):
    """Reading whole, the decoding failed before any line was split on its tab."""
    path = tmp_path / "train.tsv"
    path.write_bytes(b"a\tb\nno tab here\n" + b"a\tb\n" * 5000 + b"\xff\tx\n")
    with pytest.raises(CorpusError, match=r"train\.tsv: line 5003 is not valid UTF-8"):
        list(iter_tsv(path))
    path.write_bytes(b"a\tb\n" * 5000 + b"two\ttabs\there\n")
    with pytest.raises(CorpusError, match=r"train\.tsv: line 5001 has 2 tabs"):
        list(iter_tsv(path))


def test_fra_txt_line_numbers_count_blank_lines_across_chunks(tmp_path):
    path = tmp_path / "fra-eng.zip"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("fra-eng/fra.txt", "Go.\tVa !\n\n" * 3000 + "no tab\n")
    with pytest.raises(CorpusError, match=r"fra-eng\.zip:fra-eng/fra\.txt line 6001 has no tab separator"):
        list(iter_fra_eng(path))


# --- the arrays: .npy files, memory-mapped reading ----------------------------------------------


def test_an_npy_written_in_slices_loads_memory_mapped(tmp_path):
    w = NpyWriter(tmp_path / "a.npy", np.int32)
    for part in (np.arange(3), np.arange(0), np.arange(100_000)):
        w.append(part)
    w.close()
    a = np.load(tmp_path / "a.npy", mmap_mode="r")
    assert isinstance(a, np.memmap) and a.dtype == np.int32 and a.shape == (100_003,)
    assert a[:3].tolist() == [0, 1, 2] and int(a[-1]) == 99_999
    assert a.offset == 128  # numpy's header, written first for 0 and rewritten in place
    NpyWriter(tmp_path / "b.npy", np.int64).close()
    assert np.load(tmp_path / "b.npy").shape == (0,)


@pytest.fixture(scope="module")
def tiny_tokenized(tmp_path_factory):
    """The tiny Multi30k corpus tokenized: (folder, sentencepiece model, the pairs per split)."""
    from helpers.corpus_fixture import write_mirror

    root = tmp_path_factory.mktemp("tiny")
    write_mirror(root / "data" / "raw")
    out = _tokenize(root, "data=multi30k", "data.vocab_size=120")
    raw = root / "data/raw/multi30k"
    pairs = {k: _reference_pairs(raw / f"{k}.en.gz", raw / f"{k}.fr.gz") for k in ("train", "val")}
    return out, spm.SentencePieceProcessor(model_file=str(out / "spm.model")), pairs


def test_an_opened_dataset_holds_memory_maps_and_reads_the_right_ids(tiny_tokenized):
    out, sp, pairs = tiny_tokenized
    dm = TranslationDataModule(out, batch_size=8, max_len=100)
    ds = dm.dataset("train")
    assert all(isinstance(a, np.memmap) for a in (ds.src.ids, ds.src.offsets, ds.tgt.ids, ds.tgt.offsets))
    assert len(ds) == 40 and ds.num_dropped == 0 and ds.src.index is None
    for i in (0, 17, 39):
        s, t = ds[i]
        assert isinstance(s, np.memmap) and np.shares_memory(s, ds.src.ids)  # a view of the map
        assert (s.tolist(), t.tolist()) == (sp.encode(pairs["train"][i][0]), sp.encode(pairs["train"][i][1]))
    batch = ds.__getitems__([39, 0, 17])  # what a DataLoader fetches: read from the files
    assert [(s.tolist(), t.tolist()) for s, t in batch] == [
        (ds[i][0].tolist(), ds[i][1].tolist()) for i in (39, 0, 17)
    ]
    lengths = ds.lengths()
    assert lengths.dtype == np.uint16 and lengths.tolist() == [
        max(len(s), len(t)) + 1 for s, t in (ds[i] for i in range(40))
    ]
    # a pickled side (DataLoader workers under spawn) holds the file's name, not its contents
    assert (
        len(pickle.dumps(ds.src)) < 1000
        and pickle.loads(pickle.dumps(ds.src))[17].tolist() == ds.src[17].tolist()
    )


def test_a_missing_or_old_format_split_names_the_stage(tmp_path):
    with pytest.raises(
        FileNotFoundError, match=r"train\.src\.ids\.npy not found; run `python src/tokenize_data.py`"
    ):
        load_split(tmp_path / "train")
    (tmp_path / "train.npz").write_bytes(b"")
    with pytest.raises(
        FileNotFoundError, match=r"split 'train' in an earlier format \(train\.npz\).*tokenize_data"
    ):
        load_split(tmp_path / "train")


def test_pair_dataset_drops_long_pairs_through_an_index():
    src = [[5] * k for k in (3, 10, 0, 4, 12)]
    tgt = [[6] * k for k in (2, 2, 1, 9, 1)]
    ds = batching.PairDataset(src, tgt, max_len=5)
    assert (len(ds), ds.num_dropped, ds.src.index.tolist()) == (2, 3, [0, 2])
    assert [(s.tolist(), t.tolist()) for s, t in (ds[0], ds[1])] == [([5] * 3, [6] * 2), ([], [6])]
    assert ds.lengths().tolist() == [4, 2] and batching.PairDataset(src, tgt).src.index is None


# --- batches: the samplers against their list-based implementation -----------------------------


class _ReferenceEpochSampler:
    def __init__(self, lengths, shuffle, seed, num_replicas=1, rank=0):
        self.lengths, self.shuffle, self.seed = list(lengths), shuffle, seed
        self.num_replicas, self.rank, self.epoch, self.skip = num_replicas, rank, 0, 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __iter__(self):
        rng = random.Random(self.seed + self.epoch)
        order = list(range(len(self.lengths)))
        if self.shuffle:
            rng.shuffle(order)
        batches = self._cut(order)
        if self.shuffle:
            rng.shuffle(batches)
        if self.num_replicas > 1 and batches:
            total = -(-len(batches) // self.num_replicas) * self.num_replicas
            batches = (batches * (total // len(batches) + 1))[:total][self.rank :: self.num_replicas]
        skip, self.skip = self.skip, 0
        self.epoch += 1
        return iter(batches[skip:])


class _ReferenceBucket(_ReferenceEpochSampler):
    def __init__(self, lengths, batch_size, shuffle=True, seed=0, pool_batches=50, **shard):
        super().__init__(lengths, shuffle, seed, **shard)
        self.batch_size, self.pool = batch_size, batch_size * pool_batches

    def _cut(self, order):
        size = self.pool if self.shuffle else len(order) or 1
        batches = []
        for p in range(0, len(order), size):
            pool = sorted(order[p : p + size], key=lambda i: self.lengths[i])
            batches += [pool[i : i + self.batch_size] for i in range(0, len(pool), self.batch_size)]
        return batches


def _reference_token_budget_batches(lengths, max_tokens, order=None, max_sentences=None):
    if order is None:
        order = sorted(range(len(lengths)), key=lengths.__getitem__)
    batches, cur, longest = [], [], 0
    for i in order:
        m = max(longest, lengths[i])
        if cur and (m * (len(cur) + 1) > max_tokens or len(cur) == (max_sentences or len(order))):
            batches.append(cur)
            cur, m = [], lengths[i]
        cur.append(i)
        longest = m
    if cur:
        batches.append(cur)
    return batches


class _ReferenceTokenBudget(_ReferenceEpochSampler):
    def __init__(self, lengths, max_tokens, shuffle=True, seed=0, **shard):
        super().__init__(lengths, shuffle, seed, **shard)
        self.max_tokens = max_tokens

    def _cut(self, order):
        order.sort(key=self.lengths.__getitem__)
        return _reference_token_budget_batches(self.lengths, self.max_tokens, order)


def _random_lengths(n: int, seed: int) -> list[int]:
    rng = np.random.default_rng(seed)
    return (np.minimum(rng.geometric(0.07, n), 120) + 1).tolist()  # many ties, a long tail


SAMPLERS = {
    "bucket": (batching.BucketBatchSampler, _ReferenceBucket, {"batch_size": 32}),
    "bucket_small_pools": (
        batching.BucketBatchSampler,
        _ReferenceBucket,
        {"batch_size": 7, "pool_batches": 3},
    ),
    "token_budget": (batching.TokenBudgetBatchSampler, _ReferenceTokenBudget, {"max_tokens": 600}),
    "token_budget_tight": (batching.TokenBudgetBatchSampler, _ReferenceTokenBudget, {"max_tokens": 50}),
}


@pytest.mark.parametrize("kind", SAMPLERS)
@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("world", [1, 3])
def test_samplers_give_the_list_implementations_batches(kind, shuffle, world):
    new, reference, kw = SAMPLERS[kind]
    for n, seed in ((3000, 1), (4321, 7), (1, 0), (0, 0)):
        lengths = _random_lengths(n, seed)
        for rank in range(world):
            shard = {"shuffle": shuffle, "seed": seed, "num_replicas": world, "rank": rank, **kw}
            a, b = new(np.asarray(lengths, dtype=np.uint16), **shard), reference(lengths, **shard)
            epochs = [list(a), list(a)]  # epochs 0 and 1
            assert epochs == [list(b), list(b)] and len(a) == len(epochs[0])
            a.set_epoch(5), b.set_epoch(5)
            a.skip = b.skip = 2  # resumed mid-epoch
            assert list(a) == list(b)


def test_token_budget_batches_is_the_list_implementation():
    rng = np.random.default_rng(3)
    for _ in range(50):
        lengths = rng.integers(0, 40, int(rng.integers(0, 300))).tolist()
        for max_tokens, max_sentences in ((1, None), (37, None), (200, 5), (10_000, None)):
            expected = _reference_token_budget_batches(lengths, max_tokens, max_sentences=max_sentences)
            assert batching.token_budget_batches(lengths, max_tokens, max_sentences=max_sentences) == expected


@pytest.mark.parametrize("max_tokens", [None, 2400])
def test_real_multi30k_batches_are_the_lists(tmp_path, mirror_dir, max_tokens):
    """The DataModule's training batches from the memory-mapped arrays against the old path:
    every sentence an array, the list samplers, the old collate."""
    (tmp_path / "data/raw").mkdir(parents=True)
    (tmp_path / "data/raw/multi30k").symlink_to(mirror_dir / "multi30k")
    out = _tokenize(
        tmp_path,
        "data=multi30k",
        "data.vocab_size=2000",
        "data.more_test_splits=[]",
        "~data.splits.test_2017",
    )
    arrays = {k: np.load(p) for k, p in split_files(out / "train").items()}
    src = [arrays["src.ids"][a:b] for a, b in zip(arrays["src.offsets"][:-1], arrays["src.offsets"][1:])]
    tgt = [arrays["tgt.ids"][a:b] for a, b in zip(arrays["tgt.offsets"][:-1], arrays["tgt.offsets"][1:])]
    keep = [i for i in range(len(src)) if len(src[i]) < 40 and len(tgt[i]) < 40]  # max_len 40 drops some
    src, tgt = [src[i] for i in keep], [tgt[i] for i in keep]
    lengths = [max(len(s), len(t)) + 1 for s, t in zip(src, tgt)]
    dm = TranslationDataModule(out, batch_size=64, max_len=40, seed=3, max_tokens=max_tokens)
    assert dm.dataset("train").num_dropped == 29000 - len(keep) > 0
    loader = dm.train_dataloader()
    for epoch in (0, 1):
        reference = (
            _ReferenceTokenBudget(lengths, max_tokens, seed=3)
            if max_tokens
            else _ReferenceBucket(lengths, 64, seed=3)
        )
        reference.set_epoch(epoch)
        loader.batch_sampler.set_epoch(epoch)
        for (indices, batch), _ in zip(zip(reference, loader), range(60)):
            pairs = [(src[i], tgt[i]) for i in indices]
            expected = {
                "src": [list(s) + [EOS_ID] for s, _ in pairs],
                "tgt_in": [[BOS_ID, *t] for _, t in pairs],
                "tgt_out": [[*t, EOS_ID] for _, t in pairs],
            }
            for key, rows in expected.items():
                width = max(map(len, rows))
                assert batch[key].tolist() == [r + [PAD_ID] * (width - len(r)) for r in rows]
            assert batch["src_valid_lens"].tolist() == [len(s) + 1 for s, _ in pairs]
            assert batch["src"].dtype == torch.int64
