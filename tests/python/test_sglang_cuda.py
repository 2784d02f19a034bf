"""kvpool.sglang on a GPU (scripts/gpu-check.sh --device runs it): KvpoolLinker with SGLang's
MHATokenToKVPool and paged allocator on CUDA, a prefix one instance computed written through
into kvpool's host tier and loaded layer by layer into another instance's CUDA slots, the same
bytes; and the platform plugin's KV pool over a cuda device tier: its K and V buffers are the
tier's CUDA memory (by address), SGLang's own allocation calls lease and free its pages. Skips
without a CUDA device or without SGLang; kvpoold must be a CUDA build (gpu-check.sh's)."""
import json
import os
import subprocess
import sys

import pytest

from conftest import DEFAULT_CONF, pool_section
from engine_util import import_sglang

import_sglang()
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device: the CUDA paths of kvpool.sglang need a GPU",
                allow_module_level=True)
from sglang_instance import Instance  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
# "lkc": the linker's host tier; "pfc": a cuda device tier of 64 pages for the platform
CONF = (DEFAULT_CONF + pool_section("lkc", host_capacity="512t") + """
[pool.pfc]
layers = 2
kv_heads = 2
head_dim = 8
dtype = fp16
page_tokens = 4
device = cuda
device_capacity = 256t
host_capacity = 0
mlock = off
""")


def test_linker_cuda_offload_and_load(daemon):
    a = Instance(daemon.sock, "lkc", device="cuda")
    tokens = list(range(9000, 9000 + 24))
    slots = a.compute(tokens, seed=11)
    a.drain()
    want = a.read(slots)
    st = a.linker.stats()
    assert st["offload_pages"] == 6 and not st.get("offload_dropped"), st
    assert daemon.pool_books("lkc")["host"]["cached_tokens"] == 24
    b = Instance(daemon.sock, "lkc", device="cuda")
    for layer in range(b.layers):
        for buf in b.bufs(layer):
            assert buf.is_cuda
            buf.fill_(-3)
    device_prefix, got, failed = b.fetch(tokens)
    assert device_prefix == 0 and not failed and got is not None
    loaded, data = got
    assert len(loaded) == 24
    for x, y in zip(data, want):
        assert torch.equal(x.cpu(), y.cpu())
    assert b.linker.stats()["load_pages"] == 6
    a.close()
    b.close()


PLATFORM = r"""
import json, os, sys, torch
os.environ["SGLANG_PLATFORM"] = "kvpool"
os.environ["KVPOOL_SGLANG_POOL"] = "pfc"
os.environ["KVPOOL_SOCKET"] = {sock!r}
from sglang.srt.platforms import current_platform
from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler
set_global_server_args_for_scheduler(ServerArgs(model_path="dummy", page_size=4))
import kvpool
kv_cls = current_platform.get_kv_pool_cls(kind="mha")
alloc_cls = current_platform.get_paged_allocator_cls()
kv = kv_cls(size=1024, page_size=4, dtype=torch.float16, head_num=2, head_dim=8, layer_num=2,
            device="cuda", enable_memory_saver=False)
alloc = alloc_cls(1024, page_size=4, dtype=torch.float16, device="cuda", kvcache=kv,
                  need_sort=False)
pool = kv.kvpool_attachment.pool
view = torch.from_dlpack(pool.kv("device", 1, 1))
out = {{"cuda": kv.k_buffer[0].is_cuda and kv.v_buffer[1].is_cuda,
        "same": kv.v_buffer[1].data_ptr() == view.data_ptr(),
        "size": kv.size}}
slots = alloc.alloc(4 * 5)
kv.v_buffer[1][slots] = 2.5
torch.cuda.synchronize()
out["seen"] = bool((view[slots] == 2.5).all())
out["held"] = alloc.held_pages()
alloc.free(slots)
print(json.dumps(out), flush=True)
"""


def test_platform_kv_pool_on_a_cuda_tier(daemon):
    r = subprocess.run([sys.executable, "-c", PLATFORM.format(sock=daemon.sock)],
                       capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PYTHONWARNINGS="ignore"))
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["cuda"] and out["same"] and out["seen"], out
    assert out["size"] == 63 * 4 and out["held"] >= 5, out
