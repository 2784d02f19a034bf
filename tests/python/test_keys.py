"""Tests of the hash-keyed calls of the kvpool package: Pool.insert_keys, match_keys and
exists_keys against a real kvpoold (pools of conftest's DEFAULT_CONF plus a host-only one)."""
import hashlib

import pytest

import kvpool
from conftest import DEFAULT_CONF, host_pool

# the daemon's key limits below the library's (65,536 keys a call, 64 bytes a key), so both
# sides' refusals show
DAEMON_KEYS, DAEMON_KEY_BYTES = 4096, 48
CONF = (DEFAULT_CONF.replace("[daemon]\n", f"[daemon]\nmax_keys_per_call = {DAEMON_KEYS}\n"
                             f"max_key_bytes = {DAEMON_KEY_BYTES}\n", 1)
        + host_pool("hostonly", capacity="64t"))


def chain(n, seed=b"", size=32):
    """n chained page keys (each hashes its parent), size bytes each."""
    out, prev = [], seed
    for i in range(n):
        prev = hashlib.sha256(prev + i.to_bytes(4, "little")).digest()[:size]
        out.append(prev)
    return out


def test_insert_match_exists_device(client):
    pool = client.attach("c")
    keys = chain(3, b"dev")
    lease = pool.alloc(4)
    pages = [int(p) for p in lease.pages]
    r = pool.insert_keys(lease, keys, namespace=11)
    assert r == {"new_pages": 3, "dup_pages": 0, "done_keys": 3, "lease_pages": 1}
    assert [int(p) for p in lease.pages] == pages[3:]
    assert pool.exists_keys(keys, namespace=11) == 3
    assert pool.exists_keys(keys[:2] + [b"other"], namespace=11) == 2
    assert pool.exists_keys([b"other"] + keys, namespace=11) == 0
    assert pool.exists_keys(keys, namespace=12) == 0
    with pool.match_keys(keys + [b"tail"], namespace=11) as m:
        assert m.lock_id != 0
        assert m.tokens == 3 * pool.geometry.page_tokens
        assert [int(p) for p in m.device_pages] == pages[:3]
        assert len(m.host_pages) == 0
    m = pool.match_keys(keys, namespace=11, lock=False)
    assert m.lock_id == 0 and len(m.device_pages) == 3
    lease.free()
    pool.detach()


def test_insert_host_lease_and_dups(client):
    pool = client.attach("hostonly")
    keys = chain(4, b"host")
    with pool.alloc(2, tier="host") as lease:
        r = pool.insert_keys(lease, keys[:2], namespace=5)
        assert r["new_pages"] == 2 and len(lease.pages) == 0
    # the first two again (matched) plus two new ones, explicit pages
    with pool.alloc(3, tier="host") as lease:
        pages = [int(p) for p in lease.pages]
        m = pool.match_keys(keys[:2], namespace=5)
        assert len(m.host_pages) == 2 and len(m.device_pages) == 0
        r = pool.insert_keys(lease, keys, cached_keys=2, namespace=5, pages=pages[1:])
        m.release()
        assert r["new_pages"] == 2 and r["done_keys"] == 4
        assert [int(p) for p in lease.pages] == pages[:1]
    # a duplicate: its page is freed, the cache keeps the first one
    with pool.alloc(1, tier="host") as lease:
        r = pool.insert_keys(lease, keys[:1], namespace=5)
        assert r["dup_pages"] == 1 and r["new_pages"] == 0 and len(lease.pages) == 0
    assert pool.exists_keys(keys, namespace=5) == 4
    pool.detach()


