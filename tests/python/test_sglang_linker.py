"""kvpool.sglang.KvpoolLinker driven by SGLang 0.5.23's own UnifiedRadixCache and
UnifiedCacheLinkerWrapper on CPU tensors (sglang_instance.Instance: SGLang's MHATokenToKVPool /
MLATokenToKVPool, paged allocator, the linker built by create_unified_cache_linker from the
dynamic backend's JSON config): a prefix one instance computed is written through into the
pool's host tier, another instance (another process) matches it, loads it layer by layer into
its own device slots and reads the same bytes through the pool's layer-gated getters."""
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from conftest import DEFAULT_CONF, pool_section
from engine_util import import_sglang, restart

import_sglang()
torch = pytest.importorskip("torch")
import kvpool  # noqa: E402
from sglang_instance import Instance, linker_config  # noqa: E402
from sglang.srt.mem_cache.hicache_storage import PoolName  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
# host-only pools whose page holds one SGLang page of every layer: MHA 2 layers x 2 heads x 8
# (fp16, 4-token pages); MLA: a latent of 16 as head_dim 8 of one head; "lk1": 1-token pages;
# "lksmall": 4 pages; "lkwide": another head_dim; "lknohost": a device tier only; "lk1m": 1-token
# pages for the Mamba model's KV and states; "lkdeep": 8 layers of 2 KiB a page and K/V
CONF = (DEFAULT_CONF + pool_section("lk", host_capacity="512t")
        + pool_section("lkmla", kv_heads=1, head_dim=8, host_capacity="256t")
        + pool_section("lk1", host_capacity="64t").replace("page_tokens = 4",
                                                            "page_tokens = 1")
        + pool_section("lksmall", host_capacity="16t")
        + pool_section("lkwide", head_dim=16, host_capacity="64t")
        + pool_section("lknohost", device_capacity="64t", host_capacity="0")
        + pool_section("lk1m", host_capacity="1024t").replace("page_tokens = 4",
                                                              "page_tokens = 1")
        + pool_section("lkdeep", layers=8, kv_heads=4, head_dim=64, host_capacity="2048t"))


def toks(base, n):
    return list(range(base, base + n))


def same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert torch.equal(x, y)


CHILD = r"""
import sys, json, torch
sys.path.insert(0, {here!r})
from sglang_instance import Instance
a = Instance({sock!r}, "lk")
slots = a.compute(list(range(5000, 5000 + 24)), seed=7)
a.drain()
torch.save(a.read(slots), {out!r})
print(json.dumps(a.linker.stats()))
a.close()
"""


def test_two_processes_share_the_l2(daemon):
    """Instance A (another process) computes a prefix; its write-through lands in kvpool's
    host tier; instance B (this process) matches and loads the same bytes."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "a.pt")
        code = CHILD.format(here=HERE, sock=daemon.sock, out=out)
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=300, env=dict(os.environ, PYTHONWARNINGS="ignore"))
        assert r.returncode == 0, r.stderr[-3000:]
        st = json.loads(r.stdout.strip().splitlines()[-1])
        assert st["offload_pages"] == 6 and not st.get("offload_dropped")
        want = torch.load(out)
    assert daemon.pool_books("lk")["host"]["cached_tokens"] == 24
    b = Instance(daemon.sock, "lk")
    # B's device slots are not A's: fill them first so a missing copy shows
    for layer in range(b.layers):
        for buf in b.bufs(layer):
            buf.fill_(-3)
    dev, got, failed = b.fetch(toks(5000, 24) + [1, 2, 3])
    assert dev == 0 and not failed and got is not None
    slots, data = got
    assert len(slots) == 24
    same(data, want)
    st = b.linker.stats()
    assert st["lookup_hit_pages"] == 6 and st["load_pages"] == 6
    # the pins are gone once the load finished; nothing stays leased
    books = daemon.pool_books("lk")["host"]
    assert books["protected_tokens"] == 0 and books["leased_tokens"] == 0
    # a request of a shorter prefix hits the leading pages only, a foreign one nothing
    dev, got, failed = b.fetch(toks(5000, 10))
    assert got is not None and len(got[0]) == 8 and not failed
    same(got[1], [w[:8] for w in want])
    assert b.fetch(toks(77000, 24))[1] is None
    b.close()


def test_offload_chains_and_partial_prefixes(daemon):
    """Two requests sharing a prefix: the tree splits, the shared part is stored once, the
    child node's pages are stored as their own transfer; another instance hits both."""
    a = Instance(daemon.sock, "lk")
    s1 = a.compute(toks(100, 16), seed=1)
    a.drain()
    base = daemon.pool_books("lk")["host"]["cached_tokens"]
    s2 = a.compute(toks(100, 8) + toks(900, 8), seed=2)
    a.drain()
    # the second request's shared 8 tokens are the same tree node (not stored twice)
    assert daemon.pool_books("lk")["host"]["cached_tokens"] == base + 8
    want1 = a.read(s1)
    want2 = a.read(s2)
    b = Instance(daemon.sock, "lk")
    _, got, failed = b.fetch(toks(100, 16))
    assert not failed
    same(got[1], want1)
    _, got, failed = b.fetch(toks(100, 8) + toks(900, 8))
    # B's tree holds nothing inserted (loads stay private to the request): a full hit again
    assert not failed and len(got[0]) == 16
    same([g[8:] for g in got[1]], [w[8:] for w in want2])
    same([g[:8] for g in got[1]], [w[:8] for w in want1])
    a.close(), b.close()


