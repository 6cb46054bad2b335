"""Shared fixtures. ``tests/`` is on sys.path so tests can import corpus_fixture."""
import os
import sys
from pathlib import Path

import pytest
import torch

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
    """The tiny corpus of ``corpus_fixture`` written as a mirror folder: ``(folder, {relative path: sha256})``."""
    from corpus_fixture import write_mirror

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
