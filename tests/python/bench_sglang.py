#!/usr/bin/env python3
"""bench_sglang.py [--quick] - the rows of kvpool.sglang.KvpoolLinker (SGLang's external cache
linker over kvpool's host tier), one JSON object a line in the row format of bench_kvpool.py.
Every instance is SGLang's own UnifiedRadixCache, MHATokenToKVPool and paged allocator on CPU
tensors with the linker SGLang's create_unified_cache_linker builds (sglang_instance.py):
  sglang.linker.offload   KvpoolLinker.offload of N pages (8 layers x 8 heads x 128 x 16
                          tokens fp16: 512 KiB a page) until its completion is ready, GB/s of
                          page bytes; against a torch copy of the same bytes in the same
                          process (ratio >= 0.8)
  sglang.linker.load      KvpoolLinker.load + start_layer_wise_loading + every layer
                          completed, the same pages into other device slots (ratio >= 0.8)
                          Both: 41 reps (--quick: 7, of the same 256 pages: with fewer pages
                          the calls' fixed cost, not the copy, sets the figure), each timing
                          offload, load and the torch copy back to back, the torch copy first,
                          between or last in turn; medians (the per-rep ratios' median is in
                          the note)
  sglang.l2.shared_memory host bytes that hold the prefixes of a workload spread over 4
                          instances after two passes (the second pass hits every request in
                          both setups): 4 instances on one pool against the same 4 instances
                          on a pool each (4 private L2s); bytes from the pools' books
                          (ratio <= 0.3)
  sglang.l2.cross_instance_hit_rate
                          requests not computed (device or L2 hit) of a workload whose
                          prefixes are each asked 4 times by instances drawn at random:
                          shared pool against the private pools (informational, ratio > 1)
Needs kvpoold ($KVPOOLD or build/daemon/kvpoold), the kvpool package, torch and sglang (the
engine venv scripts/pytest.sh makes, KVP_ENGINE_VENV). SGLang's page hash is a C++ extension
built on first use: it is built before anything is timed.
"""
import os
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_kvpool import row  # noqa: E402
from conftest import Daemon  # noqa: E402

L, H, D, T = 8, 8, 128, 16


def conf(pages, small_pools):
    s = f"""
[pool.lk]
layers = {L}
kv_heads = {H}
head_dim = {D}
dtype = fp16
page_tokens = {T}
device = none
host_capacity = {pages * T}t
mlock = off
"""
    for name in ["l2shared"] + [f"l2priv{i}" for i in range(4)]:
        s += f"""
[pool.{name}]
layers = 2
kv_heads = 2
head_dim = 8
dtype = fp16
page_tokens = 4
device = none
host_capacity = {small_pools}t
mlock = off
"""
    return s


def main():
    quick = "--quick" in sys.argv[1:]
    n = 256
    reps = 7 if quick else 41
    try:
        import torch
        from engine_util import import_sglang
        import_sglang()
        from sglang_instance import Instance
    except BaseException as e:  # pytest.skip raises a BaseException
        for name, unit, target in (("sglang.linker.offload", "GB/s", "ratio >= 0.8"),
                                   ("sglang.linker.load", "GB/s", "ratio >= 0.8"),
                                   ("sglang.l2.shared_memory", "bytes", "ratio <= 0.3"),
                                   ("sglang.l2.cross_instance_hit_rate", "hit rate",
                                    "ratio > 1")):
            row(name, {}, None, "", None, unit, target, f"skipped: {e}")
        return
    d = Daemon(conf(2 * n + 8, 4096))
    try:
        transfer(d, Instance, torch, n, reps)
        l2(d, Instance, quick)
    finally:
        d.stop()


