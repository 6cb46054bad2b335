"""Fine-tuning: `python src/train.py +init_from=<checkpoint or models:/…>` starts from a trained
model's weights, and only those: real `src/train.py` runs on the tiny corpus.

A tiny Transformer parent (dropout 0) trains 4 steps on the tiny Multi30k; the child corpus is
a folder of English–French pairs (`data=parallel`, docs/how-to/own-corpus.md) tokenized with the
parent's spm.model (`data.tokenizer_from`). A callback (:mod:`helpers.first_step`) records each
process's first batch and the loss training computed on it before its first update: a
fine-tune's first loss must be the parent's loss on that batch, computed here from the parent's
checkpoint. A corpus
tokenized with another tokenizer, another `model.net` and bad `init_from` values are refused
before anything is trained or tracked, with one line that names the thing and the fix.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from attnlab.checkpoint import TOKENIZER_KEY, file_sha256, load_net
from attnlab.lit.init_from import InitFromError, find_parent, start_from_parent
from attnlab.lit.resume import config_fingerprint
from attnlab.lit.translation import TranslationModule
from attnlab.loss import sequence_loss
from helpers.corpus_fixture import sentences
from helpers.first_step import records
from helpers.tiny_train import (
    ROOT,
    TINY,
    copy_project,
    env,
    make_project,
    mlflow_client,
    runs,
    train,
    train_killed,
)

TESTS = ROOT / "tests"
PARENT = (
    "model.net.dropout=0",
    "trainer.max_steps=4",
    "checkpoint.monitor=null",
    "checkpoint.filename=final",
)
CORPUS = "data/corpus-en-fr"  # the child corpus, in each project (copy_project copies data/)
CHILD_DATA = ("data=parallel", f"data.path={CORPUS}", "data.src_lang=en", "data.tgt_lang=fr")
TOKENIZED = "data/tokenized/parallel-en-fr"
SMOOTHING = 0.1  # conf/model/transformer.yaml's label_smoothing: the training loss's


def tokenize(root: Path, *overrides: str) -> subprocess.CompletedProcess:
    """The real tokenize stage in project ``root``."""
    return subprocess.run(
        [sys.executable, "src/tokenize_data.py", f"paths.root={root}", *overrides],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env(),
        timeout=300,
    )


def first_step(folder: Path) -> str:
    """The override that adds :class:`helpers.first_step.FirstStepLoss` writing to ``folder``."""
    return f"+callbacks.first_step={{_target_: helpers.first_step.FirstStepLoss, folder: {folder}}}"


def parents_loss(ckpt: Path, batch: dict) -> float:
    """The loss training computes on ``batch`` with the weights of checkpoint ``ckpt``."""
    with torch.no_grad():
        return float(sequence_loss(load_net(ckpt).train(), batch, SMOOTHING))


def last_line(result: subprocess.CompletedProcess) -> str:
    return result.stderr.strip().splitlines()[-1]


def write_corpus(folder: Path) -> None:
    """The 48 tiny English–French sentence pairs in another order: 40 train, 4 val, 4 test."""
    pairs = [(en, fr) for en, fr, _ in sentences(seed=1)]
    folder.mkdir(parents=True)
    for split, chunk in (("train", pairs[:40]), ("val", pairs[40:44]), ("test", pairs[44:])):
        for i, lang in enumerate(("en", "fr")):
            (folder / f"{split}.{lang}").write_text("".join(pair[i] + "\n" for pair in chunk))


@pytest.fixture(scope="module")
def parent(tmp_path_factory):
    root = make_project(tmp_path_factory.mktemp("parent"))
    write_corpus(root / CORPUS)
    result = train(root, *PARENT)
    assert result.returncode == 0, result.stderr[-3000:]
    ckpt = root / "checkpoints/transformer/final.ckpt"
    run_id = torch.load(ckpt, weights_only=True)["callbacks"]["ResumeState"]["run_id"]
    return {
        "root": root,
        "ckpt": ckpt,
        "run_id": run_id,
        "spm": root / "data/tokenized/multi30k-en-fr/spm.model",
    }


@pytest.fixture(scope="module")
def child(parent, tmp_path_factory):
    """A second project whose English–French folder is tokenized with the parent's spm.model."""
    root = copy_project(parent["root"], tmp_path_factory.mktemp("child"))
    result = tokenize(root, *CHILD_DATA, f"data.tokenizer_from={parent['spm']}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert (root / TOKENIZED / "spm.model").read_bytes() == parent["spm"].read_bytes()
    return root


@pytest.fixture(scope="module")
def finetuned(parent, child, tmp_path_factory, monkeypatch_module):
    """A fine-tune killed after its second step, then resumed by the same command to step 4."""
    root = copy_project(child, tmp_path_factory.mktemp("finetune"))
    seen = root / "first_step"
    args = (
        *CHILD_DATA,
        f"+init_from={parent['ckpt']}",
        *PARENT,
        "checkpoint.every_n_train_steps=1",
        first_step(seen),
    )
    killed = train_killed(root, "step:2", *args)
    assert killed.returncode != 0, "the run finished before it could be killed"
    last = root / "checkpoints/transformer/last.ckpt"
    saved = shutil.copy(last, root / "killed.ckpt")  # the finished run deletes last.ckpt
    resumed = train(root, *args)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    return {"root": root, "killed": Path(saved), "resumed": resumed, "records": records(seen)}


@pytest.fixture(scope="module")
def monkeypatch_module():
    """``tests/`` on the PYTHONPATH of the training processes (for :mod:`helpers.first_step`)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONPATH", str(TESTS))
        yield mp


def test_the_first_step_loss_of_a_fine_tune_is_the_parents_on_that_batch(parent, finetuned):
    """Before its first update the fine-tune holds exactly the parent's weights: the loss
    training computed on its first batch (of the child corpus) is the parent's on that batch."""
    first = finetuned["records"][0]
    assert first["global_step"] == 1  # a fresh step counter: the parent ended at step 4
    assert first["loss"] == pytest.approx(parents_loss(parent["ckpt"], first["batch"]), rel=1e-6, abs=1e-6)


def test_a_resumed_fine_tune_continues_from_last_ckpt_not_from_the_parent(parent, finetuned):
    """The resumed process's first loss is that of the killed run's last.ckpt (2 updates past
    the parent), and so not the parent's."""
    _, resumed = finetuned["records"]
    assert resumed["global_step"] == 3
    killed = parents_loss(finetuned["killed"], resumed["batch"])
    assert resumed["loss"] == pytest.approx(killed, rel=1e-6, abs=1e-6)
    assert abs(resumed["loss"] - parents_loss(parent["ckpt"], resumed["batch"])) > 1e-4
    assert "resuming from" in finetuned["resumed"].stdout
    assert "resuming, so the parent's weights are not loaded again" in finetuned["resumed"].stdout


def test_a_fine_tune_is_a_fresh_run_tagged_with_its_parent(parent, finetuned):
    """Its own MLflow run (one, continued by the resume), tagged with the parent as given and
    the parent's run id, not nested under it; a fresh optimizer schedule and step counter; and
    its checkpoint records the tokenizer, the parent's."""
    (run,) = runs(mlflow_client(finetuned["root"]))
    assert run.info.status == "FINISHED" and run.info.run_id != parent["run_id"]
    assert run.data.tags["init_from"] == str(parent["ckpt"])
    assert run.data.tags["parent_run_id"] == parent["run_id"]
    assert "mlflow.parentRunId" not in run.data.tags
    ckpt = torch.load(finetuned["root"] / "checkpoints/transformer/final.ckpt", weights_only=True)
    assert ckpt["global_step"] == 4 and ckpt["lr_schedulers"][0]["last_epoch"] == 4
    assert ckpt[TOKENIZER_KEY]["sha256"] == file_sha256(parent["spm"])
    assert ckpt[TOKENIZER_KEY]["file"] == "spm.model"
    assert ckpt[TOKENIZER_KEY]["folder"] == str(finetuned["root"] / TOKENIZED)


def test_every_checkpoint_records_the_tokenizer_it_trained_with(parent):
    ckpt = torch.load(parent["ckpt"], weights_only=True)
    assert ckpt[TOKENIZER_KEY] == {
        "file": "spm.model",
        "sha256": file_sha256(parent["spm"]),
        "folder": str(parent["spm"].parent),
    }


def test_a_corpus_tokenized_with_another_tokenizer_is_refused_and_the_fix_works(parent, tmp_path):
    """The folder tokenized with its own sentencepiece model: refused before any run is tracked;
    the command the error names writes the parent's spm.model."""
    root = copy_project(parent["root"], tmp_path / "other")
    assert tokenize(root, *CHILD_DATA).returncode == 0
    own = root / TOKENIZED / "spm.model"
    result = train(root, *CHILD_DATA, f"+init_from={parent['ckpt']}", *PARENT, timeout=120)
    assert result.returncode == 1
    line = last_line(result)
    assert line.startswith(
        f"train: init_from={parent['ckpt']}: {own.parent} was tokenized with another tokenizer "
        f"(spm.model sha256 {file_sha256(own)[:12]}…, the parent's spm.model sha256 "
        f"{file_sha256(parent['spm'])[:12]}…); fine-tuning keeps the parent's vocabulary: run `python "
        "src/tokenize_data.py "
    ), line
    assert line.endswith(f" data.tokenizer_from={parent['spm']}` first (the spm.model the parent recorded)")
    assert not (root / "mlflow.db").exists()  # refused before the MLflow run was created

    command = re.search(r"`(python src/tokenize_data.py [^`]*)`", line)[1]
    assert f"data=parallel data.path={CORPUS}" in command and f"paths.root={root}" in command
    python, *args = shlex.split(command)  # `python …` as a user runs it, in this venv's Python
    assert python == "python"
    fixed = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, env=env())
    assert fixed.returncode == 0, fixed.stderr[-2000:]
    assert own.read_bytes() == parent["spm"].read_bytes()


