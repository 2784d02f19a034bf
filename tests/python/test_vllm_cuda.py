"""kvpool.vllm_copy on a GPU: vLLM-shaped CUDA block tensors (two KV cache groups over three
tensors) stored into and loaded from kvpool's host pages (a real kvpoold's host tier, mapped
and registered with CUDA) by the worker's copy path, every byte equal. And kvpool.vllm_mem, as
KvpoolConnector's get_mem_pool_context uses it: vLLM's KV cache buffer (one torch.zeros of
int8 inside torch.cuda.use_mem_pool) allocated from a run lease of a cuda device tier, its bytes
in the run's pages of the tier (read through the pool's own layer-first view), the pages leased
while it lives and free again after. Skips without CUDA.

Run as a program (scripts/gpu-check.sh --device), it prints the rows vllm.cuda.store and
vllm.cuda.load: GB/s of the worker's copies of 512 chunks (8 tensors of 64 KiB a block,
shuffled block ids) against one cudaMemcpyAsync of the same bytes between the same memories
(device tensor and registered host pages), target ratio >= 0.9.
"""
import os
import sys
import time
from types import SimpleNamespace

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import DEFAULT_CONF, Daemon, pool_section  # noqa: E402

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device: the CUDA copy path of kvpool.vllm needs a GPU",
                allow_module_level=True)
import kvpool  # noqa: E402
from kvpool.vllm_copy import CudaCopier, HostPages, PageLayout  # noqa: E402
from kvpool.vllm_mem import DeviceRuns, torch_mem_pool  # noqa: E402

CONF = DEFAULT_CONF + pool_section("vg", layers=8, kv_heads=8, head_dim=128,
                                   host_capacity=f"{520 * 16}t").replace(
    "page_tokens = 4", "page_tokens = 16")
PAGE = 64 << 10  # one tensor's block (bytes)


def caches(nblocks, ntensors, groups):
    ts = [torch.randint(-128, 127, (nblocks, PAGE), dtype=torch.int8, device="cuda")
          for _ in range(ntensors)]
    tensors = [SimpleNamespace(tensor=t, page_size_bytes=PAGE) for t in ts]
    refs = [[SimpleNamespace(tensor_idx=i, page_size_bytes=PAGE) for i in g] for g in groups]
    return ts, tensors, refs


def host_pages(pool):
    h = torch.from_dlpack(pool.host_pages_view())
    host = HostPages(h.view(h.shape[0], -1).view(torch.int8))
    assert host.register_cuda()
    return host


def spec(ids, sizes):
    return SimpleNamespace(block_ids=np.asarray(ids), group_sizes=sizes,
                           block_indices=[0] * len(sizes))


def test_store_load_two_groups(daemon):
    """Group 0 references tensors 0 and 1, group 1 tensor 2 (a draft layer): stored from
    some blocks, loaded into others, equal; a page of group 1 holds only tensor 2's region."""
    c = kvpool.connect(daemon.sock)
    pool = c.attach("vg")
    host = host_pages(pool)
    ts, tensors, refs = caches(64, 3, [[0, 1], [2]])
    layout = PageLayout(tensors, refs, 1)
    assert layout.page_bytes == 3 * PAGE <= pool.page_bytes
    cp = CudaCopier(torch.device("cuda"))
    lease = pool.alloc(6, tier="host")
    pages = np.asarray(lease.pages, dtype=np.int64)
    runs = layout.runs(spec([3, 9, 4, 7, 8, 20], [4, 2]), pages, host, True)
    cp.copy(runs).synchronize()
    runs = layout.runs(spec([30, 31, 32, 33, 40, 41], [4, 2]), pages, host, False)
    cp.copy(runs).synchronize()
    for a, b in zip([3, 9, 4, 7], [30, 31, 32, 33]):
        assert torch.equal(ts[0][a], ts[0][b]) and torch.equal(ts[1][a], ts[1][b])
    for a, b in zip([8, 20], [40, 41]):
        assert torch.equal(ts[2][a], ts[2][b])
    lease.free()
    host.unregister_cuda()
    pool.detach(), c.close()


# a cuda device tier of 1,024 pages of 2 layers x 16 tokens x 2 KiB rows: 32 KiB a page's piece
# of a stripe, stripes of 32 MiB (whole 2 MiB granules), runs aligned to 64 pages
KV_CONF = DEFAULT_CONF + """
[pool.gkv]
layers = 2
kv_heads = 8
head_dim = 128
dtype = fp16
page_tokens = 16
device = cuda:0
device_capacity = 16384t
host_capacity = 0
mlock = off
"""


def leased(c, pool):
    return next(p for p in c.status()["pools"] if p["name"] == pool)["tiers"]["device"][
        "leased_tokens"]


