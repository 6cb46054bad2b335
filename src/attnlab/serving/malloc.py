"""Keep a long-running server's memory flat: cap glibc's malloc arenas.

glibc gives each thread that allocates its own malloc arena (up to 8 per core) and rarely
returns their free space to the system. The MLflow scoring server answers requests on a
pool of threads, so under concurrent load each thread's decoding buffers land in its own
arena and the server's RSS creeps up. Measured with ``benchmarks/serve_load.py`` (the
default Transformer, 8 clients × 60 requests of 1-32 sentences, a quarter of them invalid,
beam 5, 2 workers, a quiet 2-core EPYC): mean RSS +6.4% from the first to the last
quarter of the run and still rising (1,267 → 1,402 MB by tenths; +9.6% on a busy machine,
+15.6% in a longer run), against -1.2% with this cap (1,230 → 1,213 MB), at the same
speed (44.5 and 45.4 sentences/s). The same cap as ``MALLOC_ARENA_MAX=2`` in the
server's environment, set by the served model itself so that any ``mlflow models serve``
or MLflow-built container gets it (``ATTNLAB_MALLOC_ARENAS`` sets another cap, 0 none).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform

from attnlab.errors import ConfigError

M_ARENA_MAX = -8  # mallopt() parameter number in glibc's <malloc.h>
SERVING_ARENAS = 2
ENV = "ATTNLAB_MALLOC_ARENAS"  # the served model's cap; 0 leaves glibc's default


def cap_malloc_arenas(arenas: int | None = None) -> bool:
    """Cap this process's glibc malloc arenas at ``arenas`` (``mallopt(M_ARENA_MAX, n)``).

    Threads that allocate after the call share those arenas; call it before the threads
    start (the served model does when it loads, before the server's request threads run).
    glibc fixes its limit once a process has more than 8 arenas: a later call still
    succeeds but changes nothing. The cap holds for the whole process (the scoring server,
    or an application that loads the model with ``mlflow.pyfunc.load_model``).

    Args:
        arenas: the cap; default ``$ATTNLAB_MALLOC_ARENAS``, else 2. 0 does nothing.
    Returns:
        True when the cap was set. False when nothing was done: ``arenas`` is 0, the
        environment already sets glibc's arena limit (``MALLOC_ARENA_MAX``, or
        ``glibc.malloc.arena_max`` in ``GLIBC_TUNABLES``: the user's choice wins), or the C
        library is not glibc (musl, macOS: no per-thread arenas to cap).
    Raises:
        ValueError: ``arenas`` (or ``$ATTNLAB_MALLOC_ARENAS``) is negative or not a number.
    """
    if arenas is None:
        value = os.environ.get(ENV, str(SERVING_ARENAS))
        try:
            arenas = int(value)
        except ValueError:
            raise ConfigError(
                f"{ENV}={value!r}: give a number of malloc arenas (0 leaves glibc's default)"
            ) from None
    if arenas < 0:
        raise ConfigError(f"arenas={arenas}: give 1 or more malloc arenas, or 0 to leave glibc's default")
    if (
        arenas == 0
        or "MALLOC_ARENA_MAX" in os.environ
        or "glibc.malloc.arena_max" in os.environ.get("GLIBC_TUNABLES", "")
        or platform.libc_ver()[0] != "glibc"
    ):
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    return libc.mallopt(M_ARENA_MAX, arenas) == 1
