"""Rebuild a trained model from a training checkpoint with torch and Hydra only.

``train.py`` saves Lightning checkpoints whose ``hyper_parameters`` are plain
containers (so ``torch.load(weights_only=True)`` works) and whose
``state_dict`` keys start with ``net.``. Evaluation and export read them here
without importing Lightning, which keeps those stages quick to start.
"""

from __future__ import annotations

import hashlib
import pickle
import zipfile
from pathlib import Path

import torch
from torch import nn

from attnlab.data.tokenizer import PAD_ID
from attnlab.errors import UserError
from attnlab.models import UnknownModelError, build_net
from attnlab.models.nadaraya_watson import NadarayaWatson

# The key under which a checkpoint records the tokenizer file it was trained with
# (:func:`tokenizer_record`; ``TranslationModule.on_save_checkpoint`` writes it). Checkpoints
# written before it existed lack it, and load as before.
TOKENIZER_KEY = "tokenizer"
# The tokenizer files of a tokenized folder, in the order attnlab.data.tokenizer.load_tokenizer
# looks for them: D2L's word vocabularies, else sentencepiece.
TOKENIZER_FILES = ("vocab.json", "spm.model")


class CheckpointError(UserError, ValueError):
    """The checkpoint is missing or was not written by attnlab's train.py."""