def test_the_tokenize_command_names_the_corpus_folder_even_when_train_was_not_given_it():
    """train needs no data.path (it reads the tokenized folder), tokenize does: the command a
    refusal prints holds one, a placeholder where this run was not given any."""
    from attnlab.lit.init_from import _tokenize_command

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(
            config_name="config", overrides=["data=parallel", "data.src_lang=en", "data.tgt_lang=fr"]
        )
        given = compose(config_name="config", overrides=["data=parallel", "data.path=/my/corpus"])
    assert _tokenize_command(cfg, "p/spm.model") == (
        "`python src/tokenize_data.py data=parallel data.path=<your corpus folder> data.src_lang=en "
        "data.tgt_lang=fr data.tokenizer_from=p/spm.model`"
    )
    assert "data=parallel data.path=/my/corpus data.src_lang=" in _tokenize_command(given, "p/spm.model")


def test_another_architecture_is_refused_with_the_keys_that_differ(parent, child):
    result = train(
        child, *CHILD_DATA, f"+init_from={parent['ckpt']}", *PARENT, "model.net.d_model=64", timeout=120
    )
    assert result.returncode == 1
    assert last_line(result) == (
        f"train: init_from={parent['ckpt']}: the net differs from the parent's: model.net.d_model=64 "
        "here, 32 in the parent; fine-tuning keeps the parent's architecture: run with "
        "model.net.d_model=32 (or leave those keys at the parent's values)"
    )


