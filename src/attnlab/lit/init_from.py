"""Starting a training run from a trained model's weights (fine-tuning): ``+init_from=…``.

    python src/train.py model=transformer data=fra_eng +init_from=parent.ckpt
    python src/train.py model=transformer data=fra_eng +init_from=models:/attnlab-transformer@champion

The parent is a checkpoint that ``src/train.py`` wrote, or a registered model version
(``models:/<name>@<alias>`` or ``models:/<name>/<version>``, as the export stage registers
them): its weights are then the ``checkpoint/`` artifact of the training run the version was
logged from, and its tokenizer the ``spm.model`` of the exported folder (an artifact of the
pyfunc model). Only the net's weights are taken: the optimizer, the LR schedule, the epoch and
step counters and the MLflow run start afresh. The run is tagged ``init_from`` (as given) and
``parent_run_id`` (the parent's MLflow run, where known: from the checkpoint's resume state, the
``runs/<model>.json`` beside it, or the registered version).

Checked before anything is trained or tracked, each failure an :class:`InitFromError` of one
line that names the thing and the fix:

* the parent exists and is a checkpoint of this model kind (:func:`attnlab.checkpoint.load_net`,
  or the task's ``load``), and is not the file this run writes (``checkpoints/<model>/best.ckpt``);
* the corpus was tokenized with the parent's tokenizer: the sha256 of the tokenized folder's
  ``spm.model`` (``vocab.json`` for D2L's word vocabularies) is the one the parent's checkpoint
  recorded (:data:`attnlab.checkpoint.TOKENIZER_KEY`); for a parent that predates the record, the
  vocabulary's kind and size are compared (a registered parent's exported ``spm.model`` stands in);
* ``model.net`` is the parent's, but for the keys that only shape training (:data:`TRAINING_ONLY`).

A run resumed after a kill (:mod:`attnlab.lit.resume`; the config fingerprint holds
``init_from``) takes its weights from ``last.ckpt`` and never reads the parent again.
"""

from __future__ import annotations

import logging
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytorch_lightning as pl
import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn

from attnlab.checkpoint import TOKENIZER_KEY, CheckpointError, file_sha256
from attnlab.errors import UserError
from attnlab.lit.resume import LAST, ResumeState
from attnlab.tracking.store import read_run_record

log = logging.getLogger(__name__)

# model.net keys that change how the net is trained, not what its weights are or compute.
TRAINING_ONLY = frozenset({"dropout", "reinforce_weight", "entropy_weight", "gumbel_tau"})
# models:/<name>@<alias> or models:/<name>/<version> (MLflow's model registry URIs).
MODEL_URI = re.compile(r"^models:/(?P<name>[^/@]+)(?:@(?P<alias>[^/@]+)|/(?P<version>\d+))/?$")
CHECKPOINT_ARTIFACT = "checkpoint"  # the run's artifact folder train.py logs the kept checkpoint to
_MISSING = object()


class InitFromError(UserError, ValueError):
    """``init_from`` names no usable parent, or one this run cannot start from."""


@dataclass
class Parent:
    """A trained model to start from.

    Attributes:
        source: ``init_from`` as given (a path or a ``models:/`` URI).
        checkpoint: the local checkpoint file its weights were read from.
        net: its net (eval mode, CPU).
        hparams: the checkpoint's ``hyper_parameters``.
        tokenizer: the tokenizer record (:func:`attnlab.checkpoint.tokenizer_record`) it was
            trained with, or ``None`` when unknown (a checkpoint older than the record).
        tokenizer_file: a local file that holds that tokenizer, where known (the registered
            model's exported ``spm.model``, or the recorded file if it is still unchanged).
        run_id: its MLflow run, where known.
    """

    source: str
    checkpoint: Path
    net: nn.Module
    hparams: dict
    tokenizer: dict | None
    tokenizer_file: Path | None
    run_id: str | None

    def tags(self) -> dict[str, str]:
        """The fine-tune's MLflow run tags: ``init_from`` and, where known, ``parent_run_id``."""
        return {"init_from": self.source, **({"parent_run_id": self.run_id} if self.run_id else {})}


