"""kvpool.vllm.KvpoolOffloadingSpec against vLLM 0.33.0's own OffloadingSpec, OffloadingManager
and OffloadingWorker, loaded through OffloadingSpecFactory from kv_connector_extra_config and
driven in the offloading connector's scheduler/worker sequence on CPU block tensors."""
import json
import os
import signal
import subprocess
import sys

import pytest

from conftest import DEFAULT_CONF, host_pool
from engine_util import restart

torch = pytest.importorskip("torch")
try:
    from vllm.utils.hashing import sha256
    from vllm.v1.core import kv_cache_utils
    from vllm.v1.kv_offload import base as vbase
    from vllm.v1.kv_offload import config as vconf
    from vllm.v1.kv_offload.factory import OffloadingSpecFactory
except Exception as e:  # noqa: BLE001 - any import failure is the skip reason
    from engine_util import ENGINE_VENV_HINT
    pytest.skip(f"vllm 0.33.0 with kv_cache_utils does not import here: {type(e).__name__}: "
                f"{e}; {ENGINE_VENV_HINT}", allow_module_level=True)
try:  # vLLM 0.34 on hands the worker the blocks' addresses (DevicePointers)
    from vllm.v1.kv_offload.pointer_utils import resolve_device_pointers
except ImportError:
    resolve_device_pointers = None
import kvpool  # noqa: E402
from kvpool.vllm import KvpoolOffloadingSpec  # noqa: E402

T = 4
BLOCK = 512  # bytes of one worker's block: the page_bytes of pool "vl" (2*2*2*4*8*2)
CONF = DEFAULT_CONF + host_pool("vl") + host_pool("vl2", head_dim=16)  # pages of 512, 1024


def block_keys(tokens, group=0):
    """vLLM's own block hashes (kv_cache_utils.hash_block_tokens over sha256, chained from
    NONE_HASH of the default seed) as OffloadKeys."""
    if getattr(kv_cache_utils, "NONE_HASH", None) is None:
        kv_cache_utils.init_none_hash(sha256)
    parent, out = kv_cache_utils.NONE_HASH, []
    for i in range(0, len(tokens) - len(tokens) % T, T):
        parent = kv_cache_utils.hash_block_tokens(sha256, parent, tuple(tokens[i:i + T]))
        out.append(vbase.make_offload_key(parent, group))
    return out


def config(sock, rank=0, world=1, blocks_per_chunk=1, **extra):
    e = {"spec_name": "KvpoolOffloadingSpec", "spec_module_path": "kvpool.vllm", "pool": "vl",
         "socket": sock}
    e.update(extra)
    return vconf.OffloadingConfig(
        groups=(vconf.OffloadingGroupConfig(tokens_per_block=T, layer_names=("l0", "l1"),
                                            group_id=0),),
        worker_kv_bytes_per_block=BLOCK, enable_kv_cache_events=True,
        extra_config=json.loads(json.dumps(e)), engine_id=f"engine-{rank}",
        model=vconf.OffloadingModelConfig(name="m", dtype="float16"),
        cache=vconf.OffloadingCacheConfig(tokens_per_hash=T, blocks_per_chunk=blocks_per_chunk),
        parallel=vconf.OffloadingParallelConfig(
            rank=rank, world_size=world, tp_size=world, pp_size=1, pcp_size=1, dcp_size=1,
            data_parallel_index=0, data_parallel_size=1, data_parallel_rank_local=None,
            is_parallelism_agnostic=False))


def gpu_blocks(nblocks=32, seed=0):
    """Canonical KV caches as vLLM hands them to a worker: int8 (num_blocks, page bytes)
    tensors (here K and V of every layer: two of 256 bytes a block), on the CPU."""
    g = torch.Generator().manual_seed(seed)
    ts = [torch.randint(-128, 127, (nblocks, 256), dtype=torch.int8, generator=g)
          for _ in range(2)]
    caches = vbase.CanonicalKVCaches(
        tensors=[vbase.CanonicalKVCacheTensor(t, 256) for t in ts],
        group_data_refs=[[vbase.CanonicalKVCacheRef(0, 256), vbase.CanonicalKVCacheRef(1, 256)]])
    return caches, ts


