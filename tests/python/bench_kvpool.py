#!/usr/bin/env python3
"""bench_kvpool.py [--quick] - the Python package's benchmark rows, one JSON object a line in
the row format of tests/bench (name, params, machine, baseline, baseline_what, value, unit,
ratio = value / baseline, target, note), for scripts/bench.sh to collect.

Every baseline is measured in the same process against the same kvpoold:
  python.alloc_free        Pool.alloc(1) + Lease.free() round trip, us; against the same
                           calls through the C API in a C loop (ratio <= 1.2)
  python.match_1m_tokens   Pool.match of 1M cached tokens, tokens/s; against kvp_cache_match
                           in a C loop (ratio >= 0.8)
  python.gather_4096       gather of a 4,096-token prefix's K/V (every layer) from scattered
                           pages into contiguous tensors with torch indexing on the views, GB/s;
                           against torch.clone of the same bytes (ratio >= 0.7); skipped
                           without torch
The C loops are bench_capi (bench_capi.c), a test-only extension that meson builds in
tests/python of the build tree (-Dtests=true, the default): each call runs its loop on a session
of its own to the same kvpoold, in this process.
Needs kvpoold ($KVPOOLD or build/daemon/kvpoold), bench_capi from the same build tree and an
installed kvpool package.
"""
import json
import os
import platform
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import KVPOOLD, Daemon  # noqa: E402

import kvpool  # noqa: E402

CONF = """
[pool.rpc]
layers = 1
kv_heads = 1
head_dim = 8
dtype = fp16
page_tokens = 16
device = sim
device_capacity = 1100000t
host_capacity = 0
mlock = off

[pool.gather]
layers = 4
kv_heads = 8
head_dim = 128
dtype = fp16
page_tokens = 16
device = sim
device_capacity = 16384t
host_capacity = 0
mlock = off
"""


def row(name, params, baseline, baseline_what, value, unit, target, note=""):
    have = baseline is not None and value is not None and baseline != 0
    print(json.dumps({
        "name": name, "params": params,
        "machine": {"nproc": os.cpu_count(), "kernel": platform.release()},
        "baseline": baseline, "baseline_what": baseline_what, "value": value, "unit": unit,
        "ratio": value / baseline if have else None, "target": target, "note": note}),
        flush=True)


def import_capi():
    """bench_capi, the C API baselines (bench_capi.c), from tests/python of the build tree
    kvpoold comes from."""
    d = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(KVPOOLD))), "tests",
                     "python")
    if d not in sys.path:
        sys.path.insert(0, d)
    try:
        import bench_capi
    except ImportError as e:
        raise ImportError(f"bench_capi is not built in {d} (meson builds it with -Dtests=true "
                          f"when it finds the Python headers): {e}") from e
    return bench_capi


def best_of(windows, fn):
    return min(fn() for _ in range(windows))


def bench_alloc_free(sock, pool, n, windows):
    def py():
        t0 = time.perf_counter()
        for _ in range(n):
            pool.alloc(1).free()
        return time.perf_counter() - t0

    py_s = best_of(windows, py)
    capi = import_capi()
    c_s = best_of(windows, lambda: capi.alloc_free(sock, pool.name, n))
    row("python.alloc_free", {"round_trips": n, "windows": windows}, c_s / n * 1e6,
        "the same Alloc(1 page) + Free through the C API (kvp_lease_alloc + kvp_lease_free) "
        "in a C loop, same process and daemon (a session of its own)", py_s / n * 1e6, "us",
        "ratio <= 1.2")


