"""The kvpool platform plugin for SGLang 0.5.23 (kvpool.sglang_platform): SGLang's MHA KV pool
whose buffers are views of a pool's device tier (sim here) and its paged allocator leasing the
pages from kvpool, driven with SGLang's own allocation calls (alloc_paged_token_slots_extend,
alloc_paged_token_slots_decode, free of a request's slots, the radix cache's inserts), two
instances in two processes contending for one tier."""
import json
import os
import subprocess
import sys
import time

import pytest

from conftest import DEFAULT_CONF, pool_section
from engine_util import import_sglang

import_sglang()
torch = pytest.importorskip("torch")
import kvpool  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
T = 4
# device tiers of 64 pages (fp16, 2 layers x 2 heads x 8, 4-token pages); "pfwide" another
# head_dim; "pfhost" a host tier only
CONF = (DEFAULT_CONF + pool_section("pf", device_capacity="256t", host_capacity="0")
        + pool_section("pf2", device_capacity="256t", host_capacity="0")
        + pool_section("pfwide", head_dim=16, device_capacity="64t", host_capacity="0")
        + pool_section("pfhost", host_capacity="64t")
        # an MLA model of 3 layers, latent 12 + 4: 2 tier layers of one head of 16
        + pool_section("pfmla", layers=2, kv_heads=1, head_dim=16, device_capacity="64t",
                       host_capacity="0"))

BUILD = r"""
import os, sys, torch
sys.path.insert(0, {here!r})
os.environ["SGLANG_PLATFORM"] = "kvpool"
os.environ["KVPOOL_SGLANG_POOL"] = {pool!r}
os.environ["KVPOOL_SOCKET"] = {sock!r}
from sglang.srt.platforms import current_platform
from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler
set_global_server_args_for_scheduler(ServerArgs(model_path="dummy", page_size=4))
from sglang.srt.mem_cache.allocation import (alloc_paged_token_slots_extend,
                                             alloc_paged_token_slots_decode)
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
from sglang.srt.mem_cache.unified_cache.components import ComponentType
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
kv_cls = current_platform.get_kv_pool_cls(kind="mha")
alloc_cls = current_platform.get_paged_allocator_cls()
kv = kv_cls(size=1024, page_size=4, dtype=torch.float16, head_num=2, head_dim=8, layer_num=2,
            device="cpu", enable_memory_saver=False)
alloc = alloc_cls(1024, page_size=4, dtype=torch.float16, device="cpu", kvcache=kv,
                  need_sort=False)
r2t = ReqToTokenPool(size=16, max_context_len=1024, device="cpu", enable_memory_saver=False)
cache = UnifiedRadixCache(CacheInitParams(
    req_to_token_pool=r2t, token_to_kv_pool_allocator=alloc, page_size=4, disable=False,
    tree_components=(ComponentType.FULL,)))


def extend(lens):
    '''A prefill batch of requests of lens tokens (no cached prefix), as SGLang's scheduler
    allocates it.'''
    z = torch.zeros(len(lens), dtype=torch.int64)
    s = torch.tensor(lens, dtype=torch.int64)
    return alloc_paged_token_slots_extend(cache, z, z, s, s, z - 1, int(sum(lens)))
"""


def build_code(sock, pool):
    return BUILD.format(here=HERE, pool=pool, sock=sock)


def run_here(sock, pool):
    """The platform's classes built in this process, as SGLang builds them once
    SGLANG_PLATFORM=kvpool selected the platform; returns the namespace."""
    ns: dict = {}
    env = {"SGLANG_PLATFORM": "kvpool", "KVPOOL_SGLANG_POOL": pool, "KVPOOL_SOCKET": sock}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    import sglang.srt.platforms as plat
    saved = plat._current_platform
    plat._current_platform = None
    try:
        exec(build_code(sock, pool), ns)  # noqa: S102 - the same code the child runs
    finally:
        plat._current_platform = saved
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return ns


def test_activate_only_when_selected(monkeypatch):
    from kvpool import sglang_platform

    monkeypatch.delenv("SGLANG_PLATFORM", raising=False)
    assert sglang_platform.activate() is None
    monkeypatch.setenv("SGLANG_PLATFORM", "cuda-other")
    assert sglang_platform.activate() is None
    monkeypatch.setenv("SGLANG_PLATFORM", "kvpool")
    monkeypatch.delenv("KVPOOL_SGLANG_POOL", raising=False)
    with pytest.raises(ValueError, match="KVPOOL_SGLANG_POOL"):
        sglang_platform.activate()
    monkeypatch.setenv("KVPOOL_SGLANG_POOL", "pf")
    want = "Cuda" if torch.cuda.is_available() else "Cpu"
    assert sglang_platform.activate() == f"kvpool.sglang_platform.Kvpool{want}Platform"


