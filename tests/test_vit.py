"""The Vision Transformer (D2L 11.8 (no zh section); Dosovitskiy et al. 2021), its
CNN baseline, the image data (scikit-learn's digits; MNIST and CIFAR-10 through torchvision) and
the train → evaluate → export stages of ``model=vit`` / ``model=cnn``.
"""

import hashlib
import json
import pickle
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir

import attnlab  # noqa: F401 - registers the resolvers conf/ uses, as the apps do
from attnlab.analysis.explorer import decode_weights, read_data
from attnlab.export.program import load_program
from attnlab.vision.data import load_image_splits
from attnlab.vision.evaluation import load_classifier
from attnlab.vision.lit import patch_tokens
from attnlab.vision.vit import PatchEmbedding, SmallCNN, VisionTransformer, build_image_net
from helpers.tiny_train import env

ROOT = Path(__file__).resolve().parents[1]
CONF = str(ROOT / "conf")


def _compose(*overrides, root="/tmp/attnlab-root"):
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return compose(config_name="config", overrides=[f"paths.root={root}", *overrides])


def _params(net):
    return sum(p.numel() for p in net.parameters())


# --- the model -------------------------------------------------------------------------------


def test_patch_embedding_cuts_an_arange_image_into_row_major_patches():
    """A 4×4 image 0..15 in 2×2 patches, embedded by a convolution set to copy pixel (i, j) of a
    patch into feature 2i + j: patch k is the k-th 2×2 block, left to right, then top to bottom."""
    embed = PatchEmbedding(image_size=4, patch_size=2, in_channels=1, d_model=4)
    with torch.no_grad():
        embed.conv.weight.copy_(torch.eye(4).reshape(4, 1, 2, 2))
        embed.conv.bias.zero_()
    image = torch.arange(16.0).reshape(1, 1, 4, 4)
    # rows of the image: [0 1 2 3], [4 5 6 7], [8 9 10 11], [12 13 14 15]
    expected = [[0, 1, 4, 5], [2, 3, 6, 7], [8, 9, 12, 13], [10, 11, 14, 15]]
    assert embed(image).tolist() == [expected]
    assert (embed.grid, embed.num_patches) == (2, 4)


def test_patch_embedding_keeps_channels_apart():
    """Two channels, the second 100 + the first: feature c·4 + 2i + j of a patch is pixel (i, j) of
    channel c."""
    embed = PatchEmbedding(image_size=4, patch_size=2, in_channels=2, d_model=8)
    with torch.no_grad():
        embed.conv.weight.copy_(torch.eye(8).reshape(8, 2, 2, 2))
        embed.conv.bias.zero_()
    first = torch.arange(16.0).reshape(1, 1, 4, 4)
    out = embed(torch.cat([first, first + 100], 1))
    assert out[0, 3].tolist() == [10, 11, 14, 15, 110, 111, 114, 115]  # the bottom-right patch


def test_shapes_of_the_vit_and_the_cnn():
    torch.manual_seed(0)
    vit = VisionTransformer(image_size=8, in_channels=1, num_classes=10).eval()
    X = torch.rand(5, 1, 8, 8)
    assert vit(X).shape == (5, 10)
    assert vit.encode(X).shape == (5, 1 + 16, 64)  # class token + (8/2)² patches, d_model 64
    maps = vit.class_token_attention(X)
    assert [m.shape for m in maps] == [(5, 4, 4, 4)] * 2  # per layer: (B, heads, 4, 4 patches)
    weights = vit.blks[-1].attention.attention_weights  # (B, H, 17, 17)
    torch.testing.assert_close(maps[-1].sum((-2, -1)) + weights[:, :, 0, 0], torch.ones(5, 4))
    cifar = VisionTransformer(image_size=32, in_channels=3, num_classes=10, patch_size=4).eval()
    assert cifar.encode(torch.rand(2, 3, 32, 32)).shape == (2, 1 + 64, 64)
    assert SmallCNN(image_size=28, in_channels=1, num_classes=10)(torch.rand(3, 1, 28, 28)).shape == (3, 10)


def test_the_class_token_is_position_0_and_the_classifier_reads_it():
    """With no encoder block the sequence is [cls + p_0, patch_k + p_{k+1}, ...] exactly; with blocks
    the logits are the head applied to position 0 and to nothing else."""
    torch.manual_seed(0)
    bare = VisionTransformer(image_size=8, in_channels=1, num_classes=10, num_layers=0).eval()
    with torch.no_grad():
        bare.cls_token.normal_()
    X = torch.rand(3, 1, 8, 8)
    out = bare.encode(X)
    pos = bare.pos_embedding[0]
    torch.testing.assert_close(out[:, 0], (bare.cls_token[0, 0] + pos[0]).expand(3, -1))
    torch.testing.assert_close(out[:, 1:], bare.patch_embedding(X) + pos[1:])
    vit = VisionTransformer(image_size=8, in_channels=1, num_classes=10).eval()
    encoded = vit.encode(X)
    torch.testing.assert_close(vit(X), vit.head(encoded[:, 0]))
    assert not torch.allclose(vit.head(encoded[:, 1]), vit(X))  # another position gives other logits


