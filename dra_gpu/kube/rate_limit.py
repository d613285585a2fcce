"""Client-side rate limit of the API client, as client-go's `rest.Config` QPS/Burst (`--kube-api-qps`,
`--kube-api-burst` of NVIDIA's plugin): a token bucket that holds `burst` tokens, refills at `qps` per second,
and makes each request wait for a token before it is sent. A watch takes one token when it starts, as in
client-go. QPS 0 and burst 0 mean client-go's defaults (5 and 10); a negative QPS turns the limit off."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

DEFAULT_QPS = 5.0  # client-go's rest.DefaultQPS
DEFAULT_BURST = 10  # client-go's rest.DefaultBurst


class TokenBucket:
    """Thread-safe; `take()` blocks until a token is free (the waits queue in call order)."""

    def __init__(
        self,
        qps: float,
        burst: int,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if qps == 0:
            qps = DEFAULT_QPS
        if burst == 0:
            burst = DEFAULT_BURST
        if burst < 0:
            raise ValueError(
                f"--kube-api-burst must be >= 1 (0: client-go's default {DEFAULT_BURST}), got {burst}"
            )
        self.qps = qps
        self.burst = burst
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._tokens = float(burst)
        self._stamp = clock()

    @property
    def unlimited(self) -> bool:
        return self.qps < 0

    def take(self) -> float:
        """Take one token, waiting for it if needed; returns the seconds waited."""
        if self.unlimited:
            return 0.0
        with self._lock:  # reserve under the lock, wait outside it: later callers reserve later tokens
            now = self._clock()
            self._tokens = min(float(self.burst), self._tokens + (now - self._stamp) * self.qps)
            self._stamp = now
            self._tokens -= 1.0
            wait = 0.0 if self._tokens >= 0 else -self._tokens / self.qps
        if wait > 0:
            self._sleep(wait)
        return wait
