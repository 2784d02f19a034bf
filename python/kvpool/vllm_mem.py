"""kvpool.vllm_mem: an engine's whole GPU KV cache in a kvpool pool's device tier, as one buffer.

vLLM allocates its KV cache as one buffer (allocate_kv_cache: one torch.zeros of int8 holding
every KV cache tensor) inside the context its KV connector's get_mem_pool_context returns.
KvpoolConnector (kvpool.vllm_connector) returns torch.cuda.use_mem_pool of a MemPool whose
CUDAPluggableAllocator is this module's DeviceRuns: each malloc leases a run of consecutive
device pages (Pool.alloc(run_align=...)) and maps the tier's bytes of those pages back to back
into one range of addresses; free unmaps it and ends the lease. The pages are leased like any
others: counted in the pool's books (kvpoolctl status, metrics), returned when the engine frees
them or its session ends (the process exits or dies), so the vLLM instances of a node lease
their KV memory from one pool and give it back.

The device tier is laid out layer-first: 2 x layers stripes (K and V of each layer), each of
tier pages x page_tokens rows; page p is row run p of every stripe. A run of n pages from page
f is therefore 2 x layers pieces of n x page_tokens x row bytes, piece i at i x stripe + f x
page_tokens x row of the tier. A cuda tier is mapped with the CUDA driver's virtual memory API
(the tier's exported POSIX fd imported once, cuMemAddressReserve, one cuMemMap a piece,
cuMemSetAccess), a sim tier (shared memory standing in for a GPU) with mmap of the memfd at
fixed addresses: the same arithmetic, which the CPU tests run. The pieces must be whole mapping
granules (CUDA's allocation granularity; the OS page for sim): a run starts at a multiple of
run_align pages and holds a multiple of it, and the stripe bytes must be whole granules too; a
pool whose device tier is not cannot hold a KV cache buffer and is refused with GeometryMismatch
naming a page count that would do.
"""
from __future__ import annotations

import ctypes
import logging
import math
import mmap
import os
from typing import Any

import kvpool
from kvpool._link import geometry_mismatch

__all__ = ["DeviceRuns", "RunLayout", "refuse_without_device_tier"]

log = logging.getLogger("kvpool.vllm_mem")


def refuse_without_device_tier(pool: kvpool.Pool, backends: tuple = ("cuda",)) -> None:
    """GeometryMismatch unless the pool has a device tier of one of backends."""
    g = pool.geometry
    if not pool.tier_pages("device"):
        raise geometry_mismatch(pool.name, g, g, "the pool has no device tier: an engine's KV "
                                "cache memory needs a device tier (backend cuda)")
    b = pool.tier_backend("device")
    if b not in backends:
        raise geometry_mismatch(pool.name, g, g, f"the pool's device tier is {b}, not "
                                f"{' or '.join(backends)}: an engine's KV cache memory needs "
                                "GPU memory (device_backend = cuda)")