def find_parent(source: str, kind: str, tracking_uri: str, load) -> Parent:
    """The parent ``source`` names: a checkpoint path, or a ``models:/`` URI in ``tracking_uri``.

    Args:
        source: ``init_from`` as given.
        kind: this run's model (``cfg.model.name``); the parent must be one.
        tracking_uri: the store that resolves ``models:/`` URIs (``cfg.mlflow.tracking_uri``).
        load: ``load(path, expected_kind=kind)`` → net, raising ``CheckpointError``
            (:func:`attnlab.checkpoint.load_net`, or the task's ``load``).
    Raises:
        InitFromError: a missing file; a file that is no checkpoint of src/train.py or holds
            another kind of model; a malformed ``models:/`` URI, an unknown registered model,
            alias or version, or a version whose run holds no checkpoint.
    """
    tokenizer_file = run_id = None
    if source.startswith("models:/"):
        path, run_id, tokenizer_file = _from_registry(source, tracking_uri)
    else:
        path = Path(source).expanduser().resolve()
        if not path.is_file():
            raise InitFromError(
                f"init_from={source}: {path} not found; pass a checkpoint that src/train.py wrote "
                f"(a copy of checkpoints/{kind}/best.ckpt) or a registered model "
                f"(+init_from=models:/attnlab-{kind}@champion)"
            )
    try:
        net = load(path, expected_kind=kind)
    except CheckpointError as e:
        raise InitFromError(f"init_from={source}: {e}") from None
    # read again for what the net leaves out; mapped, not copied, where torch.save's zip format allows
    ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(path))
    tokenizer = ckpt.get(TOKENIZER_KEY)
    if tokenizer is None and tokenizer_file is not None:  # an older checkpoint: its export tells
        tokenizer = {
            "file": tokenizer_file.name,
            "sha256": file_sha256(tokenizer_file),
            "folder": str(tokenizer_file.parent),
        }
    elif tokenizer is not None and tokenizer_file is None:
        recorded = Path(tokenizer["folder"]) / tokenizer["file"]
        if recorded.is_file() and file_sha256(recorded) == tokenizer["sha256"]:
            tokenizer_file = recorded
    return Parent(
        source=source,
        checkpoint=path,
        net=net,
        hparams=dict(ckpt.get("hyper_parameters", {})),
        tokenizer=tokenizer,
        tokenizer_file=tokenizer_file,
        run_id=run_id or _recorded_run_id(path, ckpt, kind),
    )


def _recorded_run_id(path: Path, ckpt: dict, kind: str) -> str | None:
    """The MLflow run that wrote the checkpoint: its resume state's run id, else the run
    ``<root>/runs/<kind>.json`` records for it (the record train.py writes beside
    ``<root>/checkpoints/<kind>/``); ``None`` when neither says."""
    state = (ckpt.get("callbacks") or {}).get(ResumeState.__qualname__) or {}
    if state.get("run_id"):
        return str(state["run_id"])
    if len(path.parents) < 3:
        return None
    try:
        record = read_run_record(path.parents[2] / "runs" / f"{kind}.json", kind)
    except (FileNotFoundError, ValueError, KeyError):
        return None
    return record.get("run_id") if Path(record["checkpoint"]) == path else None


