"""Shared fixtures. ``tests/`` is on sys.path so tests can import ``helpers`` (tiny corpora,
projects, the browser)."""

import os
import sys
from pathlib import Path

import pytest

if os.environ.get("PYTEST_XDIST_WORKER"):
    # pytest-xdist runs one worker per logical CPU (pyproject.toml): one intra-op thread each,
    # for this process and the apps it starts. Two threads per worker would put 4 spin-waiting
    # OpenMP threads on 2 cores, which slows torch down many times over.
    os.environ["OMP_NUM_THREADS"] = "1"

import torch  # after OMP_NUM_THREADS is set, so that its thread pool reads it

if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)

sys.path.insert(0, str(Path(__file__).parent))

PROJECT_ROOT = Path(__file__).resolve().parents[1]


def _mirror() -> Path:
    return Path(os.environ.get("ATTNLAB_DATA_MIRROR") or PROJECT_ROOT.parent / "shared" / "data")


@pytest.fixture(scope="session")
def mirror_dir() -> Path:
    """The offline corpus mirror (``$ATTNLAB_DATA_MIRROR``, else ``../shared/data``); skip if absent."""
    path = _mirror()
    if not (path / "multi30k").is_dir():
        pytest.skip(f"no corpus mirror at {path}; set ATTNLAB_DATA_MIRROR")
    return path.resolve()


@pytest.fixture(scope="module")
def mirror(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """The tiny corpus of ``corpus_fixture`` written as a mirror folder:
    ``(folder, {relative path: sha256})``."""
    from helpers.corpus_fixture import write_mirror

    root = tmp_path_factory.mktemp("mirror")
    return root, write_mirror(root)


@pytest.fixture(scope="session")
def fra_eng_zip() -> Path:
    """D2L's ``fra-eng.zip`` in the corpus mirror; skip if absent."""
    path = _mirror() / "fra-eng.zip"
    if not path.is_file():
        pytest.skip(f"no {path}; set ATTNLAB_DATA_MIRROR to a folder holding fra-eng.zip")
    return path.resolve()


@pytest.fixture(scope="module")
def one_torch_thread():
    """Run a module's tiny-tensor tests on one intra-op thread (restored afterwards).

    On a busy 2-core machine a second thread only adds spin-waiting (about 8×
    slower for the attention tests). Use with ``pytestmark = pytest.mark.usefixtures(...)``.
    """
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


# The longest test files first, so that under pytest-xdist (--dist loadfile) a worker starts
# them at once while the other works through the rest, instead of one of them starting last.
LONGEST_FIRST = ("test_pipeline.py", "test_d2l.py")


# The end-to-end files: real `dvc repro` and training runs in subprocesses, killed and resumed,
# DDP, servers, browsers and fresh virtualenvs. `pytest -m "not e2e"` leaves them out (the fast
# loop of CONTRIBUTING.md); CI runs everything.
E2E_FILES = (
    "test_pipeline.py",
    "test_d2l.py",
    "test_resume.py",
    "test_resume_matrix.py",
    "test_remote_tracking.py",
    "test_served_env.py",
    "test_serving_load.py",
    "test_sweep.py",
    "test_train_failures.py",
    "test_ddp.py",
    "test_ddp_shards.py",
    "test_callbacks.py",
    "test_choose_on_val.py",
    "test_init_from.py",
    "test_export_interrupt.py",
)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name in E2E_FILES:
            item.add_marker(pytest.mark.e2e)

    def rank(item):
        name = item.path.name
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: each file keeps its own order


@pytest.fixture(scope="session")
def tiny_spm(tmp_path_factory):
    """The path of a sentencepiece model (120 pieces) of the tiny corpus's sentences
    (:func:`helpers.corpus_fixture.sentences`), trained once per test process."""
    from attnlab.data.tokenizer import train_sentencepiece
    from helpers.corpus_fixture import sentences

    d = tmp_path_factory.mktemp("spm")
    train_sentencepiece([s for e, f, _ in sentences() for s in (e, f)], d / "spm", vocab_size=120)
    return d / "spm.model"
