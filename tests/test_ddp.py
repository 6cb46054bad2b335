"""Lightning DDP on CPU (gloo): two processes of the real `src/train.py` on the tiny corpus.

Each rank trains on its half of the batches; rank 1 is started by Lightning into
rank 0's Hydra run directory; one MLflow run is created; `val_bleu` (and `val_chrf`)
is the corpus score of the whole validation set, each sentence translated once (each
rank translates its share, torchmetrics sums the sacreBLEU statistics); evaluation
scores the whole test set once.
"""

import json
import subprocess
import sys

import pytest

from helpers.tiny_train import ROOT, STEPS_PER_EPOCH, env, history, make_project, mlflow_client, runs, train

EPOCHS = 6
ARGS = (
    "device=ddp",
    f"trainer.max_epochs={EPOCHS}",
    "optimizer.lr=0.005",
    "checkpoint.monitor=null",
    "checkpoint.filename=final",
)


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    root = make_project(tmp_path_factory.mktemp("ddp"))
    result = train(root, *ARGS, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return root, result


def test_two_ranks_share_rank0_hydra_dir_and_one_mlflow_run(ddp_run):
    root, result = ddp_run
    assert "Starting with 2 processes" in result.stderr
    ckpt = root / "checkpoints/transformer/final.ckpt"
    # the tokenize step of tiny_train.make_project has its own; rank 1 made no run folder of its own
    run_dirs = sorted(p for p in (root / "outputs").iterdir() if p.name != "tokenize")
    assert run_dirs == [root / "outputs/run"]
    logs = {p.name: p.read_text() for p in (root / "outputs/run").glob("*.log")}
    assert sorted(logs) == ["train.log", "train_ddp_process_1.log"]
    assert f"rank 0: checkpoint {ckpt} (exists: True)" in logs["train.log"]
    assert f"rank 1: checkpoint {ckpt} (exists: True)" in logs["train_ddp_process_1.log"]
    (run,) = runs(mlflow_client(root))
    assert run.info.status == "FINISHED"
    record = json.loads((root / "runs/transformer.json").read_text())
    assert record["run_id"] == run.info.run_id


def test_each_rank_trains_on_half_of_the_batches(ddp_run):
    import torch

    root, _ = ddp_run
    ckpt = torch.load(root / "checkpoints/transformer/final.ckpt", map_location="cpu", weights_only=True)
    assert ckpt["global_step"] == EPOCHS * STEPS_PER_EPOCH // 2


def test_val_bleu_is_one_corpus_bleu_over_the_whole_val_set(ddp_run):
    from attnlab.checkpoint import load_net
    from attnlab.data.corpora import read_lines
    from attnlab.data.tokenizer import load_tokenizer
    from attnlab.inference.decoding import translate_text
    from attnlab.metrics import corpus_scores

    root, _ = ddp_run
    client = mlflow_client(root)
    (run,) = runs(client)
    logged = history(client, run.info.run_id, "val_bleu")
    assert len(logged) == EPOCHS
    tok_dir = root / "data/tokenized/multi30k-en-fr"
    sources, refs = read_lines(tok_dir / "val.src.txt"), read_lines(tok_dir / "val.tgt.txt")
    net = load_net(root / "checkpoints/transformer/final.ckpt", expected_kind="transformer")
    hyps = translate_text(net.init_state, net.step, load_tokenizer(tok_dir), sources, batch_size=256)
    expected = corpus_scores(hyps, refs)["bleu"]
    # The test can tell: a rank's half of the set (or the mean of the halves) scores otherwise.
    halves = [corpus_scores(hyps[r::2], refs[r::2])["bleu"] for r in (0, 1)]
    assert expected > 0 and expected not in halves and expected != pytest.approx(sum(halves) / 2)
    assert logged[-1][1] == pytest.approx(expected, abs=1e-6)
    # chrF likewise: one corpus chrF2 from the ranks' summed sacreBLEU statistics.
    chrf = history(client, run.info.run_id, "val_chrf")
    assert len(chrf) == EPOCHS
    assert chrf[-1][1] == pytest.approx(corpus_scores(hyps, refs)["chrf"], abs=1e-6)


def test_evaluate_scores_the_whole_test_set_once(ddp_run):
    root, _ = ddp_run
    result = subprocess.run(
        [
            sys.executable,
            "src/evaluate.py",
            "model=transformer",
            "device=ddp",
            f"paths.root={root}",
            f"hydra.run.dir={root}/outputs/eval",
            "data.vocab_size=150",
        ],
        cwd=ROOT,
        env=env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    scores = json.loads((root / "metrics/transformer.json").read_text())
    n_test = len((root / "data/tokenized/multi30k-en-fr/test.src.txt").read_text().splitlines())
    assert scores["num_sentences"] == n_test == 4
    client = mlflow_client(root)
    (run,) = runs(client)
    assert [v for _, v in history(client, run.info.run_id, "test_bleu")] == [scores["bleu"]]
