#!/usr/bin/env python3
"""bench_engines.py [--quick] - the engine plug-ins' benchmark row, one JSON object a line in
the row format of bench_kvpool.py:
  sglang.set_get_1000_pages  KvpoolStorage.batch_set_v1 + batch_get_v1 of 1,000 pages
                             (SGLang's own page_first_direct MHATokenToKVPoolHost, 4 layers x
                             8 heads x 128 x 16 tokens fp16: 256 KiB a page, K and V two keys
                             and two kvpool pages, contiguous host indices), GB/s of
                             page bytes moved (both ways); against numpy.copyto of the same
                             bytes (one copy each way) in the same process (ratio >= 0.5)
  sglang.set_get_1000_pages_page_first_scattered
                             the same on a page_first host pool (a per-token gather) with
                             shuffled host indices (informational, same target)
Needs kvpoold ($KVPOOLD or build/daemon/kvpoold), the kvpool package, torch and sglang with its
host pools (the engine venv scripts/pytest.sh makes, KVP_ENGINE_VENV).
"""
import json
import os
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
    bench("page_first_direct", False, reps)
    bench("page_first", True, reps)


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


if __name__ == "__main__":
    main()
