"""The trained translation model that an analysis or a tutorial reads: the pipeline's own, or a
short run of the pipeline.

:func:`trained_model` returns the model ``dvc repro`` trained: the checkpoint named by
``runs/<model>.json`` and the tokenizer of ``data/tokenized/<data>-<src>-<tgt>/``, for the corpus
and languages of ``params.yaml``. With ``epochs`` it can instead train one the same way, with
fewer epochs: ``src/download.py``, ``src/tokenize_data.py`` and ``src/train.py`` with the recipe of
``params.yaml`` (``models.<model>``), run in ``<root>/.cache/trained/<model>-<key>/``. That folder
has its own data, checkpoint and MLflow store, so the project's outputs are never touched.
``key`` hashes the code, the configs, ``params.yaml`` and ``epochs``: a finished run is reused
until one of them changes, and a new run deletes the model's runs of older keys. A file lock lets
two processes ask for the same run at once.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml
from filelock import FileLock
from torch import nn

from attnlab.checkpoint import load_net
from attnlab.data.tokenizer import SentencePieceTokenizer, load_sentencepiece
from attnlab.tracking.store import read_run_record


@dataclass(frozen=True)
class TrainedModel:
    """A trained translation model and where it came from.

    Attributes:
        name: the model config (``bahdanau``, ``transformer``, ``seq2seq``).
        net: the model (``attnlab.models``), in eval mode on the CPU.
        tokenizer: its sentencepiece tokenizer.
        tokenized: the tokenize stage's folder (``val.src.txt``, ``val.tgt.txt``, …).
        epochs: the epochs of a short run of the pipeline's recipe; ``None`` for the pipeline's
            own model.
        run_id: the MLflow run that trained it.
        commit: the git commit it was trained at (MLflow's ``mlflow.source.git.commit`` tag), or
            ``None`` where the run's store is not here.
        origin: one line for a reader: which run, at which commit, how many epochs.
    """

    name: str
    net: nn.Module
    tokenizer: SentencePieceTokenizer
    tokenized: Path
    epochs: int | None
    run_id: str
    commit: str | None
    origin: str


def _params(root: Path) -> dict:
    return yaml.safe_load((root / "params.yaml").read_text(encoding="utf-8"))


def _tokenized(base: Path, params: dict) -> Path:
    return base / "data" / "tokenized" / f"{params['data']}-{params['src_lang']}-{params['tgt_lang']}"


def _commit(record: dict) -> str | None:
    """The git commit of the record's MLflow run; None if its store or run is not here."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    uri = record.get("tracking_uri")
    if not uri or (uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).exists()):
        return None  # (MLflow would create an empty store)
    try:
        run = MlflowClient(uri).get_run(record["run_id"])
    except (MlflowException, OSError):
        return None
    return run.data.tags.get("mlflow.source.git.commit")


def _load(name: str, base: Path, params: dict, epochs: int | None, origin: str) -> TrainedModel:
    record = read_run_record(base / "runs" / f"{name}.json", name)
    tokenized, commit = _tokenized(base, params), _commit(record)
    return TrainedModel(
        name,
        load_net(Path(record["checkpoint"]), expected_kind=name),
        load_sentencepiece(tokenized / "spm.model"),
        tokenized,
        epochs,
        record["run_id"],
        commit,
        f"{origin}, MLflow run {record['run_id']}, commit {commit[:7] if commit else 'unknown'}",
    )


