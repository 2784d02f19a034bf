"""kvpool.vllm_connector.KvpoolConnector and kvpool.vllm_mem.DeviceRuns on the CPU: vLLM's own
KVConnectorFactory loads the connector from kv_connector_module_path; its worker refuses a pool
without a cuda device tier with GeometryMismatch saying so, and without kv_memory_pool leaves
vLLM's memory alone. DeviceRuns maps run leases of a sim device tier (shared memory with the
cuda tier's layer-first layout) as one buffer, as it maps a cuda tier with the CUDA driver:
every byte written through the buffer is in the run's pages, the pages are booked as leased
and come back on free or at the session's end; torch's pluggable-allocator entry points
(kvp_torch_malloc / kvp_torch_free in the extension) reach it. The GPU run (vLLM's buffer in a
cuda tier) is test_vllm_cuda.py's, under scripts/gpu-check.sh --device."""
import ctypes
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import DEFAULT_CONF, Daemon, pool_section
from engine_util import llama_dir

torch = pytest.importorskip("torch")
try:
    from vllm.config import (CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig,
                             SchedulerConfig, VllmConfig)
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec,
                                            KVCacheTensor)
except Exception as e:  # noqa: BLE001 - any import failure is the skip reason
    from engine_util import ENGINE_VENV_HINT
    pytest.skip(f"vLLM's connector classes do not import here: {type(e).__name__}: {e}; "
                f"{ENGINE_VENV_HINT}", allow_module_level=True)
import kvpool  # noqa: E402
from kvpool.vllm_connector import KvpoolConnector  # noqa: E402
from kvpool.vllm_mem import DeviceRuns, extension_path  # noqa: E402

BS, HEADS, DIM = 16, 2, 64
# a sim device tier of 64 pages of 2 layers x 16 tokens x 256-byte rows: 4 KiB a page's piece
# of a stripe, every page one OS page; a second of 62 pages whose pieces are 1 KiB (4-token
# pages): stripes of 62 KiB, no whole OS pages; a host-only pool
CONF = (DEFAULT_CONF
        + pool_section("vd", head_dim=DIM, device_capacity="1024t", host_capacity="1024t")
        .replace("page_tokens = 4", f"page_tokens = {BS}")
        + pool_section("odd", head_dim=DIM, device_capacity="248t")
        + pool_section("hostonly", head_dim=DIM))


@pytest.fixture(scope="module")
def dmn():
    d = Daemon(CONF)
    yield d
    d.stop()


def leased(c, pool):
    for p in c.status()["pools"]:
        if p["name"] == pool:
            return p["tiers"]["device"]["leased_tokens"]
    raise KeyError(pool)


def check_layer_first(pool, buf, first, n):
    """Piece i (layer i // 2, K or V) of the buffer is pages first .. first + n - 1 of that
    stripe of the device tier, read through the pool's own view of it."""
    run = pool.geometry.page_tokens * pool.row_bytes
    for layer in range(pool.geometry.layers):
        for kv in range(2):
            plane = torch.from_dlpack(pool.kv("device", layer, kv)).view(torch.int8).reshape(-1)
            i = 2 * layer + kv
            assert np.array_equal(plane[first * run:(first + n) * run].numpy(),
                                  buf[i * n * run:(i + 1) * n * run]), (layer, kv)


def as_array(ptr, nbytes):
    return np.frombuffer((ctypes.c_int8 * nbytes).from_address(ptr), dtype=np.int8)


