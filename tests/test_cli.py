"""The ``attnlab-*`` commands run the project's Hydra apps exactly as ``python src/<script>.py``."""

import subprocess
import sys
from pathlib import Path

import pytest

from attnlab.cli import SCRIPTS, NotInProjectError, project_root

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def test_every_script_exists_and_has_an_entry_point():
    import tomllib

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert set(scripts) == {f"attnlab-{name}" for name in SCRIPTS}
    for name, file in SCRIPTS.items():
        assert (ROOT / "src" / file).is_file(), file
        assert scripts[f"attnlab-{name}"] == f"attnlab.cli:{name.replace('-', '_')}"


def test_the_project_is_found_from_any_folder_inside_it(tmp_path):
    assert project_root(ROOT / "conf" / "model") == ROOT
    assert project_root(ROOT) == ROOT
    with pytest.raises(NotInProjectError, match=r"cd into the project"):
        project_root(tmp_path)


def test_an_entry_point_prints_what_the_script_prints():
    """`attnlab-train --help` from a subfolder == `python src/train.py --help` from the root
    (Hydra's help lists the config groups read from conf/)."""
    direct = subprocess.run(
        [sys.executable, "src/train.py", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    entry = subprocess.run(
        [str(BIN / "attnlab-train"), "--help"], cwd=ROOT / "conf", capture_output=True, text=True, timeout=120
    )
    assert direct.returncode == entry.returncode == 0, entry.stderr[-2000:]
    models = ", ".join(sorted(f.stem for f in (ROOT / "conf" / "model").glob("*.yaml")))
    assert "seq2seq" in models and f"model: {models}" in direct.stdout
    assert entry.stdout == direct.stdout


def test_outside_a_project_the_command_says_where_to_go(tmp_path):
    out = subprocess.run(
        [str(BIN / "attnlab-translate"), "model=transformer"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert out.stderr.strip() == (
        f"attnlab-translate: {tmp_path.resolve()} is not inside an attnlab project (no folder at or "
        "above it holds conf/config.yaml and src/train.py): cd into the project you cloned, then "
        "run the command again"
    )