def _key(root: Path, name: str, epochs: int) -> str:
    """A digest of everything a short run depends on: src/ and conf/, params.yaml and the epochs."""
    digest = hashlib.sha256(f"{name}:{epochs}".encode())
    files = sorted([*(root / "src").rglob("*.py"), *(root / "conf").rglob("*.yaml"), root / "params.yaml"])
    for path in files:
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def _run(command: list[str], root: Path) -> None:
    done = subprocess.run(command, cwd=root, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(
            f"`{' '.join(command[1:])}` failed (exit {done.returncode}):\n"
            f"{done.stdout[-2000:]}{done.stderr[-4000:]}"
        )


def _train(root: Path, name: str, epochs: int, params: dict, run_dir: Path) -> None:
    """download → tokenize → train of the pipeline, ``epochs`` epochs, everything under ``run_dir``."""
    recipe = params["models"][name]
    data = [
        f"data={params['data']}",
        f"data.src_lang={params['src_lang']}",
        f"data.tgt_lang={params['tgt_lang']}",
    ]
    at = [f"paths.root={run_dir}"]
    python = sys.executable
    _run([python, "src/download.py", *at], root)
    _run([python, "src/tokenize_data.py", *data, *at], root)
    _run(
        [
            python,
            "src/train.py",
            f"model={name}",
            *data,
            f"optimizer={recipe['optimizer']}",
            f"seed={params['seed']}",
            "device=cpu",
            f"trainer.max_epochs={epochs}",
            "heatmaps.epoch_kinds=[]",  # no per-epoch maps or explorer: a short run needs none
            "trainer.enable_progress_bar=false",
            *recipe["overrides"].split(),
            *at,
        ],
        root,
    )


def trained_model(
    name: str, root: Path, epochs: int | None = None, *, fallback_epochs: int | None = None
) -> TrainedModel:
    """The pipeline's trained ``name``, or a run of ``epochs`` epochs of its recipe.

    Args:
        name: a translation model of ``params.yaml``'s ``models`` (``bahdanau``, ``transformer``).
        root: the project root (``params.yaml``, ``src/``, ``conf/``).
        epochs: ``None``: the pipeline's own model, which must exist. A number: train that many
            epochs with the pipeline's recipe (about a minute per epoch on 2 CPU cores for the
            default models), or reuse such a run; the pipeline's own model is not read.
        fallback_epochs: with ``epochs=None``, where the pipeline has not trained ``name``: say
            so and use a run of this many epochs instead (``None``: raise).
    Returns:
        The model, its tokenizer and its origin.
    Raises:
        FileNotFoundError: ``epochs`` and ``fallback_epochs`` are ``None`` and the pipeline has
            not trained ``name`` (names the command to run).
        RuntimeError: a step of the short run failed (its command and output).
        attnlab.checkpoint.CheckpointError: the checkpoint is unreadable (names the fix).
    """
    root = Path(root).resolve()
    params = _params(root)
    if epochs is None:
        if (root / "runs" / f"{name}.json").exists():
            return _load(name, root, params, None, f"the pipeline's {name} (`dvc repro`)")
        missing = (
            f"{root / 'runs' / f'{name}.json'} not found: the pipeline has not trained {name} here; "
            f"run `dvc repro` (or `dvc repro train@{name}`) first"
        )
        if fallback_epochs is None:
            raise FileNotFoundError(missing)
        print(f"NOTE: {missing}. Using a {fallback_epochs}-epoch run of its recipe instead.", flush=True)
        epochs = fallback_epochs
    run_dir = root / ".cache" / "trained" / f"{name}-{_key(root, name, epochs)}"
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(run_dir) + ".lock"):
        if not (run_dir / "runs" / f"{name}.json").exists():
            print(
                f"training {name} for {epochs} epoch(s) with the pipeline's recipe in {run_dir} …", flush=True
            )
            _train(root, name, epochs, params, run_dir)
            for old in run_dir.parent.glob(f"{name}-*"):  # runs of older code: never read again
                if old.is_dir() and old != run_dir:
                    shutil.rmtree(old, ignore_errors=True)
                elif old.suffix == ".lock" and old.name != f"{run_dir.name}.lock":
                    old.unlink(missing_ok=True)
    return _load(
        name, run_dir, params, epochs, f"{name} trained for {epochs} epoch(s) with the pipeline's recipe"
    )