class RunLayout:
    """Where a run of device pages lies in the tier: 2 x layers pieces."""

    def __init__(self, pool: kvpool.Pool, granule: int):
        g = pool.geometry
        self.stripes = 2 * g.layers
        self.tier_pages = pool.tier_pages("device")
        self.run_bytes = g.page_tokens * pool.row_bytes     # one page's bytes of one stripe
        self.stripe = self.tier_pages * self.run_bytes
        self.page_bytes = self.stripes * self.run_bytes
        self.granule = granule
        # pages whose bytes of one stripe are whole granules
        self.align = granule // math.gcd(self.run_bytes, granule)
        if self.stripe % granule:
            fit = self.tier_pages // self.align * self.align
            raise geometry_mismatch(
                pool.name, g, g, f"the device tier's stripes ({self.tier_pages} pages x "
                f"{self.run_bytes} bytes) are not whole mapping granules of {granule} bytes: "
                f"give the tier a multiple of {self.align} pages (e.g. {fit}) to hold an "
                "engine's KV cache buffer")

    def pages_for(self, nbytes: int) -> int:
        """Pages of a run holding nbytes: whole multiples of align."""
        n = -(-max(1, nbytes) // self.page_bytes)
        return -(-n // self.align) * self.align

    def pieces(self, first: int, n: int) -> list[tuple[int, int, int]]:
        """(offset in the buffer, offset in the tier, bytes) of each piece of the run."""
        size = n * self.run_bytes
        return [(i * size, i * self.stripe + first * self.run_bytes, size)
                for i in range(self.stripes)]


class _SimMaps:
    """Maps pieces of a sim tier's memfd at fixed addresses of one reserved range."""

    granule = mmap.PAGESIZE

    def __init__(self, pool: kvpool.Pool):
        self.fd = pool.tier_fd("device")
        libc = ctypes.CDLL(None, use_errno=True)
        self.mmap = libc.mmap
        self.mmap.restype = ctypes.c_void_p
        self.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                              ctypes.c_int, ctypes.c_long]
        self.munmap = libc.munmap
        self.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]

    def map(self, pieces: list, total: int) -> int:
        fail = ctypes.c_void_p(-1).value
        base = self.mmap(None, total, 0, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS |  # PROT_NONE
                         getattr(mmap, "MAP_NORESERVE", 0), -1, 0)
        if base == fail:
            raise OSError(ctypes.get_errno(), "mmap of the run's address range failed")
        for at, off, size in pieces:
            r = self.mmap(base + at, size, mmap.PROT_READ | mmap.PROT_WRITE,
                          mmap.MAP_SHARED | 0x10, self.fd, off)  # MAP_FIXED
            if r == fail:
                err = ctypes.get_errno()
                self.munmap(base, total)
                raise OSError(err, f"mmap of the device tier at {off} failed")
        return base

    def unmap(self, base: int, total: int) -> None:
        self.munmap(base, total)

    def close(self) -> None:
        pass


class _CudaMaps:
    """Maps pieces of a cuda tier (its exported POSIX fd, imported once) into reserved device
    addresses with the CUDA driver's virtual memory API."""

    POSIX_FD, PINNED, DEVICE, RW = 1, 1, 1, 3

    class _Loc(ctypes.Structure):
        _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]

    class _Prop(ctypes.Structure):
        _fields_ = [("type", ctypes.c_int), ("handle_types", ctypes.c_int),
                    ("loc_type", ctypes.c_int), ("loc_id", ctypes.c_int),
                    ("win32", ctypes.c_void_p), ("flags", ctypes.c_ubyte * 8)]

    class _Access(ctypes.Structure):
        _fields_ = [("loc_type", ctypes.c_int), ("loc_id", ctypes.c_int),
                    ("flags", ctypes.c_int)]

    def __init__(self, pool: kvpool.Pool):
        self.cu = ctypes.CDLL("libcuda.so.1")
        self.device = pool.tier_cuda_device("device")
        fd = pool.tier_fd("device")
        if fd < 0 or self.device < 0:
            raise RuntimeError("kvpool.vllm_mem: the cuda device tier is not mapped in this "
                               "process (kvpool built without CUDA, or no such GPU here)")
        self._check(self.cu.cuInit(0), "cuInit")
        prop = self._Prop(type=self.PINNED, handle_types=self.POSIX_FD,
                          loc_type=self.DEVICE, loc_id=self.device)
        g = ctypes.c_size_t()
        self._check(self.cu.cuMemGetAllocationGranularity(ctypes.byref(g), ctypes.byref(prop),
                                                          0), "cuMemGetAllocationGranularity")
        self.granule = int(g.value)
        h = ctypes.c_ulonglong()
        self._check(self.cu.cuMemImportFromShareableHandle(
            ctypes.byref(h), ctypes.c_void_p(fd), self.POSIX_FD),
            "cuMemImportFromShareableHandle")
        self.handle = h.value

    @staticmethod
    def _check(rc: int, what: str) -> None:
        if rc:
            raise RuntimeError(f"kvpool.vllm_mem: {what}: CUDA driver error {rc}")

    def map(self, pieces: list, total: int) -> int:
        cu, base = self.cu, ctypes.c_ulonglong()
        self._check(cu.cuMemAddressReserve(
            ctypes.byref(base), ctypes.c_size_t(total), ctypes.c_size_t(self.granule),
            ctypes.c_ulonglong(0), ctypes.c_ulonglong(0)), "cuMemAddressReserve")
        done = 0
        try:
            for at, off, size in pieces:
                self._check(cu.cuMemMap(
                    ctypes.c_ulonglong(base.value + at), ctypes.c_size_t(size),
                    ctypes.c_size_t(off), ctypes.c_ulonglong(self.handle),
                    ctypes.c_ulonglong(0)), "cuMemMap")
                done = at + size
            acc = self._Access(loc_type=self.DEVICE, loc_id=self.device, flags=self.RW)
            self._check(cu.cuMemSetAccess(base, ctypes.c_size_t(total), ctypes.byref(acc),
                                          ctypes.c_size_t(1)), "cuMemSetAccess")
        except Exception:
            if done:
                cu.cuMemUnmap(base, ctypes.c_size_t(done))
            cu.cuMemAddressFree(base, ctypes.c_size_t(total))
            raise
        return base.value

    def unmap(self, base: int, total: int) -> None:
        self.cu.cuMemUnmap(ctypes.c_ulonglong(base), ctypes.c_size_t(total))
        self.cu.cuMemAddressFree(ctypes.c_ulonglong(base), ctypes.c_size_t(total))

    def close(self) -> None:
        if self.handle:
            self.cu.cuMemRelease(ctypes.c_ulonglong(self.handle))
            self.handle = 0


