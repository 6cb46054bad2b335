"""Loading checkpoints (``attnlab.checkpoint.load_net``): one of another model type, one
holding pickled objects, a truncated one.

Each case gets a ``CheckpointError`` naming the problem and the fix, and nothing is
half-loaded: pickled objects are refused, never unpickled.
"""

import re
from pathlib import Path

import pytest
import torch

from attnlab.checkpoint import CheckpointError, load_net


@pytest.fixture(scope="module")
def nw_checkpoint(tmp_path_factory) -> tuple[Path, torch.Tensor]:
    """A real Lightning checkpoint: NW trained one step on D2L's synthetic data."""
    import pytorch_lightning as pl

    from attnlab.data.synthetic import synthetic_regression
    from attnlab.lit.regression import RegressionModule, full_batch_loader

    data = synthetic_regression(50, 0.5, 5.0, seed=0)
    module = RegressionModule(
        optimizer={"_target_": "torch.optim.SGD", "_partial_": True, "lr": 0.5}, init_w=1.0
    )
    module.data = data
    trainer = pl.Trainer(
        max_steps=1,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
    )
    trainer.fit(module, full_batch_loader(data["x_train"], data["y_train"]))
    path = tmp_path_factory.mktemp("ckpt") / "best.ckpt"
    trainer.save_checkpoint(path)
    return path, module.net.w.detach().clone()


def test_real_checkpoint_of_another_model_is_a_checkpoint_error(nw_checkpoint):
    path, w = nw_checkpoint
    net = load_net(path, expected_kind="nw")  # torch.load(weights_only=True) reads it
    assert net.kind == "nw" and torch.equal(net.w, w) and not torch.equal(w, torch.ones(1))
    with pytest.raises(
        CheckpointError,
        match=rf"^{re.escape(str(path))} holds a nw model, not "
        r"transformer; pass checkpoints/transformer/ \(train it with `python "
        r"src/train\.py model=transformer`\) or run with model=nw$",
    ):
        load_net(path, expected_kind="transformer")


def test_checkpoint_with_pickled_objects_is_refused_not_unpickled(tmp_path):
    from omegaconf import OmegaConf

    path = tmp_path / "old.ckpt"
    torch.save(
        {"hyper_parameters": OmegaConf.create({"init_w": 1.0}), "state_dict": {"net.w": torch.ones(1)}}, path
    )
    assert torch.load(path, weights_only=False)["hyper_parameters"]["init_w"] == 1.0  # a valid file
    with pytest.raises(
        CheckpointError,
        match=r"holds Python objects that torch\.load\(weights_only=True\) "
        r"refuses.*retrain with `python src/train\.py`",
    ):
        load_net(path)


def test_truncated_checkpoint_is_a_checkpoint_error(nw_checkpoint, tmp_path):
    data = nw_checkpoint[0].read_bytes()
    for name, content, cause in [
        ("cut.ckpt", data[: len(data) // 2], "RuntimeError: PytorchStreamReader"),
        ("empty.ckpt", b"", "EOFError: empty"),
    ]:
        (tmp_path / name).write_bytes(content)
        with pytest.raises(
            CheckpointError,
            match=rf"{name} is truncated or not a torch checkpoint "
            rf"\({cause}.*retrain with `python src/train\.py` or copy the file again",
        ):
            load_net(tmp_path / name)


def _flip_the_largest_record(path, out):
    """A copy of the torch.save archive ``path`` at ``out`` with the first byte of its largest
    tensor's data inverted (a tensor's bytes, as a bad disk or copy changes them); its name."""
    import zipfile

    with zipfile.ZipFile(path) as archive:
        tensors = [i for i in archive.infolist() if "/data/" in i.filename]  # not data.pkl
        info = max(tensors, key=lambda i: i.file_size)
    data = bytearray(path.read_bytes())
    name_len, extra_len = (
        int.from_bytes(data[info.header_offset + 26 : info.header_offset + 28], "little"),
        (int.from_bytes(data[info.header_offset + 28 : info.header_offset + 30], "little")),
    )
    start = info.header_offset + 30 + name_len + extra_len  # the local header, then the data
    data[start] ^= 0xFF
    out.write_bytes(bytes(data))
    return info.filename


def test_a_checkpoint_whose_bytes_changed_is_refused_by_its_crc(nw_checkpoint, tmp_path):
    """torch.load reads a tensor whose bytes changed without a word; the archive's CRC-32 does not."""
    from attnlab.checkpoint import changed_record
    from attnlab.lit.resume import find_resume_point

    path = nw_checkpoint[0]
    assert changed_record(path) is None
    record = _flip_the_largest_record(path, tmp_path / "best.ckpt")
    assert changed_record(tmp_path / "best.ckpt") == record
    torch.load(tmp_path / "best.ckpt", map_location="cpu", weights_only=True)  # what torch does
    with pytest.raises(CheckpointError) as e:
        load_net(tmp_path / "best.ckpt")
    assert str(e.value) == (
        f"{tmp_path / 'best.ckpt'} is damaged: the bytes of its record {record} changed after it was "
        "written (their CRC-32 does not match); retrain with `python src/train.py` or copy the file again"
    )
    # the same bytes as training's last.ckpt: not resumed, said why
    (tmp_path / "best.ckpt").rename(tmp_path / "last.ckpt")
    point, why = find_resume_point(tmp_path, "any fingerprint")
    assert point is None
    assert why == (
        f"ignoring {tmp_path / 'last.ckpt'}: not a resumable checkpoint (ValueError: the bytes of its "
        f"record {record} changed after it was written); starting afresh"
    )


def test_a_stage_given_another_corpus_than_the_checkpoint_trained_on_is_refused(tmp_path):
    """evaluate and export read the tokenized folder of the config they are given: another
    corpus's (the default Multi30k's, for a model of a user's zh-en corpus) would score the
    wrong test set, or ship the wrong tokenizer with the export."""
    from attnlab.checkpoint import TOKENIZER_KEY, TokenizerMismatchError, check_trained_tokenizer, file_sha256

    trained, other = tmp_path / "parallel-zh-en", tmp_path / "multi30k-en-fr"
    for folder, data in ((trained, b"zh-en pieces"), (other, b"en-fr pieces")):
        folder.mkdir()
        (folder / "spm.model").write_bytes(data)
    ckpt = tmp_path / "best.ckpt"
    record = {"file": "spm.model", "sha256": file_sha256(trained / "spm.model"), "folder": str(trained)}
    torch.save({TOKENIZER_KEY: record}, ckpt)
    check_trained_tokenizer(ckpt, trained)  # the corpus it trained on
    check_trained_tokenizer(ckpt, tmp_path / "no-tokenizer-here")  # nothing to compare
    with pytest.raises(TokenizerMismatchError) as e:
        check_trained_tokenizer(ckpt, other)
    assert str(e.value) == (
        f"{ckpt} trained with {trained}/spm.model (sha256 {record['sha256'][:12]}…), not with "
        f"{other}/spm.model (sha256 {file_sha256(other / 'spm.model')[:12]}…): give this stage the "
        "data settings the model trained with (e.g. data=parallel data.src_lang=zh "
        "data.tgt_lang=en), or tokenize that corpus again"
    )
    torch.save({}, ckpt)  # a checkpoint from before the record
    check_trained_tokenizer(ckpt, other)