def gspec(ids, worker=None):
    """The blocks of a transfer as vLLM's connector hands them to the worker."""
    s = vbase.GPULoadStoreSpec(list(ids), [len(ids)], [0])
    if worker is not None and resolve_device_pointers is not None:
        return resolve_device_pointers(s, worker.kv_caches)
    return s


def store(mgr, worker, keys, blocks, ctx, job=1):
    """The connector's store: prepare_store, the worker's submit_store, complete_store."""
    out = mgr.prepare_store(keys, ctx)
    if out is None:
        return None
    idx = {k: i for i, k in enumerate(keys)}
    src = [blocks[idx[k]] for k in out.keys_to_store]
    if out.keys_to_store:
        assert worker.submit_store(job, gspec(src, worker), out.store_spec)
        res = worker.get_finished()
        assert [r.job_id for r in res] == [job]
        mgr.complete_store(out.keys_to_store, ctx, success=res[0].success)
    return out


def load(mgr, worker, keys, blocks, ctx, job=2):
    """The connector's load: lookup of each key, prepare_load of the hits, the worker's
    submit_load, complete_load. Returns the hits loaded and the job's success."""
    hits = 0
    for k in keys:
        if mgr.lookup(k, ctx) != vbase.LookupResult.HIT:
            break
        hits += 1
    if not hits:
        return 0, None
    spec = mgr.prepare_load(keys[:hits], ctx)
    if hasattr(vbase.OffloadingManager, "touch"):  # vLLM 0.33
        mgr.touch(keys[:hits], ctx)
    assert worker.submit_load(job, spec, gspec(blocks[:hits], worker))
    res = worker.get_finished()
    mgr.complete_load(keys[:hits], ctx)
    return hits, res[0].success


def test_factory_store_lookup_load(daemon):
    spec = OffloadingSpecFactory.create_spec(config(daemon.sock))
    assert isinstance(spec, KvpoolOffloadingSpec) and isinstance(spec, vbase.OffloadingSpec)
    mgr = spec.get_manager()
    assert isinstance(mgr, vbase.OffloadingManager)
    caches, ts = gpu_blocks()
    worker = spec.get_worker(caches)
    assert isinstance(worker, vbase.OffloadingWorker)
    ctx = vbase.ReqContext(req_id="r1")
    mgr.on_new_request(ctx)
    keys = block_keys(list(range(100, 100 + 5 * T)))
    assert all(mgr.lookup(k, ctx) == vbase.LookupResult.MISS for k in keys)
    out = store(mgr, worker, keys, [3, 4, 5, 6, 7], ctx)
    assert out.keys_to_store == keys
    ev = list(mgr.take_events())
    assert len(ev) == 1 and ev[0].keys == keys and not ev[0].removed
    assert list(mgr.take_events()) == []
    # the same keys again: nothing to store
    assert store(mgr, worker, keys, [3, 4, 5, 6, 7], ctx).keys_to_store == []
    # load into other blocks
    hits, ok = load(mgr, worker, keys, [20, 21, 22, 23, 24], ctx)
    assert hits == 5 and ok
    for t in ts:
        assert torch.equal(t[20:25], t[3:8])
    assert daemon.pool_books("vl")["host"]["leased_tokens"] == 0
    mgr.shutdown(), worker.shutdown()


