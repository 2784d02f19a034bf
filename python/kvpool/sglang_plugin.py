"""kvpool.sglang_plugin: SGLang's HiCache host pools in a kvpool pool's host tier.

A general plugin of SGLang (entry point "kvpool" of the sglang.srt.plugins group, which SGLang's
load_plugins() runs in every process): with KVPOOL_SGLANG_HOST_POOL=<pool> (socket:
$KVPOOL_SOCKET, else kvpool's default) it registers one AROUND hook on SGLang's HookRegistry,
on HostKVCache._allocate_host_buffer (pool_host/base.py), the method every host pool that
builds its buffers through init_kv_buffer() allocates with (MHATokenToKVPoolHost,
MLATokenToKVPoolHost, DSA's and the others deriving from HostKVCache). Without the variable it
registers nothing: installing kvpool changes nothing.

With the hook, a host pool's buffer is a contiguous run of host pages leased from the pool
(held by this process's session until it exits), instead of SGLang's own allocation, and
SGLang's psutil budget check (MemAvailable and cgroup limits divided by the ranks on the host)
is replaced: the pool's host tier was sized by kvpoold once for the node, against MemAvailable,
the NUMA node, cgroup memory.max, RLIMIT_MEMLOCK and huge pages (HOST_BUDGET_EXCEEDED at
kvpoold's start when it does not fit), and every rank and instance of the node leases from that
one tier, so the node's budget counts the tier once, however many ranks and instances lease from
it. A host pool larger than what the tier has left fails with kvpool.HostBudgetExceeded:
requested_bytes, available_bytes, limit, numa_node and pool. The limit is the one that binds:
the node's own (MemAvailable, "NUMA node free memory", "cgroup memory.max", RLIMIT_MEMLOCK,
"free huge pages", as kvpoold's budget step reads them for the tier at that moment: the pool's
host_room_bytes and host_room_limit in Status) when the request exceeds the tier's free and
evictable bytes plus all the node could still give it (available_bytes: that sum), else
"host_capacity", the tier's configured size (available_bytes: its free and evictable bytes).

SGLang's DeepSeek V4 paged and state host pools (DeepSeekV4PagedHostPool, DeepSeekV4StateHostPool
in memory_pool_host.py) check their budget and allocate in their own __init__: two more AROUND
hooks mark the pool being built (on both __init__s), and a third, on
pool_host.base.host_memory_budget_bytes (the psutil budget they call), answers for such a pool
with a contiguous run of leased host pages of its size, its allocator set to carve its buffers
out of that run, or kvpool.HostBudgetExceeded as above; called for anything else, it is
SGLang's own. Not covered: the MiniMax index-K pool, which keeps SGLang's allocation.
"""
from __future__ import annotations

import logging
import os
import threading
from typing import Any, Optional

import kvpool

__all__ = ["register", "ENV_POOL", "TARGET", "V4_TARGETS", "BUDGET_TARGET"]

log = logging.getLogger("kvpool.sglang")

ENV_POOL = "KVPOOL_SGLANG_HOST_POOL"
TARGET = "sglang.srt.mem_cache.pool_host.base.HostKVCache._allocate_host_buffer"
V4_TARGETS = ("sglang.srt.mem_cache.memory_pool_host.DeepSeekV4PagedHostPool.__init__",
              "sglang.srt.mem_cache.memory_pool_host.DeepSeekV4StateHostPool.__init__")
BUDGET_TARGET = "sglang.srt.mem_cache.pool_host.base.host_memory_budget_bytes"
_ALIGN = 256
# the V4 host pools this thread is constructing, innermost last
_building = threading.local()


def register() -> None:
    """SGLang's general plugin entry: registers the host pool hook when KVPOOL_SGLANG_HOST_POOL
    names a pool, else nothing."""
    if not os.environ.get(ENV_POOL):
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(TARGET, allocate_host_buffer, HookType.AROUND)
    for target in V4_TARGETS:
        HookRegistry.register(target, build_v4_pool, HookType.AROUND)
    HookRegistry.register(BUDGET_TARGET, host_memory_budget_bytes, HookType.AROUND)
    log.info("kvpool.sglang: HiCache host pools from kvpool pool %s", os.environ[ENV_POOL])