@pytest.mark.parametrize("threads", [1, 2])
def test_layers_complete_in_order_each_once_its_bytes_landed(daemon, threads):
    """A load of 8 layers of 2 MiB (512 pages of 2 KiB of K and of V each), copied in one call
    while SGLang's layer counter hears of each layer as it lands: the layers complete in order,
    once each, and at each completion that layer's K and V are all in the request's slots
    already. With one copy thread the layers after it are not copied yet at a completion (the
    thread reports between its pieces), so a layer completed early fails here."""
    geo = dict(layers=8, heads=4, dim=64, page=4, slots=4096)
    a = Instance(daemon.sock, "lkdeep", **geo)
    s = a.compute(toks(7000, 2048), seed=5)
    a.drain()
    want = a.read(s)
    b = Instance(daemon.sock, "lkdeep", **geo,
                 config=linker_config(daemon.sock, "lkdeep", copy_threads=threads))
    seen = []
    complete = b.counter.complete

    def check(index, layer):
        slots = next(iter(b.cache.linker.private_load_indices.values()))
        seen.append((layer, all(torch.equal(buf[slots], w) for buf, w in
                                zip(b.bufs(layer), want[2 * layer:2 * layer + 2]))))
        complete(index, layer)

    b.counter.complete = check
    _, got, failed = b.fetch(toks(7000, 2048))
    assert not failed and got is not None and len(got[0]) == 2048
    assert seen == [(layer, True) for layer in range(8)]
    same(got[1], want)
    a.close(), b.close()


@pytest.mark.parametrize("mla,pool,page", [(True, "lkmla", 4), (False, "lk1", 1)],
                         ids=["mla", "page1"])
def test_mla_and_page_size_1(daemon, mla, pool, page):
    a = Instance(daemon.sock, pool, mla=mla, dim=16 if mla else 8, page=page)
    s = a.compute(toks(3000, 12), seed=3)
    a.drain()
    want = a.read(s)
    b = Instance(daemon.sock, pool, mla=mla, dim=16 if mla else 8, page=page)
    _, got, failed = b.fetch(toks(3000, 12) + [5])
    assert not failed and len(got[0]) == 12
    same(got[1], want)
    a.close(), b.close()