@pytest.mark.parametrize("cls", [VisionTransformer, SmallCNN])
def test_an_image_alone_gives_the_logits_it_gets_in_a_batch(cls):
    torch.manual_seed(0)
    net = cls(image_size=8, in_channels=1, num_classes=10).eval()
    X = torch.rand(6, 1, 8, 8)
    with torch.no_grad():
        batch = net(X)
        alone = torch.cat([net(X[i : i + 1]) for i in range(6)])
    torch.testing.assert_close(alone, batch, rtol=1e-5, atol=1e-6)


def test_bad_sizes_and_foreign_targets_are_clear_errors():
    with pytest.raises(ValueError, match="image_size=28 is not divisible by patch_size=3"):
        VisionTransformer(image_size=28, in_channels=1, num_classes=10, patch_size=3)
    with pytest.raises(ValueError, match="divisible by 4"):
        SmallCNN(image_size=10, in_channels=1, num_classes=10)
    with pytest.raises(ValueError, match="attnlab builds only"):
        build_image_net({"_target_": "os.system"}, 8, 1, 10)


def test_vit_and_cnn_have_about_the_same_number_of_parameters():
    """The default configs on digits; counts by hand (weights + biases):
    ViT: patch conv 4·64+64, class token 64, positions 17·64, 2 blocks × (W_q,k,v,o 4·64² +
    two layer norms 2·128 + FFN 64·128+128+128·64+64), head 64·10+10 = 68,554.
    CNN: 9·32+32, 32·9·64+64, 64·9·72+72, linear 72·2·2·10+10 = 63,250."""
    counts = {}
    for model in ("vit", "cnn"):
        cfg = _compose(f"model={model}")
        counts[model] = _params(build_image_net(dict(cfg.model.net), 8, 1, 10))
    block = 4 * 64 * 64 + 2 * 128 + (64 * 128 + 128 + 128 * 64 + 64)
    assert counts["vit"] == 4 * 64 + 64 + 64 + 17 * 64 + 2 * block + 64 * 10 + 10 == 68_554
    assert (
        counts["cnn"]
        == (9 * 32 + 32) + (32 * 9 * 64 + 64) + (64 * 9 * 72 + 72) + (72 * 4 * 10 + 10)
        == 63_250
    )
    assert abs(counts["cnn"] / counts["vit"] - 1) < 0.2


# --- the data --------------------------------------------------------------------------------


def test_digits_split_is_fixed_stratified_and_covers_every_image_once():
    from sklearn.datasets import load_digits

    cfg = _compose("model=vit")
    assert cfg.data.name == "digits" and cfg.optimizer._target_ == "torch.optim.AdamW"
    splits = load_image_splits(cfg.data).splits
    # 1797 images: test ceil(0.15·1797) = 270, val ceil(1527·0.15/0.85) = 270, train the 1257 left
    assert {k: len(y) for k, (_, y) in splits.items()} == {"train": 1257, "val": 270, "test": 270}
    digits = load_digits()
    all_images = torch.cat([x for x, _ in splits.values()]).reshape(-1, 64) * 16
    expected = torch.from_numpy(digits.data.astype(np.float32))
    order = lambda t: t[np.lexsort(t.numpy().T[::-1])]  # sort rows: the same multiset of images
    torch.testing.assert_close(order(all_images), order(expected))
    assert all(x.dtype == torch.float32 and x.shape[1:] == (1, 8, 8) for x, _ in splits.values())
    for _, y in splits.values():  # stratified: every class in every split
        assert set(y.tolist()) == set(range(10))
    again = load_image_splits(cfg.data).splits
    assert all(torch.equal(splits[k][1], again[k][1]) for k in splits)
    sub = load_image_splits(_compose("model=vit", "data.subset=7").data).splits
    assert {k: len(y) for k, (_, y) in sub.items()} == {"train": 7, "val": 7, "test": 7}
    assert torch.equal(sub["train"][0], splits["train"][0][:7])


def test_data_without_images_is_a_clear_error():
    from hydra.utils import get_class

    cfg = _compose("model=vit", "data=synthetic")
    with pytest.raises(ValueError, match="data=synthetic holds no images.*data=digits"):
        get_class(cfg.model.task.module).from_config(cfg)