class HostAttachment:
    """This process's connection to the host pool's kvpool pool."""

    _lock = threading.Lock()
    _all: dict = {}

    def __init__(self, pool: str, socket: Optional[str]):
        self.client = kvpool.connect(socket, name=f"sglang-host-{os.getpid()}",
                                     reconnect_ms=4294967295)
        try:
            self.pool = self.client.attach(pool)
            if not self.pool.tier_pages("host"):
                raise kvpool.InvalidArgument(f"kvpool.sglang: pool {pool} has no host tier")
            import torch

            self.pages = torch.from_dlpack(self.pool.host_pages_view()).view(torch.uint8)
            self.pages = self.pages.reshape(self.pages.shape[0], -1)
        except BaseException:
            self.client.close()
            raise
        self.leases: list = []

    @classmethod
    def get(cls, pool: Optional[str] = None, socket: Optional[str] = None) -> "HostAttachment":
        pool = pool or os.environ.get(ENV_POOL)
        if not pool:
            raise ValueError(f"kvpool.sglang: {ENV_POOL} names no pool")
        with cls._lock:
            a = cls._all.get(pool)
            if a is None or a.client.closed:
                a = cls._all[pool] = HostAttachment(pool, socket)
            return a

    def _room(self) -> tuple[int, int, Optional[int], Optional[str]]:
        """(bytes free or evictable in the host tier, its NUMA node, what the node still gives
        the tier and the limit that binds there, as kvpoold read them now: None, None when it
        could not)."""
        for p in self.client.status()["pools"]:
            if p["name"] == self.pool.name:
                t = p["tiers"]["host"]
                per = self.pool.page_bytes // max(1, self.pool.geometry.page_tokens)
                room = (int(t["free_tokens"]) + int(t["evictable_tokens"])) * per
                c = p.get("counters", {})
                return room, int(t.get("numa_node", -1)), c.get("host_room_bytes"), \
                    c.get("host_room_limit")
        return 0, -1, None, None

    def budget_exceeded(self, requested: int, why: str) -> kvpool.HostBudgetExceeded:
        """HostBudgetExceeded naming the limit that binds: the node's (MemAvailable, NUMA node
        free memory, cgroup memory.max, RLIMIT_MEMLOCK, free huge pages: kvpoold's budget
        readings) when even a host tier grown by all the node has left could not hold the
        request, else the tier's host_capacity."""
        room, node, node_room, node_limit = self._room()
        if node_room is not None and node_limit not in (None, "none") and \
                requested > room + node_room:
            limit, available = node_limit, room + node_room
            hint = (f"the node's {node_limit} binds: {node_room} more bytes are all a larger "
                    f"host tier could take; lower --hicache-ratio / --hicache-size")
        else:
            limit, available = "host_capacity", room
            hint = ("the tier's host_capacity binds (the node has room for more): give the "
                    "pool more host capacity or lower --hicache-ratio / --hicache-size")
        e = kvpool.HostBudgetExceeded(
            f"pool {self.pool.name} host tier: a HiCache host pool of {requested} bytes, "
            f"{room} bytes free or evictable ({why}); {hint}")
        e.requested_bytes, e.available_bytes, e.limit = requested, available, limit
        e.numa_node, e.pool, e.name, e.message = node, self.pool.name, "HOST_BUDGET_EXCEEDED", \
            str(e)
        return e

    def lease_run(self, nbytes: int) -> tuple[Any, Any]:
        """(lease, uint8 tensor of nbytes) over a contiguous run of leased host pages."""
        pb = self.pool.page_bytes
        n = max(1, -(-nbytes // pb))
        try:
            lease = self.pool.alloc(n, tier="host")
        except (kvpool.OutOfCapacity, kvpool.QuotaExceeded, kvpool.LimitExceeded) as e:
            raise self.budget_exceeded(nbytes, type(e).__name__) from e
        pages = sorted(int(p) for p in lease.pages)
        if pages[-1] - pages[0] + 1 != n:
            lease.free()
            raise self.budget_exceeded(nbytes, f"no contiguous run of {n} pages")
        self.leases.append(lease)
        run = self.pages[pages[0]:pages[0] + n].reshape(-1)[:nbytes]
        return lease, run


class LeaseAllocator:
    """SGLang's HostTensorAllocator interface over one leased run: allocate() carves the
    buffers init_kv_buffer asks for out of it in order."""

    def __init__(self, run: Any):
        self.run = run
        self.used = 0
        self.dtype = None
        self.dims = None
        self.fd = None

    def allocate(self, dims: tuple, dtype: Any, device: str) -> Any:
        import math

        if device != "cpu":
            raise ValueError(f"kvpool.sglang: host pool buffers are CPU memory, not {device}")
        nbytes = math.prod(dims) * dtype.itemsize
        start = -(-self.used // _ALIGN) * _ALIGN
        if start + nbytes > self.run.numel():
            raise ValueError(f"kvpool.sglang: a host buffer of {nbytes} bytes past the "
                             f"{self.run.numel()} bytes leased for the pool")
        self.used = start + nbytes
        self.dtype, self.dims = dtype, dims
        return self.run[start:start + nbytes].view(dtype).view(dims)


def allocate_host_buffer(original: Any, self: Any) -> None:
    """HostKVCache._allocate_host_buffer on a kvpool host lease (the AROUND hook)."""
    pool = os.environ.get(ENV_POOL)
    if not pool:
        return original(self)
    requested = int(self.size) * int(self.size_per_token)
    att = HostAttachment.get(pool)
    # room for the alignment of a few buffers (a pool's buffers are carved in order)
    lease, run = att.lease_run(requested + 8 * _ALIGN)
    self.allocator = LeaseAllocator(run)
    self.kvpool_lease = lease
    log.info("kvpool.sglang: %s host pool: %d tokens, %.2f GB in pool %s's host tier",
             getattr(self, "pool_label", "kv"), self.size, requested / 1e9, att.pool.name)
    self.kv_buffer = self.init_kv_buffer()
    self.fd = None


def build_v4_pool(original: Any, self: Any, *args: Any, **kwargs: Any) -> None:
    """DeepSeekV4PagedHostPool / DeepSeekV4StateHostPool.__init__, marked as being built (the
    AROUND hook): its budget call below then leases its memory."""
    outer = getattr(_building, "pools", ())
    _building.pools = outer + (self,)
    try:
        original(self, *args, **kwargs)
    finally:
        _building.pools = outer


def host_memory_budget_bytes(original: Any, *args: Any, **kwargs: Any) -> int:
    """SGLang's psutil host budget (the AROUND hook). Called by a V4 host pool being built,
    with KVPOOL_SGLANG_HOST_POOL set: leases a contiguous run of host pages of the pool's size
    (kvpool.HostBudgetExceeded when the tier cannot give it), points the pool's allocator at
    it and answers the pool's size, so SGLang's own check passes and its buffers are carved
    from the run. Anything else: SGLang's own answer."""
    pools = getattr(_building, "pools", ())
    pool = os.environ.get(ENV_POOL)
    if not pools or not pool:
        return original(*args, **kwargs)
    obj = pools[-1]
    per = obj.item_bytes if hasattr(obj, "item_bytes") else obj.state_page_bytes
    requested = int(obj.layer_num) * int(obj.num_host_pages) * int(per)
    att = HostAttachment.get(pool)
    # every layer's buffer is carved aligned
    lease, run = att.lease_run(max(1, requested + (int(obj.layer_num) + 8) * _ALIGN))
    obj.allocator = LeaseAllocator(run)
    obj.kvpool_lease = lease
    log.info("kvpool.sglang: V4 host pool %s: %.2f GB in pool %s's host tier",
             getattr(obj, "pool_name", "?"), requested / 1e9, att.pool.name)
    return requested
