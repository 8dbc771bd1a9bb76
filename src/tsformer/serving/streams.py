"""`StreamStates`: tsformer-serve's kept state of each stream (`params: {"stream": "<key>"}`), for a model
whose job answers new rows as they arrive (`Predictor.streams`).

The state itself is the job's and opaque here (`Predictor.predict_stream(state, rows, params)` returns
the answer and the next state; it bounds what it keeps per key). This store bounds the keys: past
`max_keys`, the least recently used key is dropped with a log line, and its name is remembered (a few
times `max_keys` names) so that its next request is told that its state was lost rather than silently
started again (a request that fails then says so too). Requests of one key are answered one after another
(a lock per key); a request that fails leaves the key's state as it was.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict

log = logging.getLogger(__name__)

MAX_KEY_CHARS = 200
REMEMBERED_PER_KEY = 10  # dropped keys' names remembered, per key kept


class StreamStates:
    def __init__(self, max_keys: int):
        if max_keys < 1:
            raise ValueError(f"stream keys: at least 1, got {max_keys}")
        self.max_keys = max_keys
        self._lock = threading.Lock()
        self._states: OrderedDict[str, object] = OrderedDict()  # least recently used first
        self._key_locks: dict[str, threading.Lock] = {}
        self._dropped: OrderedDict[str, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._states)

    @staticmethod
    def checked_key(key) -> str:
        if not isinstance(key, str) or not 0 < len(key) <= MAX_KEY_CHARS:
            raise ValueError(f"params: stream must be a text key of 1 to {MAX_KEY_CHARS} characters")
        return key

    def answer(self, key: str, answer_with):
        """`answer_with(state)` -> (answer, next state) for `key` (state None: a new stream), the next
        state kept; returns (answer, what the server says of the stream: `new`, `lost`)."""
        with self._lock:
            lock = self._key_locks.setdefault(key, threading.Lock())
        with lock:
            with self._lock:
                state = self._states.get(key)
                new, lost = state is None, state is None and key in self._dropped
            try:
                answer, state = answer_with(state)  # may raise: the key keeps its state
            except ValueError as err:
                if lost:  # the rows alone may not do (a forecaster's history): say why they were alone
                    raise ValueError(
                        f"stream {key!r} was dropped (more than {self.max_keys} streams kept): {err}"
                    ) from err
                raise
            with self._lock:
                self._states[key] = state
                self._states.move_to_end(key)
                self._dropped.pop(key, None)
                self._drop_oldest()
        said = {"key": key, "new": new, "lost": None}
        if lost:
            said["lost"] = (
                f"the kept rows of stream {key!r} were dropped (more than {self.max_keys} streams, the least "
                "recently used first): these rows started it again"
            )
        return answer, said

    def _drop_oldest(self) -> None:
        while len(self._states) > self.max_keys:
            key, _ = self._states.popitem(last=False)
            if not self._key_locks[key].locked():  # a request of the key still holds it otherwise
                del self._key_locks[key]
            self._dropped[key] = None
            while len(self._dropped) > REMEMBERED_PER_KEY * self.max_keys:
                self._dropped.popitem(last=False)
            log.warning("stream %r dropped: more than %d streams kept (--stream-keys)", key, self.max_keys)
