"""How `src/train.py` fails: a non-finite loss, output directories it cannot write, a fresh
clone with no tokenized corpus, float16 on a CPU, a damaged store, on one process or two (DDP).

Each failure must stop the run with a message that names what went wrong and where (the step,
the directory, the file) and what to do, alone on stderr without a traceback (the traceback is
in the run's log file, and on stderr with ``HYDRA_FULL_ERROR=1``), and must leave the files of
earlier runs as they were.
"""

import errno
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attnlab.files import OutputDirError, ensure_writable
from helpers.refusal import refusal
from helpers.tiny_train import (
    ROOT,
    STEPS_PER_EPOCH,
    copy_project,
    env,
    make_project,
    mlflow_client,
    runs,
    train,
)

FIX = "free disk space or fix its permissions, or choose another place with paths.root=<dir>"
# attnlab.lit.checkpoints' message for a NaN/inf loss, as train.py prints it
NON_FINITE = (
    r"train: training loss is (nan|inf|-inf) at step (\d+) \(epoch (\d+), batch (\d+)\); no weight "
    r"was updated with it\. .*; training stopped, the last good checkpoint is (\S+) \(the weights of "
    r"the step before; resuming them unchanged meets the same loss\)"
)


def cannot_write(d: Path, code: int) -> str:
    """The exact OutputDirError text of attnlab.files.ensure_writable for directory ``d``."""
    return f"[Errno {code}] cannot write to output directory {d} ({os.strerror(code)}): {FIX}"


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    return make_project(tmp_path_factory.mktemp("project"))


def test_non_finite_loss_stops_with_the_step_and_keeps_the_last_checkpoint(project, tmp_path):
    """SGD at lr 1e8 (gradients clipped to norm 1, so each step moves the weights by up to
    ~1e8 × warmup factor) blows the logits up within a few steps: the loss is NaN at step 3
    with seed 0. With a resume checkpoint after every step, last.ckpt holds global_step N:
    the error's "step N" is the number of optimizer steps done when the bad loss was
    computed, last.ckpt was written right after the N-th update, and the failing batch
    raised before its own update. So last.ckpt holds exactly the (finite) weights the
    non-finite loss was computed from, and nothing after them."""
    root = copy_project(project, tmp_path / "project")
    result = train(
        root, "optimizer=sgd", "optimizer.lr=1e8", "checkpoint.every_n_train_steps=1", "trainer.max_epochs=2"
    )
    last = root / "checkpoints/transformer/last.ckpt"
    m = re.fullmatch(NON_FINITE, refusal(result))
    assert m, result.stderr[-3000:]
    step, epoch, batch = int(m[2]), int(m[3]), int(m[4])
    assert step == epoch * STEPS_PER_EPOCH + batch  # one optimizer step per batch
    assert 1 <= step < 2 * STEPS_PER_EPOCH  # failed during training, after at least one update
    assert m[5] == str(last)

    ckpt = torch.load(last, map_location="cpu", weights_only=True)
    assert ckpt["global_step"] == step
    assert ckpt["state_dict"]
    for name, w in ckpt["state_dict"].items():
        assert torch.isfinite(w).all(), name
    assert not (root / "checkpoints/transformer/best.ckpt").exists()  # no validation was reached
    assert not (root / "runs/transformer.json").exists()  # nothing claims the model is trained
    (run,) = runs(mlflow_client(root))  # Lightning finalizes the logger as failed
    assert run.info.status == "FAILED"
    assert run.info.run_id == ckpt["callbacks"]["ResumeState"]["run_id"]