def _from_registry(uri: str, tracking_uri: str) -> tuple[Path, str, Path | None]:
    """(local checkpoint, run id, local exported tokenizer or None) of a registered version.

    The weights are the kept checkpoint train.py logged to the version's run (``checkpoint/``);
    the tokenizer is the ``spm.model`` of the folder the pyfunc model carries as an artifact
    (:func:`attnlab.serving.registry.log_served_model`). A local store's files are read where
    they are; a server's are downloaded to a temporary folder.
    """
    import mlflow
    from mlflow.exceptions import MlflowException

    m = MODEL_URI.match(uri)
    if m is None:
        raise InitFromError(
            f"init_from={uri} is not a registered model version: write models:/<name>@<alias> or "
            "models:/<name>/<version>, e.g. models:/attnlab-transformer@champion"
        )
    name, alias, version = m["name"], m["alias"], m["version"]
    client = mlflow.MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
    try:
        if alias:
            mv = client.get_model_version_by_alias(name, alias)
        else:
            mv = client.get_model_version(name, version)
    except MlflowException:
        raise InitFromError(_unknown_version(client, uri, name, alias, version, tracking_uri)) from None
    fix = "pass a checkpoint file instead (+init_from=<file>.ckpt)"
    if not mv.run_id:
        raise InitFromError(
            f"init_from={uri}: version {mv.version} of {name} was registered from no MLflow run, "
            f"so there is no training checkpoint to start from; {fix}"
        )
    try:
        listed = client.list_artifacts(mv.run_id, CHECKPOINT_ARTIFACT)
        found = [f.path for f in listed if f.path.endswith(".ckpt")]
        if len(found) == 1:
            path = mlflow.artifacts.download_artifacts(
                run_id=mv.run_id, artifact_path=found[0], tracking_uri=tracking_uri
            )
    except (MlflowException, OSError) as e:
        raise InitFromError(
            f"init_from={uri}: the checkpoint of its training run {mv.run_id} cannot be read "
            f"({type(e).__name__}: {str(e).splitlines()[0][:300]}); {fix}"
        ) from None
    if len(found) != 1:
        held = f"several ({', '.join(found)})" if found else "none"
        raise InitFromError(
            f"init_from={uri}: its training run {mv.run_id} holds {held} checkpoint under "
            f"{CHECKPOINT_ARTIFACT}/ where src/train.py logs one; {fix}"
        )
    return Path(path), mv.run_id, _exported_tokenizer(uri.rstrip("/"), tracking_uri)


def _exported_tokenizer(uri: str, tracking_uri: str) -> Path | None:
    """The ``spm.model`` in the artifact folders of the registered pyfunc model (its MLmodel's
    ``python_function`` artifacts), or None if it has none."""
    import mlflow
    from mlflow.exceptions import MlflowException
    from mlflow.models import Model

    get = lambda rel: Path(
        mlflow.artifacts.download_artifacts(
            artifact_uri=f"{uri}/{rel}", tracking_uri=tracking_uri, registry_uri=tracking_uri
        )
    )
    try:
        folders = Model.load(get("MLmodel")).flavors.get("python_function", {}).get("artifacts", {})
    except (MlflowException, OSError):
        return None
    for entry in folders.values():
        try:
            return get(f"{entry['path']}/spm.model")
        except (MlflowException, OSError, KeyError, TypeError):
            continue
    return None


def _unknown_version(client, uri: str, name: str, alias: str | None, version: str | None, store: str) -> str:
    """The error line for a ``models:/`` URI the registry does not resolve: which part is unknown,
    and what the store holds instead."""
    from mlflow.exceptions import MlflowException

    try:
        model = client.get_registered_model(name)
    except MlflowException:
        names = sorted(rm.name for rm in client.search_registered_models())
        return (
            f"init_from={uri}: no registered model {name} in {store} (registered: "
            f"{', '.join(names) or 'none'}); register one with `python src/export.py model=<model>`, "
            "or set MLFLOW_TRACKING_URI to the store that holds it"
        )
    if alias:
        held = ", ".join(f"{a} (version {v})" for a, v in sorted(model.aliases.items())) or "none"
        return (
            f"init_from={uri}: {name} has no alias {alias} (its aliases: {held}); use one of them "
            f"or a version, models:/{name}/<version>"
        )
    versions = sorted(int(v.version) for v in client.search_model_versions(f"name='{name}'"))
    return (
        f"init_from={uri}: {name} has no version {version} (its versions: "
        f"{', '.join(map(str, versions)) or 'none'}); use one of them or an alias, models:/{name}@champion"
    )