def test_device_runs_map_runs_as_one_buffer(dmn):
    c = kvpool.connect(dmn.sock)
    pool = c.attach("vd")
    runs = DeviceRuns(pool, ("sim",))
    assert runs.layout.align == 1 and runs.layout.page_bytes == pool.page_bytes
    busy = pool.alloc(1, "device")
    a = runs.malloc(3 * pool.page_bytes + 1)       # 4 pages
    b = runs.malloc(2 * pool.page_bytes)
    (la, na), (lb, nb) = runs.live[a], runs.live[b]
    assert (na, nb) == (4 * pool.page_bytes, 2 * pool.page_bytes)
    fa, fb = int(la.pages[0]), int(lb.pages[0])
    assert fa == 1 and fb == 5 and int(busy.pages[0]) == 0
    assert leased(c, "vd") == 7 * BS
    rng = np.random.default_rng(7)
    for ptr, n, first in ((a, na, fa), (b, nb, fb)):
        buf = as_array(ptr, n)
        buf[:] = rng.integers(-128, 127, n, dtype=np.int8)
    for ptr, n, first in ((a, na, fa), (b, nb, fb)):
        check_layer_first(pool, as_array(ptr, n), first, n // pool.page_bytes)
    runs.free(a)
    assert la.ended and leased(c, "vd") == 3 * BS
    # the freed run is reused by the next buffer of its size
    a2 = runs.malloc(4 * pool.page_bytes)
    assert int(runs.live[a2][0].pages[0]) == 1
    runs.close()
    assert leased(c, "vd") == BS
    # a session's runs come back when it ends (the engine exits or dies)
    c2 = kvpool.connect(dmn.sock)
    r2 = DeviceRuns(c2.attach("vd"), ("sim",))
    r2.malloc(10 * pool.page_bytes)
    assert leased(c, "vd") == 11 * BS
    c2.close()
    assert leased(c, "vd") == BS
    busy.free()
    c.close()


def test_device_runs_back_when_the_engine_dies(dmn):
    """A process holding a KV cache buffer is killed (kill -9): kvpoold takes its run back."""
    c = kvpool.connect(dmn.sock)
    code = ("import sys, kvpool\n"
            "from kvpool.vllm_mem import DeviceRuns\n"
            f"r = DeviceRuns(kvpool.connect({dmn.sock!r}).attach('vd'), ('sim',))\n"
            "r.malloc(12 * r.layout.page_bytes)\n"
            "print('leased', flush=True)\n"
            "sys.stdin.read()\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "leased"
        assert leased(c, "vd") == 12 * BS
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=30)
        deadline = time.monotonic() + 10
        while leased(c, "vd") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert leased(c, "vd") == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        c.close()


def test_torch_allocator_entry_points(dmn, caplog):
    """kvp_torch_malloc / kvp_torch_free, as CUDAPluggableAllocator calls them, reach the
    installed DeviceRuns; a request past the tier answers NULL and logs why."""
    c = kvpool.connect(dmn.sock)
    pool = c.attach("vd")
    runs = DeviceRuns(pool, ("sim",))
    runs.install()
    lib = ctypes.CDLL(extension_path())
    lib.kvp_torch_malloc.restype = ctypes.c_void_p
    lib.kvp_torch_malloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    lib.kvp_torch_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int,
                                   ctypes.c_void_p]
    try:
        ptr = lib.kvp_torch_malloc(5 * pool.page_bytes, 0, None)
        assert ptr and ptr in runs.live
        assert leased(c, "vd") == 5 * BS
        as_array(ptr, 5 * pool.page_bytes)[:] = 3
        lib.kvp_torch_free(ptr, 5 * pool.page_bytes, 0, None)
        assert not runs.live and leased(c, "vd") == 0
        assert not lib.kvp_torch_malloc(1000 * pool.page_bytes, 0, None)
        assert "KV cache memory from pool vd" in caplog.text and "asked for" in caplog.text
        kvpool.set_torch_allocator(None, None)
        assert not lib.kvp_torch_malloc(pool.page_bytes, 0, None)
    finally:
        kvpool.set_torch_allocator(None, None)
        runs.close()
        c.close()


def test_device_runs_refusals(dmn):
    c = kvpool.connect(dmn.sock)
    with pytest.raises(kvpool.GeometryMismatch, match="sim, not cuda"):
        DeviceRuns(c.attach("vd"))
    with pytest.raises(kvpool.GeometryMismatch, match="no device tier"):
        DeviceRuns(c.attach("hostonly"), ("sim",))
    with pytest.raises(kvpool.GeometryMismatch, match="multiple of 4 pages"):
        DeviceRuns(c.attach("odd"), ("sim",))
    c.close()


