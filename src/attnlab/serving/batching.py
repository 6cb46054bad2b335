"""Batching across concurrent requests of the served model: one decoding batch for many requests.

MLflow's scoring server runs each request's ``predict`` in a thread of its own
(``asyncio.to_thread``), so one worker holds several requests at once. Decoded one by one,
each is a small batch that leaves the cores idle between its short matrix products.
:class:`RequestBatcher` merges them, as a dynamic batcher does in an inference server:
a request's thread hands its checked sentences to one decoding thread and waits. That thread
takes the oldest waiting request with those that arrive within ``window_s`` of it (so no wait
when it has waited that long already, behind the previous batch), up to ``max_tokens`` source
tokens together, and decodes them as one batch. The decoder sorts the sentences by length and
gives each the tokens it gets alone (batch invariance,
:func:`attnlab.inference.decoding.translate`). Then the answers are split back per request.

Only requests with the same decoding settings (the ``key``: engine and beam) share a batch.
A batch whose decoding fails is decoded again one request at a time, so one bad request never
fails its batch-mates. A request still waiting at its deadline is answered with
:class:`DeadlineExceededError`, not decoded.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from attnlab.errors import UserError

log = logging.getLogger(__name__)

# Defaults of the served model (config.yaml → serving): a few milliseconds against a decode of
# hundreds, and a token budget of a few full requests.
DEFAULT_WINDOW_S = 0.005
DEFAULT_MAX_BATCH_TOKENS = 4000


class DeadlineExceededError(UserError, TimeoutError):
    """A request waited past its deadline before its batch was decoded; it was not decoded."""


@dataclass
class _Request:
    key: Hashable
    items: Any
    tokens: int
    deadline: float  # time.monotonic()
    arrival: float = field(default_factory=time.monotonic)
    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    error: BaseException | None = None


class RequestBatcher:
    """Decode concurrent requests together (module docstring).

    Args:
        decode: ``decode(key, [items, ...]) -> [answer, ...]``: the requests' items (in
            order) decoded as one batch with settings ``key``, one answer per request. It is
            only ever called from the batcher's one thread.
        window_s: how long after its arrival the oldest waiting request waits for others to
            join it (seconds, ≥ 0), unless the token budget fills first.
        max_tokens: most source tokens in one batch (≥ 1); a larger request is decoded alone.
    Raises:
        ValueError: ``window_s`` < 0 or ``max_tokens`` < 1.
    """

    def __init__(
        self,
        decode: Callable[[Hashable, list[Any]], Sequence[Any]],
        window_s: float = DEFAULT_WINDOW_S,
        max_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
    ):
        if window_s < 0:
            raise ValueError(f"window_s must be ≥ 0 seconds, got {window_s}")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be ≥ 1, got {max_tokens}")
        self.decode, self.window_s, self.max_tokens = decode, float(window_s), int(max_tokens)
        self._queue: deque[_Request] = deque()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self.batches: list[int] = []  # requests per decoded batch, for tests and benchmarks

    def submit(self, key: Hashable, items: Any, tokens: int, timeout_s: float) -> Any:
        """Decode ``items`` (one request) with settings ``key`` in a batch; its answer.

        ``tokens``: the request's source tokens; ``timeout_s``: seconds from now to its
        deadline. Blocks until answered. Raises what decoding it alone raised, or
        :class:`DeadlineExceededError` if its deadline passed before its batch began.
        """
        request = _Request(key, items, int(tokens), time.monotonic() + timeout_s)
        with self._cond:
            if self._thread is None or not self._thread.is_alive():  # started on first use
                self._thread = threading.Thread(target=self._run, name="attnlab-batcher", daemon=True)
                self._thread.start()
            self._queue.append(request)
            self._cond.notify_all()
        request.done.wait()
        if request.error is not None:
            raise request.error
        return request.result

    def _next_batch(self) -> list[_Request]:
        """The oldest request and those of its key that join it (window, token budget)."""
        with self._cond:
            while not self._queue:
                self._cond.wait()
            first = self._queue[0]
            end = first.arrival + self.window_s  # no wait if it has waited that long already
            while sum(r.tokens for r in self._queue if r.key == first.key) < self.max_tokens:
                left = end - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            batch, tokens = [], 0
            for request in list(self._queue):
                if request.key != first.key:
                    continue
                if batch and tokens + request.tokens > self.max_tokens:
                    break
                batch.append(request)
                tokens += request.tokens
            for request in batch:
                self._queue.remove(request)
            return batch

    def _run(self) -> None:
        while True:
            batch = self._next_batch()
            now = time.monotonic()
            late = [r for r in batch if r.deadline <= now]
            for request in late:
                request.error = DeadlineExceededError(
                    "the request waited past its deadline for the model to be free and was not "
                    "translated; the server is overloaded: send it again later, or serve with "
                    "more workers or machines"
                )
                request.done.set()
            batch = [r for r in batch if r.deadline > now]
            if batch:
                self.batches.append(len(batch))
                self._decode(batch)

    def _decode(self, batch: list[_Request]) -> None:
        try:
            answers = list(self.decode(batch[0].key, [r.items for r in batch]))
            if len(answers) != len(batch):
                raise RuntimeError(f"decode gave {len(answers)} answers for {len(batch)} requests")
        except BaseException as e:  # noqa: BLE001 - each request gets its own outcome below
            if len(batch) == 1:
                batch[0].error = e
                batch[0].done.set()
                return
            log.warning("a batch of %d requests failed (%s); decoding them one by one", len(batch), e)
            for request in batch:
                self._decode([request])
            return
        for request, answer in zip(batch, answers):
            request.result = answer
            request.done.set()
