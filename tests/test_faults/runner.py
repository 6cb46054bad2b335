"""Run the project's stages in processes forked from :mod:`test_faults.zygote`, with or without a fault."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


@dataclass
class Run:
    """A finished stage: exit status (negative: the signal that killed it), output, and the
    fault hook's record (the census's events, or where the fault was injected; None if it
    was not reached)."""

    argv: list[str]
    returncode: int
    stdout: str
    stderr: str
    record: dict | None
    cpu: float = 0.0  # CPU seconds (user + system)

    def tail(self, n: int = 3000) -> str:
        return f"exit {self.returncode}\n--- stdout\n{self.stdout[-n:]}\n--- stderr\n{self.stderr[-n:]}"


class Zygote:
    """One fork server (a child process of the tests) and the folder its runs' output goes to."""

    def __init__(self, workdir: Path):
        self.workdir, self.n = Path(workdir), 0
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.env = stage_env()
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "zygote.py")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=open(self.workdir / "zygote.log", "wb"),  # noqa: SIM115 - the server's, open while it runs
            text=True,
            env=self.env,
            cwd=ROOT,
        )
        self._reply(timeout=300)  # {"ready": pid}: the imports are done

    def _reply(self, timeout: float) -> dict:
        out: list[str] = []
        reader = threading.Thread(target=lambda: out.append(self.proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(timeout)
        if not out or not out[0]:
            raise RuntimeError(
                f"the fork server gave no answer in {timeout} s (see {self.workdir}/zygote.log)"
            )
        return json.loads(out[0])

    def run(
        self, argv: list[str], cwd: Path, fault: dict | None = None, timeout: float = 300, **env: str
    ) -> Run:
        """Run ``argv`` (``[script, *args]``) in ``cwd``; ``fault`` is the :mod:`test_faults.inject` spec."""
        self.n += 1
        out, err, log = (self.workdir / f"{self.n}.{k}" for k in ("stdout", "stderr", "fault.json"))
        child_env = {**self.env, **env}
        if fault:
            child_env["ATTNLAB_FAULT"] = json.dumps({**fault, "log": str(log)})
        req = {
            "argv": [str(a) for a in argv],
            "cwd": str(cwd),
            "env": child_env,
            "stdout": str(out),
            "stderr": str(err),
            "modules": str(self.workdir / f"{self.n}.modules"),
        }
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        pid = self._reply(timeout=60)["pid"]
        try:
            reply = self._reply(timeout=timeout)
        except RuntimeError:
            os.kill(pid, signal.SIGKILL)
            self._reply(timeout=60)
            raise RuntimeError(f"{argv} ran past {timeout} s; killed") from None
        return Run(
            list(argv),
            reply["returncode"],
            out.read_text(errors="replace"),
            err.read_text(errors="replace"),
            json.loads(log.read_text()) if log.exists() else None,
            reply["cpu"],
        )

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def stage_env() -> dict[str, str]:
    """The environment a stage runs in: this one, one torch thread, no tracking URI from outside
    (each project keeps its own mlflow.db), quiet logs."""
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "ATTNLAB_DATA_MIRROR")}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONHASHSEED="0")
    env.setdefault("PYTHONPATH", str(ROOT / "src"))
    return env