def test_swa_model(daemon):
    """SGLang's SWAKVPool (layers 0 and 2 of 4 sliding-window): the full-attention layers'
    pages go through the pool (whose layers are those 2), and the sliding-window layers' pages
    of each node too (PoolName.SWA in the linker's pools: one pool page per SGLang page here,
    the two SWA layers in its two layer slots); a restored tail comes with its window (SGLang
    keeps only the tokens before the window evicted) and the window's bytes are A's."""
    swa = (8, [0, 2])
    # SGLang's SWA allocator allocates single tokens (page size 1): pool "lk1"
    a = Instance(daemon.sock, "lk1", layers=4, page=1, swa=swa)
    s = a.compute(toks(31000, 16), seed=9)
    a.drain()
    want = a.read(s)
    assert len(want) == 4  # K and V of the 2 full-attention layers
    assert a.linker.stats()["offload_swa_pages"] == 16
    swa_pool = a.kv.swa_kv_pool
    a_swa = a.alloc.full_to_swa_index_mapping[s[8:]]
    want_swa = [b[a_swa].clone() for j in range(2)
                for b in (swa_pool.k_buffer[j], swa_pool.v_buffer[j])]
    b = Instance(daemon.sock, "lk1", layers=4, page=1, swa=swa)
    assert b.linker.num_layers == 4 and b.linker.dev.counter_of == [1, 3]
    assert b.linker.dev.swa_counter_of == [0, 2]
    req, m, got, failed = b._fetch(toks(31000, 16) + [1])
    assert got is not None and not failed and len(got[0]) == 16
    same(got[1], want)
    from sglang.srt.mem_cache.unified_cache.components import ComponentType
    # the window (the last 8 tokens) restored: only the 8 before it stay evicted
    assert req.kv.get_evicted_seqlen(ComponentType.SWA) == 8
    b_swa = b.alloc.full_to_swa_index_mapping[got[0][8:]]
    sp = b.kv.swa_kv_pool
    same([x[b_swa] for j in range(2) for x in (sp.k_buffer[j], sp.v_buffer[j])], want_swa)
    # a prefix stored without its window (C's linker serves the Full component only, so
    # SGLang hands it no SWA pages) is not restorable for B: a miss, SGLang computes it
    from sglang.srt.mem_cache.unified_cache.components import ComponentType as CT
    c = Instance(daemon.sock, "lk1", layers=4, page=1, swa=swa, components={CT.FULL})
    assert PoolName.SWA not in c.linker.pools
    before = daemon.pool_books("lk1")["host"]["cached_tokens"]
    c.compute(toks(32000, 16), seed=10)
    c.drain()
    assert daemon.pool_books("lk1")["host"]["cached_tokens"] == before + 16  # KV pages only
    assert b.fetch(toks(32000, 16) + [1])[1] is None
    assert b.linker.stats()["lookup_hit_pages"] == 16  # the first prefix only
    a.close(), b.close(), c.close()


def test_mamba_model(daemon):
    """SGLang's HybridLinearKVPool and HybridReqToTokenPool (a Mamba2 state pool; layers 0 and
    2 of 4 Mamba): the full-attention layers' pages go through the pool (whose layers are those
    2), and each offloaded node's Mamba state (PoolName.MAMBA in the linker's pools: its conv
    and temporal states, in mamba_parts pool pages under the keys of the node's last page);
    another instance's lookup finds the prefix with its state, its load writes the state into
    the request's Mamba slot on the Mamba layers' turns of the layer counter, and the KV and the
    state are A's bytes. A prefix stored without its state is a miss."""
    mamba = [0, 2]
    a = Instance(daemon.sock, "lk1m", layers=4, page=1, mamba=mamba)
    assert PoolName.MAMBA in a.linker.pools
    assert a.linker.num_layers == 4 and a.linker.dev.counter_of == [1, 3]
    assert a.linker.mamba.counter_of == mamba
    parts = a.linker.mamba_parts
    # 2 layers x (conv [288, 3] + temporal [2, 16, 16]) bf16 in 128-byte pool pages
    assert a.linker.mamba.nbytes == 2 * (288 * 3 + 2 * 16 * 16) * 2 and parts == 43
    before = daemon.pool_books("lk1m")["host"]["cached_tokens"]
    s = a.compute(toks(33000, 16), seed=11)
    a.drain()
    assert a.linker.stats()["offload_mamba_states"] == 1
    assert daemon.pool_books("lk1m")["host"]["cached_tokens"] == before + 16 + parts
    want = a.read(s)
    want_state = a.read_state(a.last_state)
    assert any(bool(x.any()) for x in want_state)
    b = Instance(daemon.sock, "lk1m", layers=4, page=1, mamba=mamba)
    req, m, got, failed = b._fetch(toks(33000, 16) + [1])
    assert got is not None and not failed and len(got[0]) == 16
    assert m.mamba_host_hit_length == 1
    same(got[1], want)
    assert b.linker.stats()["load_mamba_states"] == 1
    got_state = b.read_state(req.kv.mamba_pool_idx.view(1))
    same(got_state, want_state)
    # a shorter prefix than the node: no state ends there, a miss (SGLang computes it)
    assert b.fetch(toks(33000, 12) + [1])[1] is None
    # a prefix stored without its state (C's linker serves the Full component only): a miss
    from sglang.srt.mem_cache.unified_cache.components import ComponentType as CT
    c = Instance(daemon.sock, "lk1m", layers=4, page=1, mamba=mamba, components={CT.FULL})
    assert PoolName.MAMBA not in c.linker.pools
    c.compute(toks(34000, 16), seed=12)
    c.drain()
    assert b.fetch(toks(34000, 16) + [1])[1] is None
    a.close(), b.close(), c.close()