@pytest.fixture(scope="module")
def model_config():
    d = llama_dir(HEADS, DIM)
    return ModelConfig(model=d, tokenizer=d, skip_tokenizer_init=True, dtype="float16",
                       seed=0, max_model_len=2048)


def vllm_config(model_config, sock, kv_memory_pool=None):
    extra = {"spec_name": "KvpoolOffloadingSpec", "spec_module_path": "kvpool.vllm",
             "pool": "vd", "socket": sock}
    if kv_memory_pool:
        extra["kv_memory_pool"] = kv_memory_pool
    page = 2 * BS * HEADS * DIM * 2
    kv = KVCacheConfig(
        num_blocks=64, kv_cache_tensors=[KVCacheTensor(size=2 * 64 * page, layers=["l0", "l1"],
                                                       layer_stride=64 * page,
                                                       block_stride=page)],
        kv_cache_groups=[KVCacheGroupSpec(["l0", "l1"], FullAttentionSpec(
            block_size=BS, num_kv_heads=HEADS, head_size=DIM, dtype=torch.float16))])
    cfg = VllmConfig(
        model_config=model_config,
        cache_config=CacheConfig(block_size=BS, enable_prefix_caching=True),
        scheduler_config=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=512,
                                         max_model_len=2048, enable_chunked_prefill=True,
                                         is_encoder_decoder=False),
        kv_transfer_config=KVTransferConfig(kv_connector="KvpoolConnector",
                                            kv_connector_module_path="kvpool.vllm_connector",
                                            kv_role="kv_both", kv_connector_extra_config=extra),
        device_config=DeviceConfig("cpu"))
    cfg.cache_config.num_gpu_blocks = 64
    return cfg, kv


def test_connector_loaded_by_vllm(dmn, model_config):
    """vLLM's factory builds KvpoolConnector from the module path; without kv_memory_pool it
    leaves vLLM's KV memory alone (get_mem_pool_context None)."""
    cfg, kv = vllm_config(model_config, dmn.sock)
    w = KVConnectorFactory.create_connector(cfg, KVConnectorRole.WORKER, kv)
    assert isinstance(w, KvpoolConnector)
    assert w.get_mem_pool_context() is None and w.runs is None
    w.shutdown()


def test_connector_refuses_pool_without_cuda_tier(dmn, model_config):
    cfg, kv = vllm_config(model_config, dmn.sock, kv_memory_pool="vd")
    with pytest.raises(kvpool.GeometryMismatch, match="device tier is sim, not cuda"):
        KVConnectorFactory.create_connector(cfg, KVConnectorRole.WORKER, kv)
    cfg, kv = vllm_config(model_config, dmn.sock, kv_memory_pool="hostonly")
    with pytest.raises(kvpool.GeometryMismatch, match="no device tier"):
        KVConnectorFactory.create_connector(cfg, KVConnectorRole.WORKER, kv)
    cfg, kv = vllm_config(model_config, dmn.sock, kv_memory_pool="nosuch")
    with pytest.raises(kvpool.NoSuchPool):
        KVConnectorFactory.create_connector(cfg, KVConnectorRole.WORKER, kv)
    # the scheduler side never touches KV memory
    s = KVConnectorFactory.create_connector(cfg, KVConnectorRole.SCHEDULER, kv)
    assert s.runs is None
    s.shutdown()


class SimKvpoolConnector(KvpoolConnector):
    """The connector with a sim device tier allowed: its worker leases and maps as on a GPU."""

    KV_MEMORY_BACKENDS = ("cuda", "sim")


def test_connector_worker_leases_kv_memory(dmn, model_config):
    cfg, kv = vllm_config(model_config, dmn.sock, kv_memory_pool="vd")
    w = SimKvpoolConnector(cfg, KVConnectorRole.WORKER, kv)
    c = kvpool.connect(dmn.sock)
    try:
        size = kv.kv_cache_tensors[0].size  # what allocate_kv_cache asks for
        ptr = w.runs.malloc(size)
        assert leased(c, "vd") == -(-size // w.runs.layout.page_bytes) * BS
        w.shutdown()   # no torch MemPool made (CPU): the connector frees its runs
        assert leased(c, "vd") == 0 and ptr not in w.runs.live
    finally:
        c.close()