@pytest.mark.parametrize("blocked", ["checkpoints", "runs"])
def test_unwritable_output_dir_fails_before_touching_anything(project, tmp_path, blocked):
    """A regular file where an output directory should be (what root sees of a full or
    read-only disk: chmod does not stop root) stops the run at its first line, before the
    checkpoint or the run record of an earlier run is overwritten."""
    root = copy_project(project, tmp_path / "project")
    old_record = root / "runs/transformer.json"
    old_ckpt = root / "checkpoints/transformer/best.ckpt"
    old_record.parent.mkdir(parents=True)
    old_record.write_text('{"run_id": "earlier"}\n')
    old_ckpt.parent.mkdir(parents=True)
    old_ckpt.write_bytes(b"an earlier checkpoint")
    blocker = root / "blocker"
    blocker.write_text("a file, not a directory")
    target = blocker / blocked
    path_key = {"checkpoints": "paths.checkpoints", "runs": "paths.runs"}[blocked]

    result = train(root, f"{path_key}={target}", "trainer.max_epochs=1", timeout=120)
    assert refusal(result) == f"train: {cannot_write(target, errno.ENOTDIR)}"
    assert old_record.read_text() == '{"run_id": "earlier"}\n'
    assert old_ckpt.read_bytes() == b"an earlier checkpoint"
    assert blocker.read_text() == "a file, not a directory"
    assert sorted(p.name for p in (root / "checkpoints/transformer").iterdir()) == ["best.ckpt"]
    assert not (root / "mlflow.db").exists()  # stopped before the MLflow run was created


def test_float16_on_the_cpu_is_refused_before_anything_runs(project, tmp_path):
    """`trainer.precision=16-true` on a CPU: NaN at step 1 if it ran; refused at once, naming
    precision as the cause (not the learning rate), as one line without a traceback."""
    root = copy_project(project, tmp_path / "project")
    result = train(root, "trainer.precision=16-true", "trainer.max_epochs=1", "device=cpu", timeout=120)
    assert refusal(result).startswith(
        "train: trainer.precision=16-true trains in float16, which a CPU cannot do (the loss is NaN "
        "from the first step, whatever the learning rate): use trainer.precision=32-true, or bf16-mixed"
    ), result.stderr[-3000:]
    assert not (root / "mlflow.db").exists() and not (root / "checkpoints").exists()


def test_a_damaged_store_file_stops_training_with_one_line_naming_it(project, tmp_path):
    root = copy_project(project, tmp_path / "project")
    db = root / "mlflow.db"
    db.write_bytes(os.urandom(8192))
    damaged = db.read_bytes()
    result = train(root, "trainer.max_epochs=1", timeout=120)
    assert refusal(result).startswith(
        f"train: the MLflow store {db} is damaged or not a database (its first bytes are not "
        f"SQLite's header): restore it from a copy, or move it aside (`mv {db} {db}.damaged`)"
    ), result.stderr[-3000:]
    assert db.read_bytes() == damaged and not list(root.glob("checkpoints/**/*.ckpt"))


