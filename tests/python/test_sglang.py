"""kvpool.sglang.KvpoolStorage against SGLang 0.5.23's own HiCacheStorage,
StorageBackendFactory and host KV pools (MHATokenToKVPoolHost, MLATokenToKVPoolHost on the
CPU), driven as SGLang's cache controller drives a storage backend: backup = batch_set_v1,
prefetch = batch_exists + batch_get_v1, for each host layout."""
import json
import os
import signal
import subprocess
import sys

import pytest

from conftest import DEFAULT_CONF, host_pool
from engine_util import HostPool, import_sglang, restart, sglang_page_keys

hicache_storage, backend_factory, _ = import_sglang()
torch = pytest.importorskip("torch")
import kvpool  # noqa: E402
from kvpool.sglang import KvpoolStorage  # noqa: E402

L, H, D, T = 2, 2, 8, 4
MLA_DIM = 16  # kv_lora_rank + qk_rope_head_dim
# a pool page holds K or V of one SGLang page (L x T x H x D fp16 = 256 bytes: head_dim halved),
# or the MLA latent of one (L x T x MLA_DIM = 256 bytes)
CONF = (DEFAULT_CONF + host_pool("sgl", head_dim=D // 2) + host_pool("sglmla", head_dim=4) +
        host_pool("sglwide", head_dim=16, capacity="64t"))
LAYOUTS = ["layer_first", "page_first", "page_first_direct"]


def extra(sock, **kw):
    e = {"backend_name": "kvpool", "module_path": "kvpool.sglang",
         "class_name": "KvpoolStorage", "interface_v1": 1, "pool": "sgl", "socket": sock}
    e.update(kw)
    return e


def config(sock, tp_rank=0, tp_size=2, mla=False, **kw):
    return hicache_storage.HiCacheStorageConfig(
        tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0,
        attn_cp_size=1, is_mla_model=mla, enable_storage_metrics=False,
        is_page_first_layout=True, model_name="test-model",
        extra_config=json.loads(json.dumps(extra(sock, **kw))))


def make(sock, layout="page_first", tp_rank=0, pages=64, mla=False, **kw):
    """A backend loaded the way SGLang loads one from --hicache-storage-backend dynamic and
    its JSON extra config, with SGLang's own host pool registered."""
    if mla:
        kw.setdefault("pool", "sglmla")
    b = backend_factory.StorageBackendFactory.create_backend(
        "dynamic", config(sock, tp_rank, mla=mla, **kw), None)
    assert isinstance(b, KvpoolStorage) and isinstance(b, hicache_storage.HiCacheStorage)
    host = HostPool(layout, L, H, MLA_DIM if mla else D, T, pages, torch.float16, mla=mla)
    b.register_mem_pool_host(host.real)
    return b, host


def page_keys(tokens):
    return sglang_page_keys(tokens, T)


@pytest.mark.parametrize("mla", [False, True], ids=["mha", "mla"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_backup_then_prefetch(daemon, layout, mla):
    b, host = make(daemon.sock, layout, mla=mla)
    base = 1000 * (1 + LAYOUTS.index(layout)) + 500 * mla
    keys = page_keys(list(range(base, base + 6 * T)))
    src = [3, 9, 4, 5, 6, 20]
    want = [host.fill(p, seed=i + 100 * len(layout)) for i, p in enumerate(src)]
    assert b.batch_exists(keys) == 0
    assert b.batch_set_v1(keys, host.indices(src)) == [True] * 6  # backup
    assert b.batch_exists(keys) == 6
    assert b.batch_exists(keys[:3] + ["f" * 64]) == 3
    # prefetch into other host slots (a contiguous run and scattered ones)
    for dst in ([30, 31, 32, 33, 34, 35], [40, 2, 50, 7, 45, 1]):
        assert b.batch_exists(keys) == 6
        assert b.batch_get_v1(keys, host.indices(dst)) == [True] * 6
        for p, w in zip(dst, want):
            assert torch.equal(host.page(p), w)
    # the leading hits only
    got = b.batch_get_v1(keys[:2] + ["e" * 64] + keys[3:], host.indices([50, 51, 52, 53, 54, 55]))
    assert got == [True, True, False, False, False, False]
    # a second backup of the same pages stores nothing twice
    assert b.batch_set_v1(keys, host.indices(src)) == [True] * 6
    pool = "sglmla" if mla else "sgl"
    assert daemon.pool_books(pool)["host"]["leased_tokens"] == 0
    b.close()


def test_keys_carry_rank_and_components(daemon):
    """MHA: K and V as two keys "<hash>_<tp rank>_k" / "_v", per TP rank; MLA: one key
    "<hash>__k", shared by the TP ranks (the latent is replicated)."""
    b0, h0 = make(daemon.sock, tp_rank=0)
    b1, h1 = make(daemon.sock, tp_rank=1)
    keys = page_keys(list(range(50, 50 + 3 * T)))
    raw = bytes.fromhex(keys[0])
    assert b0._keys(keys[:1]) == [raw + b"_0_k", raw + b"_0_v"]
    assert b1._keys(keys[:1]) == [raw + b"_1_k", raw + b"_1_v"]
    h0.fill(1, 1), h0.fill(2, 2), h0.fill(3, 3)
    assert b0.batch_set_v1(keys[:1], h0.indices([1])) == [True]
    # the rest with prefix_keys: stored as children of the first page
    info = hicache_storage.HiCacheStorageExtraInfo(prefix_keys=keys[:1])
    assert b0.batch_set_v1(keys[1:], h0.indices([2, 3]), info) == [True, True]
    assert b0.batch_exists(keys) == 3
    assert b1.batch_exists(keys) == 0  # another TP rank's shard
    c = kvpool.connect(daemon.sock)
    p = c.attach("sgl")
    assert p.exists_keys(b0._keys(keys)) == 6  # 3 pages, K and V each
    # a page missing its V key is a miss, and stored again whole
    assert p.exists_keys(b0._keys(keys)[:5]) == 5
    m0, mh0 = make(daemon.sock, tp_rank=0, mla=True)
    m1, mh1 = make(daemon.sock, tp_rank=1, mla=True)
    assert m0._keys(keys[:1]) == [raw + b"__k"] == m1._keys(keys[:1])
    w = mh0.fill(4, 44)
    assert m0.batch_set_v1(keys[:1], mh0.indices([4])) == [True]
    assert m1.batch_exists(keys[:1]) == 1  # rank 1 finds rank 0's latent
    assert m1.batch_get_v1(keys[:1], mh1.indices([9])) == [True]
    assert torch.equal(mh1.page(9), w)
    p.detach(), c.close()
    b0.close(), b1.close(), m0.close(), m1.close()


def test_legacy_get_set_exists(daemon):
    b, host = make(daemon.sock, "layer_first")
    x = host.fill(5, 55)
    flat = x.reshape(-1).clone()  # SGLang's get_data_page(flat=True) of a layer_first page
    assert b.set("legacy-key-1", flat) is True
    assert b.exists("legacy-key-1") and not b.exists("legacy-key-2")
    assert torch.equal(b.get("legacy-key-1"), flat)
    out = torch.zeros_like(flat)
    assert b.get("legacy-key-1", out) is out and torch.equal(out, flat)
    assert b.get("legacy-key-2") is None
    assert b.batch_set(["legacy-a", "legacy-b"], [flat, flat * 2])
    r = b.batch_get(["legacy-a", "legacy-b", "legacy-c"])
    assert torch.equal(r[0], flat) and torch.equal(r[1], flat * 2) and r[2] is None
    s = b.get_stats()
    assert hasattr(s, "prefetch_pgs") and s.kvpool["connects"] == 1
    b.close()


def test_geometry_checked(daemon):
    with pytest.raises(kvpool.GeometryMismatch) as e:
        make(daemon.sock, pool="sglwide")
    assert e.value.expected.head_dim == D // 2 and e.value.actual.head_dim == 16
    with pytest.raises(kvpool.GeometryMismatch):
        make(daemon.sock, mla=True, pool="sglwide")
    b = backend_factory.StorageBackendFactory.create_backend("dynamic", config(daemon.sock),
                                                             None)
    with pytest.raises(ValueError, match="layout"):
        b.register_mem_pool_host(HostPool("page_head", L, H, D, T, 4, torch.float16).real)
    # an MLA model's backend with an MHA host pool
    m = backend_factory.StorageBackendFactory.create_backend(
        "dynamic", config(daemon.sock, mla=True, pool="sglmla"), None)
    with pytest.raises(ValueError, match="MLA|mla"):
        m.register_mem_pool_host(HostPool("page_first", L, H, D, T, 4, torch.float16).real)
    b.close(), m.close()


def test_limits_evicted_parent_foreign_namespace(daemon):
    b, host = make(daemon.sock)
    # a 65-character key (not a 64-hex page hash) still maps to valid kvpool keys
    host.fill(0, 7)
    assert b.batch_set_v1(["k" * 65], host.indices([0])) == [True]
    assert b.batch_exists(["k" * 65]) == 1
    # 10^6 keys in one call: answered in calls within the keys-per-call limit, misses
    many = [f"{i:064x}" for i in range(10**6)]
    assert b.batch_exists(many) == 0
    # a chain whose parent was evicted
    keys = page_keys(list(range(7000, 7000 + 3 * T)))
    host.fill(1, 1), host.fill(2, 2), host.fill(3, 3)
    assert b.batch_set_v1(keys[:2], host.indices([1, 2])) == [True, True]
    c = kvpool.connect(daemon.sock)
    c.flush("sgl")
    assert b.batch_exists(keys) == 0
    info = hicache_storage.HiCacheStorageExtraInfo(prefix_keys=keys[:2])
    assert b.batch_set_v1(keys[2:], host.indices([3]), info) == [True]
    assert b.batch_exists(keys) == 0 and b.batch_exists(keys[2:]) == 1
    assert b.batch_get_v1(keys, host.indices([4, 5, 6])) == [False] * 3
    # a foreign namespace sees nothing; a namespace holding token pages takes keyed pages too
    other, _ = make(daemon.sock, namespace=9)
    assert other.batch_exists(keys[2:]) == 0
    p = c.attach("sgl")
    with p.alloc(1, tier="host") as lease:
        p.insert(lease, list(range(1, T + 1)), namespace=10)
    tok, th = make(daemon.sock, namespace=10)
    th.fill(0, 0)
    assert tok.batch_exists(keys) == 0
    assert tok.batch_set_v1(keys[:1], th.indices([0])) == [True]
    assert tok.batch_exists(keys) == 1
    assert p.match(list(range(1, T + 1)), namespace=10).tokens == T
    books = daemon.pool_books("sgl")
    assert books["host"]["leased_tokens"] == 0
    p.detach(), c.close(), b.close(), other.close(), tok.close()


def test_kvpoold_killed_and_restarted(own_daemon):
    d = own_daemon
    conf = open(d.conf).read()
    with open(d.conf, "w") as f:
        f.write(conf + CONF[len(DEFAULT_CONF):])
    d.signal(signal.SIGTERM)
    restart(d)
    b, host = make(d.sock)
    keys = page_keys(list(range(300, 300 + 2 * T)))
    w = [host.fill(1, 1), host.fill(2, 2)]
    assert b.batch_set_v1(keys, host.indices([1, 2])) == [True, True]
    d.proc.kill()
    # kvpoold gone: misses and False, counted, nothing raised
    assert b.batch_exists(keys) == 0
    assert b.batch_get_v1(keys, host.indices([3, 4])) == [False, False]
    assert b.batch_set_v1(keys, host.indices([1, 2])) == [False, False]
    assert not b.exists(keys[0]) and b.get(keys[0]) is None
    st = b.stats()
    assert sum(v for k, v in st.items() if k.endswith(("_unavailable", "Error"))) >= 4
    restart(d)
    import time
    end = time.monotonic() + 10
    while b.batch_exists(keys) == 0 and b.stats().get("reconnects", 0) == 0:
        assert time.monotonic() < end, b.stats()
        time.sleep(0.05)
    assert b.stats()["reconnects"] == 1
    # the restarted daemon holds nothing: store again, read back
    assert b.batch_set_v1(keys, host.indices([1, 2])) == [True, True]
    assert b.batch_get_v1(keys, host.indices([5, 6])) == [True, True]
    assert torch.equal(host.page(5), w[0]) and torch.equal(host.page(6), w[1])
    b.close()


CHILD = r"""
import sys, json, torch
sys.path.insert(0, {here!r})
from engine_util import HostPool, import_sglang
hs, bf, ut = import_sglang()
cfg = hs.HiCacheStorageConfig(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0,
    attn_cp_size=1, is_mla_model=False, enable_storage_metrics=False,
    is_page_first_layout=True, model_name="m", extra_config=json.loads({extra!r}))
b = bf.StorageBackendFactory.create_backend("dynamic", cfg, None)
host = HostPool("page_first_direct", 2, 2, 8, 4, 16, torch.float16)
b.register_mem_pool_host(host.real)
keys, prior = [], None
toks = list(range(9000, 9000 + 16))
for i in range(0, 16, 4):
    prior = ut.get_hash_str(toks[i:i + 4], prior)
    keys.append(prior)
for i in range(4):
    host.fill(i, 1000 + i)
print(json.dumps(b.batch_set_v1(keys, host.indices([0, 1, 2, 3]))))
"""


def test_two_instances(daemon):
    """Instance A (another process, page_first_direct) backs pages up; instance B (this one,
    layer_first) finds them and reads the same bytes."""
    here = os.path.dirname(os.path.abspath(__file__))
    code = CHILD.format(here=here, extra=json.dumps(extra(daemon.sock)))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env=dict(os.environ, PYTHONWARNINGS="ignore"))
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [True] * 4
    cfg = hicache_storage.HiCacheStorageConfig(
        tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=False,
        model_name="m", extra_config=extra(daemon.sock))
    b = backend_factory.StorageBackendFactory.create_backend("dynamic", cfg, None)
    host = HostPool("layer_first", L, H, D, T, 16, torch.float16)
    b.register_mem_pool_host(host.real)
    keys = page_keys(list(range(9000, 9016)))
    assert b.batch_exists(keys) == 4
    assert b.batch_get_v1(keys, host.indices([8, 9, 10, 11])) == [True] * 4
    ref = HostPool("layer_first", L, H, D, T, 4, torch.float16)
    for i in range(4):
        assert torch.equal(host.page(8 + i), ref.fill(i, 1000 + i))
    b.close()
