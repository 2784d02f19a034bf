"""kvpool.vllm over pools with tiers below host. A disk tier, driven by vLLM's own Scheduler and
OffloadingConnector (test_vllm_scheduler.Engine) and a real kvpoold: a request stores its
prompt, other requests' stores push its host pages to the disk, then a request with the same
prompt finds its blocks (lookup counts the pages on disk as hits) and loads them (FetchKeys
reads them into host pages first): every loaded byte equal to what was stored, no lock nor
lease left. With the disk's bytes flipped under kvpoold, the manager's load fetches nothing:
prepare_load answers no pages, counts them and raises nothing, and the blocks are misses
afterwards; a fetch kvpoold refuses (the session's quota held) is a counted miss. A remote
tier: a block one node's engine stored (written through to a real Redis Cluster) is a hit for
another node's engine, whose load fetches it from the cluster, every byte checked."""
import time

import pytest

from conftest import Daemon, pool_section
from disk_util import disk_counters, disk_folder, disk_lines, flip_disk_bytes, remove_folder

from test_remote import connected, ports, remote_section, settle  # noqa: F401
from test_vllm_scheduler import (BS, DIM, Engine, books, model_config,  # noqa: F401
                                 model_dir, prompt)

import kvpool  # noqa: E402
from kvpool.vllm import _rank_keys  # noqa: E402

HOST_PAGES = 16   # the host tier: two requests of 8 chunks
CHUNKS = 8
QUOTA_PAGES = 12  # a session's quota: one request's store, not two


def conf(folder):
    """Pool v2 (pages of one chunk of layout "full") with a host tier of HOST_PAGES, a disk
    tier of 512 pages and a session quota of QUOTA_PAGES."""
    extra = disk_lines(folder, "v2", f"{512 * BS}t") + f"session_quota = {QUOTA_PAGES * BS}t\n"
    return "[daemon]\n" + pool_section(
        "v2", layers=2, head_dim=DIM, host_capacity=f"{HOST_PAGES * BS}t",
        extra=extra).replace("page_tokens = 4", f"page_tokens = {BS}")


@pytest.fixture(scope="module")
def folder():
    d = disk_folder()
    yield d
    remove_folder(d)


@pytest.fixture(scope="module")
def daemon(folder):
    d = Daemon(conf(folder))
    yield d
    d.stop()


@pytest.fixture
def engine(daemon, model_config):  # noqa: F811 - the fixture imported above
    e = Engine(model_config, daemon.sock, "full", max_tokens=2048)
    yield e
    e.close()
    with kvpool.connect(daemon.sock) as c:
        c.flush("v2")


def offload_keys(e, tokens):
    """The OffloadKeys vLLM's scheduler gives the manager for a prompt's whole blocks."""
    from vllm.sampling_params import SamplingParams
    from vllm.v1.kv_offload.base import make_offload_key
    from vllm.v1.request import Request
    req = Request("keys", list(tokens), SamplingParams(max_tokens=1), None,
                  block_hasher=e.hasher)
    return [make_offload_key(h, 0) for h in req.block_hashes]


def push_to_disk(daemon, e, p, seed):
    """Stores the prompts of other requests until the host tier has been filled twice over:
    the pages of prompt p stored before leave it for the disk. Waits until the disk tier
    holds every one of them (a MatchKeys finds none local, all below)."""
    for s in range(3):
        e.add(prompt(CHUNKS, seed=seed + s))
        e.run()
    kk = [rk for k in offload_keys(e, p) for rk in _rank_keys(k, 1)]
    with kvpool.connect(daemon.sock) as c:
        pool = c.attach("v2")
        for _ in range(500):  # the disk tier writes behind the evictions
            m = pool.match_keys(kk, lock=False)
            if m.remote_pages == CHUNKS:
                break
            time.sleep(0.02)
        assert (len(m.host_pages), m.remote_pages) == (0, CHUNKS)
        pool.detach()


def test_blocks_on_disk_are_hits_and_load_back(daemon, engine):
    """A prompt's 8 chunks pushed to the disk by other requests: the same prompt again is 8
    lookup hits below host, 8 pages fetched (read from the disk once each) and loaded, every
    byte of every token equal to what was stored; no lock nor lease left."""
    e = engine
    p = prompt(CHUNKS, seed=7)
    e.add(p)
    e.run()
    push_to_disk(daemon, e, p, seed=100)
    s0 = e.manager.stats()
    read0 = disk_counters(daemon).get("disk_read_pages", 0)
    e.forget_gpu()
    seen = {}
    rid = e.add(p)
    e.run(on_scheduled=lambda r, start: seen.setdefault(r, (start, e.check(r, start))))
    start, checked = seen[rid]
    s1 = e.manager.stats()
    # every chunk was found (on the disk) and loaded: vLLM computed only the last token
    assert start == CHUNKS * BS
    assert checked == CHUNKS * BS * 2   # every token of both layers, byte for byte
    assert s1["lookup_hits_below"] - s0.get("lookup_hits_below", 0) == CHUNKS
    assert s1["fetched_pages"] - s0.get("fetched_pages", 0) == CHUNKS
    assert disk_counters(daemon)["disk_read_pages"] - read0 == CHUNKS
    assert books(daemon, "v2") == (0, 0)
    assert e.manager.locks_held() == 0