def _torchvision_datasets():
    """torchvision.datasets, or a skip naming why it does not import (a build for another torch)."""
    try:
        import torchvision.datasets as datasets
    except (ImportError, RuntimeError) as e:
        pytest.skip(f"torchvision does not import here: {type(e).__name__}: {str(e).splitlines()[0]}")
    return datasets


def _write_idx(path: Path, array: np.ndarray) -> None:
    """MNIST's idx format: magic 0x0000 08 <ndim> (unsigned bytes), the sizes (big-endian int32), data."""
    header = struct.pack(">I", 0x0800 + array.ndim) + b"".join(struct.pack(">I", n) for n in array.shape)
    path.write_bytes(header + array.astype(np.uint8).tobytes())


def _fixture_images(n, shape, offset):
    """n distinct uint8 images, image k filled with (offset + 7k + pixel index) mod 256; label k mod 10."""
    size = int(np.prod(shape))
    images = (offset + 7 * np.arange(n)[:, None] + np.arange(size)[None]) % 256
    return images.reshape(n, *shape).astype(np.uint8), np.arange(n) % 10


def test_mnist_config_reads_idx_files_under_mnist_raw(tmp_path):
    _torchvision_datasets()
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    train_x, train_y = _fixture_images(6, (28, 28), 0)
    test_x, test_y = _fixture_images(3, (28, 28), 100)
    for prefix, x, y in (("train", train_x, train_y), ("t10k", test_x, test_y)):
        _write_idx(raw / f"{prefix}-images-idx3-ubyte", x)
        _write_idx(raw / f"{prefix}-labels-idx1-ubyte", y)
    cfg = _compose("model=vit", "data=mnist", f"data.root={tmp_path}", "data.val_size=2")
    assert cfg.data.image_size == 28 and cfg.data.channels == 1
    splits = load_image_splits(cfg.data).splits
    assert {k: tuple(x.shape) for k, (x, _) in splits.items()} == {
        "train": (4, 1, 28, 28),
        "val": (2, 1, 28, 28),
        "test": (3, 1, 28, 28),
    }
    torch.testing.assert_close(splits["test"][0][:, 0], torch.from_numpy(test_x).float() / 255)
    assert splits["test"][1].tolist() == [0, 1, 2]
    # train and val are the 6 training images, each once, each with its own label
    seen = torch.cat([splits["train"][0], splits["val"][0]])[:, 0, 0, 0] * 255  # first pixel = 7k
    labels = torch.cat([splits["train"][1], splits["val"][1]])
    assert sorted(round(v) for v in seen.tolist()) == [0, 7, 14, 21, 28, 35]
    assert [round(v) // 7 for v in seen.tolist()] == labels.tolist()


def test_mnist_without_its_files_names_the_layout(tmp_path):
    _torchvision_datasets()
    cfg = _compose("model=vit", "data=mnist", f"data.root={tmp_path}")
    with pytest.raises(FileNotFoundError, match="MNIST/raw/ with train-images-idx3-ubyte"):
        load_image_splits(cfg.data)


def test_cifar10_config_reads_the_python_pickle_batches(tmp_path, monkeypatch):
    """The python version's layout: data_batch_1..5 and test_batch ({"data": (N, 3072) uint8 in
    channel planes R, G, B, "labels": [...]}) and batches.meta ({"label_names": [...]}).
    torchvision checks each file's MD5 against CIFAR-10's; here they are the fixture's."""
    datasets = _torchvision_datasets()
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    batches, md5 = {}, {}
    for i, name in enumerate([f"data_batch_{k}" for k in range(1, 6)] + ["test_batch"]):
        x, y = _fixture_images(2, (3, 32, 32), 11 * i)
        batches[name] = (x, y)
        (folder / name).write_bytes(
            pickle.dumps({"data": x.reshape(2, 3072), "labels": y.tolist()}, protocol=2)
        )
    names = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
    (folder / "batches.meta").write_bytes(pickle.dumps({"label_names": names}, protocol=2))
    for f in folder.iterdir():
        md5[f.name] = hashlib.md5(f.read_bytes()).hexdigest()
    cls = datasets.CIFAR10
    monkeypatch.setattr(cls, "train_list", [[f"data_batch_{k}", md5[f"data_batch_{k}"]] for k in range(1, 6)])
    monkeypatch.setattr(cls, "test_list", [["test_batch", md5["test_batch"]]])
    monkeypatch.setattr(cls, "meta", {**cls.meta, "md5": md5["batches.meta"]})
    cfg = _compose("model=vit", "data=cifar10", f"data.root={tmp_path}", "data.val_size=3")
    read = load_image_splits(cfg.data)
    assert read.classes == names
    splits = read.splits
    assert {k: tuple(x.shape) for k, (x, _) in splits.items()} == {
        "train": (7, 3, 32, 32),
        "val": (3, 3, 32, 32),
        "test": (2, 3, 32, 32),
    }
    test_x, test_y = batches["test_batch"]
    torch.testing.assert_close(splits["test"][0], torch.from_numpy(test_x).float() / 255)  # planes kept
    assert splits["test"][1].tolist() == test_y.tolist()
    train_all = torch.cat([splits["train"][0], splits["val"][0]])
    expected = (
        torch.from_numpy(np.concatenate([batches[f"data_batch_{k}"][0] for k in range(1, 6)])).float() / 255
    )
    found = sorted(train_all.reshape(10, -1).tolist())
    assert found == sorted(expected.reshape(10, -1).tolist())
    # a file that is not CIFAR-10's (MD5 differs) is refused by torchvision's own check
    monkeypatch.setattr(cls, "test_list", [["test_batch", "0" * 32]])
    with pytest.raises(FileNotFoundError, match="cifar-10-batches-py/ with data_batch_1..5"):
        load_image_splits(cfg.data)


# --- the stages: train → evaluate → export, in seconds ----------------------------------------


def _run(script, root, *overrides):
    proc = subprocess.run(
        [
            sys.executable,
            f"src/{script}.py",
            *overrides,
            "device=cpu",
            "data.subset=64",
            f"paths.root={root}",
            f"hydra.run.dir={root}/outputs/{script}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=env(),  # no MLFLOW_TRACKING_URI: the store is <root>/mlflow.db
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.mark.parametrize("model", ["vit", "cnn"])
def test_train_evaluate_export_on_a_digits_subset(tmp_path, model):
    _run("train", tmp_path, f"model={model}", "trainer.max_epochs=1", "trainer.enable_progress_bar=false")
    ckpt = tmp_path / "checkpoints" / model / "best.ckpt"
    net = load_classifier(ckpt, expected_kind=model)
    pngs = sorted(p.name for p in (tmp_path / "plots" / model / "attention").glob("*.png"))
    # heatmaps.sentences = [0, 1, 2]: three val images, the class token's last-layer attention
    assert pngs == ([f"image{i}_cls_attention.png" for i in range(3)] if model == "vit" else [])
    explorer = tmp_path / "plots" / model / "explorer.html"
    assert explorer.exists() == (model == "vit")
    if model == "vit":  # every layer and head over [CLS] and the 16 patches of the 3 val images
        (epoch,) = read_data(explorer.read_text(encoding="utf-8"))["epochs"]
        val_x, val_y = load_image_splits(_compose(f"model={model}", "data.subset=64").data).splits["val"]
        sources = [s["source"] for s in epoch["sentences"]]
        assert sources == [f"val image {i}, label {int(val_y[i])}" for i in range(3)]
        kind = epoch["sentences"][2]["kinds"]["encoder_self"]
        assert kind["keys"] == kind["queries"] == patch_tokens(4)
        assert kind["keys"][:6] == ["[CLS]", "0,0", "0,1", "0,2", "0,3", "1,0"]  # row-major
        assert (len(kind["keys"]), kind["keys"][-1]) == (17, "3,3")
        last = torch.from_numpy(decode_weights(kind["layers"][-1])).float()  # (H, 17, 17)
        with torch.no_grad():
            cls_row = net.class_token_attention(val_x[:3])[-1][2]  # (H, 4, 4)
        torch.testing.assert_close(last[:, 0, 1:].reshape(cls_row.shape), cls_row, rtol=0, atol=1e-5)
    out = _run("evaluate", tmp_path, f"model={model}")
    scores = json.loads((tmp_path / "metrics" / f"{model}.json").read_text())
    test_x, test_y = load_image_splits(_compose(f"model={model}", "data.subset=64").data).splits["test"]
    with torch.no_grad():
        logits = net(test_x)
    correct = int((logits.argmax(-1) == test_y).sum())
    assert scores["num_images"] == 64 and scores["errors"] == 64 - correct
    assert scores["accuracy"] == pytest.approx(correct / 64)
    assert "test images scored" in out.stdout
    _run("export", tmp_path, f"model={model}")
    program = load_program(tmp_path / "models" / model / "model.pt2")
    for n in (1, 5, 64):  # any batch size
        torch.testing.assert_close(program(test_x[:n]), logits[:n], rtol=1e-5, atol=1e-5)
    config = json.loads((tmp_path / "models" / model / "config.json").read_text())
    assert config["task"] == "classification" and config["model"] == model and config["num_classes"] == 10
    assert config["classes"] == [str(d) for d in range(10)]  # the digits, in logit order
    with pytest.raises(Exception, match="holds a"):
        load_classifier(ckpt, expected_kind="cnn" if model == "vit" else "vit")
