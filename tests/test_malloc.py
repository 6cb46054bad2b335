"""The scoring server caps glibc's malloc arenas (:mod:`attnlab.serving.malloc`) when it loads the model.

Counted with glibc's own ``malloc_info``: 8 threads that allocate at the same time get
their own arenas unless the cap holds (the load behaviour it fixes is measured by
``benchmarks/serve_load.py`` and bounded in tests/test_serving_load.py).
"""

import os
import platform
import subprocess
import sys

import pytest

from attnlab.serving.malloc import cap_malloc_arenas
from attnlab.serving.threads import SCORING_SERVER_ENV
from helpers.serve_harness import tiny_export

COUNT_ARENAS = r"""
import ctypes, ctypes.util, sys, tempfile, threading
from attnlab.serving.malloc import cap_malloc_arenas
if sys.argv[1].startswith("served:"):  # what the scoring server does: load the served model
    from types import SimpleNamespace
    from attnlab.serving.model import TranslationModel
    TranslationModel().load_context(SimpleNamespace(artifacts={"export": sys.argv[1][7:]}))
    print("served")
else:
    print(cap_malloc_arenas(int(sys.argv[1])) if sys.argv[1] != "none" else None)
barrier, keep = threading.Barrier(8), []
def work():
    barrier.wait()  # all 8 alive and allocating at once
    keep.append(bytearray(64 * 1024))  # under the mmap threshold: from the thread's arena
threads = [threading.Thread(target=work) for _ in range(8)]
for t in threads: t.start()
for t in threads: t.join()
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.fopen.restype = ctypes.c_void_p
with tempfile.NamedTemporaryFile("r") as f:
    fp = ctypes.c_void_p(libc.fopen(f.name.encode(), b"w"))
    libc.malloc_info(0, fp)
    libc.fclose(fp)
    print(f.read().count("<heap nr="))
"""

glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc arenas are glibc's")


def _arenas(cap: str, **env: str) -> tuple[str, int]:
    clean = {
        k: v
        for k, v in os.environ.items()
        if k not in ("MALLOC_ARENA_MAX", "GLIBC_TUNABLES", "ATTNLAB_MALLOC_ARENAS", SCORING_SERVER_ENV)
    }
    out = subprocess.run(
        [sys.executable, "-c", COUNT_ARENAS, cap],
        env={**clean, **env},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.split()
    return out[0], int(out[1])


@glibc
def test_the_cap_keeps_concurrent_threads_in_two_arenas():
    applied, uncapped = _arenas("none")
    assert applied == "None" and uncapped >= 9  # the main arena and one per thread
    assert _arenas("2") == ("True", 2)
    assert _arenas("1") == ("True", 1)


@glibc
def test_the_users_malloc_arena_max_wins():
    assert _arenas("2", MALLOC_ARENA_MAX="4") == ("False", 4)
    assert _arenas("2", GLIBC_TUNABLES="glibc.malloc.arena_max=3") == ("False", 3)


@glibc
def test_the_scoring_server_caps_the_arenas_when_it_loads_the_model(tmp_path):
    export = tiny_export(tmp_path, {"beam_size": 1}, 80)
    server = {SCORING_SERVER_ENV: str(export)}  # as MLflow's scoring server starts
    assert _arenas(f"served:{export}", **server) == ("served", 2)
    assert _arenas(f"served:{export}", ATTNLAB_MALLOC_ARENAS="0", **server)[1] >= 9  # the opt-out
    assert _arenas(f"served:{export}")[1] >= 9  # a script that loads the model keeps its malloc


def test_a_bad_cap_is_refused(monkeypatch):
    with pytest.raises(ValueError, match="arenas=-1: give 1 or more malloc arenas, or 0"):
        cap_malloc_arenas(-1)
    monkeypatch.setenv("ATTNLAB_MALLOC_ARENAS", "two")
    with pytest.raises(ValueError, match="ATTNLAB_MALLOC_ARENAS='two': give a number"):
        cap_malloc_arenas()
    assert cap_malloc_arenas(0) is False