def transfer(d, Instance, torch, n, reps):
    from sglang.srt.mem_cache.hicache_storage import PoolName, PoolTransfer

    inst = Instance(d.sock, "lk", layers=L, heads=H, dim=D, page=T, slots=2 * n * T + 2 * T)
    lk = inst.linker
    for layer in range(L):
        for b in inst.bufs(layer):
            b.normal_()
    src = torch.arange(T, (n + 1) * T, dtype=torch.int64)  # pages 1..n
    dst = torch.arange((n + 1) * T, (2 * n + 1) * T, dtype=torch.int64)
    page_bytes = 2 * L * T * H * D * 2
    nbytes = n * page_bytes
    a = torch.randn(nbytes // 4)
    c = torch.empty_like(a)
    import kvpool
    client = kvpool.connect(d.sock)  # the linker's own client is its threads'

    def offload(i):
        keys = [f"{i:032x}{k:032x}" for k in range(n)]
        t0 = time.perf_counter()
        assert lk.offload([PoolTransfer(name=PoolName.KV, device_indices=src, keys=keys)])
        while lk.num_completed_offloads() == 0:  # polled as SGLang's scheduler polls it,
            time.sleep(0.0002)  # without taking a core from the copies
        dt = time.perf_counter() - t0
        assert lk.pop_completed_offload() is True
        return dt, keys

    def load(keys):
        t0 = time.perf_counter()
        assert lk.load("r", [PoolTransfer(name=PoolName.KV, device_indices=dst, keys=keys)])
        index = lk.start_layer_wise_loading()
        assert lk.finish_layer_wise_loading(index)
        return time.perf_counter() - t0

    def memcpy():
        t0 = time.perf_counter()
        c.copy_(a)
        return time.perf_counter() - t0

    # warm: the page hash extension, the mapping's first touch, the copies
    _, keys = offload(-1)
    load(keys)
    client.flush("lk")
    memcpy()
    o_s, l_s, m_s = [], [], []
    for i in range(reps):  # interleaved, so every side sees the same machine; the torch copy
        if i % 3 == 0:  # goes first, between, or last in turn (what ran just before a copy
            m_s.append(memcpy())  # moves it on this machine)
        dt, keys = offload(i)
        o_s.append(dt)
        if i % 3 == 1:
            m_s.append(memcpy())
        l_s.append(load(keys))
        if i % 3 == 2:
            m_s.append(memcpy())
        client.flush("lk")
    for p in (0, n // 2, n - 1):
        for layer in (0, L - 1):
            for b in inst.bufs(layer):
                assert torch.equal(b[dst[p * T:(p + 1) * T]], b[src[p * T:(p + 1) * T]])
    inst.close()
    client.close()
    # medians: this machine's copies swing by 2x and more between runs of other work; each
    # rep's three timings are taken back to back, and the per-rep ratios are in the note
    med = statistics.median
    params = {"pages": n, "page_bytes": page_bytes, "layers": L, "reps": reps,
              "threads": torch.get_num_threads()}
    base = nbytes / med(m_s) / 1e9
    per_o = med(m / o for m, o in zip(m_s, o_s))
    per_l = med(m / lt for m, lt in zip(m_s, l_s))
    row("sglang.linker.offload", params, base, "torch copy_ of the same bytes (median)",
        nbytes / med(o_s) / 1e9, "GB/s", "ratio >= 0.8",
        f"offload() to its completion, median of {reps}: exists, a host lease, one copy_runs "
        f"of every page and layer, insert_keys; median per-rep ratio {per_o:.3f}")
    row("sglang.linker.load", params, base, "torch copy_ of the same bytes (median)",
        nbytes / med(l_s) / 1e9, "GB/s", "ratio >= 0.8",
        f"load() (match_keys with a lock) + start_layer_wise_loading + every layer landed "
        f"(one copy_buffer_runs, a group a layer), median of {reps}; median per-rep ratio "
        f"{per_l:.3f}")


def run_workload(d, Instance, pools, plan, tokens_of):
    """plan: (instance, prefix) requests in order; each instance on pools[instance]. A hit is
    a request whose prefix was not computed (its device tree or the L2 had it). Returns
    (hits, requests, instances)."""
    insts = [Instance(d.sock, pools[i], slots=4096) for i in range(4)]
    hits = 0
    for i, p in plan:
        toks = tokens_of(p)
        hits += insts[i].serve(toks, seed=p) == len(toks)
    for inst in insts:
        inst.drain()
    return hits, len(plan), insts


def host_bytes(d, pools):
    total = 0
    for name in set(pools):
        b = d.pool_books(name)["host"]
        total += b["cached_tokens"] // 4 * (2 * 2 * 4 * 2 * 8 * 2)
    return total


def l2(d, Instance, quick):
    P, pages = (8, 4) if quick else (24, 8)
    shared, private = ["l2shared"] * 4, [f"l2priv{i}" for i in range(4)]

    def tokens_of(p):
        return list(range(100000 * (p + 1), 100000 * (p + 1) + pages * 4))

    # shared memory: every instance asks every prefix, two passes
    rng = random.Random(1)
    plan = [(i, p) for _ in range(2) for p in range(P) for i in rng.sample(range(4), 4)]
    res = {}
    for label, pools in (("shared", shared), ("private", private)):
        hits, n, insts = run_workload(d, Instance, pools, plan, tokens_of)
        # the second pass alone: every request hits in both setups
        second = plan[len(plan) // 2:]
        res[label] = (host_bytes(d, pools), hits, n, second)
        for inst in insts:
            inst.close()
        for name in set(pools):
            flush(d, name)
    sb, sh, sn, _ = res["shared"]
    pb, ph, pn, _ = res["private"]
    row("sglang.l2.shared_memory", {"instances": 4, "prefixes": P, "pages_per_prefix": pages,
                                    "requests": sn},
        pb, "4 instances on a private pool each, the same requests", sb, "bytes",
        "ratio <= 0.3",
        f"host bytes holding the prefixes after two passes; hit rate shared {sh / sn:.3f}, "
        f"private {ph / pn:.3f} (second pass: every request hits in both)")
    # cross-instance hit rate: each prefix asked 4 times by instances drawn at random
    rng = random.Random(2)
    plan = [(rng.randrange(4), p) for p in range(P) for _ in range(4)]
    rng.shuffle(plan)
    rates = {}
    for label, pools in (("shared", shared), ("private", private)):
        hits, n, insts = run_workload(d, Instance, pools, plan, tokens_of)
        rates[label] = hits / n
        for inst in insts:
            inst.close()
        for name in set(pools):
            flush(d, name)
    row("sglang.l2.cross_instance_hit_rate", {"instances": 4, "prefixes": P,
                                              "requests": len(plan)},
        rates["private"], "4 instances on a private pool each, the same requests",
        rates["shared"], "hit rate", "ratio > 1",
        "requests not computed (device tree or L2 hit); each prefix asked 4 times by "
        "instances drawn at random")


def flush(d, name):
    import kvpool
    c = kvpool.connect(d.sock)
    c.flush(name)
    c.close()


if __name__ == "__main__":
    main()
