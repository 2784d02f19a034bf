"""kvpool._link: a kvpoold connection for engine plug-ins that reconnects by itself.

An engine must keep serving when kvpoold is down or restarts: every call of a plug-in goes
through Link.call, which answers None (the caller's miss) instead of raising, counts why, and
attaches again after a bounded backoff (no busy loop: while the backoff runs, calls do not
touch the socket). One lock serialises the calls, as a kvpool Client is not thread-safe and
engines call their storage tier from several threads.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from typing import Any, Callable, Optional

import kvpool

log = logging.getLogger("kvpool")

# kvpoold went away or cannot serve this session any more: drop the connection, retry later
_DOWN = (kvpool.NoDaemon, kvpool.TransportError, kvpool.ShuttingDown, kvpool.ProtocolError,
         kvpool.VersionMismatch, kvpool.NoSuchPool)

BACKOFF_MIN_S = 0.05
BACKOFF_MAX_S = 2.0
# The Link reconnects by itself (bounded backoff, calls answer misses meanwhile), so the
# client's own reconnect is off: a call never waits for kvpoold to come back.
RECONNECT_MS = 4294967295


def held_pages(pool: kvpool.Pool, keys: list[bytes], namespace: int) -> tuple[int, int]:
    """(local, below): the leading keys held in the pool's device and host pages, and those
    after them held by the tiers below host (disk, remote). One MatchKeys without a lock:
    kvpoold counts the disk's pages from its key map and asks a remote tier only when the
    pool has one and the local pages fall short."""
    m = pool.match_keys(keys, namespace=namespace, lock=False)
    return len(m.device_pages) + len(m.host_pages), int(m.remote_pages)


def match_or_fetch(pool: kvpool.Pool, keys: list[bytes], namespace: int,
                   count: Callable[[str, int], None]) -> Any:
    """The locked match of keys; where tiers below host hold pages after the local ones (and
    no device pages were matched), the locked answer of a FetchKeys that read them into host
    pages first, the first match released. A fetch that fails is counted (count("fetch_<error>",
    1)) and the local match stands: fewer pages, never an error; connection loss and a
    restart are raised (Link.call's to handle)."""
    m = pool.match_keys(keys, namespace=namespace, lock=True)
    if not m.remote_pages or len(m.device_pages):
        return m
    try:
        f = pool.fetch_keys(keys, namespace=namespace, lock=True)
    except _DOWN + (kvpool.Restarted,):
        raise
    except kvpool.Error as e:
        count(f"fetch_{type(e).__name__}", 1)
        log.info("kvpool: fetch: %s", e)
        return m
    m.release()
    count("fetched_pages", int(f.fetched_pages))
    count("fetch_missed_pages", int(f.missed_pages))
    return f


def geometry_mismatch(pool_name: str, want: kvpool.Geometry, have: kvpool.Geometry,
                      why: str) -> kvpool.GeometryMismatch:
    """A kvpool.GeometryMismatch with expected/actual filled in."""
    e = kvpool.GeometryMismatch(f"pool {pool_name}: {why} (engine {tuple(want)}, pool "
                                f"{tuple(have)})")
    e.expected, e.actual, e.message, e.name = want, have, str(e), "GEOMETRY_MISMATCH"
    return e


class Link:
    """One client and one attached pool, re-established on demand.

    check(pool) runs on every attach (raise GeometryMismatch to refuse the pool); setup(pool)
    builds what the caller derives from the pool (views) and its result is kept as .state.
    """

    def __init__(self, pool: str, socket: Optional[str] = None, name: str = "engine",
                 check: Optional[Callable[[kvpool.Pool], None]] = None,
                 setup: Optional[Callable[[kvpool.Pool], Any]] = None):
        self.pool_name = pool
        self.socket = socket
        self.name = name
        self.check = check
        self.setup = setup
        self.lock = threading.Lock()
        self.stats: Counter = Counter()
        self.client: Optional[kvpool.Client] = None
        self.pool: Optional[kvpool.Pool] = None
        self.state: Any = None
        self._backoff = BACKOFF_MIN_S
        self._next_try = 0.0

    def _attach(self) -> Optional[kvpool.Pool]:
        now = time.monotonic()
        if now < self._next_try:
            self.stats["skipped_while_down"] += 1
            return None
        try:
            client = kvpool.connect(self.socket, name=self.name, reconnect_ms=RECONNECT_MS)
            try:
                pool = client.attach(self.pool_name)
                if self.check:
                    self.check(pool)
                state = self.setup(pool) if self.setup else None
            except BaseException:
                client.close()
                raise
        except kvpool.GeometryMismatch as e:
            self.stats["geometry_mismatch"] += 1
            log.error("kvpool: %s", e)
            self._down(now)
            return None
        except kvpool.Error as e:
            self.stats["connect_failed"] += 1
            log.warning("kvpool: attaching pool %s failed: %s", self.pool_name, e)
            self._down(now)
            return None
        if self.stats["connects"]:
            self.stats["reconnects"] += 1
        self.stats["connects"] += 1
        self.client, self.pool, self.state = client, pool, state
        self._backoff = BACKOFF_MIN_S
        return pool

    def _down(self, now: float) -> None:
        self._next_try = now + self._backoff
        self._backoff = min(self._backoff * 2, BACKOFF_MAX_S)

    def drop(self) -> None:
        """Forgets the connection (views first, so the mappings can go)."""
        self.state = None
        pool, client = self.pool, self.client
        self.pool = self.client = None
        try:
            if client is not None:
                client.close()
        except kvpool.Error:
            pass
        del pool

    def connect_now(self) -> Optional[kvpool.Pool]:
        """Attaches now if not attached (ignores the backoff); the pool or None."""
        with self.lock:
            if self.pool is None:
                self._next_try = 0.0
                return self._attach()
            return self.pool

    def call(self, what: str, fn: Callable[[kvpool.Pool, Any], Any]) -> Any:
        """fn(pool, state) under the lock; None when kvpoold cannot be reached or the call
        failed (counted under what and the error's name)."""
        with self.lock:
            fresh = self.pool is None  # this call makes the connection
            pool = self.pool if self.pool is not None else self._attach()
            if pool is None:
                self.stats[f"{what}_unavailable"] += 1
                return None
            for attempt in (0, 1):
                try:
                    return fn(pool, self.state)
                except kvpool.Restarted as e:
                    # the client reconnected and resumed by itself; the pool may be mapped
                    # anew, so what setup derived from it is derived again
                    self.stats[f"{what}_Restarted"] += 1
                    log.info("kvpool: %s: %s", what, e)
                    try:
                        self.state = self.setup(pool) if self.setup else None
                    except kvpool.Error:
                        self.drop()
                        self._down(time.monotonic())
                    return None
                except _DOWN as e:
                    self.stats[f"{what}_{type(e).__name__}"] += 1
                    self.drop()
                    # A connection that served before and is gone now (kvpoold reclaimed an
                    # idle session after keepalive_ms, or restarted): attach again at once and
                    # retry this call once; a second loss, or a failed attach, backs off.
                    if attempt == 0 and not fresh:
                        log.info("kvpool: %s: %s; reconnecting now", what, e)
                        self._next_try = 0.0
                        pool = self._attach()
                        if pool is not None:
                            continue
                        self.stats[f"{what}_unavailable"] += 1
                        return None
                    log.warning("kvpool: %s: %s; reconnecting", what, e)
                    self._down(time.monotonic())
                    return None
                except kvpool.Error as e:
                    self.stats[f"{what}_{type(e).__name__}"] += 1
                    log.info("kvpool: %s: %s", what, e)
                    return None
            return None

    def close(self) -> None:
        with self.lock:
            self.drop()