def test_kv_memory_in_cuda_tier():
    d = Daemon(KV_CONF)
    try:
        c = kvpool.connect(d.sock)
        pool = c.attach("gkv")
        assert pool.tier_backend("device") == "cuda"
        runs = DeviceRuns(pool)
        lay = runs.layout
        assert lay.align * lay.run_bytes % runs.maps.granule == 0
        mp = torch_mem_pool(runs)
        nbytes = 100 * pool.page_bytes + 12345  # allocate_kv_cache: one int8 buffer
        with torch.cuda.use_mem_pool(mp):
            buf = torch.zeros(nbytes, dtype=torch.int8, device="cuda")
        assert len(runs.live) == 1
        ptr, (lease, total) = next(iter(runs.live.items()))
        assert buf.data_ptr() == ptr and total >= nbytes
        n, first = len(lease.pages), int(lease.pages[0])
        assert first % lay.align == 0 and leased(c, "gkv") == n * 16
        buf.copy_(torch.randint(-128, 127, (nbytes,), dtype=torch.int8, device="cuda"))
        torch.cuda.synchronize()
        run = lay.run_bytes
        for layer in range(2):
            for kv in range(2):
                plane = torch.from_dlpack(pool.kv("device", layer, kv)).view(torch.int8)
                plane = plane.reshape(-1)[first * run:(first + n) * run]
                i = 2 * layer + kv
                lo, hi = i * n * run, min((i + 1) * n * run, nbytes)
                if lo < hi:
                    assert torch.equal(plane[:hi - lo], buf[lo:hi]), (layer, kv)
        del buf
        torch.cuda.synchronize()
        del mp
        torch.cuda.empty_cache()
        freed_by_torch = not runs.live
        runs.close()
        print(f"kv memory: {n} pages leased from page {first}; torch freed the buffer itself: "
              f"{freed_by_torch}")
        assert leased(c, "gkv") == 0
        pool.detach(), c.close()
    finally:
        d.stop()


def rows(n=512, ntensors=8, reps=5):
    """vllm.cuda.store / vllm.cuda.load against one cudaMemcpyAsync of the same bytes."""
    from bench_kvpool import row
    d = Daemon(CONF)
    try:
        c = kvpool.connect(d.sock)
        pool = c.attach("vg")
        host = host_pages(pool)
        ts, tensors, refs = caches(2 * n, ntensors, [list(range(ntensors))])
        layout = PageLayout(tensors, refs, 1)
        cp = CudaCopier(torch.device("cuda"))
        lease = pool.alloc(n, tier="host")
        pages = np.asarray(lease.pages, dtype=np.int64)
        perm = torch.randperm(2 * n, generator=torch.Generator().manual_seed(3)).tolist()
        src, dst = perm[:n], perm[n:]
        st = layout.runs(spec(src, [n]), pages, host, True)
        ld = layout.runs(spec(dst, [n]), pages, host, False)
        nbytes = n * ntensors * PAGE
        # the baseline: the same bytes between a device tensor and the registered pages
        dev = torch.empty(nbytes, dtype=torch.int8, device="cuda")
        lo = int(pages.min())
        hview = host.tensor.view(-1)[lo * host.page_bytes:lo * host.page_bytes + nbytes]
        assert hview.numel() == nbytes, "the pool's host tier is too small for the baseline"

        def timed(fn):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            return time.perf_counter() - t0

        s_s = l_s = d2h = h2d = float("inf")
        for _ in range(reps + 1):
            s_s = min(s_s, timed(lambda: cp.copy(st).synchronize()))
            d2h = min(d2h, timed(lambda: hview.copy_(dev, non_blocking=True)))
            l_s = min(l_s, timed(lambda: cp.copy(ld).synchronize()))
            h2d = min(h2d, timed(lambda: dev.copy_(hview, non_blocking=True)))
        for t in ts:
            for i in (0, n // 2, n - 1):
                assert torch.equal(t[dst[i]], t[src[i]])
        params = {"chunks": n, "tensors": ntensors, "block_bytes": PAGE, "reps": reps,
                  "path": cp.path}
        row("vllm.cuda.store", params, nbytes / d2h / 1e9,
            "one cudaMemcpyAsync of the same bytes, device to registered host pages",
            nbytes / s_s / 1e9, "GB/s", "ratio >= 0.9", "KvpoolOffloadingWorker's store runs")
        row("vllm.cuda.load", params, nbytes / h2d / 1e9,
            "one cudaMemcpyAsync of the same bytes, registered host pages to device",
            nbytes / l_s / 1e9, "GB/s", "ratio >= 0.9", "KvpoolOffloadingWorker's load runs")
        lease.free()
        host.unregister_cuda()
        pool.detach(), c.close()
    finally:
        d.stop()


if __name__ == "__main__":
    rows()
