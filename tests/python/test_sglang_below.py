"""kvpool's SGLang plug-ins over pools with a disk tier below host, against a real kvpoold and
SGLang 0.5.23's own classes: KvpoolLinker under SGLang's UnifiedRadixCache (sglang_instance)
and KvpoolStorage from SGLang's StorageBackendFactory with SGLang's host pool (as
test_sglang.py drives it). An instance stores pages, other traffic pushes them out of the host
tier to the disk, then a lookup (batch_exists) counts them as hits below host and a load
(batch_get_v1) fetches them into host pages and copies them: every byte equal to what was
stored, no lock nor lease left. With the disk's bytes flipped under kvpoold, the fetch reads
nothing: a counted miss, no exception, and the pages are misses afterwards; a fetch kvpoold
refuses (the session's quota held) is a counted miss too."""
import json
import time
from array import array

import pytest

from conftest import Daemon, pool_section
from disk_util import disk_counters, disk_folder, disk_lines, flip_disk_bytes, remove_folder
from engine_util import HostPool, import_sglang, sglang_page_keys

hicache_storage, backend_factory, _ = import_sglang()
torch = pytest.importorskip("torch")
import kvpool  # noqa: E402
from kvpool.sglang import KvpoolStorage  # noqa: E402
from sglang_instance import Instance  # noqa: E402
from test_sglang_linker import same, toks  # noqa: E402

L, H, D, T = 2, 2, 8, 4
PAGES = 6        # SGLang pages a test stores and reads back
HOST_PAGES = 8   # the host tiers' pages: the other traffic fills them twice over
QUOTA_PAGES = 2 * PAGES  # "sgd"'s session quota: one backup of PAGES pages (K and V each)


def conf(folder):
    """Pool "lkd" (the linker's: a pool page holds an SGLang page of every layer) and pool
    "sgd" (the storage backend's: a pool page holds K or V of one SGLang page), with host tiers
    of HOST_PAGES SGLang pages (2 x HOST_PAGES pool pages for "sgd") and disk tiers of 512
    pool pages; "sgd" with a session quota of QUOTA_PAGES pool pages."""
    return ("[daemon]\n"
            + pool_section("lkd", host_capacity=f"{HOST_PAGES * T}t",
                           extra=disk_lines(folder, "lkd", f"{512 * T}t"))
            + pool_section("sgd", head_dim=D // 2, host_capacity=f"{2 * HOST_PAGES * T}t",
                           extra=disk_lines(folder, "sgd", f"{512 * T}t")
                           + f"session_quota = {QUOTA_PAGES * T}t\n"))


@pytest.fixture
def folder():
    d = disk_folder()
    yield d
    remove_folder(d)


@pytest.fixture
def daemon(folder):
    """A kvpoold of the test's own (a test corrupts its disk files)."""
    d = Daemon(conf(folder))
    yield d
    d.stop()


def wait_on_disk(daemon, pool, keys):
    """Waits until the disk tier holds every one of keys and the host tier none (the disk
    tier writes behind the evictions)."""
    with kvpool.connect(daemon.sock) as c:
        p = c.attach(pool)
        for _ in range(500):
            m = p.match_keys(keys, lock=False)
            if m.remote_pages == len(keys):
                break
            time.sleep(0.02)
        assert (len(m.host_pages), m.remote_pages) == (0, len(keys))
        p.detach()


def books(daemon, pool):
    """(protected, leased) tokens of the pool's host tier."""
    h = daemon.pool_books(pool)["host"]
    return h["protected_tokens"], h["leased_tokens"]


# -- KvpoolLinker --

def linker_keys(inst, tokens):
    """The pool keys KvpoolLinker stores tokens' whole pages under (SGLang's storage hashes
    as the unified cache linker computes them)."""
    from sglang.srt.mem_cache.radix_cache import RadixKey
    from sglang.srt.mem_cache.utils import get_storage_hash_str
    return inst.linker._keys(get_storage_hash_str(RadixKey(array("q", tokens)), None,
                                                  page_size=T))


def offload_to_disk(daemon, tokens, seed):
    """Instance A computes tokens (written through to the pool), then other prefixes until
    the host tier was filled twice over: tokens' pages are on the disk only. Returns A's KV
    of tokens."""
    a = Instance(daemon.sock, "lkd")
    s = a.compute(tokens, seed=seed)
    a.drain()
    want = a.read(s)
    for k in range(3):
        a.compute(toks(50000 + 1000 * seed + 100 * k, PAGES * T), seed=seed + 1 + k)
        a.drain()
    assert a.linker.stats()["offload_pages"] == 4 * PAGES
    wait_on_disk(daemon, "lkd", linker_keys(a, tokens))
    a.close()
    return want


