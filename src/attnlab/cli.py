"""The ``attnlab-*`` commands: each runs one of the project's Hydra apps (``src/<script>.py``).

``attnlab-translate model=transformer`` is ``python src/translate.py model=transformer`` run
from the project it is called in (the nearest folder, from the working directory up, that
holds ``conf/config.yaml`` and ``src/``), with the same arguments, output and exit status.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

SCRIPTS = {
    "download": "download.py",
    "tokenize": "tokenize_data.py",
    "train": "train.py",
    "evaluate": "evaluate.py",
    "export": "export.py",
    "translate": "translate.py",
    "head-importance": "head_importance.py",
}


class NotInProjectError(RuntimeError):
    """An ``attnlab-*`` command was run outside an attnlab project."""


def project_root(start: Path | None = None) -> Path:
    """The nearest folder at or above ``start`` (default: the working directory) that holds
    ``conf/config.yaml`` and ``src/train.py``.

    Raises:
        NotInProjectError: none does (names the folder searched and the fix).
    """
    start = (start or Path.cwd()).resolve()
    for folder in (start, *start.parents):
        if (folder / "conf" / "config.yaml").is_file() and (folder / "src" / "train.py").is_file():
            return folder
    raise NotInProjectError(
        f"{start} is not inside an attnlab project (no folder at or above it holds conf/config.yaml "
        "and src/train.py): cd into the project you cloned, then run the command again"
    )


def run(name: str) -> None:
    """Run ``src/<SCRIPTS[name]>`` of the current project as ``__main__`` with this process's
    arguments; on a :class:`NotInProjectError` print its message and exit with status 2."""
    try:
        script = project_root() / "src" / SCRIPTS[name]
    except NotInProjectError as e:
        print(f"attnlab-{name}: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    sys.argv[0] = str(script)
    sys.path.insert(0, str(script.parent))
    runpy.run_path(str(script), run_name="__main__")


def download() -> None:
    run("download")


def tokenize() -> None:
    run("tokenize")


def train() -> None:
    run("train")


def evaluate() -> None:
    run("evaluate")


def export() -> None:
    run("export")


def translate() -> None:
    run("translate")


def head_importance() -> None:
    run("head-importance")