def test_kvpoold_killed_and_restarted(own_daemon):
    """kvpoold gone between calls: lookups miss, offloads are dropped and counted, nothing
    raises into SGLang; once it is back the linker attaches again and stores and hits."""
    d = own_daemon
    with open(d.conf, "w") as f:
        f.write(CONF)
    d.signal(signal.SIGTERM)
    restart(d)
    a = Instance(d.sock, "lk")
    b = Instance(d.sock, "lk")
    a.compute(toks(40, 16), seed=4)
    a.drain()
    assert b.fetch(toks(40, 16))[1] is not None
    d.proc.kill()
    d.proc.wait()
    # down: a miss, an offload dropped (the node stays unstored in A's tree), no exception
    assert b.fetch(toks(40, 16))[1] is None
    a.compute(toks(600, 8), seed=5)
    a.drain()
    assert a.linker.stats()["offload_dropped"] >= 1
    sb = b.linker.stats()
    assert sum(v for k, v in sb.items() if k.endswith(("_unavailable", "Error"))) >= 1
    restart(d)
    # the restarted daemon holds nothing; a new prefix is written through and B hits it
    end, base = time.monotonic() + 20, 20000
    while True:
        s = a.compute(toks(base, 16), seed=base)
        a.drain()
        _, got, failed = b.fetch(toks(base, 16))
        if got is not None:
            break
        assert time.monotonic() < end, (a.linker.stats(), b.linker.stats())
        base += 16
        time.sleep(0.1)
    assert not failed
    same(got[1], a.read(s))
    assert a.linker.stats()["reconnects"] >= 1 and b.linker.stats()["reconnects"] >= 1
    a.close(), b.close()


def test_host_tier_full_drops_offloads(daemon):
    """A host tier smaller than the prefix: the offload is dropped and counted, the tree
    keeps the node unstored, the request is unaffected."""
    a = Instance(daemon.sock, "lksmall")
    s = a.compute(toks(8000, 24), seed=6)  # 6 pages, the tier holds 4
    a.drain()
    st = a.linker.stats()
    assert st["offload_dropped"] == 1 and st.get("offload_OutOfCapacity", 0) == 1, st
    books = daemon.pool_books("lksmall")["host"]
    assert books["leased_tokens"] == 0 and books["cached_tokens"] == 0
    # the node is not marked stored: a later write-through tries again
    assert a.cache.linker.pending_offloads == []
    assert len(s) == 24
    a.close()


