"""Threads of the served model matched to the cores: workers × torch threads ≤ cores.

``mlflow models serve`` starts ``--workers`` uvicorn processes (MLflow's default 1, or
``MLFLOW_MODELS_WORKERS``); each loads the model and, left alone, torch gives each as many
intra-op threads as the machine has cores. Two workers on two cores then run four OpenMP
threads that spin-wait for each other. :func:`match_threads` gives each worker
``max(1, cores // workers)`` threads instead, where ``cores`` are those this process may run on
(``os.sched_getaffinity``). A thread count the user set wins: ``OMP_NUM_THREADS`` in the
server's environment is left as torch read it.

OpenMP's wait policy is read once, when torch loads its OpenMP runtime, so
:func:`passive_wait_policy` must run before ``import torch``: the served model's module
(:mod:`attnlab.serving.model`) calls it first, in the scoring server's processes
(:func:`in_scoring_server`). ``OMP_WAIT_POLICY`` set by the user wins.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

_WORKERS = re.compile(r"(?:^|\s)(?:--workers|-w)[ =](\d+)(?:\s|$)")


def passive_wait_policy() -> str | None:
    """Set ``OMP_WAIT_POLICY=PASSIVE`` unless the environment sets it or torch is imported
    already (too late: the runtime has read it). Returns the policy in force, or None when
    it could not be set (torch imported, no setting)."""
    if "OMP_WAIT_POLICY" in os.environ:
        return os.environ["OMP_WAIT_POLICY"]
    if "torch" in sys.modules:
        return None
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    return "PASSIVE"


def _cmdline(pid: int | str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


# MLflow's scoring server (mlflow.pyfunc.scoring_server.get_cmd, for `mlflow models serve` and
# its container) gives uvicorn the model's path in this variable; its workers inherit it.
SCORING_SERVER_ENV = "__pyfunc_model_path__"


def in_scoring_server() -> bool:
    """Whether this process is MLflow's scoring server or one of its workers (``mlflow models
    serve``, the model's container): :data:`SCORING_SERVER_ENV` is set. False where a script or
    notebook loads the model."""
    return SCORING_SERVER_ENV in os.environ


def uvicorn_workers() -> int:
    """The number of server processes this one is part of: ``--workers N`` on the command line
    of this process or its parent (uvicorn's, as MLflow starts it; Linux's ``/proc``), else
    ``MLFLOW_MODELS_WORKERS``, else 1."""
    for pid in ("self", os.getppid()):
        line = _cmdline(pid)
        if "uvicorn" in line:
            found = _WORKERS.search(line)
            if found:
                return max(1, int(found.group(1)))
    value = os.environ.get("MLFLOW_MODELS_WORKERS", "")
    return max(1, int(value)) if value.isdigit() else 1


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def match_threads(workers: int | None = None) -> dict[str, int | str]:
    """Give torch ``max(1, cores // workers)`` intra-op threads unless ``OMP_NUM_THREADS`` is set.

    Returns ``{"cores", "workers", "threads", "set_by"}``: ``set_by`` is ``"attnlab"`` or
    ``"OMP_NUM_THREADS"`` (the user's setting, kept).
    """
    import torch

    cores = usable_cores()
    workers = uvicorn_workers() if workers is None else max(1, int(workers))
    if os.environ.get("OMP_NUM_THREADS", "").strip():
        return {
            "cores": cores,
            "workers": workers,
            "threads": torch.get_num_threads(),
            "set_by": "OMP_NUM_THREADS",
        }
    threads = max(1, cores // workers)
    torch.set_num_threads(threads)
    return {"cores": cores, "workers": workers, "threads": threads, "set_by": "attnlab"}