def test_take_events_reports_removals(daemon):
    """Blocks this manager stored and kvpoold evicted since are reported removed, once."""
    spec = OffloadingSpecFactory.create_spec(config(daemon.sock, events_check_ms=0))
    mgr = spec.get_manager()
    caches, ts = gpu_blocks(seed=9)
    worker = spec.get_worker(caches)
    ctx = vbase.ReqContext(req_id="ev")
    keys = block_keys(list(range(2000, 2000 + 4 * T)))
    store(mgr, worker, keys, [1, 2, 3, 4], ctx)
    ev = list(mgr.take_events())
    assert [(e.keys, e.removed) for e in ev] == [(keys, False)]
    assert list(mgr.take_events()) == []  # all still there: nothing to report
    # another client drops two of them (the chain's tail goes first: leaves-first eviction)
    c = kvpool.connect(daemon.sock)
    p = c.attach("vl")
    assert p.exists_keys([bytes(k) + b"\x00r\x00\x00" for k in keys]) == 4
    c.flush("vl")
    ev = list(mgr.take_events())
    assert len(ev) == 1 and ev[0].removed and sorted(ev[0].keys) == sorted(keys)
    assert list(mgr.take_events()) == []  # reported once
    # stored again: a stored event again
    store(mgr, worker, keys[:1], [1], ctx)
    assert [(e.keys, e.removed) for e in mgr.take_events()] == [(keys[:1], False)]
    assert mgr.stats()["removed_blocks"] == 4
    p.detach(), c.close()
    mgr.shutdown(), worker.shutdown()
    # events disabled (vLLM does not drain take_events then): nothing is kept
    cfg = config(daemon.sock)
    off = OffloadingSpecFactory.create_spec(
        vconf.OffloadingConfig(**{**cfg.__dict__, "enable_kv_cache_events": False}))
    mgr, worker = off.get_manager(), off.get_worker(caches)
    store(mgr, worker, block_keys(list(range(3000, 3000 + T))), [5], ctx)
    assert list(mgr.take_events()) == [] and not mgr._stored
    mgr.shutdown(), worker.shutdown()


def test_tp_ranks(daemon):
    """World size 2: each rank's worker stores its shard; a block is a hit once both are in."""
    spec0 = OffloadingSpecFactory.create_spec(config(daemon.sock, 0, 2))
    spec1 = OffloadingSpecFactory.create_spec(config(daemon.sock, 1, 2))
    mgr = spec0.get_manager()
    c0, t0 = gpu_blocks(seed=1)
    c1, t1 = gpu_blocks(seed=2)
    w0, w1 = spec0.get_worker(c0), spec1.get_worker(c1)
    ctx = vbase.ReqContext(req_id="tp")
    keys = block_keys(list(range(500, 500 + 2 * T)))
    out = mgr.prepare_store(keys, ctx)
    assert out.store_spec.pages.shape == (2, 2)
    w0.submit_store(1, gspec([1, 2], w0), out.store_spec)
    w1.submit_store(1, gspec([1, 2], w1), out.store_spec)
    assert w0.get_finished()[0].success and w1.get_finished()[0].success
    mgr.complete_store(out.keys_to_store, ctx)
    assert mgr.lookup(keys[0], ctx) == vbase.LookupResult.HIT
    spec = mgr.prepare_load(keys, ctx)
    w0.submit_load(2, spec, gspec([10, 11], w0))
    w1.submit_load(2, spec, gspec([10, 11], w1))
    assert w0.get_finished()[0].success and w1.get_finished()[0].success
    mgr.complete_load(keys, ctx)
    for t in t0 + t1:
        assert torch.equal(t[10:12], t[1:3])
    assert not torch.equal(t0[0][10:12], t1[0][10:12])
    mgr.shutdown(), w0.shutdown(), w1.shutdown()