def test_pages_that_fail_on_disk_are_misses(daemon, engine, folder):
    """The disk's bytes flipped under kvpoold: lookup still counts the blocks (the key map
    knows them), but the load's fetch reads none (each page fails its check, counted by
    kvpoold): prepare_load answers no pages, counts them, raises nothing and holds no lock;
    the blocks are misses afterwards."""
    from vllm.v1.kv_offload.base import LookupResult, ReqContext
    e = engine
    p = prompt(CHUNKS, seed=31)
    e.add(p)
    e.run()
    push_to_disk(daemon, e, p, seed=300)
    keys = offload_keys(e, p)
    assert len(keys) == CHUNKS
    m, ctx = e.manager, ReqContext(req_id="direct")
    s0 = m.stats()
    assert all(m.lookup(k, ctx) == LookupResult.HIT for k in keys)
    assert m.stats()["lookup_hits_below"] - s0.get("lookup_hits_below", 0) == CHUNKS
    flip_disk_bytes(f"{folder}/v2.disk", 1000)
    bad0 = disk_counters(daemon).get("disk_corrupt_pages", 0)
    spec = m.prepare_load(keys, ctx)
    assert spec.pages.shape == (0, 1)
    s1 = m.stats()
    assert s1["fetch_missed_pages"] - s0.get("fetch_missed_pages", 0) == CHUNKS
    assert s1.get("fetched_pages", 0) == s0.get("fetched_pages", 0)
    m.complete_load(keys, ctx)
    assert m.locks_held() == 0 and books(daemon, "v2") == (0, 0)
    assert disk_counters(daemon)["disk_corrupt_pages"] - bad0 >= 1
    assert m.lookup(keys[0], ctx) == LookupResult.MISS


def test_fetch_refused_is_a_counted_miss(daemon, engine):
    """The scheduler's session holds its whole quota in leased store pages when a load must
    fetch: kvpoold refuses the FetchKeys (QUOTA_EXCEEDED); prepare_load answers the local
    pages (none), counts the refusal and raises nothing into vLLM."""
    from vllm.v1.kv_offload.base import ReqContext
    e = engine
    p = prompt(CHUNKS, seed=41)
    e.add(p)
    e.run()
    push_to_disk(daemon, e, p, seed=400)
    keys = offload_keys(e, p)
    m, ctx = e.manager, ReqContext(req_id="direct")
    held = m.prepare_store(offload_keys(e, prompt(QUOTA_PAGES, seed=42)), ctx)
    assert len(held.keys_to_store) == QUOTA_PAGES
    s0 = m.stats()
    spec = m.prepare_load(keys, ctx)
    assert spec.pages.shape == (0, 1)
    s1 = m.stats()
    assert s1["fetch_QuotaExceeded"] - s0.get("fetch_QuotaExceeded", 0) == 1
    assert s1.get("fetched_pages", 0) == s0.get("fetched_pages", 0)
    m.complete_load(keys, ctx)
    m.complete_store(held.keys_to_store, ctx, success=False)
    assert m.locks_held() == 0 and books(daemon, "v2") == (0, 0)
    # with the quota free again, the same load fetches every page
    spec = m.prepare_load(keys, ctx)
    assert spec.pages.shape == (CHUNKS, 1)
    assert m.stats()["fetched_pages"] - s1.get("fetched_pages", 0) == CHUNKS
    m.complete_load(keys, ctx)
    assert books(daemon, "v2") == (0, 0)


def remote_conf(ports, mode):
    """A node's config: pool v2 (as above, no disk tier) with the remote tier in mode."""
    return ("[daemon]\nkeepalive_ms = 120000\n" + remote_section(ports) + pool_section(
                "v2", layers=2, head_dim=DIM, host_capacity=f"{HOST_PAGES * BS}t",
                extra=f"remote = {mode}\n").replace("page_tokens = 4", f"page_tokens = {BS}"))


def test_blocks_of_another_node_come_from_the_remote_tier(model_config, ports):  # noqa: F811
    """Node W's engine stores a prompt (written through to the cluster); node R's engine,
    on another kvpoold whose cache never held it, finds every chunk (lookup: the remote tier
    holds it) and loads it (FetchKeys from the cluster), every byte equal to what W's engine
    computed; no lock nor lease left on R."""
    w = r = ew = er = None
    try:
        w = Daemon(remote_conf(ports, "write-through"))
        r = Daemon(remote_conf(ports, "write-through"))
        for d in (w, r):
            connected(d)
        ew = Engine(model_config, w.sock, "full", max_tokens=2048)
        p = prompt(CHUNKS, seed=51)
        ew.add(p)
        ew.run()
        settle(w)
        er = Engine(model_config, r.sock, "full", max_tokens=2048)
        seen = {}
        rid = er.add(p)
        er.run(on_scheduled=lambda q, start: seen.setdefault(q, (start, er.check(q, start))))
        start, checked = seen[rid]
        s = er.manager.stats()
        assert start == CHUNKS * BS and checked == CHUNKS * BS * 2
        assert s["lookup_hits_below"] == CHUNKS and s["fetched_pages"] == CHUNKS
        assert books(r, "v2") == (0, 0) and er.manager.locks_held() == 0
    finally:
        for e in (ew, er):
            if e is not None:
                e.close()
        for d in (w, r):
            if d is not None:
                d.stop()
