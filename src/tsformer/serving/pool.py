"""`WorkerPool`: the threads that run the model for tsformer-serve, with a bound on the requests waiting.

The event loop only reads requests and writes answers; parsing a table, the model and writing the answer
run in `workers` threads (PyTorch and most of pandas' work release the GIL, so the threads share the
cores; benchmarks/RESULTS_serve.md measures them). A request is admitted before its body is read, so that
at most `workers + queue` requests hold a body and a table at once: past that bound `admit` says no and
the server answers 503 at once (never a hang). So does it when the calls ahead of a request, at the mean
time of the recent calls, would keep it waiting past its time limit (`seconds`): a client is told at
once to retry, rather than after the limit. A request that waits or runs past its time limit all the same is
answered 504: waiting, it is taken off the queue; running, its thread finishes the call (a thread cannot
be stopped) and keeps its place in the bound until then, so that a slow model is never given more work
than the bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor


class TimeLimit(Exception):
    """The request's time limit passed while it waited for a worker or ran."""


class WorkerPool:
    def __init__(self, workers: int, queue: int, seconds: float | None = None):
        if workers < 1 or queue < 0:
            raise ValueError(f"workers={workers} (at least 1) and queue={queue} (at least 0)")
        self.workers, self.queue = workers, queue
        self.executor = ThreadPoolExecutor(
            workers, thread_name_prefix="tsformer-model", initializer=_yield_to_loop
        )
        self._lock = threading.Lock()  # admitted and running change in the loop's thread and the workers'
        self.admitted = 0  # requests holding a place: waiting for a worker or running
        self.running = 0
        self.seconds = seconds  # the requests' time limit
        self.mean_call: float | None = None  # seconds of the recent calls (a moving mean, weight 0.2)

    @property
    def waiting(self) -> int:
        """Requests admitted and not yet running (the queue's depth)."""
        return max(0, self.admitted - self.running)

    def admit(self) -> str | None:
        """A place for one more request (None; give it back with `release`, or through `run`), or why
        there is none: `workers + queue` requests hold one, or those ahead would keep it waiting past `seconds`."""
        with self._lock:
            if self.admitted >= self.workers + self.queue:
                return f"{self.running} requests running, {self.waiting} waiting"
            if self.seconds is not None and self.mean_call is not None:
                # rounds of calls before its own starts (its own time is unknown: a request alone is always
                # admitted, so that one slow call never shuts the server)
                expected = (self.admitted // self.workers) * self.mean_call
                if expected > self.seconds:
                    return f"{self.admitted} requests ahead, about {expected:.0f} s at {self.mean_call:.2f} s each"
            self.admitted += 1
            return None

    def release(self) -> None:
        with self._lock:
            self.admitted -= 1

    async def run(self, work: Callable[[], object], seconds: float):
        """`work()` in a worker thread, for an admitted request (its place is given back when the call
        ends, or when it is taken off the queue); `TimeLimit` after `seconds`."""

        def counted():
            with self._lock:
                self.running += 1
            started = time.perf_counter()
            try:
                return work()
            finally:
                seconds = time.perf_counter() - started
                with self._lock:
                    self.running -= 1
                    self.mean_call = (
                        seconds if self.mean_call is None else 0.8 * self.mean_call + 0.2 * seconds
                    )

        try:
            future: Future = self.executor.submit(counted)
        except RuntimeError:  # the pool is shut down (the server stops)
            self.release()
            raise
        future.add_done_callback(lambda _: self.release())  # also when cancelled while waiting
        try:
            # shielded: a time limit cancels the wait, and the call is cancelled only if not started
            return await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(future)), max(seconds, 0.0))
        except asyncio.TimeoutError:
            future.cancel()
            raise TimeLimit from None

    def shutdown(self) -> None:
        """No new call; the waiting ones are cancelled, a running one finishes in its thread."""
        self.executor.shutdown(wait=False, cancel_futures=True)


MODEL_NICENESS = 5  # how much lower the model threads' scheduling priority is than the event loop's


def _yield_to_loop() -> None:
    """A model thread's scheduling priority a little below the event loop's (Linux: a thread's own nice
    value), so that on a busy machine the loop gets a core first when a request or /health arrives.
    Raising one's own nice value needs no privilege; elsewhere it is left as it is."""
    if sys.platform != "linux":
        return
    with contextlib.suppress(OSError):
        thread = threading.get_native_id()
        os.setpriority(
            os.PRIO_PROCESS, thread, min(19, os.getpriority(os.PRIO_PROCESS, thread) + MODEL_NICENESS)
        )
