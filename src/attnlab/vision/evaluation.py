"""The image classifiers' evaluate stage (ViT, D2L 11.8 (no zh section), and its CNN baseline):
the net back from a
training checkpoint, test accuracy, and the summary ``src/evaluate.py`` prints.

``conf/model/{vit,cnn}.yaml`` name these as ``task.load``, ``task.evaluate`` and
``task.summary``. Nothing here imports Lightning.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn
from torch.nn import functional as F

from attnlab.checkpoint import CheckpointError
from attnlab.console.runs import mlflow_client, mlflow_links
from attnlab.console.summaries import block
from attnlab.device import single_device
from attnlab.inference.evaluation import Evaluation
from attnlab.vision.data import load_image_splits
from attnlab.vision.vit import build_image_net

BATCH_SIZE = 256  # test images scored together


def load_classifier(
    path: Path, expected_kind: str | None = None, tokenized_dir: Path | None = None
) -> nn.Module:
    """The image classifier a ``src/train.py`` checkpoint of ``model=vit``/``cnn`` holds, in eval
    mode on the CPU, read with ``torch.load(weights_only=True)`` (tensors and plain containers only).
    ``tokenized_dir`` is accepted as :func:`attnlab.checkpoint.load_net` takes it (a task's
    ``load``), and not read: an image model has no tokenizer.

    Raises:
        CheckpointError: a missing, corrupt or foreign file; a model of another kind than
            ``expected_kind`` (``vit``, ``cnn``); weights that do not fit (each names the fix).
    """
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path} not found; train first (`python src/train.py model={expected_kind}`)")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, KeyError, ValueError, OSError) as e:
        raise CheckpointError(
            f"{path} is not a checkpoint of src/train.py ({type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else 'empty'}); retrain with `python src/train.py`"
        ) from None
    hp = ckpt.get("hyper_parameters", {}) if isinstance(ckpt, dict) else {}
    if not {"net", "image_size", "channels", "num_classes"} <= set(hp):
        raise CheckpointError(
            f"{path} holds no image classifier of attnlab's src/train.py; pass checkpoints/vit/ or "
            "checkpoints/cnn/ files, or retrain with `python src/train.py model=vit`"
        )
    try:
        net = build_image_net(hp["net"], hp["image_size"], hp["channels"], hp["num_classes"])
    except ValueError as e:
        raise CheckpointError(f"{path}: {e}") from None
    if expected_kind is not None and net.kind != expected_kind:
        raise CheckpointError(
            f"{path} holds a {net.kind} model, not {expected_kind}; run with model={net.kind}"
        )
    try:
        net.load_state_dict({k[4:]: v for k, v in ckpt.get("state_dict", {}).items() if k.startswith("net.")})
    except RuntimeError as e:
        raise CheckpointError(
            f"{path}: its weights do not fit the {net.kind} model its hyper_parameters describe "
            f"({str(e).splitlines()[0]}); retrain with `python src/train.py`"
        ) from None
    return net.eval()


@torch.no_grad()
def predict(net: nn.Module, images: torch.Tensor, device: torch.device | str = "cpu") -> torch.Tensor:
    """Logits (N, num_classes) float32 of ``images`` (N, C, H, W), in batches of :data:`BATCH_SIZE`."""
    net = net.to(device).eval()
    return torch.cat([net(x.to(device)).cpu() for x in images.split(BATCH_SIZE)])


def evaluate_classification(cfg: DictConfig, net: nn.Module) -> Evaluation:
    """Top-1 accuracy and mean cross-entropy of ``net`` on the test split of ``data``
    (:func:`attnlab.vision.data.load_image_splits`, ``data.subset`` applies), on the device
    ``device`` names. Scores: ``accuracy`` (in [0, 1]), ``loss`` (nats per image),
    ``num_images``, ``errors``, ``data`` (the data config that says which split); MLflow
    ``test_accuracy`` and ``test_loss``.

    Raises:
        ValueError: data that hold no images.
        attnlab.device.DeviceUnavailableError: the device is not available here.
    """
    images, labels = load_image_splits(cfg.data).splits["test"]
    logits = predict(net, images, single_device(cfg.device))
    correct = int((logits.argmax(-1) == labels).sum())
    accuracy = correct / len(labels)
    loss = float(F.cross_entropy(logits, labels))
    scores = {
        "accuracy": accuracy,
        "loss": loss,
        "num_images": len(labels),
        "errors": len(labels) - correct,
        "data": OmegaConf.to_container(cfg.data, resolve=True),
    }
    return Evaluation(scores, {"test_accuracy": accuracy, "test_loss": loss})


def classification_summary(
    name: str,
    scores: dict,
    metrics_path: Path,
    record: dict,
    hypotheses: Path | None = None,
    logged=(),
) -> str:
    """The end-of-evaluation summary of an image classifier (the arguments of
    :func:`attnlab.console.summaries.evaluate_summary`; ``hypotheses`` is always ``None``)."""
    rows: list[tuple[str, object]] = [
        ("test accuracy", f"{scores['accuracy']:.4f} ({scores['errors']} of {scores['num_images']} wrong)"),
        ("test loss", f"{scores['loss']:.4f} (cross-entropy per image)"),
        ("metrics", metrics_path),
    ]
    uri, run_id = record["tracking_uri"], record["run_id"]
    what = f" (logged {', '.join(logged)})" if logged else ""
    notes = []
    try:
        experiment_id = mlflow_client(uri).get_run(run_id).info.experiment_id
        rows += [("MLflow run", run_id + what), *mlflow_links(uri, experiment_id, run_id)]
    except Exception as e:  # noqa: BLE001 - the summary notes an unreadable run and goes on
        rows.append(("MLflow run", run_id + what))
        notes.append(f"could not read run {run_id} from {uri} ({type(e).__name__})")
    return block(f"{name}: {scores['num_images']} test images scored", rows, notes)
