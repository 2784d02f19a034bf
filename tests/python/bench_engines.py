#!/usr/bin/env python3
"""bench_engines.py [--quick] [--only=TEXT] - the engine plug-ins' benchmark rows (those whose
name holds TEXT with --only), one JSON object a line in the row format of bench_kvpool.py:
  sglang.set_get_1000_pages  KvpoolStorage.batch_set_v1 + batch_get_v1 of 1,000 pages
                             (SGLang's own page_first_direct MHATokenToKVPoolHost, 4 layers x
                             8 heads x 128 x 16 tokens fp16: 256 KiB a page, K and V two keys
                             and two kvpool pages, contiguous host indices), GB/s of
                             page bytes moved (both ways); against numpy.copyto of the same
                             bytes (one copy each way) in the same process (ratio >= 0.5)
  sglang.set_get_1000_pages_page_first_scattered
                             the same on a page_first host pool (a per-token gather) with
                             shuffled host indices (informational, same target)
  vllm.store, vllm.load      kvpool.vllm's worker (KvpoolOffloadingWorker.submit_store /
                             submit_load, as vLLM's OffloadingConnector calls it) of 512
                             chunks of one block (8 layers' tensors of 64 KiB: 512 KiB a
                             chunk, 256 MiB in all) between CPU block tensors (shuffled block
                             ids) and kvpool's host pages, GB/s; against numpy.copyto of the
                             same bytes between the same memories (block tensor rows of
                             their own and the chunks' pages, one contiguous copy a tensor)
                             in the same process (ratio >= 0.8); medians of the reps, each
                             rep the plug-in's copy and the baseline's back to back
Needs kvpoold ($KVPOOLD or build/daemon/kvpoold), the kvpool package, torch and sglang with its
host pools, vllm (the engine venv scripts/pytest.sh makes, KVP_ENGINE_VENV).
"""
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_kvpool import row  # noqa: E402
from conftest import Daemon  # noqa: E402

L, H, D, T, N = 4, 8, 128, 16, 1000
CONF = f"""
[pool.eng]
layers = {L}
kv_heads = {H}
head_dim = {D // 2}
dtype = fp16
page_tokens = {T}
device = none
host_capacity = {2 * (N + 8) * T}t
mlock = off
"""


def main():
    quick = "--quick" in sys.argv[1:]
    reps = 2 if quick else 5
    only = [a[len("--only="):] for a in sys.argv[1:] if a.startswith("--only=")]
    if not only or any(o in "sglang.set_get_1000_pages" for o in only):
        bench("page_first_direct", False, reps)
        bench("page_first", True, reps)
    if not only or any(o in "vllm.store vllm.load" for o in only):
        bench_vllm(reps)