def test_geometry_checked(daemon):
    cfg = config(daemon.sock)
    bad = vconf.OffloadingConfig(**{**cfg.__dict__, "worker_kv_bytes_per_block": 1024})
    spec = OffloadingSpecFactory.create_spec(bad)
    # refused when the engine starts, the bytes vLLM needs named
    with pytest.raises(kvpool.GeometryMismatch, match="page_bytes 512 != vLLM's 1024 bytes"):
        spec.get_manager()
    caches, _ = gpu_blocks()
    with pytest.raises(kvpool.GeometryMismatch, match="page_bytes 512"):
        spec.get_worker(caches)
    # a pool recreated with another geometry after the start: counted, lookups miss
    good = OffloadingSpecFactory.create_spec(cfg)
    mgr = good.get_manager()
    mgr.spec = spec
    mgr.link.check = lambda p: spec.check_pool(p)
    mgr.link.drop()
    assert mgr.lookup(block_keys(list(range(T)))[0], vbase.ReqContext("g")) == \
        vbase.LookupResult.MISS
    assert mgr.stats()["geometry_mismatch"] == 1
    mgr.shutdown()
    with pytest.raises(ValueError, match="pool"):
        OffloadingSpecFactory.create_spec(vconf.OffloadingConfig(
            **{**cfg.__dict__, "extra_config": {"spec_name": "KvpoolOffloadingSpec",
                                                "spec_module_path": "kvpool.vllm"}}))


def test_limits_evicted_parent_foreign_namespace(daemon):
    spec = OffloadingSpecFactory.create_spec(config(daemon.sock))
    mgr = spec.get_manager()
    caches, ts = gpu_blocks(seed=3)
    worker = spec.get_worker(caches)
    ctx = vbase.ReqContext(req_id="edge")
    # a 65-byte key: past the bytes-per-key limit (LimitExceeded), the engine sees a miss
    assert mgr.lookup(vbase.OffloadKey(b"x" * 65), ctx) == vbase.LookupResult.MISS
    assert mgr.stats()["lookup_LimitExceeded"] == 1
    # 10^6 keys in one prepare_load: refused, an empty load spec, the load fails
    many = [vbase.make_offload_key(i.to_bytes(32, "big"), 0) for i in range(10**6)]
    s = mgr.prepare_load(many, ctx)
    assert s.pages.shape[0] == 0 and mgr.stats()["load_LimitExceeded"] == 1
    mgr.complete_load(many, ctx)
    # a chain whose parent was evicted
    keys = block_keys(list(range(900, 900 + 3 * T)))
    store(mgr, worker, keys[:2], [1, 2], ctx)
    kvpool.connect(daemon.sock).flush("vl")
    assert mgr.lookup(keys[0], ctx) == vbase.LookupResult.MISS
    store(mgr, worker, keys[2:], [3], ctx)
    assert load(mgr, worker, keys, [10, 11, 12], ctx) == (0, None)
    assert mgr.lookup(keys[2], ctx) == vbase.LookupResult.HIT
    # a foreign namespace sees none of it
    other = OffloadingSpecFactory.create_spec(config(daemon.sock, namespace=77)).get_manager()
    assert other.lookup(keys[2], ctx) == vbase.LookupResult.MISS
    assert daemon.pool_books("vl")["host"]["leased_tokens"] == 0
    mgr.shutdown(), worker.shutdown(), other.shutdown()


