"""Console output (the attnlab.console package): what a `dvc repro` log and a terminal show.

The tiny Transformer (tests/tiny_train.py) trains for 2 epochs as a `dvc repro` stage
would run it: DVC_STAGE set, stdout a pipe, the progress bar enabled in the config.
Its stdout must be exactly a start line, one line per epoch whose numbers are the
run's MLflow history, and the summary, whose run id, artifact URI and best epoch are
the ones MLflow and runs/transformer.json hold; stderr must be empty. Evaluate and
export then run on that project, in this process, under DVC_STAGE too. Further
in-process checks cover the progress bar's per-step ``loss`` and ``tokens/s``, which
callbacks a terminal gets, and what logs.setup hides with and without ATTNLAB_VERBOSE.
"""

from __future__ import annotations

import importlib.util
import io
import json
import logging
import os
import re
import subprocess
import sys
import warnings

import pytest
import torch
from hydra import compose, initialize_config_dir

from attnlab.checkpoint import load_net
from attnlab.console import logs, summaries
from attnlab.console.runs import mlflow_links
from attnlab.lit.progress import RichBar
from attnlab.tracking.store import read_run_record
from helpers.tiny_train import ROOT, TINY, history, make_project, mlflow_client, runs, train

EPOCHS = 2
# Lines the stages printed before attnlab.console, which a `dvc repro` log must not show.
NOISE = (
    "GPU available",
    "TPU available",
    "Tip:",
    "litlogger",
    "Seed set to",
    "Trainer.fit` stopped",
    "val_check_interval",
    "Experiment with name",
    "Creating initial MLflow database",
    "INFO mlflow",
    "alembic",
    "does not have many workers",
    "logging interval",
    "LeafSpec",
    "Total params",
    "Downloading artifacts",
    "Successfully registered model",
    "Created version",
    "rank 0: checkpoint",
    "[train][INFO]",
)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(project root, the finished `dvc repro`-style training process)."""
    root = make_project(tmp_path_factory.mktemp("console"))
    # One heatmap sentence: the PNGs are not what this file is about (about 25 s less on 2 cores);
    # `++` keeps the run valid should that key move.
    result = train(
        root,
        f"trainer.max_epochs={EPOCHS}",
        "trainer.enable_progress_bar=true",
        "++heatmaps.sentences=[0]",
        DVC_STAGE="train@transformer",
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return root, result


def _quiet(stdout: str, stderr: str) -> None:
    out = stdout + stderr
    assert stderr == "", stderr[-3000:]
    assert "\r" not in out  # no progress bar redrawn in place
    assert out.isascii(), [line for line in out.splitlines() if not line.isascii()]
    assert [n for n in NOISE if n in out] == []


def test_dvc_stage_training_prints_epoch_lines_and_a_summary_that_match_mlflow(trained):
    root, result = trained
    _quiet(result.stdout, result.stderr)
    record = read_run_record(root / "runs/transformer.json", "transformer")  # checkpoint made absolute
    client = mlflow_client(root)
    (run,) = runs(client)
    run_id = run.info.run_id
    assert record["run_id"] == run_id
    # the bar-only entries stay out of MLflow: its metric names are the documented ones, and the
    # per-head statistics of every kind, layer and head (attnlab.analysis.heads)
    per_head = {
        f"{stat}/{kind}/layer{layer}/head{head}"
        for stat in ("entropy", "confidence")
        for kind in ("encoder_self", "decoder_self", "encoder_decoder")
        for layer in (1, 2)
        for head in range(1, 5)
    }
    per_head |= {
        f"diagonal_offset/encoder_decoder/layer{layer}/head{head}" for layer in (1, 2) for head in range(1, 5)
    }
    assert (
        set(run.data.metrics)
        == {"train_loss", "val_loss", "val_bleu", "val_chrf", "tokens_per_sec", "epoch"} | per_head
    )
    values = {
        k: [v for _, v in history(client, run_id, k)]
        for k in ("train_loss", "val_loss", "val_bleu", "val_chrf", "tokens_per_sec")
    }
    assert all(len(v) == EPOCHS for v in values.values()), values
    best = torch.load(record["checkpoint"], map_location="cpu", weights_only=True)
    n_params = sum(p.numel() for p in load_net(record["checkpoint"], "transformer").parameters())

    lines = result.stdout.splitlines()
    from pytorch_lightning.utilities.model_summary import get_human_readable_count

    assert lines[0] == (
        f"transformer: {get_human_readable_count(n_params).replace(' ', '')} parameters "
        f"on cpu, 8 steps per epoch, max_epochs {EPOCHS}"
    )
    for epoch in range(EPOCHS):  # exactly one line per epoch, MLflow's numbers
        tl, vl, vb, vc, tps = (values[k][epoch] for k in values)
        assert re.fullmatch(
            re.escape(
                f"epoch {epoch + 1}/{EPOCHS}  train_loss {tl:.4f}  val_loss {vl:.4f}  "
                f"val_bleu {vb:.2f}  val_chrf {vc:.2f}  tokens/s {tps:.0f}  ("
            )
            + r"\d+\.\d s\)",
            lines[1 + epoch],
        )

    # The kept checkpoint is the first epoch with the lowest val_loss; its epoch (0-based) says so.
    best_epoch = values["val_loss"].index(min(values["val_loss"]))
    assert best["epoch"] == best_epoch
    uri = record["tracking_uri"]
    assert uri == f"sqlite:///{root}/mlflow.db"
    page = f"http://127.0.0.1:5000/#/experiments/{run.info.experiment_id}/runs/{run_id}"
    assert lines[1 + EPOCHS :] == [
        f"transformer: trained {EPOCHS} epochs ({8 * EPOCHS} steps)",
        f"  best epoch : {best_epoch + 1} of {EPOCHS} (lowest val_loss)",
        f"  val_loss   : {values['val_loss'][best_epoch]:.4f}",
        f"  val_bleu   : {values['val_bleu'][best_epoch]:.2f}",
        f"  val_chrf   : {values['val_chrf'][best_epoch]:.2f}",
        f"  checkpoint : {record['checkpoint']}",
        f"  MLflow run : {run_id} (transformer-multi30k-en-fr-seed0)",
        f"  artifacts  : {client.get_run(run_id).info.artifact_uri}",
        f"  tracking   : {uri}",
        f"  browse     : mlflow ui --backend-store-uri {uri}",
        f"  run page   : {page}",
    ]
    assert len(lines) <= 1 + EPOCHS + 15


def _app(script: str):
    """The Hydra app ``src/<script>.py`` as a module; its ``main(cfg)`` runs in this process."""
    spec = importlib.util.spec_from_file_location(f"{script}_app", ROOT / "src" / f"{script}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_dvc_stage_evaluate_and_export_print_only_their_summaries(trained, console_state, monkeypatch, capfd):
    """The two stages' `main` in this process (no second torch/MLflow start-up), output
    captured at the file descriptors, DVC_STAGE set as `dvc repro` sets it."""
    root, _ = trained
    client = mlflow_client(root)
    (run,) = runs(client)
    run_id, uri = run.info.run_id, f"sqlite:///{root}/mlflow.db"
    links = [
        f"  browse     : mlflow ui --backend-store-uri {uri}",
        f"  run page   : http://127.0.0.1:5000/#/experiments/{run.info.experiment_id}/runs/{run_id}",
    ]
    monkeypatch.setenv("DVC_STAGE", "evaluate@transformer")
    capfd.readouterr()

    _app("evaluate").main(_cfg(root))
    evaluated = capfd.readouterr()
    _quiet(evaluated.out, evaluated.err)
    scores = json.loads((root / "metrics/transformer.json").read_text())
    logged = client.get_run(run_id).data.metrics
    assert (logged["test_bleu"], logged["test_chrf"]) == (scores["bleu"], scores["chrf"])
    more = scores["more_test_sets"]["test_2017_flickr"]
    assert logged["test_chrf/test_2017_flickr"] == more["chrf"]
    assert evaluated.out.splitlines() == [
        "transformer: 4 test sentences scored",
        f"  test_bleu   : {scores['bleu']:.2f} (sacreBLEU, cased, 13a)",
        f"  bleu_lc     : {scores['bleu_lc']:.2f}",
        f"  chrF        : {scores['chrf']:.2f}",
        f"  bleu_tok_lc : {scores['bleu_tok_lc']:.2f} (as Multi30k papers score)",
        f"  also        : test_2017_flickr: BLEU {more['bleu']:.2f}, bleu_lc {more['bleu_lc']:.2f}, "
        f"chrF {more['chrf']:.2f}, bleu_tok_lc {more['bleu_tok_lc']:.2f} (4 sentences)",
        f"  metrics     : {root / 'metrics/transformer.json'}",
        f"  hypotheses  : {root / 'metrics/transformer.hyp.txt'}",
        f"  MLflow run  : {run_id} (logged test_bleu, test_bleu_lc, test_chrf, test_bleu_tok_lc, "
        "test_*/test_2017_flickr)",
        *(line.replace(" :", "  :", 1) for line in links),  # keys padded to bleu_tok_lc's width
    ]

    monkeypatch.setenv("DVC_STAGE", "export@transformer")
    _app("export").main(_cfg(root))
    exported = capfd.readouterr()
    _quiet(exported.out, exported.err)  # MLflow's "Successfully registered model ..." included
    (version,) = client.search_model_versions("name='attnlab-transformer'")
    assert (version.version, version.run_id) == (1, run_id)
    assert exported.out.splitlines() == [
        "transformer: exported",
        f"  folder     : {root / 'models/transformer'}",
        "  registered : attnlab-transformer version 1 (alias champion)",
        f"  MLflow run : {run_id}",
        f"  serve      : MLFLOW_TRACKING_URI={uri} mlflow models serve "
        "-m models:/attnlab-transformer@champion -w 2 -p 5001 --env-manager local",
        '  translate  : python src/translate.py model=transformer +text="A dog runs."',
    ]


def _cfg(root, *overrides):
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose(config_name="config", overrides=[*TINY, f"paths.root={root}", *overrides])


def test_progress_bar_shows_each_steps_loss_and_the_epochs_running_tokens_per_sec(trained, tmp_path):
    """In process, Lightning's Rich bar (what a terminal gets): at every step ``loss`` is the
    step's training loss and ``tokens/s`` the target tokens of the epoch's earlier steps over
    their time (none at the first step), as float32; the last values are drawn in the bar."""
    import pytorch_lightning as pl

    from attnlab.lit.translation import TranslationModule

    root, _ = trained
    module, (datamodule,) = TranslationModule.from_config(_cfg(root))
    seen = []

    class Record(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            seen.append({"done": (pl_module._epoch_tokens, pl_module._epoch_train_time)})

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            seen[-1].update(loss=outputs["loss"].item(), bar=bar.get_metrics(trainer, pl_module))

    screen = io.StringIO()
    bar = RichBar(console_kwargs={"file": screen, "force_terminal": True, "width": 300})
    trainer = pl.Trainer(
        max_epochs=1,
        accelerator="cpu",
        devices=1,
        logger=False,
        limit_val_batches=0,
        enable_checkpointing=False,
        enable_model_summary=False,
        callbacks=[bar, Record()],
    )
    trainer.fit(module, datamodule)

    assert len(seen) == 8
    assert "tokens/s" not in seen[0]["bar"]
    for step in seen:
        assert step["bar"]["loss"] == step["loss"]
        tokens, seconds = step["done"]
        if seconds:
            assert step["bar"]["tokens/s"] == torch.tensor(tokens / seconds).item() > 0
    assert "v_num" not in seen[-1]["bar"]
    drawn = re.sub(r"\x1b\[[0-9;]*m", "", screen.getvalue())
    assert f"loss: {seen[-1]['loss']:.3f}" in drawn
    assert f"tokens/s: {seen[-1]['bar']['tokens/s']:.3f}" in drawn


def test_console_callbacks_bar_on_a_terminal_epoch_lines_elsewhere(trained, monkeypatch):
    """Built as train.py builds them, from conf/callbacks/default.yaml."""
    from hydra.utils import instantiate

    root, _ = trained
    names = lambda cfg: [type(c).__name__ for c in instantiate(cfg.callbacks.console)]
    monkeypatch.delenv("DVC_STAGE", raising=False)
    monkeypatch.delenv(logs.VERBOSE_ENV, raising=False)
    assert not sys.stdout.isatty()
    assert names(_cfg(root)) == ["EpochLines"]  # TINY turns the bar off
    assert names(_cfg(root, "trainer.enable_progress_bar=true")) == ["EpochLines", "NoBar"]
    monkeypatch.setenv("DVC_STAGE", "train@transformer")
    assert names(_cfg(root, "trainer.enable_progress_bar=true")) == ["EpochLines", "NoBar", "ModelSummary"]
    leader, follower = os.openpty()  # a real terminal as stdout
    with open(follower, "w") as tty:
        monkeypatch.setattr(sys, "stdout", tty)
        assert names(_cfg(root, "trainer.enable_progress_bar=true")) == ["RichBar", "ModelSummary"]
        assert names(_cfg(root)) == ["EpochLines", "ModelSummary"]
        monkeypatch.undo()
    os.close(leader)


@pytest.fixture
def console_state(monkeypatch):
    """Undo what logs.setup() changes in this process: warning filters, logger levels,
    handler filters, environment variables."""
    for var in (
        "DVC_STAGE",
        logs.VERBOSE_ENV,
        "MLFLOW_LOGGING_LEVEL",
        "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR",
        "MLFLOW_TRACKING_URI",
    ):
        # setenv first, so that undo restores the variable's state before the test even when
        # the test (or logs.setup) sets it directly: delenv of an absent variable records nothing
        monkeypatch.setenv(var, "")
        monkeypatch.delenv(var)
    names = ("", "pytorch_lightning", "lightning_fabric", "train", "attnlab.lit.checkpoints", "mlflow")
    levels = {n: logging.getLogger(n).level for n in names}
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    lightning_logger = logging.getLogger("pytorch_lightning")
    lightning_logger.addHandler(handler)
    for name in ("train", "attnlab.lit.checkpoints"):
        logging.getLogger(name).addHandler(handler)
        logging.getLogger(name).setLevel(logging.INFO)
    lightning_logger.setLevel(logging.INFO)
    filters = {h: list(h.filters) for n in names for h in logging.getLogger(n).handlers}
    with warnings.catch_warnings():
        yield out
    for h, f in filters.items():
        h.filters[:] = f
    lightning_logger.removeHandler(handler)
    for name in ("train", "attnlab.lit.checkpoints"):
        logging.getLogger(name).removeHandler(handler)
    for n, level in levels.items():
        logging.getLogger(n).setLevel(level)


def _emit() -> list[str]:
    """Log and warn what a training run does; return the warnings that would be shown."""
    from pytorch_lightning.utilities.warnings import PossibleUserWarning

    lightning_log = logging.getLogger("pytorch_lightning.utilities.rank_zero")
    lightning_log.info("GPU available: False, used: False")
    lightning_log.info("💡 Tip: For seamless cloud logging and experiment tracking, try installing litlogger")
    logging.getLogger("pytorch_lightning.loggers.mlflow").warning(
        "Experiment with name attnlab not found. Creating it."
    )
    lightning_log.warning("a real Lightning warning")
    logging.getLogger("train").info("resuming from last.ckpt (saved in epoch 2, after step 11)")
    logging.getLogger("attnlab.lit.checkpoints").info(
        "rank %d: checkpoint %s (exists: %s)", 0, "best.ckpt", True
    )
    logging.getLogger("attnlab.lit.checkpoints").info(
        "kept checkpoint: the mean of the weights after epochs %s", [5, 6, 7]
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.warn(
            "The 'train_dataloader' does not have many workers which may be a bottleneck.",
            PossibleUserWarning,
            stacklevel=2,
        )
        warnings.warn(
            "Glyph 25105 (\N{CJK UNIFIED IDEOGRAPH-6211}) missing from font(s) DejaVu Sans.",
            UserWarning,
            stacklevel=2,
        )
        warnings.warn("training loss is nan at step 3", UserWarning, stacklevel=2)
    return [str(w.message) for w in caught]


def test_setup_hides_known_noise_keeps_real_warnings_and_verbose_keeps_everything(console_state):
    out = console_state
    everything = [
        "GPU available: False, used: False",
        "💡 Tip: For seamless cloud logging and experiment tracking, try installing litlogger",
        "Experiment with name attnlab not found. Creating it.",
        "a real Lightning warning",
        "resuming from last.ckpt (saved in epoch 2, after step 11)",
        "rank 0: checkpoint best.ckpt (exists: True)",
        "kept checkpoint: the mean of the weights after epochs [5, 6, 7]",
    ]
    both_warnings = [
        "The 'train_dataloader' does not have many workers which may be a bottleneck.",
        "Glyph 25105 (\N{CJK UNIFIED IDEOGRAPH-6211}) missing from font(s) DejaVu Sans.",
        "training loss is nan at step 3",
    ]

    os.environ["DVC_STAGE"] = "train@transformer"
    os.environ[logs.VERBOSE_ENV] = "1"
    logs.setup()  # verbose: nothing hidden, nothing set
    assert _emit() == both_warnings
    assert out.getvalue().splitlines() == everything
    assert "MLFLOW_LOGGING_LEVEL" not in os.environ

    del os.environ[logs.VERBOSE_ENV]
    out.truncate(0), out.seek(0)
    logs.setup()  # under `dvc repro`
    assert os.environ["MLFLOW_LOGGING_LEVEL"] == "WARNING"
    assert _emit() == ["training loss is nan at step 3"]
    assert out.getvalue().splitlines() == [
        "a real Lightning warning",
        "resuming from last.ckpt (saved in epoch 2, after step 11)",
    ]


def test_setup_outside_dvc_hides_only_the_noise(console_state):
    out = console_state
    logs.setup()
    assert _emit() == ["training loss is nan at step 3"]
    assert out.getvalue().splitlines() == [
        "GPU available: False, used: False",
        "a real Lightning warning",
        "resuming from last.ckpt (saved in epoch 2, after step 11)",
        "rank 0: checkpoint best.ckpt (exists: True)",
        "kept checkpoint: the mean of the weights after epochs [5, 6, 7]",
    ]


def test_block_aligns_keys_and_mlflow_links_name_the_ui():
    assert summaries.block("t", [("a", 1), ("long key", "x"), ("skipped", None)], ["note"]) == (
        "t\n  a        : 1\n  long key : x\nnote"
    )
    assert mlflow_links("sqlite:////p/mlflow.db", "3", "abc") == [
        ("browse", "mlflow ui --backend-store-uri sqlite:////p/mlflow.db"),
        ("run page", "http://127.0.0.1:5000/#/experiments/3/runs/abc"),
    ]
    assert mlflow_links("http://h:5000/", "3", "abc") == [
        ("run page", "http://h:5000/#/experiments/3/runs/abc")
    ]


def test_importing_the_console_does_not_import_lightning():
    """download and tokenize use the console; Lightning (seconds to import) comes with
    attnlab.lit.progress, which only train imports."""
    code = (
        "import sys, attnlab.console.logs, attnlab.console.summaries, attnlab.console.runs, "
        "attnlab.console.epoch_table; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('lightning', 'pytorch_lightning')))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout == "[]\n"


_IMPORT_AFTER_SETUP = """
import logging, sys
logging.basicConfig(stream=sys.stderr, level=logging.INFO)   # a root handler, as Hydra's
from attnlab.console import logs
logs.setup()
import pytorch_lightning as pl   # imported after the console setup, as train does
trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False)
print(trainer.strategy.root_device)
"""


@pytest.mark.parametrize("stage", ["evaluate@transformer", None])
def test_lightning_imported_after_setup_stays_quiet_under_dvc(stage):
    """Importing Lightning sets its logger back to INFO; under `dvc repro` its banners
    ("GPU available: ...") still stay hidden, and outside DVC they show."""
    env = {k: v for k, v in os.environ.items() if k not in ("DVC_STAGE", logs.VERBOSE_ENV)}
    if stage:
        env["DVC_STAGE"] = stage
    result = subprocess.run(
        [sys.executable, "-c", _IMPORT_AFTER_SETUP],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        timeout=120,
    )
    assert result.stdout == "cpu\n"
    assert ("GPU available: False, used: False" in result.stderr) is (stage is None), result.stderr