def bench(layout, scattered, reps):
    name = "sglang.set_get_1000_pages" + ("_page_first_scattered" if scattered else "")
    try:
        import numpy
        import torch
        from engine_util import HostPool, import_sglang
        hs, bf, _ = import_sglang()
    except BaseException as e:  # pytest.skip raises a BaseException
        row(name, {"pages": N}, None, "numpy.copyto of the same bytes",
            None, "GB/s", "ratio >= 0.5", f"skipped: {e}")
        return
    d = Daemon(CONF)
    try:
        cfg = hs.HiCacheStorageConfig(
            tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
            is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True,
            model_name="bench", extra_config={
                "backend_name": "kvpool", "module_path": "kvpool.sglang",
                "class_name": "KvpoolStorage", "interface_v1": 1, "pool": "eng",
                "socket": d.sock})
        b = bf.StorageBackendFactory.create_backend("dynamic", cfg, None)
        host = HostPool(layout, L, H, D, T, 2 * N, torch.float16)
        host.real.kv_buffer.normal_()
        b.register_mem_pool_host(host.real)
        page_bytes = 2 * L * T * H * D * 2
        nbytes = N * page_bytes
        order = torch.randperm(2 * N, generator=torch.Generator().manual_seed(1)) if scattered \
            else torch.arange(2 * N)
        src_pages, dst_pages = order[:N], order[N:]
        src_idx, dst_idx = host.indices(src_pages), host.indices(dst_pages)
        flush = b.link.pool.client
        a = numpy.random.default_rng(0).standard_normal(nbytes // 8)
        c1, c2 = numpy.empty_like(a), numpy.empty_like(a)

        def plugin(i):
            keys = [f"{i:032x}{k:032x}" for k in range(N)]
            t0 = time.perf_counter()
            assert b.batch_set_v1(keys, src_idx) == [True] * N
            assert b.batch_exists(keys) == N
            assert b.batch_get_v1(keys, dst_idx) == [True] * N
            dt = time.perf_counter() - t0
            flush.flush("eng")
            return dt

        def memcpy():
            t0 = time.perf_counter()
            numpy.copyto(c1, a)
            numpy.copyto(c2, c1)
            return time.perf_counter() - t0

        plugin(-1), memcpy()
        p_s = m_s = float("inf")
        for i in range(reps):  # interleaved, so both see the same machine
            p_s, m_s = min(p_s, plugin(i)), min(m_s, memcpy())
        for i in (0, N // 2, N - 1):
            assert torch.equal(host.page(int(dst_pages[i])), host.page(int(src_pages[i])))
        b.close()
        row(name, {"pages": N, "page_bytes": page_bytes, "layout": layout,
                   "scattered": scattered, "reps": reps},
            2 * nbytes / m_s / 1e9, "numpy.copyto of the same bytes, once each way",
            2 * nbytes / p_s / 1e9, "GB/s", "ratio >= 0.5",
            "batch_set_v1 + batch_exists + batch_get_v1, "
            + ("shuffled host indices" if scattered else "contiguous host indices"))
    finally:
        d.stop()


VL, VPAGE, VN = 8, 64 << 10, 512  # layers (tensors), bytes of a layer's block, chunks
VCONF = f"""
[pool.vl]
layers = {VL}
kv_heads = 8
head_dim = 128
dtype = fp16
page_tokens = 16
device = none
host_capacity = {(VN + 8) * 16}t
mlock = off
"""


def bench_vllm(reps):
    params = {"chunks": VN, "tensors": VL, "block_bytes": VPAGE, "reps": reps}
    base_what = "numpy.copyto of the same bytes between the same memories (medians)"
    try:
        import numpy
        import torch
        from vllm.v1.kv_offload import base as vbase
        from vllm.v1.kv_offload import config as vconf
        from vllm.v1.kv_offload.factory import OffloadingSpecFactory
    except BaseException as e:  # noqa: BLE001 - the skip reason
        for n in ("vllm.store", "vllm.load"):
            row(n, params, None, base_what, None, "GB/s", "ratio >= 0.8", f"skipped: {e}")
        return
    try:
        from vllm.v1.kv_offload.pointer_utils import resolve_device_pointers
    except ImportError:
        resolve_device_pointers = None
    d = Daemon(VCONF)
    try:
        cfg = vconf.OffloadingConfig(
            groups=(vconf.OffloadingGroupConfig(tokens_per_block=16, group_id=0,
                                                layer_names=tuple(f"l{i}" for i in range(VL))),),
            worker_kv_bytes_per_block=VL * VPAGE, enable_kv_cache_events=False,
            extra_config={"spec_name": "KvpoolOffloadingSpec", "spec_module_path": "kvpool.vllm",
                          "pool": "vl", "socket": d.sock},
            engine_id="bench", model=vconf.OffloadingModelConfig(name="m", dtype="float16"),
            cache=vconf.OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=1),
            parallel=vconf.OffloadingParallelConfig(
                rank=0, world_size=1, tp_size=1, pp_size=1, pcp_size=1, dcp_size=1,
                data_parallel_index=0, data_parallel_size=1, data_parallel_rank_local=None,
                is_parallelism_agnostic=False))
        spec = OffloadingSpecFactory.create_spec(cfg)
        nblocks = 2 * VN  # shuffled source and destination blocks, then VN the baseline's
        ts = [torch.randint(-128, 127, (nblocks + VN, VPAGE), dtype=torch.int8)
              for _ in range(VL)]
        caches = vbase.CanonicalKVCaches(
            [vbase.CanonicalKVCacheTensor(t, VPAGE) for t in ts],
            [[vbase.CanonicalKVCacheRef(i, VPAGE) for i in range(VL)]])
        mgr, worker = spec.get_manager(), spec.get_worker(caches)
        perm = torch.randperm(nblocks, generator=torch.Generator().manual_seed(2)).tolist()
        src, dst = perm[:VN], perm[VN:]

        def gpu(ids):
            s = vbase.GPULoadStoreSpec(ids, [len(ids)], [0])
            return resolve_device_pointers(s, caches) if resolve_device_pointers else s

        ctx = vbase.ReqContext(req_id="bench")
        keys = [vbase.make_offload_key(i.to_bytes(32, "big"), 0) for i in range(VN)]
        out = mgr.prepare_store(keys, ctx)
        assert out.keys_to_store == keys
        nbytes = VN * VL * VPAGE
        # the baseline's memories: the same bytes between the block tensors (the last VN rows
        # of each, contiguous) and the chunks' pages (contiguous in a fresh pool)
        pages = numpy.asarray(out.store_spec.pages[:, 0])
        host = worker._host().tensor.numpy().reshape(-1)
        lo = int(pages.min()) * worker._host().page_bytes
        assert int(pages.max()) - int(pages.min()) == VN - 1, "the chunks' pages are not one span"
        span = host[lo:lo + nbytes].reshape(VL, VN * VPAGE)
        rows = [t.numpy().reshape(-1)[nblocks * VPAGE:] for t in ts]

        def store():
            g = gpu(src)
            t0 = time.perf_counter()
            worker.submit_store(1, g, out.store_spec)
            dt = time.perf_counter() - t0
            assert worker.get_finished()[0].success
            return dt

        def load():
            g = gpu(dst)
            t0 = time.perf_counter()
            worker.submit_load(2, out.store_spec, g)
            dt = time.perf_counter() - t0
            assert worker.get_finished()[0].success
            return dt

        def memcpy(to_host):
            t0 = time.perf_counter()
            for i, r in enumerate(rows):
                if to_host:
                    numpy.copyto(span[i], r)
                else:
                    numpy.copyto(r, span[i])
            return time.perf_counter() - t0

        store(), load(), memcpy(True), memcpy(False)
        st, ld, mst, mld = [], [], [], []
        for _ in range(reps):  # interleaved, so both see the same machine
            mst.append(memcpy(True))
            st.append(store())  # the baseline wrote the pages: the store writes them again
            ld.append(load())
            mld.append(memcpy(False))
        for t in ts:
            for i in (0, VN // 2, VN - 1):
                assert torch.equal(t[dst[i]], t[src[i]])
        mgr.complete_store(keys, ctx)
        mgr.shutdown(), worker.shutdown()
        med = statistics.median
        for n, sec, base in (("vllm.store", med(st), med(mst)), ("vllm.load", med(ld), med(mld))):
            row(n, params, nbytes / base / 1e9, base_what, nbytes / sec / 1e9, "GB/s",
                "ratio >= 0.8", "submit_store: block tensors to pages" if n == "vllm.store"
                else "submit_load: pages to block tensors")
    finally:
        d.stop()


if __name__ == "__main__":
    main()