def _train_fresh(root: Path, **extra_env: str) -> subprocess.CompletedProcess:
    """The design card's ``python src/train.py model=transformer`` in a project that has no
    data yet (a fresh clone)."""
    command = [sys.executable, "src/train.py", "model=transformer", "device=cpu", f"paths.root={root}"]
    return subprocess.run(
        [*command, f"hydra.run.dir={root}/outputs/run"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=env(**extra_env),
    )


def test_a_fresh_clone_is_told_to_tokenize_in_one_line_with_the_trace_in_the_log(tmp_path):
    """No data/tokenized yet: the one line that says what to run, no traceback on stderr; the
    traceback is in the run's log file, and on stderr with HYDRA_FULL_ERROR=1."""
    folder = tmp_path / "data/tokenized/multi30k-en-fr"
    message = (
        f"no tokenizer (spm.model or vocab.json) in {folder}; run `python src/tokenize_data.py` "
        "(or `dvc repro tokenize`) with the same data= option"
    )
    assert refusal(_train_fresh(tmp_path)) == f"train: {message}"
    log = (tmp_path / "outputs/run/train.log").read_text()
    assert f"[ERROR] - train: {message}\nTraceback (most recent call last):" in log
    assert log.rstrip().endswith(f"attnlab.errors.MissingFileError: {message}")

    full = _train_fresh(tmp_path, HYDRA_FULL_ERROR="1")
    assert full.returncode == 1
    assert "Traceback (most recent call last):" in full.stderr
    assert full.stderr.strip().splitlines()[-1] == f"attnlab.errors.MissingFileError: {message}"
    assert not (tmp_path / "mlflow.db").exists() and not list(tmp_path.glob("checkpoints/**/*.ckpt"))


def test_each_ddp_rank_refuses_in_one_line_without_a_traceback(project, tmp_path):
    """Two DDP ranks (the second a copy of the command Lightning starts) whose loss is NaN at
    the same step: each says so in one line, rank 1 naming itself; its traceback is in its own
    log file (train_ddp_process_1.log)."""
    root = copy_project(project, tmp_path / "project")
    result = train(
        root,
        "device=ddp",
        "optimizer=sgd",
        "optimizer.lr=1e12",
        "model.warmup_steps=1",
        "checkpoint.every_n_train_steps=1",
        "trainer.max_epochs=6",
        timeout=600,
    )
    assert result.returncode != 0
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    said = [line for line in result.stderr.splitlines() if line.startswith("train: ")]
    assert said and len(said) <= 2, result.stderr[-3000:]
    for line in said:
        assert re.fullmatch(NON_FINITE, line.replace("train: rank 1: ", "train: ")), line
    if len(said) == 2:  # rank 0 may be stopped by Lightning first, when rank 1 ended before it
        assert sorted(line.startswith("train: rank 1: ") for line in said) == [False, True]
    logs = {p.name: p.read_text() for p in (root / "outputs/run").glob("*.log")}
    assert "attnlab.loss.NonFiniteLossError: training loss is" in logs["train_ddp_process_1.log"]


_CHILD = """
import json, resource, sys
from attnlab.files import OutputDirError, ensure_writable
if sys.argv[2] != "none":
    limit = int(sys.argv[2])
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
try:
    ensure_writable(sys.argv[1])
except OutputDirError as e:
    print(json.dumps({"errno": e.errno, "message": str(e)}))
else:
    print(json.dumps(None))
"""


def ensure_writable_in_child(
    d: Path, fsize_limit: int | None = None, prefix: tuple[str, ...] = ()
) -> dict | None:
    """``ensure_writable(d)`` in a fresh Python (started through ``prefix``, if any), optionally
    with files capped at ``fsize_limit`` bytes; its OutputDirError as ``{"errno", "message"}``,
    or None when it passed."""
    out = subprocess.run(
        [*prefix, sys.executable, "-c", _CHILD, str(d), str(fsize_limit or "none")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(out.stdout)


def test_full_disk_is_an_output_dir_error(tmp_path):
    """A real "no space" from the kernel: with RLIMIT_FSIZE at 1 KiB, ensure_writable's 4 KiB
    probe write fails with EFBIG (Python ignores SIGXFSZ, so the write returns the error)."""
    d = tmp_path / "checkpoints"
    assert ensure_writable_in_child(d, fsize_limit=1 << 20) is None  # 1 MiB: the probe fits
    assert ensure_writable_in_child(d, fsize_limit=1024) == {
        "errno": errno.EFBIG,
        "message": cannot_write(d, errno.EFBIG),
    }
    assert list(d.iterdir()) == []  # the probe file is gone


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a chmod 0o555 directory anyway")
def test_read_only_directory(tmp_path):
    d = tmp_path / "read_only"
    d.mkdir()
    d.chmod(0o555)
    try:
        for target in (d, d / "checkpoints"):  # the directory itself, and one to create in it
            with pytest.raises(OutputDirError) as e:
                ensure_writable(target)
            assert (e.value.errno, str(e.value)) == (errno.EACCES, cannot_write(target, errno.EACCES))
    finally:
        d.chmod(0o755)


@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and util-linux setpriv"
)
def test_read_only_directory_as_root_without_dac_override(tmp_path):
    """The chmod case where the tests run as root: the check runs as root without the
    capabilities that let root ignore permission bits (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH),
    so a root-owned 0o555 directory refuses it as it refuses any user."""
    d = tmp_path / "read_only"
    d.mkdir()
    d.chmod(0o555)
    no_override = ("setpriv", "--bounding-set=-dac_override,-dac_read_search", "--inh-caps=-all")
    try:
        assert ensure_writable_in_child(tmp_path, prefix=no_override) is None  # its own dir: still fine
        for target in (d, d / "checkpoints"):  # the directory itself, and one to create in it
            got = ensure_writable_in_child(target, prefix=no_override)
            assert got == {"errno": errno.EACCES, "message": cannot_write(target, errno.EACCES)}
        assert list(d.iterdir()) == []
    finally:
        d.chmod(0o755)