def test_linker_pages_on_disk_are_hits_and_load_back(daemon):
    """Instance B's lookup counts the prefix A offloaded, now on the disk, as hits below host;
    its load fetches the pages (read from the disk once each) and copies them into B's device
    slots: every byte A computed; no lock nor lease left."""
    p = toks(1000, PAGES * T)
    want = offload_to_disk(daemon, p, seed=7)
    read0 = disk_counters(daemon).get("disk_read_pages", 0)
    b = Instance(daemon.sock, "lkd")
    for layer in range(b.layers):  # B's slots are not A's: a missing copy shows
        for buf in b.bufs(layer):
            buf.fill_(-3)
    dev, got, failed = b.fetch(p + [1, 2, 3])
    assert dev == 0 and not failed and got is not None
    slots, data = got
    assert len(slots) == PAGES * T
    same(data, want)
    st = b.linker.stats()
    assert st["lookup_hit_pages"] == PAGES and st["lookup_hit_pages_below"] == PAGES
    assert st["fetched_pages"] == PAGES and st["load_pages"] == PAGES
    assert not st.get("fetch_missed_pages")
    assert disk_counters(daemon)["disk_read_pages"] - read0 == PAGES
    assert books(daemon, "lkd") == (0, 0)
    # now in host pages again: a hit with no fetch
    dev, got, failed = b.fetch(p)
    assert got is not None and not failed
    same(got[1], want)
    assert b.linker.stats()["fetched_pages"] == PAGES
    b.close()


def test_linker_corrupt_disk_pages_are_misses(daemon, folder):
    """The disk's bytes flipped under kvpoold: B's lookup still counts the pages (the key map
    knows them), the load's fetch reads none (each fails its check): the load is refused,
    counted, nothing raises into SGLang, no lock nor lease is left, and the prefix is a miss
    afterwards."""
    p = toks(2000, PAGES * T)
    offload_to_disk(daemon, p, seed=17)
    flip_disk_bytes(f"{folder}/lkd.disk", 100)  # pages under 1 KiB
    bad0 = disk_counters(daemon).get("disk_corrupt_pages", 0)
    b = Instance(daemon.sock, "lkd")
    dev, got, failed = b.fetch(p + [1])
    assert got is None and dev == 0
    st = b.linker.stats()
    assert st["lookup_hit_pages_below"] == PAGES
    assert st["fetch_missed_pages"] == PAGES and not st.get("fetched_pages")
    assert st["load_refused"] == 1 and not st.get("load_pages")
    assert disk_counters(daemon)["disk_corrupt_pages"] - bad0 >= 1
    assert books(daemon, "lkd") == (0, 0)
    assert b.fetch(p + [1])[1] is None
    assert b.linker.stats()["lookup_hit_pages"] == PAGES  # the first lookup's only
    b.close()


# -- KvpoolStorage (L3) --

def storage(daemon, layout="page_first", pages=64):
    """A backend loaded as SGLang loads one from --hicache-storage-backend dynamic, SGLang's
    host pool registered."""
    cfg = hicache_storage.HiCacheStorageConfig(
        tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True,
        model_name="test-model", extra_config=json.loads(json.dumps({
            "backend_name": "kvpool", "module_path": "kvpool.sglang",
            "class_name": "KvpoolStorage", "interface_v1": 1, "pool": "sgd",
            "socket": daemon.sock})))
    b = backend_factory.StorageBackendFactory.create_backend("dynamic", cfg, None)
    assert isinstance(b, KvpoolStorage)
    host = HostPool(layout, L, H, D, T, pages, torch.float16)
    b.register_mem_pool_host(host.real)
    return b, host


def page_keys(tokens):
    return sglang_page_keys(tokens, T)


def backup_to_disk(daemon, b, host, keys, seed):
    """Backs up keys' pages (batch_set_v1), then other pages until the host tier was filled
    twice over: keys' pages are on the disk only. Returns the pages' bytes."""
    want = [host.fill(i, seed + i) for i in range(PAGES)]
    assert b.batch_set_v1(keys, host.indices(list(range(PAGES)))) == [True] * PAGES
    for k in range(3):
        other = page_keys(toks(60000 + 1000 * seed + 100 * k, PAGES * T))
        for i in range(PAGES):
            host.fill(PAGES + i, seed + 10 * (k + 1) + i)
        src = list(range(PAGES, 2 * PAGES))
        assert b.batch_set_v1(other, host.indices(src)) == [True] * PAGES
    wait_on_disk(daemon, "sgd", b._keys(keys))
    return want


