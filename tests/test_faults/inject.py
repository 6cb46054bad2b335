"""The fault a stage meets, at the N-th file operation it makes on the project (runs in the stage's process).

A Python audit hook (:func:`sys.addaudithook`) sees every file operation that goes through
Python: ``open`` (read or write), renames, removals, folder creation and removal, copies,
temporary files and SQLite connections. Those whose path lies in the project count, on the
main thread only (so the count is the same every run). A *census* run records them all; a
*fault* run acts at the N-th (chosen by a seeded generator from the census count), before the
operation itself runs, the way SQLite's crash tests stop after the N-th write:

- ``kill``: SIGKILL, the process ends on the spot (power cut, OOM killer, ``kill -9``);
- ``interrupt``: SIGINT, what Ctrl-C sends (``KeyboardInterrupt`` at the next bytecode);
- ``fill``: the disk fills: a filler file takes every free byte of the small filesystem the
  project lives on (less ``free`` bytes), or, without one, ``RLIMIT_FSIZE`` drops to
  ``free`` bytes (64 KiB at least) so that no file can grow past it (``EFBIG``; Python
  ignores SIGXFSZ). The stage goes on and meets the full disk in its next writes.

C code that opens files itself (``torch.save`` to a path, SQLite's pages) makes no event of
its own; it is reached through the operations around it, and the full disk reaches inside it.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import signal
import sys
import threading
from pathlib import Path

# The audit events of file operations (https://docs.python.org/3/library/audit_events.html).
EVENTS = frozenset(
    {
        "open",
        "os.rename",
        "os.replace",
        "os.remove",
        "os.rmdir",
        "os.mkdir",
        "os.truncate",
        "os.link",
        "os.symlink",
        "shutil.copyfile",
        "shutil.move",
        "shutil.rmtree",
        "tempfile.mkstemp",
        "tempfile.mkdtemp",
        "sqlite3.connect",
    }
)
TWO_PATHS = frozenset({"os.rename", "os.replace", "os.link", "os.symlink", "shutil.copyfile", "shutil.move"})
FILLER = ".fault-filler"  # the filler file's name, at the top of the small filesystem


def cap_files(free: int) -> int:
    """Cap the size of every file this process writes at ``free`` bytes, 64 KiB at least (its
    stdout and stderr are files too); returns the cap."""
    free = max(free, 1 << 16)
    resource.setrlimit(resource.RLIMIT_FSIZE, (free, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    return free


def fill(target: str, free: int) -> str:
    """Fill the filesystem of the folder ``target`` up to ``free`` bytes with a filler file;
    returns what is left."""
    path = os.path.join(target, FILLER)
    with open(path, "ab", buffering=0) as f:  # (this open is outside the project's paths count)
        for chunk in (1 << 20, 1 << 12, 1):
            block = b"\0" * chunk
            try:
                while True:
                    f.write(block)
            except OSError:
                pass
        if free:
            f.truncate(max(0, f.tell() - free))
        os.fsync(f.fileno())
    st = os.statvfs(target)
    return f"filled {target}: {st.f_bavail * st.f_frsize} bytes free"


def manifest(root: str) -> dict[str, str]:
    """``{path relative to root: sha256}`` of every file under ``root`` (the filler left out)."""
    out = {}
    for folder, _, names in os.walk(root):
        for name in names:
            p = os.path.join(folder, name)
            if name != FILLER and os.path.isfile(p) and not os.path.islink(p):
                with open(p, "rb") as f:
                    out[os.path.relpath(p, root)] = hashlib.file_digest(f, "sha256").hexdigest()
    return dict(sorted(out.items()))


class Hook:
    """The audit hook of one run: counts the project's file operations and acts at ``at``.

    ``spec`` (JSON in ``$ATTNLAB_FAULT``): ``root`` (the project), ``log`` (a file the hook
    writes its record to: the census's events, or the event it acted at), ``action`` (census,
    kill, interrupt, fill), ``at`` (1-based), ``fill_target`` and ``free`` (for fill).
    """

    def __init__(self, spec: dict):
        self.spec, self.root = spec, os.path.realpath(spec["root"]) + os.sep
        self.count, self.events, self.fired = 0, [], False
        self.main = threading.main_thread().ident

    def _project_path(self, event: str, args: tuple) -> str | None:
        """The first path of the operation that lies in the project, relative to it (else None).

        Relative paths are taken from the working directory, or the folder of the ``dir_fd``
        argument where the event gives one; an ``open`` of a relative path that does not
        exist there counts as outside (``shutil.rmtree`` opens names relative to a folder's
        descriptor, which its event does not give)."""
        paths = args[:2] if event in TWO_PATHS else args[:1]
        dir_fd = args[-1] if event in ("os.remove", "os.rmdir", "os.mkdir") else None
        for a in paths:
            if not isinstance(a, (str, bytes, os.PathLike)):
                continue
            p = os.fsdecode(a)
            if p.startswith("file:"):  # an SQLite URI
                p = p[5:].split("?")[0]
            if not os.path.isabs(p):
                if isinstance(dir_fd, int):
                    p = os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), p)
                elif event == "open" and not os.path.lexists(p):
                    continue
            p = os.path.realpath(p)
            if p.startswith(self.root):
                return os.path.relpath(p, self.root)
        return None

    def __call__(self, event: str, args: tuple) -> None:
        if event not in EVENTS or self.fired or threading.get_ident() != self.main:
            return
        try:
            rel = self._project_path(event, args)
        except OSError:  # a descriptor gone: not the project's business to fail on
            rel = None
        if rel is None:
            return
        self.count += 1
        where = f"{event} {rel}" + (f" ({args[1]})" if event == "open" and isinstance(args[1], str) else "")
        if self.spec["action"] == "census":
            self.events.append(where)
            return
        if self.count != self.spec["at"]:
            return
        self.fired = True
        record = {"at": self.count, "event": where, "manifest": manifest(self.root)}
        capped = self.spec["action"] == "fill" and self.spec["fill_target"] == "rlimit"
        if capped:  # the record first: it is a file too
            record["fill"] = f"RLIMIT_FSIZE={max(self.spec['free'], 1 << 16)}"
        elif self.spec["action"] == "fill":
            record["fill"] = fill(self.spec["fill_target"], self.spec["free"])
        self.write(record)
        if capped:
            cap_files(self.spec["free"])
        if self.spec["action"] == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif self.spec["action"] == "interrupt":
            signal.raise_signal(signal.SIGINT)

    def write(self, record: dict) -> None:
        Path(self.spec["log"]).write_text(json.dumps(record))

    def finish(self) -> None:
        """At the end of a census run: write the events seen."""
        if self.spec["action"] == "census":
            self.write({"events": self.events})


def install() -> Hook | None:
    """Install the hook that ``$ATTNLAB_FAULT`` describes (none when it is unset)."""
    spec = os.environ.get("ATTNLAB_FAULT")
    if not spec:
        return None
    hook = Hook(json.loads(spec))
    sys.addaudithook(hook)
    return hook