def test_the_fingerprint_of_a_resumable_run_includes_init_from():
    cfg = OmegaConf.create({"model": {"name": "transformer"}})
    with_parent = OmegaConf.merge(cfg, {"init_from": "parent.ckpt"})
    other = OmegaConf.merge(cfg, {"init_from": "models:/attnlab-transformer@champion"})
    assert len({config_fingerprint(c) for c in (cfg, with_parent, other)}) == 3


# --- bad input, in process ------------------------------------------------------------------


def test_a_missing_file_is_refused(tmp_path):
    missing = tmp_path / "nope.ckpt"
    with pytest.raises(InitFromError) as e:
        find_parent(str(missing), "transformer", f"sqlite:///{tmp_path}/mlflow.db", load_net)
    assert str(e.value) == (
        f"init_from={missing}: {missing} not found; pass a checkpoint that src/train.py wrote (a copy "
        "of checkpoints/transformer/best.ckpt) or a registered model "
        "(+init_from=models:/attnlab-transformer@champion)"
    )


def test_a_file_that_is_no_checkpoint_is_refused(tmp_path):
    text = tmp_path / "notes.ckpt"
    text.write_text("not a checkpoint\n")
    with pytest.raises(InitFromError) as e:
        find_parent(str(text), "transformer", f"sqlite:///{tmp_path}/mlflow.db", load_net)
    assert str(e.value) == (
        f"init_from={text}: {text} is corrupt or not a torch checkpoint (neither a zip archive nor a "
        "pickle); retrain with `python src/train.py` or copy the file again"
    )


