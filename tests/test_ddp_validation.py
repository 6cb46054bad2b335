"""Validation scores every val pair once, on any number of DDP ranks (issue 37, section 4).

Under DDP every rank must run the same number of validation steps, so the batch sampler pads a
short rank with a repeat of another rank's batch (:class:`attnlab.data.batching._EpochBatchSampler`).
Those repeats are read but not counted: ``val_loss``, ``val_bleu`` and ``val_chrf`` on 2, 3 and 4
CPU ranks (real Lightning DDP over gloo, ``tests/helpers/val_scorer.py``) equal the
single-process scores of the same checkpoint, and ``val_loss`` covers exactly the split's pairs.

The corpus has 37 val pairs, in 13 batches of 3: 13 is not a multiple of 2, 3 or 4, so every
world size pads (1, 2 and 3 repeated batches); with batches of 16 there are 3 batches, fewer
than 4 ranks, and rank 3 reads nothing but a repeat.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from helpers.corpus_fixture import sentences
from helpers.tiny_train import ROOT, TINY, env

NUM_VAL = 37
SMALL, LARGE = 3, 16  # val batch sizes: 13 batches, and 3 batches (fewer than 4 ranks)


def _overrides(root: Path, batch_size: int) -> list[str]:
    return [
        f"paths.root={root}",
        "data=parallel",
        f"data.path={root / 'corpus'}",
        "data.src_lang=en",
        "data.tgt_lang=fr",
        "data.vocab_size=150",
        f"data.val_bleu_sentences={NUM_VAL}",  # val_bleu over the whole split
        *(a for a in TINY if a.split("=")[0].startswith(("model", "device", "heatmaps"))),
        f"model.batch_size={batch_size}",
        "heatmaps.head_stats_sentences=0",
    ]


def _write_corpus(folder: Path) -> None:
    """48 training pairs, 37 val pairs (another order of the same sentences), 5 test pairs."""
    folder.mkdir(parents=True)
    splits = {"train": sentences(0), "val": sentences(1)[:NUM_VAL], "test": sentences(2)[:5]}
    for split, triples in splits.items():
        for lang, column in (("en", 0), ("fr", 1)):
            (folder / f"{split}.{lang}").write_text("".join(t[column] + "\n" for t in triples))


def _run(args: list[str], timeout: int = 300) -> None:
    result = subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env(OMP_NUM_THREADS="1"),
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A tokenized corpus and a checkpoint trained on it by the real train.py (one process)."""
    root = tmp_path_factory.mktemp("ddp_val")
    _write_corpus(root / "corpus")
    tiny = _overrides(root, SMALL)
    _run(["src/tokenize_data.py", *tiny[:6], f"hydra.run.dir={root}/outputs/tokenize"])
    _run(
        [
            "src/train.py",
            *tiny,
            "trainer.max_epochs=8",
            "optimizer.lr=0.005",
            "trainer.enable_progress_bar=false",
            "trainer.deterministic=true",
            "checkpoint.monitor=null",
            "checkpoint.filename=final",
            f"hydra.run.dir={root}/outputs/run",
        ]
    )
    return root


_scores: dict[tuple[Path, int, int], list[dict]] = {}


def validate(root: Path, devices: int, batch_size: int) -> list[dict]:
    """The per-rank records of ``val_scorer.py`` on ``devices`` ranks (run once per setting)."""
    key = (root, devices, batch_size)
    if key not in _scores:
        out = root / f"val_{devices}x{batch_size}"
        out.mkdir()
        config = out / "overrides.json"
        config.write_text(json.dumps(_overrides(root, batch_size)))
        ckpt = root / "checkpoints/transformer/final.ckpt"
        _run(["tests/helpers/val_scorer.py", str(config), str(ckpt), str(out), str(devices)])
        _scores[key] = [json.loads((out / f"rank{r}.json").read_text()) for r in range(devices)]
    return _scores[key]


def test_one_process_scores_each_val_pair_once_with_the_reference_loss(project):
    from attnlab.checkpoint import load_net
    from attnlab.data.batching import collate
    from attnlab.data.tokenizer import PAD_ID, load_split

    (record,) = validate(project, 1, SMALL)
    assert sorted(i for batch in record["read"] for i in batch) == list(range(NUM_VAL))
    assert record["pairs"] == NUM_VAL
    # Reference: summed token cross-entropy over the whole split in one batch / its token count.
    src, tgt = load_split(project / "data/tokenized/parallel-en-fr/val")
    batch = collate([(src[i], tgt[i]) for i in range(NUM_VAL)])
    net = load_net(project / "checkpoints/transformer/final.ckpt", expected_kind="transformer").eval()
    with torch.no_grad():
        logits = net(batch["src"], batch["src_valid_lens"], batch["tgt_in"])
    labels = batch["tgt_out"].flatten()
    loss = F.cross_entropy(logits.flatten(0, 1), labels, ignore_index=PAD_ID, reduction="sum")
    tokens = int((labels != PAD_ID).sum())
    assert tokens == sum(len(t) + 1 for t in tgt)  # every target token and its <eos>
    # float32 throughout, the split in 13 batches here and one batch there: rounding only
    assert record["metrics"]["val_loss"] == pytest.approx(loss.item() / tokens, rel=1e-5)
    assert record["metrics"]["val_bleu"] > 0  # the comparisons below can tell hypotheses apart


