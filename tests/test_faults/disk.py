"""The project's own small filesystem: a tmpfs mounted on its folder, where the tests may mount one
(root); else none, and a full disk is played by capping the stage's file sizes
(``RLIMIT_FSIZE``, :func:`test_faults.inject.fill`).

On a tmpfs the project is, as on most machines, on another filesystem than ``/tmp``: a file
written to a temporary folder and then moved into the project is copied, not renamed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from contextlib import contextmanager
from pathlib import Path

SIZE = 64 << 20  # the exported project is about 8 MiB, and export writes about as much again


@contextmanager
def project_filesystem(path: Path, size: int = SIZE):
    """Mount a tmpfs of ``size`` bytes on the (existing, empty) folder ``path`` for the block.

    Yields the fill target of :func:`test_faults.inject.fill`: ``str(path)`` on the tmpfs, or
    ``"rlimit"`` where none could be mounted (not root, no ``mount``, no permission, or
    ``ATTNLAB_FAULT_NO_TMPFS`` set).
    """
    path = Path(path)
    mounted = (
        not os.environ.get("ATTNLAB_FAULT_NO_TMPFS")  # to try the other way where one could mount
        and os.geteuid() == 0
        and shutil.which("mount") is not None
        and subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)], capture_output=True
        ).returncode
        == 0
    )
    try:
        yield str(path) if mounted else "rlimit"
    finally:
        if mounted:
            subprocess.run(["umount", str(path)], check=True)