def test_evicted_between_lookup_and_load(daemon):
    """Pages evicted after the match: the load is refused (SGLang computes the prefix), the
    request is not aborted and the slots go back."""
    from array import array
    from sglang.srt.mem_cache.base_prefix_cache import InitLoadBackParams, MatchPrefixParams
    from sglang.srt.mem_cache.radix_cache import RadixKey

    a = Instance(daemon.sock, "lk")
    a.compute(toks(12000, 16), seed=8)
    a.drain()
    b = Instance(daemon.sock, "lk")
    free0 = b.alloc.available_size()
    req = b.request(toks(12000, 16))
    m = b.cache.match_prefix(MatchPrefixParams(key=RadixKey(array("q", toks(12000, 16))),
                                               req=req))
    assert m.host_hit_length == 16
    req.last_node = m.last_device_node
    c = kvpool.connect(daemon.sock)
    c.flush("lk")
    c.close()
    n, _ = b.cache.init_load_back(InitLoadBackParams(
        best_match_node=m.last_host_node, host_hit_length=m.host_hit_length, req=req))
    assert n == 0
    assert b.alloc.available_size() == free0
    assert b.cache.ready_to_load_host_cache() == -1
    assert b.linker.stats()["load_refused"] == 1
    a.close(), b.close()


def not_kvpoold():
    """A unix socket whose server answers something else than kvpoold."""
    d = tempfile.mkdtemp()
    path = os.path.join(d, "s")
    s = socket.socket(socket.AF_UNIX)
    s.bind(path)
    s.listen(4)

    def serve():
        while True:
            try:
                c, _ = s.accept()
            except OSError:
                return
            c.recv(100)
            c.sendall(b"HTTP/1.0 400 Bad Request\r\n\r\n" * 4)
            c.close()

    threading.Thread(target=serve, daemon=True).start()
    return path, s


def test_bad_input(daemon):
    from sglang.srt.mem_cache.unified_cache.components import ComponentType

    # a pool of another geometry: typed, both geometries named, at construction
    with pytest.raises(kvpool.GeometryMismatch) as e:
        Instance(daemon.sock, "lkwide")
    assert tuple(e.value.expected) == (2, 2, 8, "fp16", 4)
    assert tuple(e.value.actual) == (2, 2, 16, "fp16", 4)
    assert "(2, 2, 8, 'fp16', 4)" in str(e.value) and "(2, 2, 16, 'fp16', 4)" in str(e.value)
    with pytest.raises(kvpool.GeometryMismatch):
        Instance(daemon.sock, "lk", page=8)
    # a pool with no host tier
    with pytest.raises(kvpool.GeometryMismatch, match="host tier"):
        Instance(daemon.sock, "lknohost")
    # unknown and missing keys of the extra config
    with pytest.raises(ValueError, match=r"unknown linker_extra_config keys \['pol'\]"):
        Instance(daemon.sock, "lk", config=linker_config(daemon.sock, "lk", pol="x"))
    with pytest.raises(ValueError, match="needs \"pool\""):
        Instance(daemon.sock, "lk", config={"linker": "KvpoolLinker",
                                            "linker_module_path": "kvpool.sglang",
                                            "linker_extra_config": {"socket": daemon.sock}})
    # no such pool
    with pytest.raises(kvpool.NoSuchPool):
        Instance(daemon.sock, "nope")
    # a socket that answers but is not kvpoold
    path, s = not_kvpoold()
    with pytest.raises(kvpool.Error) as e:
        Instance(path, "lk")
    assert isinstance(e.value, (kvpool.TransportError, kvpool.ProtocolError))
    s.close()
    # components whose state the linker does not hold, and a Mamba component without SGLang's
    # Mamba pools
    with pytest.raises(ValueError, match="C128"):
        Instance(daemon.sock, "lk", components={ComponentType.FULL, ComponentType.C128})
    with pytest.raises(ValueError, match="HybridLinearKVPool and HybridReqToTokenPool"):
        Instance(daemon.sock, "lk", components={ComponentType.FULL, ComponentType.MAMBA})
    # no kvpoold at all: constructed, every lookup a miss
    gone = os.path.join(tempfile.mkdtemp(), "none.sock")
    i = Instance(gone, "lk")
    assert i.fetch(toks(1, 8))[1] is None
    i.compute(toks(1, 8), seed=1)
    i.drain()
    assert i.linker.stats()["offload_dropped"] == 1
    i.close()
