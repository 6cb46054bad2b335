"""The DevTools client of the browser tests (tests/browser.py) keeps every message it reads.

Chromium writes the DevTools protocol as NUL-separated JSON on one pipe, and one read can bring
a command's answer together with the events behind it. The explorer logs "drawn <state>" from a
``setTimeout(0)`` right after the ``Runtime.evaluate`` that chose the state, so that event often
shares a read with the answer; a client that returns on the answer and drops the rest of the read
waits for it in vain (a CI failure of test_explorer). Here the pipe is fed by hand, no browser.
"""

from __future__ import annotations

import json
import os

from helpers.browser import DevTools


def _client() -> tuple[DevTools, int, int]:
    """A DevTools client on two plain pipes; (client, the end Chromium would write, the end it
    would read)."""
    client = DevTools.__new__(DevTools)  # no Chromium: the pipes stand in for it
    chromium_reads, to_fd = os.pipe()
    from_fd, chromium_writes = os.pipe()
    client._attach(to_fd, from_fd)  # the state __init__ sets up once Chromium runs
    return client, chromium_writes, chromium_reads


def _wire(*messages: dict) -> bytes:
    return b"".join(json.dumps(m).encode() + b"\0" for m in messages)


def _logged(text: str, session: str) -> dict:
    return {
        "method": "Runtime.consoleAPICalled",
        "sessionId": session,
        "params": {"type": "log", "args": [{"type": "string", "value": text}]},
    }


def test_an_event_read_with_a_commands_answer_is_kept():
    client, chromium_writes, chromium_reads = _client()
    before, after = _logged("before the answer", "S"), _logged("drawn head=1", "S")
    # The answer to command 1 with an event on each side of it, in one write (so one read).
    os.write(
        chromium_writes,
        _wire(before, {"id": 1, "sessionId": "S", "result": {"ok": 7}}, after)
        + json.dumps(_logged("half a message", "S")).encode()[:20],
    )
    assert client.call("Runtime.evaluate", "S", timeout=5, expression="1") == {"ok": 7}
    sent = json.loads(os.read(chromium_reads, 1 << 16).rstrip(b"\0"))
    assert (sent["id"], sent["method"], sent["sessionId"]) == (1, "Runtime.evaluate", "S")
    assert client.events == [before]  # an event before the answer is recorded by the call
    found = client.wait_for(
        lambda e: e.get("params", {}).get("args", [{}])[0].get("value") == "drawn head=1",
        5,
        "the event behind the answer",
    )
    assert found == after
    assert client.console("S") == [("log", "before the answer"), ("log", "drawn head=1")]
    assert client._buffer == json.dumps(_logged("half a message", "S")).encode()[:20]  # kept too
    for fd in (client._from, client._to, chromium_writes, chromium_reads):
        os.close(fd)


def test_messages_are_taken_once_and_in_order_across_reads():
    client, chromium_writes, chromium_reads = _client()
    events = [_logged(f"event {i}", "S") for i in range(5)]
    os.write(chromium_writes, _wire(*events[:2], {"id": 1, "result": {}}, events[2]))
    client.call("Page.enable", "S", timeout=5)
    os.write(chromium_writes, _wire(events[3], {"id": 2, "result": {}}, events[4]))
    client.call("Runtime.enable", "S", timeout=5)
    client.wait_for(lambda e: e == events[4], 5)
    assert client.events == events  # each once, in the order Chromium wrote them
    for fd in (client._from, client._to, chromium_writes, chromium_reads):
        os.close(fd)
