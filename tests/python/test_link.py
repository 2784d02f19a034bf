"""kvpool._link.Link, the reconnecting connection of the engine plug-ins: a quiet session is
kept while its process lives; a session kvpoold closed anyway (here: reclaimed after keepalive_ms
because kvpoold was given no pidfd to watch the peer) costs the engine no miss; a daemon that is
gone does (counted, with a backoff)."""
import time

import pytest

from conftest import DEFAULT_CONF, Daemon
from kvpool._link import Link

KEEPALIVE_MS = 200


SHORT_KEEPALIVE = DEFAULT_CONF.replace("[daemon]\n", f"[daemon]\nkeepalive_ms = {KEEPALIVE_MS}\n")


@pytest.fixture
def idle_daemon():
    """keepalive_ms 200 and no pidfd for any peer (injected): idle sessions are reclaimed."""
    d = Daemon(SHORT_KEEPALIVE, env={"KVPOOLD_FAULTS": "pidfd:1"})
    yield d
    d.stop()


@pytest.fixture
def watching_daemon():
    """keepalive_ms 200, peers watched through their pidfds (the normal case)."""
    d = Daemon(SHORT_KEEPALIVE)
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


def test_quiet_session_is_kept_while_its_process_lives(watching_daemon):
    link = Link("c", socket=watching_daemon.sock, name="link-test")
    assert link.call("probe", probe) == 4
    time.sleep(10 * KEEPALIVE_MS / 1000)  # quiet for ten keep-alives
    assert link.call("probe", probe) == 4
    assert link.stats["reconnects"] == 0  # the same session answered
    link.close()


def test_daemon_gone_is_a_miss_with_backoff(idle_daemon):
    link = Link("c", socket=idle_daemon.sock, name="link-test")
    assert link.call("probe", probe) == 4
    idle_daemon.stop()
    assert link.call("probe", probe) is None  # lost, the one retry finds no daemon
    assert link.call("probe", probe) is None  # inside the backoff: socket not touched
    assert link.stats["skipped_while_down"] >= 1
    link.close()
