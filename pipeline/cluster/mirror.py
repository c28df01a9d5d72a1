"""The fleet controller's mirror of its state in Redis (best effort; see Mirror)."""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .fleetspec import Camera, FleetSpec

log = logging.getLogger(__name__)


class MirroredState(Protocol):
    """What ``Mirror.catch_up`` writes back: the fleet controller's state (a protocol, so that the
    mirror need not import the controller that holds it)."""

    spec: FleetSpec | None
    starts: int
    cameras: dict[str, Camera]
    placement: dict[str, int]
    outages: list[dict[str, Any]]


class Mirror:
    """The controller's writes to Redis, best effort. While Redis is away the controller goes on from
    its memory (cameras are still placed and moved) and writes are skipped; once Redis answers again,
    ``catch_up`` writes the whole state back (Redis may have restarted empty).

    A thread of its own asks Redis for its run id every CHECK_S: a Redis that restarted (empty, or
    from an older snapshot) between two writes has a new one, and is written back in full too
    (redis-py reconnects without a word, so no write fails to tell)."""

    RETRY_S = (2.0, 30.0)  # the first retry, the longest wait between retries (each doubles)
    CHECK_S = 5.0

    def __init__(self, db: Any, fleet: str, keys: dict[str, str]) -> None:
        self.db, self.fleet, self.keys = db, fleet, keys
        self.behind = False
        self._next_try, self._wait_s = 0.0, self.RETRY_S[0]
        self._run_id: str | None = None  # of the Redis the state was last written to in full (or first seen)
        self._stop = threading.Event()
        self.check()
        threading.Thread(target=self._watch, name=f"mirror-{fleet}", daemon=True).start()

    def close(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.wait(self.CHECK_S):
            self.check()

    def check(self) -> None:
        """Fall behind (catch_up is due at once) when Redis is away or restarted since the last look."""
        if self.behind:
            return
        try:
            run_id = str(self.db.info("server")["run_id"])
        except Exception as exc:  # redis.RedisError and its socket errors: Redis is away
            self._fall_behind(exc)
            return
        if self._run_id is not None and run_id != self._run_id:
            log.warning("fleet %s: Redis restarted (a new run id); the whole state is written back", self.fleet)
            self.behind, self._next_try, self._wait_s = True, 0.0, self.RETRY_S[0]
        self._run_id = run_id

    def write(self, change) -> None:
        """``change(pipe)`` queues its commands on a Redis pipeline; run them, or fall behind."""
        if self.behind:
            return  # catch_up writes everything
        try:
            pipe = self.db.pipeline()
            change(pipe)
            pipe.execute()
        except Exception as exc:  # redis.RedisError and its socket errors: Redis is away
            self._fall_behind(exc)

    def _fall_behind(self, exc: Exception) -> None:
        log.warning("fleet %s: Redis unreachable (%s); going on from memory, the placement is written back "
                    "when it answers", self.fleet, type(exc).__name__)
        self.behind, self._wait_s = True, self.RETRY_S[0]
        self._next_try = time.monotonic() + self._wait_s

    def catch_up(self, state: MirroredState) -> None:
        """Rewrite spec, cameras, placement, outages and the start count, when behind and due."""
        if not self.behind or time.monotonic() < self._next_try or state.spec is None:
            return
        try:
            pipe = self.db.pipeline()
            pipe.delete(*self.keys.values())
            pipe.set(self.keys["spec"], json.dumps({**state.spec.to_dict(), "cameras": []}))
            pipe.set(self.keys["starts"], state.starts)
            for cid, cam in state.cameras.items():
                pipe.hset(self.keys["cameras"], cid, json.dumps(cam.to_dict()))
            for cid, index in state.placement.items():
                pipe.hset(self.keys["placement"], cid, index)
            if state.outages:
                pipe.rpush(self.keys["outages"], *(json.dumps(o) for o in state.outages))
            pipe.execute()
        except Exception:  # still away (a Redis that hangs costs this loop a connect timeout per try)
            self._wait_s = min(self.RETRY_S[1], 2 * self._wait_s)
            self._next_try = time.monotonic() + self._wait_s
            return
        self.behind, self._run_id = False, None  # the next check takes the run id written to
        log.warning("fleet %s: Redis answers again; the placement is mirrored again", self.fleet)