def check_parent(parent: Parent, cfg: DictConfig, module: pl.LightningModule) -> None:
    """Refuse a parent whose vocabulary or net differs from this run's.

    ``module`` is this run's (its ``hparams``, and its ``tokenizer_facts`` where it trains on a
    tokenized corpus).

    Raises:
        InitFromError: the corpus was tokenized with another tokenizer (names the
            ``tokenize_data.py`` command that uses the parent's); ``model.net`` keys differ from
            the parent's (names them, both values and the overrides that match the parent).
    """
    _check_tokenizer(parent, cfg, module)
    _check_net(parent, cfg)


def _vocabulary(hparams) -> str:
    """The vocabulary a module's hparams describe, in words."""
    if hparams.get("src_vocab_size"):
        return (
            f"D2L's word vocabularies ({hparams.get('vocab_size')} target, "
            f"{hparams['src_vocab_size']} source words)"
        )
    return f"{hparams.get('vocab_size')} sentencepiece pieces"


def _check_tokenizer(parent: Parent, cfg: DictConfig, module) -> None:
    here, there = getattr(module, "tokenizer_facts", None), parent.tokenizer
    folder = here["folder"] if here else "this run's corpus"
    if there is None:  # a parent older than the record, or a task without a corpus: sizes only
        sizes = lambda hp: (hp.get("vocab_size"), hp.get("src_vocab_size"))
        if sizes(module.hparams) == sizes(parent.hparams):
            if here is not None:
                log.warning(
                    "init_from=%s predates tokenizer records: only its vocabulary's kind and size "
                    "(%s) could be compared with %s's",
                    parent.source,
                    _vocabulary(parent.hparams),
                    folder,
                )
            return
        raise InitFromError(
            f"init_from={parent.source}: {folder} was tokenized with another tokenizer: "
            f"{_vocabulary(module.hparams)}, the parent's {_vocabulary(parent.hparams)} (the parent "
            "predates tokenizer records, so only the vocabularies' kind and size are compared); "
            "fine-tuning keeps the parent's vocabulary: run "
            + _tokenize_command(cfg, "<the spm.model of the parent's tokenized folder>")
            + " first"
        )
    if here is not None and (here["file"], here["sha256"]) == (there["file"], there["sha256"]):
        return
    what = f"{here['file']} sha256 {here['sha256'][:12]}…" if here else "no tokenizer"
    raise InitFromError(
        f"init_from={parent.source}: {folder} was tokenized with another tokenizer ({what}, the "
        f"parent's {there['file']} sha256 {there['sha256'][:12]}…); fine-tuning keeps the parent's "
        f"vocabulary: {_tokenizer_fix(parent, cfg)}"
    )


def _tokenizer_fix(parent: Parent, cfg: DictConfig) -> str:
    """How to tokenize this corpus with the parent's tokenizer."""
    there = parent.tokenizer
    recorded = Path(there["folder"]) / there["file"]
    if there["file"] != "spm.model":
        return (
            f"the parent trained on D2L's word vocabularies ({recorded}), which data.tokenizer_from "
            "cannot reuse (it takes a sentencepiece model): fine-tune it on that folder's corpus"
        )
    if parent.tokenizer_file is not None:
        where = (
            f"the spm.model exported with {parent.source}"
            if parent.source.startswith("models:/")
            else "the spm.model the parent recorded"
        )
        return f"run {_tokenize_command(cfg, str(parent.tokenizer_file))} first ({where})"
    return (
        f"run {_tokenize_command(cfg, '<the parent’s spm.model>')} first; the parent recorded "
        f"{recorded}, which is gone or has changed since: use a copy whose sha256 is "
        f"{there['sha256']} (e.g. the spm.model of the parent's export, models/{cfg.model.name}/)"
    )


