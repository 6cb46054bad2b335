"""A corpus read by two DDP nodes (docs/how-to/resume-ddp.md, "A corpus larger than one machine").

The zh-en fixture is tokenized by the real tokenize stage into memory-mapped arrays, then two
processes, started as two nodes are (``MASTER_ADDR``, ``MASTER_PORT``, ``NODE_RANK``;
``device.num_nodes=2``), train on it with Lightning's DDP over gloo
(``tests/helpers/shard_reader.py``). Per epoch, each pair is read by exactly one rank, except the
pairs of the batches that pad the epoch's batch list to a multiple of the world size
(``_EpochBatchSampler`` wraps around to its first batches, as ``DistributedSampler`` does): those
are read once more, by the rank short of a batch, and no other pair is read twice.
"""

import json
import os
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from attnlab.data.batching import PairDataset, TokenBudgetBatchSampler, collate
from attnlab.data.tokenizer import load_split

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "zh-en"
EPOCHS = 2
WORLD = 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _odd_budget(lengths) -> tuple[int, int]:
    """A token budget whose epoch has an odd number of batches, so one batch pads the list."""
    for max_tokens in range(1500, 3000, 7):
        n = len(TokenBudgetBatchSampler(lengths, max_tokens, seed=0))
        if n % WORLD:
            return max_tokens, n
    raise AssertionError("no budget in range gives an odd batch count")


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("shards")
    overrides = [
        f"paths.root={tmp}",
        "data=parallel",
        f"data.path={FIXTURE}",
        "data.src_lang=zh",
        "data.tgt_lang=en",
        "data.vocab_size=300",
    ]
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    subprocess.run(
        [sys.executable, "src/tokenize_data.py", *overrides],
        cwd=ROOT,
        check=True,
        capture_output=True,
        timeout=300,
    )
    tokenized = Path(cfg.paths.tokenized)
    src, tgt = load_split(tokenized / "train")
    train = PairDataset(src, tgt, cfg.data.max_len)
    max_tokens, num_batches = _odd_budget(train.lengths())
    out = tmp / "out"
    out.mkdir()
    port = str(_free_port())
    nodes = []
    for node_rank in range(WORLD):
        env = {
            **os.environ,
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
            "NODE_RANK": str(node_rank),
            "WORLD_SIZE": str(WORLD),
            "OMP_NUM_THREADS": "1",
        }
        nodes.append(
            subprocess.Popen(
                [
                    sys.executable,
                    str(ROOT / "tests/helpers/shard_reader.py"),
                    str(tokenized),
                    str(out),
                    str(EPOCHS),
                    str(max_tokens),
                ],
                cwd=tmp,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    for node in nodes:
        output, _ = node.communicate(timeout=300)
        assert node.returncode == 0, output[-3000:]
    logs = [json.loads((out / f"rank{r}.json").read_text()) for r in range(WORLD)]
    return train, max_tokens, num_batches, logs


def test_the_two_nodes_form_one_world_reading_memory_mapped_arrays(two_nodes):
    _, _, _, logs = two_nodes
    assert [(log["global_rank"], log["node_rank"], log["world_size"]) for log in logs] == [
        (0, 0, 2),
        (1, 1, 2),
    ]
    assert all(log["memory_mapped"] for log in logs)


def test_each_pair_is_read_by_one_rank_per_epoch_but_the_padding_batches(two_nodes):
    train, max_tokens, num_batches, logs = two_nodes
    per_rank = -(-num_batches // WORLD)  # every rank runs this many steps an epoch
    assert [len(log["read"]) for log in logs] == [per_rank * EPOCHS] * WORLD
    padding = per_rank * WORLD - num_batches
    assert padding == 1
    # The epoch's batch list, as one process cuts it (same seed, same epoch).
    single = TokenBudgetBatchSampler(train.lengths(), max_tokens, seed=0)
    for epoch in range(EPOCHS):
        single.set_epoch(epoch)
        batches = list(single)
        reads = [b for log in logs for b in log["read"][epoch * per_rank : (epoch + 1) * per_rank]]
        counts = Counter(i for b in reads for i in b)
        assert set(counts) == set(range(len(train)))  # every pair read
        twice = {i for i, c in counts.items() if c == 2}
        assert max(counts.values()) == 2
        assert twice == set(batches[0])  # the wrapped-around batch, and only it
        # The ranks' batches are the single process's batches, dealt out in turn.
        for rank, log in enumerate(logs):
            mine = log["read"][epoch * per_rank : (epoch + 1) * per_rank]
            assert mine == (batches + batches[:padding])[rank::WORLD]


def test_the_model_receives_the_pairs_each_rank_read(two_nodes):
    train, _, _, logs = two_nodes
    for log in logs:
        assert len(log["received"]) == len(log["read"])
        for indices, row_sums in zip(log["read"], log["received"]):
            expected = collate([train[i] for i in indices])["src"].sum(dim=1).tolist()
            assert row_sums == expected