def test_sglang_resolves_the_platform(daemon):
    """SGLang's own platform discovery (the installed entry point): SGLANG_PLATFORM=kvpool
    gives kvpool's platform, a subclass of the machine's; unset, SGLang's default."""
    code = ("import sglang.srt.platforms as p; from sglang.srt.platforms.cpu import "
            "CpuSRTPlatform; from sglang.srt.platforms.cuda import CudaSRTPlatform; "
            "c = p.current_platform; print(type(c).__module__, type(c).__name__, "
            "isinstance(c, (CpuSRTPlatform, CudaSRTPlatform)))")
    env = dict(os.environ, PYTHONWARNINGS="ignore", KVPOOL_SGLANG_POOL="pf",
               KVPOOL_SOCKET=daemon.sock, SGLANG_PLATFORM="kvpool")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    mod, name, sub = r.stdout.split()[-3:]
    assert mod == "kvpool.sglang_platform" and name.startswith("Kvpool") and sub == "True"
    env.pop("SGLANG_PLATFORM")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split()[-3] != "kvpool.sglang_platform"


def test_allocator_on_the_device_tier(daemon):
    ns = run_here(daemon.sock, "pf")
    kv, alloc, extend = ns["kv"], ns["alloc"], ns["extend"]
    books = lambda: daemon.pool_books("pf")["device"]  # noqa: E731
    assert books()["leased_tokens"] == 0 and alloc.held_pages() == 0  # idle: nothing held
    # a prefill of two requests (7 and 9 tokens: 2 + 3 pages)
    out = extend([7, 9])
    assert out.numel() == 16 and len(torch.unique(out // T)) == 5
    assert not bool((out < T).any())  # the padding page is never handed out
    held = alloc.held_pages()
    assert books()["leased_tokens"] == held * T and held >= 5
    # the bytes SGLang writes at the slots are the tier's: another client reads them
    kv.k_buffer[1][out] = torch.arange(16, dtype=torch.float16)[:, None, None].expand(16, 2, 8)
    c = kvpool.connect(daemon.sock)
    p = c.attach("pf")
    k1 = torch.from_dlpack(p.kv("device", 1, 0))
    assert torch.equal(k1[out][:, 0, 0], torch.arange(16, dtype=torch.float16))
    # decode steps through SGLang's own call, crossing page boundaries
    from sglang.srt.mem_cache.allocation import alloc_paged_token_slots_decode
    r1, r2 = list(out[:7]), list(out[7:])
    for _ in range(6):
        seq = torch.tensor([len(r1) + 1, len(r2) + 1])
        last = torch.tensor([int(r1[-1]), int(r2[-1])])
        loc = alloc_paged_token_slots_decode(ns["cache"], seq, seq, last, 2)
        r1.append(loc[0]), r2.append(loc[1])
    assert (int(r1[-1]) + 1) % T == len(r1) % T
    slots = torch.tensor([int(x) for x in r1 + r2])
    assert len(torch.unique(slots)) == len(slots)
    # a request finishes: its pages go back to kvpool at once
    alloc.free(torch.tensor([int(x) for x in r1]))
    assert books()["leased_tokens"] == alloc.held_pages() * T < held * T + 2 * T
    alloc.free(torch.tensor([int(x) for x in r2]))
    pad = T if alloc._padding else 0
    assert alloc.held_pages() * T == pad and books()["leased_tokens"] == pad
    p.detach(), c.close()
    kv.kvpool_attachment.close()


CHILD = r"""
{build}
import json
held = extend([4 * 40])  # 40 pages of the 64
print(json.dumps({{"held": alloc.held_pages()}}), flush=True)
sys.stdin.readline()
"""


def test_two_instances_contend(daemon):
    """Instance A (another process) holds most of the tier; B's prefill that does not fit
    fails with kvpool's OutOfCapacity figures through SGLang's allocation call; A killed, its
    pages are B's at once."""
    code = CHILD.format(build=build_code(daemon.sock, "pf2"))
    a = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=dict(os.environ, PYTHONWARNINGS="ignore"))
    try:
        line = a.stdout.readline()
        assert line, a.stderr.read()[-3000:]
        a_held = json.loads(line)["held"]
        assert a_held >= 40
        ns = run_here(daemon.sock, "pf2")
        extend, alloc = ns["extend"], ns["alloc"]
        first = extend([4 * 8])  # fits
        with pytest.raises(kvpool.OutOfCapacity) as e:
            extend([4 * 20])  # 20 pages: more than the tier has left
        err = e.value
        assert err.tier == "device" and err.requested_tokens >= T
        assert err.free_tokens < 20 * T and err.total_tokens == 256
        assert err.other_sessions_tokens >= a_held * T
        assert err.held_tokens == alloc.held_pages() * T
        assert "other sessions" in str(err) and "Try to lower" not in str(err)
        a.kill()
        a.wait()
        # the killed instance's session is gone: its pages come back at once
        end = time.monotonic() + 5
        while True:
            try:
                out = extend([4 * 20])
                break
            except kvpool.OutOfCapacity:
                assert time.monotonic() < end
                time.sleep(0.01)
        assert out.numel() == 80 and first.numel() == 32
        ns["kv"].kvpool_attachment.close()
    finally:
        if a.poll() is None:
            a.kill()
            a.wait()


def test_bad_input(daemon):
    with pytest.raises(kvpool.GeometryMismatch) as e:
        run_here(daemon.sock, "pfwide")
    assert tuple(e.value.expected) == (2, 2, 8, "fp16", 4)
    assert tuple(e.value.actual) == (2, 2, 16, "fp16", 4)
    with pytest.raises(kvpool.GeometryMismatch, match="device tier"):
        run_here(daemon.sock, "pfhost")
    with pytest.raises(kvpool.NoSuchPool):
        run_here(daemon.sock, "nope")
    from kvpool.sglang_platform import KvpoolCpuPlatform
    plat = KvpoolCpuPlatform()
    mha, mla = plat.get_kv_pool_cls(kind="mha"), plat.get_kv_pool_cls(kind="mla")
    env = {"KVPOOL_SGLANG_POOL": "pfmla", "KVPOOL_SOCKET": daemon.sock}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        # page size 1: SGLang's own allocator would hand out the tier's slots unleased
        with pytest.raises(ValueError, match="page size 1"):
            mha(size=64, page_size=1, dtype=torch.float16, head_num=1, head_dim=16,
                layer_num=4, device="cpu", enable_memory_saver=False)
        # an MLA model the pool does not fit: both geometries named
        with pytest.raises(kvpool.GeometryMismatch) as e:
            mla(size=64, page_size=4, dtype=torch.float16, kv_lora_rank=24,
                qk_rope_head_dim=8, layer_num=3, device="cpu", enable_memory_saver=False)
        assert tuple(e.value.expected) == (2, 1, 32, "fp16", 4)
        assert tuple(e.value.actual) == (2, 1, 16, "fp16", 4)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    # the allocator with another KV pool
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
    from kvpool.sglang_platform_pool import KvpoolPagedAllocator
    plain = MHATokenToKVPool(size=64, page_size=4, dtype=torch.float16, head_num=2, head_dim=8,
                             layer_num=2, device="cpu", enable_memory_saver=False)
    with pytest.raises(ValueError, match="KV pool"):
        KvpoolPagedAllocator(64, 4, torch.float16, "cpu", plain, False)


def test_mla_pool_on_the_device_tier(daemon, monkeypatch):
    """SGLang's MLA KV pool through the platform: each layer's latent buffer is half a tier
    layer (layer m: the K half of tier layer m // 2 for even m, the V half for odd m), by
    address; SGLang's allocation calls lease and free its pages."""
    from kvpool.sglang_platform import KvpoolCpuPlatform
    from kvpool.sglang_platform_pool import KvpoolPagedAllocator

    monkeypatch.setenv("KVPOOL_SGLANG_POOL", "pfmla")
    monkeypatch.setenv("KVPOOL_SOCKET", daemon.sock)
    mla = KvpoolCpuPlatform().get_kv_pool_cls(kind="mla")
    kv = mla(size=1024, page_size=4, dtype=torch.float16, kv_lora_rank=12, qk_rope_head_dim=4,
             layer_num=3, device="cpu", enable_memory_saver=False)
    assert kv.size == 15 * T and len(kv.kv_buffer) == 3  # 16 pages, page 0 the padding
    c = kvpool.connect(daemon.sock)
    p = c.attach("pfmla")
    mine = kv.kvpool_attachment.pool  # the platform's own mapping of the tier
    for m in range(3):
        assert kv.kv_buffer[m].data_ptr() == mine.slot_address("device", m // 2, m % 2, 0)
        assert tuple(kv.kv_buffer[m].shape) == (16 * T, 1, 16)
    assert kv.data_ptrs.tolist() == [b.data_ptr() for b in kv.kv_buffer]
    alloc = KvpoolPagedAllocator(1024, page_size=4, dtype=torch.float16, device="cpu",
                                 kvcache=kv, need_sort=False)
    slots = alloc.alloc(5 * T)
    assert slots is not None and not bool((slots < T).any())
    assert daemon.pool_books("pfmla")["device"]["leased_tokens"] >= 5 * T
    # a write to layer 1's latent lands in the V half of tier layer 0, not in layer 0's
    kv.kv_buffer[1][slots] = 1.5
    odd = torch.from_dlpack(p.kv("device", 0, 1))
    assert bool((odd[slots] == 1.5).all()) and not bool((kv.kv_buffer[0][slots] == 1.5).any())
    alloc.free(slots)
    pad = T if alloc._padding else 0
    assert daemon.pool_books("pfmla")["device"]["leased_tokens"] == pad
    p.detach(), c.close()
    kv.kvpool_attachment.close()