class DeviceRuns:
    """Buffers of a pool's device tier, each a run lease mapped as one range: malloc(nbytes)
    and free(address), and the same as torch's pluggable allocator calls them (torch_malloc,
    torch_free, registered with kvpool.set_torch_allocator by install())."""

    def __init__(self, pool: kvpool.Pool, backends: tuple = ("cuda",)):
        refuse_without_device_tier(pool, backends)
        self.pool = pool
        self.maps: Any = (_CudaMaps(pool) if pool.tier_backend("device") == "cuda"
                          else _SimMaps(pool))
        self.layout = RunLayout(pool, self.maps.granule)
        self.live: dict[int, tuple[Any, int]] = {}  # address -> (lease, bytes mapped)

    def malloc(self, nbytes: int) -> int:
        """An address of at least nbytes (whole pages of a run); raises kvpool's typed errors
        (OutOfCapacity names the run asked for)."""
        n = self.layout.pages_for(nbytes)
        lease = self.pool.alloc(n, tier="device", run_align=self.layout.align)
        total = n * self.layout.page_bytes
        try:
            base = self.maps.map(self.layout.pieces(int(lease.pages[0]), n), total)
        except BaseException:
            lease.free()
            raise
        self.live[base] = (lease, total)
        return base

    def free(self, ptr: int) -> None:
        ent = self.live.pop(ptr, None)
        if ent is None:
            return
        lease, total = ent
        self.maps.unmap(ptr, total)
        if not lease.ended:
            lease.free()

    def torch_malloc(self, size: int, device: int, stream: int) -> int:
        try:
            return self.malloc(size)
        except kvpool.Error as e:  # torch raises its out-of-memory error on 0
            log.error("kvpool.vllm_mem: %d bytes of KV cache memory from pool %s: %s", size,
                      self.pool.name, e)
            return 0

    def torch_free(self, ptr: int, size: int, device: int, stream: int) -> None:
        self.free(ptr)

    def install(self) -> None:
        """Makes this the allocator behind kvpool's kvp_torch_malloc / kvp_torch_free."""
        kvpool.set_torch_allocator(self.torch_malloc, self.torch_free)

    def close(self) -> None:
        for ptr in list(self.live):
            self.free(ptr)
        self.maps.close()


def extension_path() -> str:
    """The file torch's CUDAPluggableAllocator loads kvp_torch_malloc / kvp_torch_free from."""
    from kvpool import _kvpool
    return os.path.abspath(_kvpool.__file__)


def torch_mem_pool(runs: DeviceRuns) -> Any:
    """A torch.cuda.MemPool whose allocations are runs' buffers (installed as the allocator)."""
    import torch
    runs.install()
    alloc = torch.cuda.memory.CUDAPluggableAllocator(extension_path(), "kvp_torch_malloc",
                                                     "kvp_torch_free")
    return torch.cuda.MemPool(alloc.allocator())