def _tokenize_command(cfg: DictConfig, tokenizer_from: str) -> str:
    """``python src/tokenize_data.py`` with this run's ``data``/``paths`` overrides and
    ``data.tokenizer_from``, in backquotes."""
    d = cfg.data
    try:
        from hydra.core.hydra_config import HydraConfig

        given = list(HydraConfig.get().overrides.task)
    except ValueError:  # not in a Hydra app: the corpus as the config names it
        given = [*([f"data.path={d.path}"] if d.get("path") else []), f"data.src_lang={d.src_lang}"]
        given.append(f"data.tgt_lang={d.tgt_lang}")
    key = lambda o: o.lstrip("+~").split("=", 1)[0]
    keep = [o for o in given if key(o).split(".")[0] in ("data", "paths") and key(o) != "data.tokenizer_from"]
    if not any(key(o) == "data" for o in keep):
        keep.insert(0, f"data={d.name}")
    if d.name == "parallel" and not any(key(o) == "data.path" for o in keep):
        keep.insert(1, f"data.path={d.get('path') or '<your corpus folder>'}")
    return f"`python src/tokenize_data.py {' '.join(keep)} data.tokenizer_from={tokenizer_from}`"


def _show(value) -> str:
    """A config value as a Hydra override writes it."""
    if value is _MISSING:
        return "(not set)"
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    return str(value)


def _check_net(parent: Parent, cfg: DictConfig) -> None:
    theirs = parent.hparams.get("net")
    if not isinstance(theirs, dict) or cfg.model.get("net") is None:
        return  # a net without a config (NW): its weights' shapes are checked when loaded
    ours = OmegaConf.to_container(cfg.model.net, resolve=True)
    keys = sorted((set(ours) | set(theirs)) - TRAINING_ONLY)
    differ = [k for k in keys if ours.get(k, _MISSING) != theirs.get(k, _MISSING)]
    if not differ:
        return
    both = "; ".join(
        f"model.net.{k}={_show(ours.get(k, _MISSING))} here, {_show(theirs.get(k, _MISSING))} in the parent"
        for k in differ
    )
    fix = " ".join(f"model.net.{k}={_show(theirs[k])}" for k in differ if k in theirs)
    raise InitFromError(
        f"init_from={parent.source}: the net differs from the parent's: {both}; fine-tuning keeps "
        f"the parent's architecture: run with {fix} (or leave those keys at the parent's values)"
    )


def _own_output(source: str, cfg: DictConfig) -> Path | None:
    """The checkpoint file this run writes that ``source`` names, if it names one."""
    if source.startswith("models:/"):
        return None
    path, folder = Path(source).expanduser().resolve(), Path(cfg.paths.checkpoints).resolve()
    written = {folder / f"{cfg.checkpoint.filename}.ckpt", folder / f"{LAST}.ckpt"}
    return path if path in written and path.is_file() else None


def start_from_parent(cfg: DictConfig, module: pl.LightningModule, load) -> Parent:
    """Load the net weights of the parent ``cfg.init_from`` names into ``module.net``, after
    :func:`find_parent` and :func:`check_parent`; nothing else of the parent is taken.

    Args:
        cfg: the composed config (``init_from``, ``model``, ``paths``, ``checkpoint``, ``mlflow``).
        module: this run's freshly built module.
        load: see :func:`find_parent`.
    Raises:
        InitFromError: see :func:`find_parent` and :func:`check_parent`; the parent is the
            checkpoint this run writes (it would be replaced); weights that do not fit.
    """
    source = str(cfg.init_from)
    if (own := _own_output(source, cfg)) is not None:
        raise InitFromError(
            f"init_from={source}: {own} is the checkpoint this run writes, so fine-tuning would "
            f"replace it: copy it first (`cp {source} parent.ckpt`, then +init_from=parent.ckpt), "
            f"or start from its registered model (+init_from=models:/attnlab-{cfg.model.name}@champion)"
        )
    parent = find_parent(source, cfg.model.name, cfg.mlflow.tracking_uri, load)
    check_parent(parent, cfg, module)
    try:
        module.net.load_state_dict(parent.net.state_dict())
    except RuntimeError as e:
        raise InitFromError(
            f"init_from={source}: its weights do not fit this run's {cfg.model.name} "
            f"({str(e).splitlines()[0]}); start from a parent of the same configuration"
        ) from None
    log.info(
        "init_from=%s: starting from the weights of %s (MLflow run %s); optimizer, LR schedule, "
        "epochs and MLflow run start afresh",
        source,
        parent.checkpoint,
        parent.run_id or "unknown",
    )
    return parent