def file_sha256(path: Path) -> str:
    """SHA-256 (hex) of the file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def tokenizer_record(tokenized_dir: Path) -> dict | None:
    """What a checkpoint records (under :data:`TOKENIZER_KEY`) of the tokenizer it trained with.

    Returns:
        ``{"file": "spm.model" or "vocab.json", "sha256": hex digest of its bytes, "folder":
        the tokenized folder, absolute}``, the file :func:`attnlab.data.tokenizer.load_tokenizer`
        reads; ``None`` when ``tokenized_dir`` holds neither (a model trained on no corpus).
    """
    folder = Path(tokenized_dir).resolve()
    for name in TOKENIZER_FILES:
        if (folder / name).is_file():
            return {"file": name, "sha256": file_sha256(folder / name), "folder": str(folder)}
    return None


class TokenizerMismatchError(UserError, ValueError):
    """A stage was given a tokenized corpus other than the one the checkpoint trained on."""


def check_trained_tokenizer(checkpoint: Path, tokenized_dir: Path) -> None:
    """Refuse to evaluate or export a checkpoint with another corpus's tokenizer: the
    checkpoint's :data:`TOKENIZER_KEY` record against ``tokenized_dir``'s file (sha256). A
    checkpoint without the record, or a folder without a tokenizer, is not checked.

    Raises:
        TokenizerMismatchError: names both tokenizers and the fix (the data settings of train).
    """
    _check_tokenizer(checkpoint, torch.load(checkpoint, map_location="cpu", weights_only=True), tokenized_dir)


def _check_tokenizer(checkpoint: Path, ckpt: dict, tokenized_dir: Path) -> None:
    """:func:`check_trained_tokenizer` of the loaded checkpoint ``ckpt`` (read from ``checkpoint``)."""
    theirs = ckpt.get(TOKENIZER_KEY)
    here = tokenizer_record(tokenized_dir)
    if not theirs or not here or theirs.get("sha256") == here["sha256"]:
        return
    raise TokenizerMismatchError(
        f"{checkpoint} trained with {theirs.get('folder')}/{theirs.get('file')} (sha256 "
        f"{str(theirs.get('sha256'))[:12]}…), not with {here['folder']}/{here['file']} (sha256 "
        f"{here['sha256'][:12]}…): give this stage the data settings the model trained with "
        "(e.g. data=parallel data.src_lang=zh data.tgt_lang=en), or tokenize that corpus again"
    )


def _saved_by_torch(path: Path) -> bool:
    """Whether the file is laid out as ``torch.save`` writes one: a zip archive, or (torch < 1.6)
    a pickle, which starts with the PROTO opcode."""
    if zipfile.is_zipfile(path):
        return True
    with open(path, "rb") as f:
        return f.read(1) == b"\x80"


def changed_record(path: Path) -> str | None:
    """The first record of the ``torch.save`` zip archive ``path`` whose bytes no longer match
    the CRC-32 the archive stores for it (bytes changed after the file was written, which
    ``torch.load`` does not check); None when all match, or when ``path`` is no zip archive."""
    try:
        with zipfile.ZipFile(path) as archive:
            return archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError):
        return None  # not a zip: torch.load names what it is


def load_net(path: Path, expected_kind: str | None = None, tokenized_dir: Path | None = None) -> nn.Module:
    """The checkpoint's model (``attnlab.models``) in eval mode on the CPU.

    The file is read once, with ``torch.load(weights_only=True)``: tensors and plain
    containers only, never arbitrary pickled objects.

    Args:
        path: the checkpoint train.py kept (``checkpoints/<model>/best.ckpt``, or
            ``final.ckpt`` with ``checkpoint.monitor=null checkpoint.filename=final``).
        expected_kind: ``nw``, ``bahdanau`` or ``transformer``; checked against the checkpoint.
        tokenized_dir: the tokenized corpus the model will read or carry (evaluate, export):
            checked as :func:`check_trained_tokenizer` does; ``None``: not checked.
    Raises:
        TokenizerMismatchError: ``tokenized_dir`` is another corpus's (names both and the fix).
        CheckpointError: missing file; a truncated, corrupt or changed file (a record whose
            CRC-32 fails), or one that is no torch checkpoint; one holding objects
            ``weights_only=True`` refuses
            (e.g. OmegaConf configs); a foreign checkpoint; a model of another
            kind than ``expected_kind``; weights that do not fit the model; a model
            config naming a class other than attnlab's models (see
            :func:`attnlab.models.build_net`: nothing it names is imported or called).
            Each names the file and the fix (retrain with ``src/train.py``).
    """
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path} not found; train first (`dvc repro` or `python src/train.py`)")
    if (record := changed_record(path)) is not None:
        raise CheckpointError(
            f"{path} is damaged: the bytes of its record {record} changed after it was written "
            "(their CRC-32 does not match); retrain with `python src/train.py` or copy the file again"
        )
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        if "Weights only load failed" not in str(e) or not _saved_by_torch(path):
            why = str(e) if _saved_by_torch(path) else "neither a zip archive nor a pickle"
            raise CheckpointError(
                f"{path} is corrupt or not a torch checkpoint ({why}); "
                "retrain with `python src/train.py` or copy the file again"
            ) from None
        raise CheckpointError(
            f"{path} holds Python objects that torch.load(weights_only=True) refuses (attnlab never "
            "unpickles arbitrary objects), e.g. OmegaConf configs in its hyper_parameters; it was not "
            "written by this version of src/train.py: retrain with `python src/train.py`"
        ) from None
    except (RuntimeError, EOFError, KeyError, ValueError, OSError) as e:
        raise CheckpointError(
            f"{path} is truncated or not a torch checkpoint "
            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else 'empty'}); "
            "retrain with `python src/train.py` or copy the file again"
        ) from None
    hp = ckpt.get("hyper_parameters", {}) if isinstance(ckpt, dict) else {}
    if "net" in hp:
        extra = {"src_vocab_size": hp["src_vocab_size"]} if hp.get("src_vocab_size") else {}
        try:  # attnlab's own model classes only: nothing else the file names is imported
            net = build_net(hp["net"], vocab_size=hp["vocab_size"], pad_id=PAD_ID, **extra)
        except UnknownModelError as e:
            raise CheckpointError(f"{path}: {e}") from None
    elif "init_w" in hp:
        net = NadarayaWatson(parametric=True, init_w=hp["init_w"])
    else:
        raise CheckpointError(
            f"{path} was not written by attnlab's src/train.py (no model "
            "hyper_parameters); pass a checkpoints/<model>/ file or retrain with "
            "`python src/train.py`"
        )
    if expected_kind is not None and net.kind != expected_kind:
        raise CheckpointError(
            f"{path} holds a {net.kind} model, not {expected_kind}; pass "
            f"checkpoints/{expected_kind}/ (train it with `python src/train.py "
            f"model={expected_kind}`) or run with model={net.kind}"
        )
    if tokenized_dir is not None:
        _check_tokenizer(path, ckpt, tokenized_dir)
    try:
        net.load_state_dict(
            {k[len("net.") :]: v for k, v in ckpt.get("state_dict", {}).items() if k.startswith("net.")}
        )
    except RuntimeError as e:
        raise CheckpointError(
            f"{path}: its weights do not fit the {net.kind} model its "
            f"hyper_parameters describe ({str(e).splitlines()[0]}); "
            "retrain with `python src/train.py`"
        ) from None
    return net.eval()
