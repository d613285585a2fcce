"""Bounded connection handling for the webhook: a fixed pool of worker threads and a deadline per request.

A thread per connection lets any client that can reach the port (every pod, without a NetworkPolicy) create
threads without bound. Here a fixed number of workers serve connections from a bounded queue; while it is full
the server stops accepting and new connections wait in the kernel's listen backlog. No client holds a worker
for long, however slowly it trickles bytes: the TLS handshake and each request (read, review, answer) must be
done by their deadline, or the socket is shut down under the worker, which ends its blocked read or write.
"""

from __future__ import annotations

import contextlib
import os
import queue
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import structlog

log = structlog.get_logger(__name__)


class Deadlines:
    """Open connections (by file descriptor) and when each must be done.

    Entries are dropped before their socket is closed (`forget`), under the same lock that `expire` holds
    while it shuts sockets down, so a descriptor number reused by a newer connection is never shut down.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._due: dict[int, float] = {}

    def set(self, fd: int, seconds: float) -> None:
        with self._lock:
            self._due[fd] = time.monotonic() + seconds

    def forget(self, fd: int) -> None:
        with self._lock:
            self._due.pop(fd, None)

    def expire(self) -> int:
        """Shut down every connection past its deadline; returns how many."""
        now = time.monotonic()
        with self._lock:
            late = [fd for fd, due in self._due.items() if due <= now]
            for fd in late:
                del self._due[fd]
                _shutdown_fd(fd)
        if late:
            log.info("webhook connections past their deadline closed", count=len(late))
        return len(late)

    def __len__(self) -> int:
        with self._lock:
            return len(self._due)


def _shutdown_fd(fd: int) -> None:
    # shutdown() acts on the socket, not the descriptor: on a duplicate it wakes the worker blocked on the
    # original without touching that thread's Python (or SSL) socket object.
    with contextlib.suppress(OSError):
        dup = socket.socket(fileno=os.dup(fd))
        try:
            dup.shutdown(socket.SHUT_RDWR)
        finally:
            dup.close()


Connection = tuple[socket.socket, Any]


class WorkerPool:
    """`workers` threads serving queued connections with `serve(sock, address)`; at most `backlog` wait."""

    def __init__(self, serve: Callable[[socket.socket, Any], None], workers: int, backlog: int) -> None:
        if workers < 1:
            raise ValueError(f"workers must be at least 1, got {workers}")
        self._serve = serve
        self._queue: queue.Queue[Connection | None] = queue.Queue(maxsize=backlog)
        self._threads = [
            threading.Thread(target=self._work, name=f"webhook-worker-{i}", daemon=True)
            for i in range(workers)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, sock: socket.socket, address: Any, timeout_s: float) -> bool:
        """Queue a connection, waiting up to `timeout_s` for room; False when the queue stayed full."""
        try:
            self._queue.put((sock, address), timeout=timeout_s)
        except queue.Full:
            return False
        return True

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            try:
                self._serve(*item)
            except Exception as err:  # one connection's failure must not cost the pool a worker
                log.warning("webhook connection failed", client=item[1], error=repr(err))

    def stop(self, timeout_s: float = 5.0) -> list[Connection]:
        """Stop the workers after the connections they serve; returns those still queued (unserved)."""
        left: list[Connection] = []
        with contextlib.suppress(queue.Empty):
            while True:
                item = self._queue.get_nowait()
                if item is not None:
                    left.append(item)
        for _ in self._threads:
            self._queue.put(None)
        end = time.monotonic() + timeout_s  # one bound for all: a worker may be mid-request
        for thread in self._threads:
            thread.join(timeout=max(0.0, end - time.monotonic()))
        return left
