"""The image classifiers' export stage (ViT, D2L 11.8 (no zh section), and its CNN baseline):
a ``torch.export``
program with a dynamic batch size, loadable with torch alone.

``conf/model/{vit,cnn}.yaml`` name :func:`export_classifier` as ``task.export``. The folder
``models/<model>/`` holds ``model.pt2`` (images (B, C, H, W) float32 in [0, 1] → logits
(B, num_classes) float32; :func:`attnlab.export.program.load_program` loads it) and
``config.json`` (the image size, channels, classes, how pixels are scaled, the model and data
configs, the MLflow run).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn

from attnlab.export.program import MAX_SIZE, load_program
from attnlab.files import staged_dir
from attnlab.vision.data import load_image_splits

FORMAT_VERSION = 1
PROGRAM = "model.pt2"


def export_image_program(net: nn.Module, example: torch.Tensor, path: Path) -> torch.export.ExportedProgram:
    """``torch.export`` ``net`` (eval mode) for images shaped like ``example`` (B, C, H, W), any
    batch size from 1 to :data:`attnlab.export.program.MAX_SIZE`, and save it to ``path``."""
    batch = torch.export.Dim("batch", min=1, max=MAX_SIZE)
    with torch.no_grad():
        program = torch.export.export(net.eval(), (example,), dynamic_shapes=({0: batch},))
    torch.export.save(program, str(path))
    return program


def export_classifier(cfg: DictConfig, net: nn.Module, record: dict, out_dir: Path) -> dict:
    """``model.pt2`` and ``config.json`` in ``out_dir`` (built aside, then put in its place), after
    checking that the saved program, loaded back, gives the net's logits on the first test images
    (to 1e-5); nothing is registered in MLflow.

    Returns:
        ``{}`` (the summary names the folder and the run).
    Raises:
        AssertionError: the reloaded program's logits differ from the net's.
    """
    data = cfg.data
    splits = load_image_splits(data)
    images = splits.splits["test"][0][:8]
    with staged_dir(Path(out_dir)) as tmp:
        export_image_program(net, images, tmp / PROGRAM)
        with torch.no_grad():
            torch.testing.assert_close(
                load_program(tmp / PROGRAM)(images), net.eval()(images), rtol=1e-5, atol=1e-5
            )
        facts = {
            "format_version": FORMAT_VERSION,
            "task": "classification",
            "model": cfg.model.name,
            "program": PROGRAM,
            "input": f"float32 (B, {data.channels}, {data.image_size}, {data.image_size}), pixels in [0, 1]",
            "num_classes": data.num_classes,
            "classes": list(splits.classes),  # the name of each output, in logit order
            "mlflow_run_id": record["run_id"],
            "model_config": OmegaConf.to_container(cfg.model, resolve=True),
            "data": OmegaConf.to_container(data, resolve=True),
        }
        (tmp / "config.json").write_text(json.dumps(facts, indent=2))
    return {}