def bench_match(sock, pool, tokens, n, windows):
    import numpy

    toks = numpy.arange(1, tokens + 1, dtype=numpy.uint32)
    lease = pool.alloc(tokens // pool.geometry.page_tokens)
    pool.insert(lease, toks)
    lease.free()

    def py():
        t0 = time.perf_counter()
        for _ in range(n):
            m = pool.match(toks, lock=False)
        assert m.tokens == tokens
        return time.perf_counter() - t0

    py_s = best_of(windows, py)
    capi = import_capi()

    def c():
        s, matched = capi.match(sock, pool.name, toks, n)
        assert matched == tokens
        return s

    c_s = best_of(windows, c)
    row("python.match_1m_tokens", {"tokens": tokens, "matches": n, "windows": windows},
        tokens * n / c_s, "kvp_cache_match of the same tokens (unlocked) in a C loop, same process "
        "and daemon (a session of its own)", tokens * n / py_s, "tokens/s", "ratio >= 0.8")


def bench_gather(pool, tokens, reps):
    try:
        import torch
    except ImportError:
        row("python.gather_4096", {"tokens": tokens}, None, "torch.clone of the same bytes",
            None, "GB/s", "ratio >= 0.7", "skipped: torch is not installed")
        return
    g = pool.geometry
    npages = tokens // g.page_tokens
    lease = pool.alloc(npages)
    pages = torch.from_numpy(lease.pages.astype("int64"))[torch.randperm(npages)]
    # Each layer's K or V plane as [pages, page_tokens * kv_heads * head_dim]: a page is one
    # contiguous row of the plane, so one index over dim 0 copies whole pages (an index_select
    # on the [pages, page_tokens, kv_heads, head_dim] view walks the inner dims element-wise
    # and ran at 0.43-0.6 of the clone).
    page_elems = g.page_tokens * g.kv_heads * g.head_dim
    planes = [torch.from_dlpack(pool.kv("device", layer, kv)).view(-1, page_elems)
              for layer in range(g.layers) for kv in (0, 1)]
    for i, p in enumerate(planes):
        p[:npages].copy_(torch.randn(npages, page_elems).to(p.dtype) + i)
    src = [p[:npages].contiguous() for p in planes]  # the same bytes, contiguous
    nbytes = sum(s.numel() * s.element_size() for s in src)

    def gather():
        t0 = time.perf_counter()
        out = [p.index_select(0, pages) for p in planes]
        dt = time.perf_counter() - t0
        assert out[0].shape == src[0].shape
        return dt

    # the gather is right: every layer's pages in the order asked, as [tokens, heads, dim]
    got = [p.index_select(0, pages).view(tokens, g.kv_heads, g.head_dim) for p in planes]
    for o, p in zip(got, planes):
        want = p.view(-1, g.page_tokens, g.kv_heads, g.head_dim)[pages].reshape(o.shape)
        assert torch.equal(o, want)

    def clone():
        t0 = time.perf_counter()
        out = [s.clone() for s in src]
        dt = time.perf_counter() - t0
        assert out[0].shape == src[0].shape
        return dt

    gather(), clone()
    g_s = c_s = float("inf")
    for _ in range(reps):  # interleaved, so both see the same machine
        g_s, c_s = min(g_s, gather()), min(c_s, clone())
    lease.free()
    row("python.gather_4096", {"tokens": tokens, "layers": g.layers, "bytes": nbytes,
                               "reps": reps}, nbytes / c_s / 1e9,
        "torch.clone of the same bytes (contiguous)", nbytes / g_s / 1e9, "GB/s",
        "ratio >= 0.7", "index_select of the pages (dim 0) on each layer's K and V view "
        "reshaped [pages, page_tokens*kv_heads*head_dim]; torch threads %d"
        % torch.get_num_threads())


def main():
    quick = "--quick" in sys.argv[1:]
    d = Daemon(CONF)
    try:
        with kvpool.connect(d.sock, name="bench") as c:
            rpc = c.attach("rpc")
            if quick:
                bench_alloc_free(d.sock, rpc, 2000, 1)
                bench_match(d.sock, rpc, 1 << 20, 3, 1)
            else:
                bench_alloc_free(d.sock, rpc, 20000, 3)
                bench_match(d.sock, rpc, 1 << 20, 20, 3)
            rpc.detach()
            gp = c.attach("gather")
            bench_gather(gp, 4096, 5 if quick else 20)
            gp.detach()
    finally:
        d.stop()


if __name__ == "__main__":
    main()