def test_a_checkpoint_of_another_model_kind_is_refused(tmp_path):
    """A real Bahdanau module's checkpoint (its conf/model/bahdanau.yaml net) given to a
    Transformer run."""
    net = OmegaConf.to_container(OmegaConf.load(ROOT / "conf/model/bahdanau.yaml").net)
    module = TranslationModule(net=net, optimizer={}, vocab_size=20)
    path = tmp_path / "bahdanau.ckpt"
    torch.save({"hyper_parameters": dict(module.hparams), "state_dict": module.state_dict()}, path)
    with pytest.raises(InitFromError) as e:
        find_parent(str(path), "transformer", f"sqlite:///{tmp_path}/mlflow.db", load_net)
    assert str(e.value) == (
        f"init_from={path}: {path} holds a bahdanau model, not transformer; pass "
        "checkpoints/transformer/ (train it with `python src/train.py model=transformer`) or run "
        "with model=bahdanau"
    )


def test_the_checkpoint_this_run_writes_is_refused_as_a_parent(parent, tmp_path):
    """Fine-tuning from checkpoints/<model>/<checkpoint.filename>.ckpt would replace the parent."""
    folder = parent["ckpt"].parent
    cfg = OmegaConf.create(
        {
            "init_from": str(parent["ckpt"]),
            "model": {"name": "transformer"},
            "paths": {"checkpoints": str(folder)},
            "checkpoint": {"filename": "final"},
            "mlflow": {"tracking_uri": f"sqlite:///{tmp_path}/mlflow.db"},
        }
    )
    with pytest.raises(InitFromError) as e:
        start_from_parent(cfg, None, load_net)
    assert str(e.value) == (
        f"init_from={parent['ckpt']}: {parent['ckpt']} is the checkpoint this run writes, so "
        f"fine-tuning would replace it: copy it first (`cp {parent['ckpt']} parent.ckpt`, then "
        "+init_from=parent.ckpt), or start from its registered model "
        "(+init_from=models:/attnlab-transformer@champion)"
    )


@pytest.fixture(scope="module")
def empty_registry(tmp_path_factory):
    """A SQLite store with one registered model, attnlab-transformer, that has no version."""
    uri = f"sqlite:///{tmp_path_factory.mktemp('registry')}/mlflow.db"
    mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri).create_registered_model("attnlab-transformer")
    return uri


@pytest.mark.parametrize(
    "uri, message",
    [
        (
            "models:/attnlab-transformer",
            "init_from=models:/attnlab-transformer is not a registered model version: write "
            "models:/<name>@<alias> or models:/<name>/<version>, e.g. models:/attnlab-transformer@champion",
        ),
        (
            "models:/attnlab-bahdanau@champion",
            "init_from=models:/attnlab-bahdanau@champion: no registered model attnlab-bahdanau in {uri} "
            "(registered: attnlab-transformer); register one with `python src/export.py model=<model>`, "
            "or set MLFLOW_TRACKING_URI to the store that holds it",
        ),
        (
            "models:/attnlab-transformer@best",
            "init_from=models:/attnlab-transformer@best: attnlab-transformer has no alias best (its "
            "aliases: none); use one of them or a version, models:/attnlab-transformer/<version>",
        ),
        (
            "models:/attnlab-transformer/3",
            "init_from=models:/attnlab-transformer/3: attnlab-transformer has no version 3 (its "
            "versions: none); use one of them or an alias, models:/attnlab-transformer@champion",
        ),
    ],
    ids=["malformed", "unknown-model", "unknown-alias", "unknown-version"],
)
def test_an_unknown_registered_model_is_refused_with_what_the_store_holds(empty_registry, uri, message):
    with pytest.raises(InitFromError) as e:
        find_parent(uri, "transformer", empty_registry, load_net)
    assert str(e.value) == message.format(uri=empty_registry)