def test_kvpoold_killed_and_restarted(own_daemon):
    d = own_daemon
    with open(d.conf, "a") as f:
        f.write(CONF[len(DEFAULT_CONF):])
    d.signal(signal.SIGTERM)
    restart(d)
    spec = OffloadingSpecFactory.create_spec(config(d.sock))
    mgr = spec.get_manager()
    caches, ts = gpu_blocks(seed=4)
    worker = spec.get_worker(caches)
    worker.PING_S = 0.0
    ctx = vbase.ReqContext(req_id="k")
    keys = block_keys(list(range(40, 40 + 2 * T)))
    assert store(mgr, worker, keys, [1, 2], ctx).keys_to_store == keys
    d.proc.kill()
    assert mgr.lookup(keys[0], ctx) == vbase.LookupResult.MISS
    assert mgr.prepare_store(keys, ctx) is None
    s = mgr.prepare_load(keys, ctx)
    assert worker.submit_load(5, s, gspec([8, 9], worker))
    assert worker.get_finished()[0].success is False
    mgr.complete_load(keys, ctx)
    restart(d)
    import time
    end = time.monotonic() + 10
    while mgr.prepare_store(keys, ctx) is None:
        assert time.monotonic() < end, mgr.stats()
        time.sleep(0.05)
    assert mgr.stats()["reconnects"] == 1
    # the prepared store above leased pages of the new daemon: complete it
    mgr.complete_store(keys, ctx, success=False)
    assert store(mgr, worker, keys, [1, 2], ctx, job=7).keys_to_store == keys
    assert load(mgr, worker, keys, [12, 13], ctx) == (2, True)
    for t in ts:
        assert torch.equal(t[12:14], t[1:3])
    mgr.shutdown(), worker.shutdown()


CHILD = r"""
import sys
sys.path.insert(0, {here!r})
import test_vllm as tv
from vllm.v1.kv_offload import base as vbase
from vllm.v1.kv_offload.factory import OffloadingSpecFactory
spec = OffloadingSpecFactory.create_spec(tv.config({sock!r}))
mgr = spec.get_manager()
caches, ts = tv.gpu_blocks(seed=42)
w = spec.get_worker(caches)
keys = tv.block_keys(list(range(7000, 7000 + 4 * tv.T)))
out = tv.store(mgr, w, keys, [4, 5, 6, 7], vbase.ReqContext(req_id="a"))
print(len(out.keys_to_store))
"""


def test_two_instances(daemon):
    """Instance A (another process) stores blocks; instance B finds and loads the same bytes."""
    here = os.path.dirname(os.path.abspath(__file__))
    out = subprocess.run([sys.executable, "-c", CHILD.format(here=here, sock=daemon.sock)],
                         capture_output=True, text=True, timeout=120, cwd=here)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "4"
    spec = OffloadingSpecFactory.create_spec(config(daemon.sock))
    mgr = spec.get_manager()
    caches, ts = gpu_blocks(seed=7)
    worker = spec.get_worker(caches)
    _, ref = gpu_blocks(seed=42)
    keys = block_keys(list(range(7000, 7000 + 4 * T)))
    assert load(mgr, worker, keys, [16, 17, 18, 19], vbase.ReqContext(req_id="b")) == (4, True)
    for t, r in zip(ts, ref):
        assert torch.equal(t[16:20], r[4:8])
    mgr.shutdown(), worker.shutdown()


def test_layout_past_the_page_refused(daemon):
    """Block tensors whose chunk layout needs more than the pool's page: the worker is refused
    when it starts, GeometryMismatch naming the bytes each group needs."""
    spec = OffloadingSpecFactory.create_spec(config(daemon.sock))
    ts = [torch.zeros((8, 512), dtype=torch.int8) for _ in range(2)]
    caches = vbase.CanonicalKVCaches(
        tensors=[vbase.CanonicalKVCacheTensor(t, 512) for t in ts],
        group_data_refs=[[vbase.CanonicalKVCacheRef(0, 512)],
                         [vbase.CanonicalKVCacheRef(1, 512)]])
    with pytest.raises(kvpool.GeometryMismatch, match=r"needs pages of 1024 bytes \(group 0 "
                       r"\(vLLM group 0, full\): 1 tensors, 512 bytes per block, 512 bytes of a "
                       r"page; group 1: 1 tensors, 512 bytes per block, 1024 bytes of a page\), "
                       r"the pool's hold 512"):
        spec.get_worker(caches)


