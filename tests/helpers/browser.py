"""Helpers of the browser checks: `mlflow ui` on a free loopback port, its REST endpoints, and
headless Chromium: its command line (DOM dumps, screenshots) and, for pages that must be
waited for in real time or whose console matters, the DevTools protocol (:class:`DevTools`).

`mlflow ui` serves MLflow's single-page web app and, under /ajax-api/2.0/mlflow/, the REST
endpoints that app calls. A run whose artifact location is a local folder (<project>/mlruns/…)
has its files listed by /ajax-api/…/artifacts/list and sent by /get-artifact, both read from
that folder. Headless Chromium then loads the app itself.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path

import pytest

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
WINDOW = (1400, 900)  # width, height of the screenshot, in CSS pixels (device scale 1)


def find_browser() -> str:
    """The first Chromium-family binary on PATH; skip the test when there is none."""
    for name in BROWSERS:
        if path := shutil.which(name):
            return path
    pytest.skip(
        f"no Chromium on PATH (looked for {', '.join(BROWSERS)}); "
        "install one (Debian: `apt-get install chromium`) to run the browser check"
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def mlflow_ui(store: Path, folder: Path, env: dict):
    """`mlflow ui` over the SQLite `store` on a free loopback port; yields its base URL.

    It runs in `folder`, in its own process group (the CLI starts a uvicorn worker), and the
    whole group is ended on exit. MLflow's job runner (task-queue workers for its GenAI
    jobs) is switched off: nothing here uses it.
    """
    port = free_port()
    url, log = f"http://127.0.0.1:{port}", folder / "mlflow-ui.log"
    cmd = [
        sys.executable,
        "-m",
        "mlflow",
        "ui",
        "--backend-store-uri",
        f"sqlite:///{store}",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
    ]
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd,
            cwd=folder,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**env, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, f"mlflow ui exited:\n{log.read_text()[-3000:]}"
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                assert time.monotonic() < deadline, (
                    f"mlflow ui not healthy after 120 s:\n{log.read_text()[-3000:]}"
                )
                time.sleep(0.3)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def http(url: str, body: dict | None = None, **query) -> bytes:
    """GET `url` with `query` (or POST `body` as JSON); the response body."""
    if query:
        url += "?" + urllib.parse.urlencode(query)
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as r:
        return r.read()


def headless(browser: str, profile: Path, window: tuple[int, int]) -> list[str]:
    """The command line both ways of driving Chromium start with: headless, in ``profile``,
    ``window`` CSS pixels. `--no-sandbox`: CI runs as root, where Chromium's sandbox refuses to
    start."""
    return [
        browser,
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--hide-scrollbars",
        f"--user-data-dir={profile}",
        f"--window-size={window[0]},{window[1]}",
    ]


def chromium(
    browser: str, url: str, profile: Path, *action: str, window: tuple[int, int] = WINDOW
) -> subprocess.CompletedProcess:
    """Headless Chromium loads `url` and does `action` (`--dump-dom`, `--screenshot=…`,
    `--enable-logging=stderr --v=0` to print the page's console messages to stderr).

    `--virtual-time-budget` lets the page run its scripts and fetches for 20 s of virtual
    time (paused while requests are pending) before the action, so the React app has
    rendered. `--no-sandbox`: CI runs as root, where Chromium's sandbox refuses to start.
    """
    cmd = [*headless(browser, profile, window), "--virtual-time-budget=20000", *action, url]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


class DevTools:
    """Headless Chromium driven over the DevTools protocol on a pipe (`--remote-debugging-pipe`:
    JSON messages ending in NUL on file descriptors 3 and 4), standard library only.

    Unlike the CLI's `--virtual-time-budget` (which stalls scripts in a cross-process iframe,
    such as the MLflow UI's sandboxed HTML artifact view), it waits in real time, for a
    condition; and it reports console messages with their level and uncaught exceptions, from
    the page and from its iframes (each attached as its own session, held at start until its
    console and network are being recorded). Use as a context manager; the browser is ended on
    exit.
    """

    def __init__(
        self, browser: str, profile: Path, window: tuple[int, int] = WINDOW, flags: Sequence[str] = ()
    ):
        """Start ``browser`` headless with ``profile``; ``flags`` are further command-line flags."""
        to_read, self._to = os.pipe()  # we write, Chromium reads on fd 3
        self._from, from_write = os.pipe()  # Chromium writes on fd 4
        args = [*headless(browser, profile, window), *flags, "--remote-debugging-pipe", "about:blank"]
        log_path = Path(profile).parent / f"{Path(profile).name}-chromium.log"
        self._log = open(log_path, "wb")  # noqa: SIM115 - Chromium's stdout while it runs; __exit__ closes it
        self._proc = subprocess.Popen(
            ["bash", "-c", f'exec "$@" 3<&{to_read} 4>&{from_write}', "bash", *args],
            pass_fds=(to_read, from_write),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        os.close(to_read)
        os.close(from_write)
        self._attach(self._to, self._from)

    def _attach(self, to_fd: int, from_fd: int) -> None:
        """Speak the protocol over two pipe ends: ``to_fd`` (written), ``from_fd`` (read)."""
        self._to, self._from = to_fd, from_fd
        self._buffer, self._id = b"", 0
        self._inbox: collections.deque[dict] = collections.deque()  # read, not yet taken
        self.events: list[dict] = []  # every event received, in order
        self.frames: dict[str, str] = {}  # session id of each attached iframe → its URL

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._proc.pid, signal.SIGKILL)
        self._proc.wait()
        os.close(self._to)
        os.close(self._from)
        self._log.close()

    def _receive(self, timeout: float) -> dict | None:
        """The next message: one read earlier and not yet taken, else one that arrives within
        `timeout` seconds (None if none does). A read can bring several messages; each is
        taken exactly once, in order, so an event right behind a command's answer is kept."""
        import select

        if not self._inbox and b"\0" not in self._buffer:
            ready, _, _ = select.select([self._from], [], [], max(0.0, timeout))
            if ready:
                chunk = os.read(self._from, 1 << 20)
                assert chunk, "Chromium closed its DevTools pipe (it exited)"
                self._buffer += chunk
        while b"\0" in self._buffer:
            raw, self._buffer = self._buffer.split(b"\0", 1)
            self._inbox.append(json.loads(raw))
        return self._inbox.popleft() if self._inbox else None

    def _event(self, message: dict) -> None:
        self.events.append(message)
        if message.get("method") == "Target.attachedToTarget":  # an iframe in its own process
            child, info = message["params"]["sessionId"], message["params"]["targetInfo"]
            self.frames[child] = info["url"]
            self._setup(child)
            self.call("Runtime.runIfWaitingForDebugger", child)

    def _setup(self, session: str) -> None:
        for domain in ("Runtime.enable", "Page.enable", "Log.enable", "Network.enable"):
            with contextlib.suppress(RuntimeError):  # an iframe session has no Page domain
                self.call(domain, session)
        self.call("Target.setAutoAttach", session, autoAttach=True, waitForDebuggerOnStart=True, flatten=True)

    def call(self, method: str, session: str | None = None, timeout: float = 30, **params) -> dict:
        """Send one command (to `session`, or to the browser) and return its result.
        Raises RuntimeError with Chromium's error message, AssertionError after `timeout` s."""
        self._id += 1
        sent = self._id
        message = {"id": sent, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        os.write(self._to, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        pending = []
        while True:
            assert time.monotonic() < deadline, f"no answer to {method} in {timeout} s"
            m = self._receive(deadline - time.monotonic())
            if m is None:
                continue
            if m.get("id") == sent:
                for event in pending:
                    self._event(event)
                if "error" in m:
                    raise RuntimeError(f"{method}: {m['error'].get('message')}")
                return m.get("result", {})
            if "method" in m:
                pending.append(m)

    def wait_for(self, found, timeout: float = 60, what: str = "") -> dict:
        """Receive events until `found(event)` is true for one (also one received earlier);
        return it. AssertionError after `timeout` s."""
        deadline, seen = time.monotonic() + timeout, 0
        while True:
            for event in self.events[seen:]:
                if found(event):
                    return event
            seen = len(self.events)
            assert time.monotonic() < deadline, f"waited {timeout} s for {what or found}"
            m = self._receive(deadline - time.monotonic())
            if m is not None and "method" in m:
                self._event(m)

    def open(self, url: str) -> str:
        """A new tab showing `url` (navigation started, not waited for); its session id."""
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self._setup(session)
        self.call("Page.navigate", session, url=url)
        return session

    def evaluate(self, session: str, expression: str):
        """The value of a JavaScript expression in `session`'s page (promises awaited)."""
        result = self.call(
            "Runtime.evaluate", session, expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression!r} threw {result['exceptionDetails']}")
        return result["result"].get("value")

    def screenshot(self, session: str, path: Path) -> Path:
        """A PNG of what the tab shows (its iframes included)."""
        import base64

        data = self.call("Page.captureScreenshot", session, format="png")["data"]
        Path(path).write_bytes(base64.b64decode(data))
        return Path(path)

    def console(self, session: str | None = None) -> list[tuple[str, str]]:
        """(level, text) of every console message and uncaught exception so far (of `session`
        only, if given): levels log, info, warning, error, ..., and "exception"."""
        out = []
        for e in self.events:
            if session is not None and e.get("sessionId") != session:
                continue
            p = e.get("params", {})
            if e.get("method") == "Runtime.consoleAPICalled":
                out.append(
                    (p["type"], " ".join(str(a.get("value", a.get("description", ""))) for a in p["args"]))
                )
            elif e.get("method") == "Runtime.exceptionThrown":
                d = p["exceptionDetails"]
                out.append(("exception", d.get("exception", {}).get("description") or d["text"]))
            elif e.get("method") == "Log.entryAdded":
                out.append((p["entry"]["level"], p["entry"]["text"]))
        return out
