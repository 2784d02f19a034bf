"""Pressure notices through the Python package: a client connected with pressure_notices=True
is told when a tier's free pages fall below the pool's watermark and when they recover
(Client.pressure_notices, kvpool.decode_pressure); a client that did not ask gets nothing."""
import time

import pytest

import kvpool
from conftest import DEFAULT_CONF, pool_section

# 64 device pages of 4 tokens, watermark 16 pages, no rate limit.
CONF = DEFAULT_CONF + pool_section("pr", layers=1, kv_heads=1, device_capacity="256t",
                                   extra="pressure_watermark = 25%\npressure_interval_ms = 0\n")


def test_notice_then_recovery(daemon):
    with kvpool.connect(daemon.sock, name="listener", pressure_notices=True) as a, \
            kvpool.connect(daemon.sock, name="writer") as w:
        pa = a.attach("pr")
        assert pa.pressure_notices is True
        assert pa.pressure_watermark("device") == 64
        pw = w.attach("pr")
        assert pw.pressure_notices is False
        assert list(a.pressure_notices()) == []
        lease = pw.alloc(50)                      # 14 pages free: below the watermark
        got = list(a.pressure_notices(timeout=5))
        assert len(got) == 1
        n = got[0]
        assert isinstance(n, kvpool.PressureNotice)
        assert (n.pool, n.pool_id, n.tier, n.recovered) == ("pr", pa.id, "device", False)
        assert (n.free_tokens, n.watermark_tokens, n.total_tokens) == (56, 64, 256)
        assert n.evictable_tokens == 0 and n.reserved_tokens == 0 and n.coalesced == 0
        lease.free()
        got = list(a.pressure_notices(timeout=5))
        assert [(x.recovered, x.free_tokens, x.seq) for x in got] == [(True, 256, n.seq + 1)]
        # the writer never asked: no event at all
        w.ping()
        assert w.next_event() is None


def test_decode_pressure_from_events(daemon):
    with kvpool.connect(daemon.sock, name="listener", pressure_notices=True) as a, \
            kvpool.connect(daemon.sock, name="writer") as w:
        pa = a.attach("pr")                      # kept: a Pool that goes detaches
        pw = w.attach("pr")
        lease = pw.alloc(60)
        ev = None
        for _ in range(50):
            ev = a.next_event()
            if ev is not None:
                break
            a.ping()                              # a call reads what the daemon pushed
            time.sleep(0.05)
        assert ev is not None and ev.type == kvpool.EVENT_PRESSURE and ev.id == 0
        n = kvpool.decode_pressure(ev)
        assert n.recovered is False and n.free_tokens == 16
        lease.free()
        other = kvpool.Event((11, 0, 0, 0, b"", 0))
        assert kvpool.decode_pressure(other) is None
        with pytest.raises(kvpool.ProtocolError):
            kvpool.decode_pressure(kvpool.Event((kvpool.EVENT_PRESSURE, 0, 0, 0, b"\xff", 1)))
        with pytest.raises(TypeError):
            kvpool.decode_pressure((60, 0, 0, 0, b"", 0))
        with pytest.raises(ValueError):
            list(a.pressure_notices(timeout=-1))
        assert len(list(a.pressure_notices(timeout=5))) == 1   # the recovery
        pa.detach()
        pw.detach()


def test_no_notices_without_asking(daemon):
    with kvpool.connect(daemon.sock, name="quiet") as q, \
            kvpool.connect(daemon.sock, name="writer") as w:
        pq = q.attach("pr")
        assert pq.pressure_notices is False
        pw = w.attach("pr")
        lease = pw.alloc(60)
        assert list(q.pressure_notices(timeout=0.3)) == []
        lease.free()
