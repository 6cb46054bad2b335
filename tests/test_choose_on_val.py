"""scripts/choose_on_val.py: averaging and the length penalty chosen on the validation split.

A real tiny Transformer trains 3 epochs with the per-epoch ModelCheckpoint the README gives;
the script's averages must be the element-wise means of those files, its scores sacreBLEU's on
the hypotheses the kept weights decode, its choice the best row, and ``--write`` a checkpoint
that ``load_net`` (the evaluate stage's loader) reads with exactly the chosen weights.
"""

import importlib.util
import json
import re
import shutil
import subprocess
import sys

import pytest
import sacrebleu
import torch

from attnlab.checkpoint import load_net
from attnlab.data.corpora import read_lines
from attnlab.data.tokenizer import load_sentencepiece
from attnlab.inference.decoding import translate_text
from attnlab.inference.ensemble import Ensemble
from helpers.tiny_train import ROOT, TINY, env, make_project, train

EVERY_EPOCH = (
    "+callbacks.every_epoch={_target_: pytorch_lightning.callbacks.ModelCheckpoint, "
    'dirpath: %s, filename: "e{epoch:02d}", monitor: step, mode: max, save_top_k: -1, '
    "save_weights_only: true, auto_insert_metric_name: false}"
)


def _script():
    spec = importlib.util.spec_from_file_location("choose_on_val", ROOT / "scripts/choose_on_val.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = make_project(tmp_path_factory.mktemp("choose"))
    epochs = root / "epochs"
    done = train(root, "trainer.max_epochs=3", EVERY_EPOCH % epochs)
    assert done.returncode == 0, done.stderr[-3000:]
    return root, epochs


def test_averages_scores_and_the_written_choice(trained, tmp_path):
    root, epochs = trained
    tokenized = root / "data/tokenized/multi30k-en-fr"
    script = _script()
    kept = script.epoch_checkpoints(epochs)
    assert [e for e, _ in kept] == [1, 2, 3]

    # the mean of the last 2 epochs, element by element, from the files themselves
    e2, e3 = (torch.load(p, map_location="cpu", weights_only=True)["state_dict"] for _, p in kept[1:])
    mean = script.average_last(kept, 2)["state_dict"]
    key = "net.encoder_blocks.0.ffn.dense1.weight"
    assert not torch.equal(e2[key], e3[key])
    torch.testing.assert_close(
        mean[key], (e2[key].double() + e3[key].double()).div(2).float(), rtol=0, atol=0
    )

    out, written = tmp_path / "choice.json", tmp_path / "best.ckpt"
    result = script.main(
        [
            str(epochs),
            "--tokenized",
            str(tokenized),
            "--last",
            "1",
            "2",
            "3",
            "--alpha",
            "1.0",
            "0.0",
            "--beam-size",
            "2",
            "--out",
            str(out),
            "--write",
            str(written),
        ]
    )
    assert json.loads(out.read_text()) == result
    assert [row["last"] for row in result["averaging"]] == [1, 2, 3]
    assert result["averaging"][1]["epochs"] == [2, 3]

    # the last epoch alone at α 1: sacreBLEU on what the epoch-3 file decodes (the reference)
    net = load_net(kept[-1][1], expected_kind="transformer")
    sources, references = read_lines(tokenized / "val.src.txt"), read_lines(tokenized / "val.tgt.txt")
    hypotheses = translate_text(
        net.init_state, net.step, load_sentencepiece(tokenized / "spm.model"), sources, beam_size=2, alpha=1.0
    )
    want = sacrebleu.corpus_bleu(hypotheses, [references]).score
    assert result["averaging"][0]["bleu"] == pytest.approx(want, abs=1e-9)

    # the choice is the best row of each step; --write holds exactly its weights
    best_n = max(result["averaging"], key=lambda r: (round(r["bleu"], 6), -r["last"]))["last"]
    assert result["chosen"]["last"] == best_n
    assert result["chosen"]["bleu"] == max(r["bleu"] for r in result["length_penalty"])
    assert [r["alpha"] for r in result["length_penalty"]] == [1.0, 0.0]
    best_alpha = max(result["length_penalty"], key=lambda r: (round(r["bleu"], 6), r["alpha"] == 1.0))
    assert result["chosen"]["alpha"] == best_alpha["alpha"]
    chosen = script.average_last(kept, best_n)["state_dict"]
    reloaded = load_net(written, expected_kind="transformer").state_dict()
    for name, value in reloaded.items():
        torch.testing.assert_close(value, chosen[f"net.{name}"], rtol=0, atol=0)

    # scored on test as the guide does it: the chosen average over the best.ckpt that
    # runs/transformer.json names, the chosen α to evaluate (beam 5, conf/model/transformer.yaml)
    best = root / "checkpoints/transformer/best.ckpt"
    trained_best = best.read_bytes()
    try:
        shutil.copy(written, best)
        alpha = result["chosen"]["alpha"]
        done = subprocess.run(
            [sys.executable, "src/evaluate.py", *TINY, f"paths.root={root}", f"hydra.run.dir={tmp_path}/ev",
             f"model.decoding.alpha={alpha}"],
            cwd=ROOT, capture_output=True, text=True, timeout=300, env=env(),
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        metrics = json.loads((root / "metrics/transformer.json").read_text())
        hypotheses = _ensemble_hypotheses([written], tokenized, "test", 5, alpha)
        assert read_lines(root / "metrics/transformer.hyp.txt") == hypotheses
        want = sacrebleu.corpus_bleu(hypotheses, [read_lines(tokenized / "test.tgt.txt")]).score
        assert metrics["bleu"] == pytest.approx(want, abs=1e-9)
    finally:
        best.write_bytes(trained_best)


def test_a_bahdanau_run_is_chosen_on_the_same_scores(trained, tmp_path):
    """Any translation model's epochs: a tiny Bahdanau's, scored as its own checkpoint decodes."""
    root, _ = trained
    epochs = tmp_path / "epochs"
    bahdanau = ["model=bahdanau", "device=cpu", "model.net.embed_size=16", "model.net.num_hiddens=32",
                "model.max_tokens=40", "data.vocab_size=150", "data.val_bleu_sentences=4",
                "trainer.enable_progress_bar=false", "trainer.max_epochs=2", "heatmaps.sentences=[0]",
                "heatmaps.epoch_kinds=[]"]  # fmt: skip
    cmd = [sys.executable, "src/train.py", *bahdanau, f"paths.root={root}", f"hydra.run.dir={tmp_path}/run"]
    done = subprocess.run(
        [*cmd, EVERY_EPOCH % epochs], cwd=ROOT, capture_output=True, text=True, timeout=300, env=env()
    )
    assert done.returncode == 0, done.stderr[-3000:]
    tokenized = root / "data/tokenized/multi30k-en-fr"
    script = _script()
    result = script.main([str(epochs), "--tokenized", str(tokenized), "--last", "1", "--alpha", "1.0"])
    net = load_net(script.epoch_checkpoints(epochs)[-1][1], expected_kind="bahdanau")
    sources, references = read_lines(tokenized / "val.src.txt"), read_lines(tokenized / "val.tgt.txt")
    hypotheses = translate_text(
        net.init_state, net.step, load_sentencepiece(tokenized / "spm.model"), sources, beam_size=5, alpha=1.0
    )
    assert result["chosen"]["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hypotheses, [references]).score)
    # a Bahdanau checkpoint as a member of the Transformer's epochs: refused, naming both
    _, transformer_epochs = trained
    bahdanau_ckpt = script.epoch_checkpoints(epochs)[-1][1]
    with pytest.raises(SystemExit, match=rf"--ensemble: {bahdanau_ckpt} holds a bahdanau model, the "
                       r"epochs a transformer; ensemble checkpoints of one model"):  # fmt: skip
        script.main([str(transformer_epochs), "--tokenized", str(tokenized), "--last", "1",
                     "--ensemble", str(bahdanau_ckpt)])  # fmt: skip


def test_bad_input_names_the_fix(trained, tmp_path):
    root, epochs = trained
    tokenized = root / "data/tokenized/multi30k-en-fr"
    script = _script()
    with pytest.raises(SystemExit, match=r"--last 4: .* keeps 3 epochs; give N from 1 to 3"):
        script.main([str(epochs), "--tokenized", str(tokenized), "--last", "4"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit, match="holds no \\*.ckpt; train with the per-epoch ModelCheckpoint"):
        script.main([str(tmp_path / "empty"), "--tokenized", str(tokenized)])
    with pytest.raises(SystemExit, match="lacks spm.model, val.src.txt, val.tgt.txt; run the tokenize stage"):
        script.main([str(epochs), "--tokenized", str(tmp_path / "empty")])


def test_a_second_run_or_a_gap_in_the_folder_is_refused(trained, tmp_path):
    import shutil

    _, epochs = trained
    script = _script()
    twice = tmp_path / "twice"
    shutil.copytree(epochs, twice)
    shutil.copy(twice / "e01.ckpt", twice / "e01-v1.ckpt")  # what a second run into the folder writes
    with pytest.raises(
        SystemExit,
        match=r"holds 2 checkpoints of epoch 2 \(e01-v1.ckpt, e01.ckpt\): "
        r"more than one run wrote there",
    ):
        script.epoch_checkpoints(twice)
    gap = tmp_path / "gap"
    shutil.copytree(epochs, gap)
    (gap / "e01.ckpt").unlink()
    with pytest.raises(SystemExit, match=r"lacks the checkpoints of epochs \[2\]"):
        script.epoch_checkpoints(gap)


def test_the_best_row_and_its_tie_rules():
    """Highest BLEU wins; a tie goes to the smaller N, and to the reference α even when another
    α of the same BLEU was listed (or decoded) first."""
    best = _script().best
    rows = [
        {"last": 1, "bleu": 40.1},
        {"last": 3, "bleu": 40.5},
        {"last": 5, "bleu": 40.5},
        {"last": 8, "bleu": 40.2},
    ]
    assert best(rows, lambda r: -r["last"])["last"] == 3
    assert best(rows[:1] + rows[3:], lambda r: -r["last"])["last"] == 8
    alphas = [{"alpha": 0.6, "bleu": 40.5}, {"alpha": 1.0, "bleu": 40.5}, {"alpha": 1.2, "bleu": 40.4}]
    assert best(alphas, lambda r: r["alpha"] == 1.0)["alpha"] == 1.0
    assert best(alphas[::2], lambda r: r["alpha"] == 1.0)["alpha"] == 0.6


def _ensemble_hypotheses(paths, tokenized, split, beam_size, alpha):
    """The reference: the nets of ``paths`` decoding ``split`` together through
    :class:`~attnlab.inference.ensemble.Ensemble`, each loaded by ``load_net``."""
    nets = [load_net(p) for p in paths]
    ensemble = Ensemble([(net.init_state, net.step) for net in nets])
    sources = read_lines(tokenized / f"{split}.src.txt")
    tokenizer = load_sentencepiece(tokenized / "spm.model")
    return translate_text(
        ensemble.init_state, ensemble.step, tokenizer, sources, beam_size=beam_size, alpha=alpha
    )


def test_an_ensemble_is_chosen_on_val_and_scored_by_evaluate(trained, tmp_path):
    """``--ensemble`` decodes each candidate with the given checkpoints; evaluate's
    ``+model.decoding.ensemble`` scores the same ensemble on test, and says so in the metrics."""
    root, epochs = trained
    tokenized = root / "data/tokenized/multi30k-en-fr"
    script = _script()
    kept = script.epoch_checkpoints(epochs)
    member = kept[0][1]  # epoch 1's weights: another net on the same tokenized corpus
    result = script.main(
        [str(epochs), "--tokenized", str(tokenized), "--last", "1", "--alpha", "1.0", "0.0",
         "--beam-size", "2", "--ensemble", str(member), "--out", str(tmp_path / "choice.json"),
         "--write", str(tmp_path / "seed1.ckpt")]
    )  # fmt: skip
    assert result["ensemble"] == [str(member)]
    assert json.loads((tmp_path / "choice.json").read_text()) == result
    written = load_net(tmp_path / "seed1.ckpt").state_dict()  # the chosen N = 1: epoch 3's weights
    newest = torch.load(kept[-1][1], map_location="cpu", weights_only=True)["state_dict"]
    assert all(torch.equal(value, newest[f"net.{name}"]) for name, value in written.items())
    references = read_lines(tokenized / "val.tgt.txt")
    for row in result["length_penalty"]:
        hypotheses = _ensemble_hypotheses([kept[-1][1], member], tokenized, "val", 2, row["alpha"])
        assert row["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hypotheses, [references]).score, abs=1e-9)
    alone = script.main([str(epochs), "--tokenized", str(tokenized), "--last", "1", "--alpha", "0.0",
                         "--beam-size", "2"])  # fmt: skip
    assert alone["ensemble"] == []

    # evaluate: the kept checkpoint and epoch 1's together, beam 5 α 1 (conf/model/transformer.yaml);
    # the member's path relative to the project, as the docs give it
    best = root / "checkpoints/transformer/best.ckpt"  # what runs/transformer.json names
    relative = f"outputs/member-{tmp_path.name}.ckpt"
    shutil.copy(member, root / relative)
    cmd = [sys.executable, "src/evaluate.py", *TINY, f"paths.root={root}", f"hydra.run.dir={tmp_path}/ev"]
    done = subprocess.run(
        [*cmd, f"+model.decoding.ensemble=[{relative}]"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env=env(),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads((root / "metrics/transformer.json").read_text())
    assert metrics["decoding"]["ensemble"] == [relative]
    hypotheses = _ensemble_hypotheses([best, member], tokenized, "test", 5, 1.0)
    assert read_lines(root / "metrics/transformer.hyp.txt") == hypotheses
    references = read_lines(tokenized / "test.tgt.txt")
    assert metrics["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hypotheses, [references]).score, abs=1e-9)

    for value, problem in [
        (f"[{tmp_path}/missing.ckpt]", rf"model.decoding.ensemble: {tmp_path}/missing.ckpt not found; "
                                      r".*\(this member: give the path of a checkpoint of this model"),
        ("oops", r"model.decoding.ensemble must be a list of checkpoint paths, e.g. "
                 r"'\+model.decoding.ensemble=\[outputs/seed1.ckpt\]'; got 'oops'"),
    ]:  # fmt: skip
        refused = subprocess.run(
            [*cmd, f"+model.decoding.ensemble={value}"],
            cwd=ROOT, capture_output=True, text=True, timeout=300, env=env(),
        )  # fmt: skip
        assert refused.returncode != 0
        assert re.search(problem, refused.stderr), refused.stderr[-2000:]
    with pytest.raises(SystemExit, match=rf"--ensemble: {tmp_path}/missing.ckpt not found; train first"):
        script.main(
            [
                str(epochs),
                "--tokenized",
                str(tokenized),
                "--last",
                "1",
                "--ensemble",
                str(tmp_path / "missing.ckpt"),
            ]
        )
    for app, problem in [
        (
            "src/translate.py",
            "model.decoding.ensemble is evaluate's: translate decodes the one exported model",
        ),
        ("src/export.py", "model.decoding.ensemble is evaluate's: export writes the one net it trained"),
    ]:
        refused = subprocess.run(
            [sys.executable, app, *TINY, f"paths.root={root}", f"hydra.run.dir={tmp_path}/x",
             "+text=A dog.", f"+model.decoding.ensemble=[{relative}]"],
            cwd=ROOT, capture_output=True, text=True, timeout=300, env=env(),
        )  # fmt: skip
        assert refused.returncode != 0
        assert problem in refused.stderr, refused.stderr[-2000:]
