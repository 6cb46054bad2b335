"""A fork server for the project's scripts: import torch, Lightning, MLflow and Hydra once, then run
each ``src/<stage>.py`` in a fresh forked process, as ``python src/<stage>.py …`` would.

Started once per test process (``python tests/test_faults/zygote.py``), it reads one JSON request a
line on stdin (``argv``, ``cwd``, ``env``, ``stdout``, ``stderr``: file paths) and answers
``{"pid": …}`` when the child starts, then ``{"returncode": …, "cpu": …}`` (negative: killed
by that signal, as :mod:`subprocess` says it; the CPU seconds it used). The child is a real
process: its own pid, signals, file descriptors, limits and exit status; what it saves over a
fresh interpreter is the 5 seconds of imports, which would otherwise be most of a tiny stage's
run. After each child the server imports what the child imported, so the next starts warmer.

The child ends as the interpreter ends a script: ``SystemExit`` with a message prints it to
stderr (status 1); any other exception prints its traceback (status 1; an uncaught
``KeyboardInterrupt`` then kills the process with SIGINT, as Python does); then the
non-daemon threads are joined and the ``atexit`` functions run.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import json
import os
import runpy
import signal
import sys
import threading
import traceback

_PRELOADED: set[str] = set()


# What every stage imports (the rest is learnt from the children: _learn).
PRELOAD = (
    "torch",
    "hydra",
    "mlflow.pyfunc",
    "mlflow.pytorch",
    "pytorch_lightning",
    "sentencepiece",
    "attnlab.data.download",
    "attnlab.export.tasks",
    "attnlab.inference.evaluation",
    "attnlab.lit.translation",
    "attnlab.serving.translator",
    "attnlab.tracking.store",
)


def _preload() -> None:
    for name in PRELOAD:
        importlib.import_module(name)
    sys.modules["torch"].set_num_threads(1)  # as OMP_NUM_THREADS=1 asks; no thread pool started
    _PRELOADED.update(sys.modules)
    assert threading.active_count() == 1, threading.enumerate()  # forking copies no thread


def _learn(path: str) -> None:
    """Import the modules a child imported (one name a line, in import order; a name that
    fails to import is left), so that the next child starts with them."""
    try:
        with open(path) as f:
            names = f.read().split()
        os.unlink(path)
    except OSError:
        return
    for name in names:
        if name not in sys.modules and not name.startswith("__"):
            with contextlib.suppress(Exception):  # a module that fails here fails in the child too
                importlib.import_module(name)
    _PRELOADED.update(sys.modules)
    extra = [t for t in threading.enumerate() if t is not threading.main_thread()]
    assert not extra, f"importing {path}'s modules started threads: {extra}"


def _exit_status(code) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _child(req: dict, channels: tuple[int, int]) -> None:
    """Run the script of ``req`` in this (forked) process; never returns."""
    for fd in channels:
        os.close(fd)
    status = 1
    try:
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(os.open(req["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), 1)
        os.dup2(os.open(req["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), 2)
        sys.path.insert(0, os.path.dirname(os.path.abspath(req["argv"][0])))  # as `python script.py`
        sys.argv = list(req["argv"])
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import inject

        hook = inject.install()
        interrupted = False
        try:
            runpy.run_path(req["argv"][0], run_name="__main__")
            status = 0
        except SystemExit as e:
            status = _exit_status(e.code)
        except BaseException as e:  # noqa: BLE001 - what the interpreter does with any uncaught exception
            sys.excepthook(type(e), e, e.__traceback__)
            interrupted = isinstance(e, KeyboardInterrupt)
            status = 1
        threading._shutdown()  # type: ignore[attr-defined]  # as Py_FinalizeEx: non-daemon threads
        atexit._run_exitfuncs()
        if hook:
            hook.finish()
        if req.get("modules"):  # what the run imported, in order, for the server to import too
            with open(req["modules"], "w") as f:
                f.write("\n".join(m for m in list(sys.modules) if m not in _PRELOADED))
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):  # a full disk, a closed stream
                stream.flush()
        if interrupted:
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
    except BaseException:  # noqa: BLE001 - the child must reach os._exit, never the server's loop
        traceback.print_exc()
    os._exit(status)


def serve() -> None:
    requests = os.fdopen(os.dup(0), "r")
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # stray prints of the preloaded modules do not reach the channel
    _preload()
    replies.write(json.dumps({"ready": os.getpid()}) + "\n")
    for line in requests:
        req = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(req, (requests.fileno(), replies.fileno()))
        replies.write(json.dumps({"pid": pid}) + "\n")
        _, status, usage = os.wait4(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        replies.write(json.dumps({"returncode": code, "cpu": usage.ru_utime + usage.ru_stime}) + "\n")
        if req.get("modules"):
            _learn(req["modules"])


if __name__ == "__main__":
    serve()