def test_key_limits_and_types(client, daemon):
    pool = client.attach("c")
    # past the library's limits: refused before sending, the limit named
    with pytest.raises(kvpool.LimitExceeded) as e:
        pool.exists_keys([b"x" * 65])
    assert (e.value.what, e.value.limit) == ("bytes per key", 64)
    with pytest.raises(kvpool.InvalidArgument):
        pool.match_keys([b"a", b""])
    big = [i.to_bytes(8, "little") for i in range(10**6)]
    for call in (pool.exists_keys, pool.match_keys):
        with pytest.raises(kvpool.LimitExceeded) as e:
            call(big, namespace=40)
        assert (e.value.what, e.value.limit) == ("keys per call", 65536)
    # past the daemon's max_key_bytes and max_keys_per_call: its refusal, its limit named
    with pytest.raises(kvpool.LimitExceeded) as e:
        pool.exists_keys([b"x" * (DAEMON_KEY_BYTES + 1)], namespace=40)
    assert (e.value.what, e.value.limit) == ("bytes per key", DAEMON_KEY_BYTES)
    with pytest.raises(kvpool.LimitExceeded) as e:
        pool.match_keys(big[:DAEMON_KEYS + 1], namespace=40)
    assert (e.value.what, e.value.limit) == ("keys per call", DAEMON_KEYS)
    assert pool.exists_keys([b"x" * DAEMON_KEY_BYTES], namespace=40) == 0
    assert pool.exists_keys(big[:DAEMON_KEYS], namespace=40) == 0
    with pytest.raises(TypeError):
        pool.exists_keys(b"one-bytes-object")
    with pytest.raises(TypeError):
        pool.exists_keys(["str key"])
    with pytest.raises(TypeError):
        pool.exists_keys(None)
    lease = pool.alloc(2)
    with pytest.raises(ValueError):
        pool.insert_keys(lease, chain(3, b"more"))  # 3 keys, 2 pages
    with pytest.raises(kvpool.LimitExceeded):
        pool.insert_keys(lease, [b"k" * 65], namespace=41)
    with pytest.raises(kvpool.LimitExceeded):
        pool.insert_keys(lease, [b"k" * (DAEMON_KEY_BYTES + 1)], namespace=41)
    assert len(lease.pages) == 2  # a refused call leaves the lease as it was
    lease.free()
    assert daemon.pool_books("c")["device"]["leased_tokens"] == 0
    pool.detach()


def test_namespace_kinds_coexist(client):
    pool = client.attach("c")
    pt = pool.geometry.page_tokens
    tokens = list(range(1, pt + 1))
    with pool.alloc(1) as lease:
        pool.insert(lease, tokens, namespace=21)
    assert pool.exists_keys([b"k"], namespace=21) == 0
    with pool.alloc(1) as lease:
        pool.insert_keys(lease, [b"k"], namespace=21)
    # each kind matches its own pages in the shared namespace
    assert pool.exists_keys([b"k"], namespace=21) == 1
    assert pool.match(tokens, namespace=21).tokens == pt
    assert pool.match(tokens, namespace=22).tokens == 0
    pool.detach()


def test_evicted_parent_and_books(client, daemon):
    pool = client.attach("c")
    keys = chain(4, b"evict")
    with pool.alloc(4) as lease:
        pool.insert_keys(lease, keys, namespace=31)
    # evict everything evictable from both tiers: the leaves go first, the chain is gone
    client.flush("c")
    assert pool.exists_keys(keys, namespace=31) == 0
    assert pool.exists_keys(keys[2:], namespace=31) == 0
    m = pool.match_keys(keys, namespace=31)
    assert m.tokens == 0 and m.lock_id == 0
    # a child inserted on its own after the parent went is a run of its own
    with pool.alloc(1) as lease:
        r = pool.insert_keys(lease, keys[3:], namespace=31)
        assert r["new_pages"] == 1
    assert pool.exists_keys(keys, namespace=31) == 0
    assert pool.exists_keys(keys[3:], namespace=31) == 1
    books = daemon.pool_books("c")
    assert books["device"]["leased_tokens"] == 0
    pool.detach()


def test_insert_after_match_evicted(client):
    pool = client.attach("c")
    keys = chain(3, b"gone")
    with pool.alloc(1) as lease:
        pool.insert_keys(lease, keys[:1], namespace=32)
    m = pool.match_keys(keys[:1], namespace=32, lock=False)
    assert m.tokens == pool.geometry.page_tokens
    client.flush("c")
    with pool.alloc(2) as lease:
        r = pool.insert_keys(lease, keys, cached_keys=1, namespace=32)
        assert r["done_keys"] == 0 and r["new_pages"] == 0
        assert len(lease.pages) == 2  # the pages stay in the lease
    pool.detach()
