"""Self-contained exported models: TorchScript + sentencepiece + JSON, no Lightning, no Hydra.

A translation export folder ``models/<model>/`` holds
``init_state.pt`` and ``step.pt`` (TorchScript traces of the model's decoding
interface, see :mod:`attnlab.decoding`), ``spm.model`` and ``config.json``.
:func:`load_translator` needs only torch and sentencepiece; the decoding loop
is :func:`attnlab.decoding.greedy_decode`, the same one evaluation uses, so
an export decodes exactly the tokens its checkpoint does.
NW exports ``model.pt`` mapping x (Q,) float32 → ŷ (Q,), with its training
points baked in.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import warnings
from pathlib import Path

import torch
from torch import nn

from attnlab.decoding import encode_sources

FORMAT_VERSION = 1


class _InitState(nn.Module):
    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, src, src_valid_lens):
        return self.net.init_state(src, src_valid_lens)


class _Step(nn.Module):
    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, ys, *state):
        return self.net.step(ys, *state)


class _NWPredictor(nn.Module):
    def __init__(self, net, x_train, y_train):
        super().__init__()
        self.net = net
        self.register_buffer("x_train", x_train)
        self.register_buffer("y_train", y_train)

    def forward(self, x):
        return self.net(x, self.x_train, self.y_train)


def _trace(module: nn.Module, example: tuple) -> torch.jit.ScriptModule:
    with warnings.catch_warnings():  # tracer warnings about Python ints are expected here
        warnings.simplefilter("ignore")
        return torch.jit.trace(module, example, check_trace=False)


def _staging_dir(out_dir: Path) -> Path:
    """An empty, world-readable folder beside ``out_dir`` to build the export in."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    os.chmod(tmp, 0o755)  # mkdtemp makes 0700
    return tmp


def _publish(tmp: Path, out_dir: Path) -> None:
    """Replace ``out_dir`` by the finished ``tmp`` folder (never a half-written export)."""
    out_dir = Path(out_dir)
    if out_dir.exists():
        old = out_dir.with_name(out_dir.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(out_dir, old)
        os.replace(tmp, out_dir)
        shutil.rmtree(old)
    else:
        os.replace(tmp, out_dir)


def export_translation(net: nn.Module, tokenizer_path: Path, out_dir: Path, config: dict) -> Path:
    """Trace ``net`` (a Transformer or Bahdanau in eval mode) and write the export folder.

    Args:
        net: model with ``init_state``/``step`` (see :mod:`attnlab.decoding`).
        tokenizer_path: its ``spm.model``.
        out_dir: target folder, replaced atomically.
        config: JSON-serializable facts stored as ``config.json`` (model name, sizes).
    """
    import sentencepiece as spm

    net = net.eval().cpu()
    sp = spm.SentencePieceProcessor(model_file=str(tokenizer_path))
    src, valid = encode_sources(sp, ["a first example sentence .", "two"])
    out_dir = Path(out_dir)
    tmp = _staging_dir(out_dir)
    with torch.no_grad():
        state = net.init_state(src, valid)
        ys = torch.full((src.shape[0], 3), 4, dtype=torch.long)
        _trace(_InitState(net), (src, valid)).save(str(tmp / "init_state.pt"))
        _trace(_Step(net), (ys, *state)).save(str(tmp / "step.pt"))
    shutil.copy(tokenizer_path, tmp / "spm.model")
    (tmp / "config.json").write_text(json.dumps(
        {"format_version": FORMAT_VERSION, "task": "translation", **config}, indent=2))
    _publish(tmp, out_dir)
    return out_dir


def export_regression(net: nn.Module, x_train: torch.Tensor, y_train: torch.Tensor,
                      out_dir: Path, config: dict) -> Path:
    """Trace a NW model with its training points as keys/values into ``out_dir/model.pt``."""
    out_dir = Path(out_dir)
    tmp = _staging_dir(out_dir)
    predictor = _NWPredictor(net.eval(), x_train, y_train)
    with torch.no_grad():
        _trace(predictor, (x_train[:3].clone(),)).save(str(tmp / "model.pt"))
    (tmp / "config.json").write_text(json.dumps(
        {"format_version": FORMAT_VERSION, "task": "regression", **config}, indent=2))
    _publish(tmp, out_dir)
    return out_dir


def load_translator(export_dir: Path):
    """Load an export folder: (init_state, step, tokenizer, config), with torch and sentencepiece only.

    Raises:
        FileNotFoundError: if the folder is not a translation export (names the stage to run).
    """
    import sentencepiece as spm

    d = Path(export_dir)
    cfg_path = d / "config.json"
    if not cfg_path.exists():
        raise FileNotFoundError(f"{cfg_path} not found; export first with "
                                "`python src/export.py model=<name>` or `dvc repro`")
    config = json.loads(cfg_path.read_text())
    if config.get("task") != "translation":
        raise ValueError(f"{d} holds a {config.get('task')} model, not a translation model")
    init_state = torch.jit.load(str(d / "init_state.pt"), map_location="cpu")
    step = torch.jit.load(str(d / "step.pt"), map_location="cpu")
    tokenizer = spm.SentencePieceProcessor(model_file=str(d / "spm.model"))
    return init_state, step, tokenizer, config
