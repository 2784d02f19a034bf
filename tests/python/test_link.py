"""kvpool._link.Link, the reconnecting connection of the engine plug-ins: a session kvpoold
reclaimed for idleness (keepalive_ms) costs the engine no miss, a daemon that is gone does
(counted, with a backoff)."""
import time

import pytest

from conftest import DEFAULT_CONF, Daemon
from kvpool._link import Link

KEEPALIVE_MS = 200


@pytest.fixture
def idle_daemon():
    d = Daemon(DEFAULT_CONF.replace("keepalive_ms = 120000", f"keepalive_ms = {KEEPALIVE_MS}"))
    yield d
    d.stop()


def probe(pool, state):
    """One round trip to kvpoold: the count of a key chain nobody cached."""
    return pool.exists_keys([b"link-probe"], namespace=7) + 4


def test_idle_reclaim_reconnects_within_the_call(idle_daemon):
    link = Link("c", socket=idle_daemon.sock, name="link-test")
    assert link.call("probe", probe) == 4
    time.sleep(3 * KEEPALIVE_MS / 1000)  # kvpoold closes the idle session meanwhile
    assert link.call("probe", probe) == 4  # answered, not a miss
    assert link.stats["reconnects"] == 1
    assert link.stats["probe_unavailable"] == 0
    link.close()


def test_daemon_gone_is_a_miss_with_backoff(idle_daemon):
    link = Link("c", socket=idle_daemon.sock, name="link-test")
    assert link.call("probe", probe) == 4
    idle_daemon.stop()
    assert link.call("probe", probe) is None  # lost, the one retry finds no daemon
    assert link.call("probe", probe) is None  # inside the backoff: socket not touched
    assert link.stats["skipped_while_down"] >= 1
    link.close()