@pytest.mark.parametrize("layout", ["layer_first", "page_first"])
def test_storage_pages_on_disk_are_hits_and_read_back(daemon, layout):
    """Pages backed up, then pushed to the disk: batch_exists counts them (below host) and
    batch_get_v1 fetches them (K and V of each, read from the disk once each) into other host
    slots, every byte equal; the legacy get reads one too; no lock nor lease left."""
    b, host = storage(daemon, layout)
    keys = page_keys(toks(3000 + 100 * len(layout), PAGES * T))
    want = backup_to_disk(daemon, b, host, keys, seed=5)
    read0 = disk_counters(daemon).get("disk_read_pages", 0)
    assert b.batch_exists(keys) == PAGES
    assert b.stats()["exists_hits_below"] == PAGES
    dst = [40, 2, 50, 41, 42, 30]
    for p in dst:
        host.fill(p, 999)
    assert b.batch_get_v1(keys, host.indices(dst)) == [True] * PAGES
    for p, w in zip(dst, want):
        assert torch.equal(host.page(p), w)
    st = b.stats()
    assert st["fetched_pages"] == 2 * PAGES and not st.get("fetch_missed_pages")
    assert disk_counters(daemon)["disk_read_pages"] - read0 == 2 * PAGES
    assert books(daemon, "sgd") == (0, 0)
    b.close()


def test_storage_legacy_get_fetches(daemon):
    """The single-key get of a page on the disk fetches it: SGLang's flat data page."""
    b, host = storage(daemon, "layer_first")
    keys = page_keys(toks(4000, PAGES * T))
    want = backup_to_disk(daemon, b, host, keys, seed=9)
    flat = b.get(keys[0])
    assert flat is not None and torch.equal(flat, want[0].reshape(-1))
    assert b.stats()["fetched_pages"] == 2
    assert books(daemon, "sgd") == (0, 0)
    b.close()


def test_storage_corrupt_disk_pages_are_misses(daemon, folder):
    """The disk's bytes flipped under kvpoold: batch_exists still counts the pages, but
    batch_get_v1 reads none (each fails its check): all False, counted, nothing raised, no
    lock nor lease left; the pages are misses afterwards."""
    b, host = storage(daemon)
    keys = page_keys(toks(5000, PAGES * T))
    backup_to_disk(daemon, b, host, keys, seed=13)
    assert b.batch_exists(keys) == PAGES
    flip_disk_bytes(f"{folder}/sgd.disk", 100)
    bad0 = disk_counters(daemon).get("disk_corrupt_pages", 0)
    assert b.batch_get_v1(keys, host.indices(list(range(20, 20 + PAGES)))) == [False] * PAGES
    st = b.stats()
    assert st["fetch_missed_pages"] == 2 * PAGES and not st.get("fetched_pages")
    assert st["get_missed_pages"] == PAGES
    assert disk_counters(daemon)["disk_corrupt_pages"] - bad0 >= 1
    assert books(daemon, "sgd") == (0, 0)
    assert b.batch_exists(keys) == 0
    assert b.get(keys[0]) is None
    b.close()


def test_storage_fetch_refused_is_a_counted_miss(daemon):
    """The backend's session holds its whole quota in a lease when batch_get_v1 must fetch:
    kvpoold refuses the FetchKeys (QUOTA_EXCEEDED); the pages are misses, the refusal is
    counted and nothing raises into SGLang. With the quota free again the same call reads
    every page."""
    b, host = storage(daemon)
    keys = page_keys(toks(6000, PAGES * T))
    want = backup_to_disk(daemon, b, host, keys, seed=21)
    held = b.link.pool.alloc(QUOTA_PAGES, tier="host")
    dst = list(range(20, 20 + PAGES))
    assert b.batch_get_v1(keys, host.indices(dst)) == [False] * PAGES
    st = b.stats()
    assert st["fetch_QuotaExceeded"] == 1 and not st.get("fetched_pages")
    held.free()
    assert books(daemon, "sgd") == (0, 0)
    assert b.batch_get_v1(keys, host.indices(dst)) == [True] * PAGES
    for p, w in zip(dst, want):
        assert torch.equal(host.page(p), w)
    assert b.stats()["fetched_pages"] == 2 * PAGES
    assert books(daemon, "sgd") == (0, 0)
    b.close()