def test_a_parent_older_than_the_tokenizer_record_is_compared_by_vocabulary(parent, child, tmp_path, caplog):
    """A checkpoint written before checkpoints recorded their tokenizer: the same vocabulary kind
    and size is accepted with a warning (and the weights are the parent's), another size refused."""
    ckpt = torch.load(parent["ckpt"], weights_only=True)
    del ckpt[TOKENIZER_KEY], ckpt["callbacks"]
    old = tmp_path / "old.ckpt"
    torch.save(ckpt, old)

    def cfg(root, *overrides):
        with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
            return compose(
                config_name="config",
                overrides=[
                    *TINY,
                    f"paths.root={root}",
                    *CHILD_DATA,
                    *PARENT,
                    f"+init_from={old}",
                    *overrides,
                ],
            )

    accepted = cfg(child)
    module, _ = TranslationModule.from_config(accepted)
    found = start_from_parent(accepted, module, load_net)
    assert found.run_id is None and found.tags() == {"init_from": str(old)}
    assert "predates tokenizer records" in caplog.text
    for name, weight in load_net(parent["ckpt"]).state_dict().items():
        assert torch.equal(module.net.state_dict()[name], weight), name

    other = copy_project(parent["root"], tmp_path / "other")
    assert tokenize(other, *CHILD_DATA, "data.vocab_size=60").returncode == 0
    refused = cfg(other)
    module, _ = TranslationModule.from_config(refused)
    assert module.hparams.vocab_size != ckpt["hyper_parameters"]["vocab_size"]
    with pytest.raises(InitFromError) as e:
        start_from_parent(refused, module, load_net)
    assert str(e.value) == (
        f"init_from={old}: {other / TOKENIZED} was tokenized with another tokenizer: "
        f"{module.hparams.vocab_size} sentencepiece pieces, the parent's "
        f"{ckpt['hyper_parameters']['vocab_size']} sentencepiece pieces (the parent predates tokenizer "
        "records, so only the vocabularies' kind and size are compared); fine-tuning keeps the parent's "
        f"vocabulary: run `python src/tokenize_data.py data=parallel data.path={CORPUS} data.src_lang=en "
        "data.tgt_lang=fr data.tokenizer_from=<the spm.model of the parent's tokenized folder>` first"
    )


# --- models:/ --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def registered(parent):
    """The parent exported and registered by the real export stage (no CTranslate2, no AOTI)."""
    root = parent["root"]
    result = subprocess.run(
        [
            sys.executable,
            "src/export.py",
            *TINY,
            *PARENT,
            f"paths.root={root}",
            "export.ctranslate2=[]",
            "export.compile=false",
            f"hydra.run.dir={root}/outputs/export",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env(),
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return {"uri": f"sqlite:///{root}/mlflow.db", "model": "models:/attnlab-transformer@champion"}


def test_a_registered_model_starts_a_fine_tune_from_its_training_checkpoint(
    parent, child, registered, tmp_path, monkeypatch_module
):
    root = copy_project(child, tmp_path / "from-registry")
    seen = tmp_path / "first_step"
    result = train(
        root,
        *CHILD_DATA,
        f"+init_from={registered['model']}",
        *PARENT,
        "trainer.max_steps=1",
        first_step(seen),
        MLFLOW_TRACKING_URI=registered["uri"],
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (first,) = records(seen)
    assert first["loss"] == pytest.approx(parents_loss(parent["ckpt"], first["batch"]), rel=1e-6, abs=1e-6)
    client = mlflow_client(parent["root"])  # the store the URI names holds the fine-tune's run too
    (run,) = [r for r in runs(client) if r.info.run_id != parent["run_id"]]
    assert run.data.tags["init_from"] == registered["model"]
    assert run.data.tags["parent_run_id"] == parent["run_id"]


def test_a_registered_parent_names_its_exported_tokenizer_in_the_fix(parent, registered, tmp_path):
    root = copy_project(parent["root"], tmp_path / "other")  # its data only: no store of its own
    assert tokenize(root, *CHILD_DATA).returncode == 0
    result = train(
        root,
        *CHILD_DATA,
        f"+init_from={registered['model']}",
        *PARENT,
        timeout=120,
        MLFLOW_TRACKING_URI=registered["uri"],
    )
    assert result.returncode == 1
    line = last_line(result)
    exported = re.search(r" data\.tokenizer_from=(\S+)` first \(the spm\.model exported with ", line)
    assert exported, line
    assert line.endswith(f"(the spm.model exported with {registered['model']})")
    spm = Path(exported[1])
    assert spm.name == "spm.model" and spm.is_relative_to(parent["root"] / "mlruns")  # the logged model's
    assert spm.read_bytes() == parent["spm"].read_bytes()