def test_chunks_of_two_blocks_and_a_partial_first_chunk(daemon):
    """blocks_per_chunk 2 with two groups: a load that starts in the middle of a chunk
    (block_indices odd) takes the chunk's second block, as vLLM's own CPU worker does."""
    spec = OffloadingSpecFactory.create_spec(config(daemon.sock, blocks_per_chunk=2, pool="vl2"))
    mgr = spec.get_manager()
    caches, ts = gpu_blocks(nblocks=32, seed=5)
    caches = vbase.CanonicalKVCaches(caches.tensors, [[vbase.CanonicalKVCacheRef(0, 256)],
                                                      [vbase.CanonicalKVCacheRef(1, 256)]])
    worker = spec.get_worker(caches)
    ctx = vbase.ReqContext(req_id="k2")
    keys = [vbase.make_offload_key(bytes([i]) * 32, g) for g in (0, 1) for i in (1, 2)]
    out = mgr.prepare_store(keys, ctx)
    assert out.keys_to_store == keys and out.store_spec.pages.shape == (4, 1)
    # group 0: blocks 1..4 (two chunks), group 1: blocks 5..8
    src = vbase.GPULoadStoreSpec(list(range(1, 9)), [4, 4], [0, 0])
    if resolve_device_pointers is not None:
        src = resolve_device_pointers(src, caches)
    assert worker.submit_store(1, src, out.store_spec)
    assert worker.get_finished()[0].success
    mgr.complete_store(set(keys), ctx)
    assert all(mgr.lookup(k, ctx) == vbase.LookupResult.HIT for k in keys)
    # load the last 3 blocks of each group (skip 1 of the first chunk)
    spec_l = mgr.prepare_load(keys, ctx)
    dst = vbase.GPULoadStoreSpec([20, 21, 22, 24, 25, 26], [3, 3], [1, 1])
    if resolve_device_pointers is not None:
        dst = resolve_device_pointers(dst, caches)
    assert worker.submit_load(2, spec_l, dst)
    assert worker.get_finished()[0].success
    mgr.complete_load(set(reversed(keys)), ctx)
    assert torch.equal(ts[0][20:23], ts[0][2:5])
    assert torch.equal(ts[1][24:27], ts[1][6:9])
    # group 1 wrote only tensor 1's region: tensor 0 of the destination untouched there
    assert not torch.equal(ts[0][24:27], ts[0][6:9])
    assert daemon.pool_books("vl2")["host"]["protected_tokens"] == 0
    mgr.shutdown(), worker.shutdown()


def test_chain_in_request_order_across_stores(daemon):
    """A request's chunks stored in two steps, each completed with a set (vLLM's container):
    they form one chain in the request's order, so kvpoold's leaves-first eviction takes the
    request's last chunks first and the ones left are a prefix."""
    spec = OffloadingSpecFactory.create_spec(config(daemon.sock))
    mgr = spec.get_manager()
    caches, ts = gpu_blocks(seed=8)
    worker = spec.get_worker(caches)
    c = kvpool.connect(daemon.sock)
    c.flush("vl")
    ctx = vbase.ReqContext(req_id="chain")
    keys = block_keys(list(range(5000, 5000 + 8 * T)))
    for i, k in enumerate(keys):
        ctx.set_offload_key_position(k, (i + 1) * T)
    for part in (keys[:4], keys[4:]):
        out = mgr.prepare_store(part, ctx)
        assert worker.submit_store(1, gspec(range(1, 1 + len(part)), worker), out.store_spec)
        assert worker.get_finished()[0].success
        mgr.complete_store(set(reversed(part)), ctx)
    assert [mgr.lookup(k, ctx) for k in keys] == [vbase.LookupResult.HIT] * 8
    # three pages' tokens evicted: the chain's last three keys
    assert c.evict("vl", 3 * T, tier="host") >= 3 * T
    assert [mgr.lookup(k, ctx) == vbase.LookupResult.HIT for k in keys] == [True] * 5 + \
        [False] * 3
    mgr.on_request_finished(ctx)
    assert not mgr._tails
    c.close()
    mgr.shutdown(), worker.shutdown()