@pytest.mark.parametrize("devices", [2, 3, 4])
def test_n_ranks_score_each_val_pair_once_as_one_process_does(project, devices):
    (single,) = validate(project, 1, SMALL)
    ranks = validate(project, devices, SMALL)
    assert [r["world_size"] for r in ranks] == [devices] * devices
    # Every rank ran the same number of steps, so pairs were read more than once ...
    steps = -(-13 // devices)
    assert [len(r["read"]) for r in ranks] == [steps] * devices
    reads = Counter(i for r in ranks for batch in r["read"] for i in batch)
    assert set(reads) == set(range(NUM_VAL))
    assert sum(reads.values()) == NUM_VAL + SMALL * (steps * devices - 13)
    # ... but each is scored once: the metrics are the single process's.
    for r in ranks:
        assert r["pairs"] == NUM_VAL
        # Each batch's loss is computed as in the single process (same batch, same 1-thread CPU
        # code); only the order in which 13 float32 batch sums are added differs: at most 13
        # roundings of 2**-24 (relative) each, under 1e-6 (seen: one float32 ulp, 1.1e-7).
        assert r["metrics"]["val_loss"] == pytest.approx(single["metrics"]["val_loss"], rel=1e-6, abs=0)
        # Corpus BLEU and chrF are functions of summed integer statistics of the same greedy
        # translations: equal up to the float64 formula's last bit.
        for key in ("val_bleu", "val_chrf"):
            assert r["metrics"][key] == pytest.approx(single["metrics"][key], rel=1e-12, abs=0)


def test_a_rank_with_only_a_repeated_batch_counts_nothing(project):
    """3 batches of 16 on 4 ranks: rank 3's only step repeats rank 0's batch."""
    (single,) = validate(project, 1, LARGE)
    ranks = validate(project, 4, LARGE)
    assert [len(r["read"]) for r in ranks] == [1, 1, 1, 1]
    assert ranks[3]["read"] == ranks[0]["read"]
    for r in ranks:
        assert r["pairs"] == NUM_VAL
        assert r["metrics"]["val_loss"] == pytest.approx(single["metrics"]["val_loss"], rel=1e-6, abs=0)
        assert r["metrics"]["val_bleu"] == pytest.approx(single["metrics"]["val_bleu"], rel=1e-12, abs=0)


# --- the image models and Nadaraya–Watson: in-memory splits shared out by RankShard ------------

TASKS = {
    "vit": ["model=vit", "data.subset=50", "model.batch_size=8"],  # 50 val images: 17, 17, 16
    "nw": ["model=nw"],  # D2L's 50 test points, one batch per rank
}


def _task_scores(root: Path, overrides: list[str], devices: int) -> list[dict]:
    out = root / f"{devices}_ranks"
    out.mkdir()
    (out / "overrides.json").write_text(json.dumps([*overrides, "device=cpu", f"paths.root={root}"]))
    _run(["tests/helpers/task_val_scorer.py", str(out / "overrides.json"), str(out), str(devices)])
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(devices)]


@pytest.mark.parametrize("task", list(TASKS))
def test_the_image_and_nw_models_score_each_val_item_once_on_3_ranks(tmp_path, task):
    from hydra import compose, initialize_config_dir
    from hydra.utils import get_class

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[*TASKS[task], f"paths.root={tmp_path}"])
    _, (_, val) = get_class(cfg.model.task.module).from_config(cfg)
    num_val = len(val.dataset)
    (single,) = _task_scores(tmp_path, TASKS[task], 1)
    ranks = _task_scores(tmp_path, TASKS[task], 3)
    assert single["scored"] == num_val == 50
    # each rank its share, every item once: 17 + 17 + 16
    assert [r["scored"] for r in ranks] == [len(range(r, num_val, 3)) for r in range(3)]
    for r in ranks:
        for key, value in single["metrics"].items():  # val_loss (and val_acc): reduced over ranks
            # the same per-item values (seeded weights, 1-thread CPU), summed in another order
            assert r["metrics"][key] == pytest.approx(value, rel=1e-6, abs=0), key


def test_a_rank_shard_reads_every_index_once(monkeypatch):
    from attnlab.errors import ConfigError
    from attnlab.lit import shards

    assert list(shards.RankShard(5)) == [0, 1, 2, 3, 4]  # outside DDP: all, in order
    seen = []
    for rank in range(4):
        monkeypatch.setattr(shards, "rank_and_world", lambda rank=rank: (rank, 4))
        seen.append(list(shards.RankShard(10)))
        assert len(shards.RankShard(10)) == len(seen[-1])
    assert seen == [[0, 4, 8], [1, 5, 9], [2, 6], [3, 7]]
    with pytest.raises(ConfigError, match="a validation split of 3 item"):
        list(shards.RankShard(3))
