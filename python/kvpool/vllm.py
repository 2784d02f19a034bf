"""kvpool.vllm: a vLLM offloading spec whose offloaded blocks are kvpool's hash-keyed host pages.

vLLM instances on one node that attach the same kvpool pool share their offloaded KV: blocks
one instance stores are looked up and loaded by every other. Start vLLM with::

    --kv-transfer-config '{"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
        "kv_connector_extra_config": {"spec_name": "KvpoolOffloadingSpec",
            "spec_module_path": "kvpool.vllm", "pool": "llama-8b",
            "socket": "/run/kvpool/kvpoold.sock"}}'

Extra config keys: pool (required: a pool with a host tier whose page_bytes equal vLLM's
worker_kv_bytes_per_block x blocks_per_chunk, i.e. one worker's bytes of one offloaded
chunk), socket, namespace (int, default 0), timeout_ms (default 5000), events_check_ms (default
1000).

The scheduler side (KvpoolOffloadingManager) answers lookup from the pool's hash-keyed pages
and leases host pages for stores; the worker side (KvpoolOffloadingWorker) copies between
vLLM's canonical GPU block tensors and the host pages with torch copies on the package's
views (the host mapping is registered with CUDA for DMA when the blocks are on a GPU). Keys:
vLLM's OffloadKey (block hash + group index) followed by the worker rank: every worker's
shard of a block is one page, and a block is a hit only when every rank's page is cached.

kvpoold unreachable: lookup answers MISS, prepare_store None (vLLM counts an allocation
failure), loads fail (vLLM recomputes); nothing raises into the engine, and both sides attach
again by themselves.

KV events (enable_kv_cache_events): take_events reports the blocks this manager stored and,
since kvpoold evicts on its own, their removals: it re-checks the blocks it reported stored
with ExistsKeys (one call per 4,096 keys plus one per removed block, at most every
events_check_ms, default 1000, and at most 1,024 calls at a time; the rest the next time). A
block evicted, flushed or lost with a kvpoold restart is reported removed once; blocks other
instances stored are theirs to report.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Collection, Iterable
from typing import Any, Optional

import numpy as np
import torch
from vllm.v1.kv_offload.base import (
    CanonicalKVCaches,
    GPULoadStoreSpec,
    LoadStoreSpec,
    LookupResult,
    Medium,
    OffloadingEvent,
    OffloadingManager,
    OffloadingSpec,
    OffloadingWorker,
    OffloadKey,
    PrepareStoreOutput,
    ReqContext,
    RequestOffloadingContext,
    TransferResult,
)
from vllm.v1.kv_offload.config import OffloadingConfig

import kvpool
from kvpool._link import Link, geometry_mismatch

__all__ = ["KvpoolOffloadingSpec", "KvpoolOffloadingManager", "KvpoolOffloadingWorker",
           "KvpoolLoadStoreSpec"]

log = logging.getLogger("kvpool.vllm")


class KvpoolLoadStoreSpec(LoadStoreSpec):
    """kvpool host pages of offloaded chunks: pages[i, r] holds rank r's bytes of chunk i."""

    def __init__(self, pages: np.ndarray, world: int = 1):
        self.pages = np.asarray(pages, dtype=np.int64).reshape(-1, world)

    def __repr__(self) -> str:
        return f"KvpoolLoadStoreSpec({self.pages.tolist()})"


def _rank_keys(key: bytes, world: int) -> list[bytes]:
    return [bytes(key) + b"\x00r" + r.to_bytes(2, "big") for r in range(world)]


class KvpoolOffloadingSpec(OffloadingSpec):
    """The OffloadingSpec OffloadingSpecFactory loads from spec_module_path kvpool.vllm."""

    def __init__(self, config: OffloadingConfig):
        super().__init__(config)
        if "pool" not in self.extra_config:
            raise ValueError("kvpool.vllm: kv_connector_extra_config needs \"pool\"")
        self.pool_name = str(self.extra_config["pool"])
        self.socket = self.extra_config.get("socket")
        self.namespace = int(self.extra_config.get("namespace", 0))
        self.timeout_ms = int(self.extra_config.get("timeout_ms", 5000))
        self.world = config.parallel.world_size
        self.rank = config.parallel.rank
        self.chunk_bytes = config.worker_kv_bytes_per_block * self.blocks_per_chunk
        self._manager: Optional[KvpoolOffloadingManager] = None

    def check_pool(self, pool: kvpool.Pool) -> None:
        """GeometryMismatch unless the pool has host pages of one worker's chunk bytes."""
        pool.client.set_timeout(self.timeout_ms)
        g = pool.geometry
        if not pool.tier_pages("host"):
            raise geometry_mismatch(pool.name, g, g, "the pool has no host tier")
        if pool.page_bytes != self.chunk_bytes:
            raise geometry_mismatch(
                pool.name, g, g, f"page_bytes {pool.page_bytes} != vLLM's "
                f"{self.config.worker_kv_bytes_per_block} bytes per block x "
                f"{self.blocks_per_chunk} blocks per chunk")

    def get_manager(self) -> OffloadingManager:
        if self._manager is None:
            self._manager = KvpoolOffloadingManager(self)
        return self._manager

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        return KvpoolOffloadingWorker(self, kv_caches)


class KvpoolOffloadingManager(OffloadingManager):
    """Scheduler side: lookups, locks for loads and leases for stores in the pool."""

    def __init__(self, spec: KvpoolOffloadingSpec):
        self.spec = spec
        self.world = spec.world
        self.ns = spec.namespace
        self.link = Link(spec.pool_name, spec.socket, name="vllm-scheduler",
                         check=spec.check_pool)
        self.link.connect_now()
        self._loads: dict[tuple, list[Any]] = {}
        self._stores: dict[OffloadKey, tuple[Any, int]] = {}  # key -> (lease, row)
        self._rows: dict[int, np.ndarray] = {}               # lease id -> pages [n, world]
        self._events: list[OffloadingEvent] = []
        # blocks reported stored and not yet reported removed (insertion order)
        self._stored: dict[OffloadKey, None] = {}
        self._events_on = bool(getattr(spec.config, "enable_kv_cache_events", False))
        self._check_s = int(spec.extra_config.get("events_check_ms", 1000)) / 1000.0
        self._last_check = time.monotonic()

    def _kk(self, keys: Iterable[OffloadKey]) -> list[bytes]:
        out: list[bytes] = []
        for k in keys:
            out += _rank_keys(k, self.world)
        return out

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        r = self.link.call("lookup", lambda p, s: p.exists_keys(self._kk([key]),
                                                                namespace=self.ns))
        self.link.stats["lookups"] += 1
        if r == self.world:
            self.link.stats["lookup_hits"] += 1
            return LookupResult.HIT
        return LookupResult.MISS

    def prepare_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> LoadStoreSpec:
        keys = list(keys)
        m = self.link.call("load", lambda p, s: p.match_keys(self._kk(keys), namespace=self.ns,
                                                             lock=True))
        pages = np.zeros((0, self.world), dtype=np.int64)
        if m is not None:
            n = len(m.host_pages) // self.world if not len(m.device_pages) else 0
            pages = np.asarray(m.host_pages[:n * self.world], dtype=np.int64).reshape(
                n, self.world)
            self._loads.setdefault(tuple(keys), []).append(m)
        return KvpoolLoadStoreSpec(pages, self.world)

    def complete_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        ms = self._loads.get(tuple(keys))
        if not ms:
            return
        m = ms.pop(0)
        if not ms:
            del self._loads[tuple(keys)]
        self.link.call("release", lambda p, s: m.release())

    def prepare_store(self, keys: Collection[OffloadKey],
                      req_context: ReqContext) -> Optional[PrepareStoreOutput]:
        keys = list(keys)

        def go(p, s):
            todo = [k for k in keys if k not in self._stores and
                    p.exists_keys(self._kk([k]), namespace=self.ns) < self.world]
            if not todo:
                return PrepareStoreOutput([], KvpoolLoadStoreSpec(np.zeros(0), self.world), [])
            lease = p.alloc(len(todo) * self.world, tier="host")
            rows = np.asarray(lease.pages, dtype=np.int64).reshape(len(todo), self.world)
            self._rows[lease.id] = rows
            for i, k in enumerate(todo):
                self._stores[k] = (lease, i)
            return PrepareStoreOutput(todo, KvpoolLoadStoreSpec(rows, self.world), [])

        return self.link.call("store", go)

    def complete_store(self, keys: Collection[OffloadKey], req_context: ReqContext,
                       success: bool = True) -> None:
        by_lease: dict[int, tuple[Any, list[tuple[OffloadKey, int]]]] = {}
        for k in keys:
            ent = self._stores.pop(k, None)
            if ent is not None:
                by_lease.setdefault(ent[0].id, (ent[0], []))[1].append((k, ent[1]))
        for lid, (lease, items) in by_lease.items():
            rows = self._rows[lid]

            def go(p, s, lease=lease, items=items, rows=rows):
                if success:
                    kk = self._kk([k for k, _ in items])
                    pages = np.concatenate([rows[i] for _, i in items]).astype(np.uint32)
                    r = p.insert_keys(lease, kk, namespace=self.ns, pages=pages)
                    return r["done_keys"] // self.world
                return 0

            done = self.link.call("store", go) or 0
            if done and self._events_on:
                stored = [k for k, _ in items[:done]]
                self._events.append(OffloadingEvent(keys=stored, medium=Medium.CPU,
                                                    removed=False))
                self._stored.update(dict.fromkeys(stored))
            if not any(ent[0].id == lid for ent in self._stores.values()):
                del self._rows[lid]
                self.link.call("free", lambda p, s, lease=lease: (
                    lease.free() if not lease.ended and len(lease.pages) else None))

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    CHECK_KEYS = 4096   # keys of one ExistsKeys re-check
    CHECK_CALLS = 1024   # ExistsKeys calls of one take_events at most

    def _removed(self) -> list[OffloadKey]:
        """The blocks reported stored that kvpoold no longer holds (dropped from _stored)."""
        blocks, gone = list(self._stored), []
        step = max(1, self.CHECK_KEYS // self.world)

        def go(p, s):
            i, calls = 0, 0
            while i < len(blocks) and calls < self.CHECK_CALLS:
                part = blocks[i:i + step]
                calls += 1
                have = p.exists_keys(self._kk(part), namespace=self.ns) // self.world
                if have < len(part):
                    gone.append(part[have])  # the first missing one; go on after it
                i += have + 1 if have < len(part) else len(part)
            return True

        if not blocks or self.link.call("events", go) is None:
            return []
        for k in gone:
            del self._stored[k]
        return gone

    def take_events(self) -> Iterable[OffloadingEvent]:
        """The blocks stored since the last call, then those found removed."""
        ev, self._events = self._events, []
        now = time.monotonic()
        if self._events_on and now - self._last_check >= self._check_s:
            self._last_check = now
            gone = self._removed()
            if gone:
                ev.append(OffloadingEvent(keys=gone, medium=Medium.CPU, removed=True))
                self.link.stats["removed_blocks"] += len(gone)
        yield from ev

    def get_stats(self) -> Any:
        return None

    def stats(self) -> dict:
        return dict(self.link.stats)

    def shutdown(self) -> None:
        self.link.close()


class KvpoolOffloadingWorker(OffloadingWorker):
    """Worker side: copies this rank's blocks between vLLM's canonical KV tensors and the
    pool's host pages (synchronously; finished jobs are reported by get_finished)."""

    PING_S = 1.0  # how often a transfer first checks kvpoold is still the one mapped

    def __init__(self, spec: KvpoolOffloadingSpec, kv_caches: CanonicalKVCaches):
        self.spec = spec
        self.rank = spec.rank
        self.k = spec.blocks_per_chunk
        self.tensors = [t.tensor.view(t.tensor.shape[0], -1).view(torch.int8)
                        for t in kv_caches.tensors]
        sizes = [t.shape[1] for t in self.tensors]
        self.offsets = np.cumsum([0] + sizes)[:-1].tolist()
        self.sizes = sizes
        self.block_bytes = sum(sizes)
        self.cuda = any(t.is_cuda for t in self.tensors)
        self._registered: Optional[int] = None
        self.link = Link(spec.pool_name, spec.socket, name=f"vllm-worker-{self.rank}",
                         check=spec.check_pool, setup=self._setup)
        self.link.connect_now()
        self._last_ping = time.monotonic()
        self._done: list[TransferResult] = []

    def _setup(self, pool: kvpool.Pool) -> Any:
        host = torch.from_dlpack(pool.host_pages_view())
        host = host.view(host.shape[0], -1).view(torch.int8)
        if self.cuda:
            cudart = torch.cuda.cudart()
            rc = cudart.cudaHostRegister(host.data_ptr(), host.numel(), 0)
            if int(rc) != 0:
                log.warning("kvpool.vllm: cudaHostRegister failed (%s): copies are unpinned",
                            rc)
        return host.view(host.shape[0], self.k, self.block_bytes)

    def _host(self) -> Optional[torch.Tensor]:
        now = time.monotonic()
        if now - self._last_ping >= self.PING_S and self.link.pool is not None:
            self._last_ping = now
            self.link.call("ping", lambda p, s: p.client.ping())
        r = self.link.call("map", lambda p, s: s)
        return r

    def _blocks(self, spec: GPULoadStoreSpec, n: int) -> Optional[torch.Tensor]:
        ids = torch.from_numpy(spec.block_ids.astype(np.int64))
        if self.k > 1 and any(int(i) % self.k for i in spec.block_indices):
            return None  # a chunk split across the request's first block: not handled
        if ids.numel() != n * self.k:
            return None
        return ids

    def submit_store(self, job_id: int, src_spec: GPULoadStoreSpec,
                     dst_spec: LoadStoreSpec) -> bool:
        host = self._host()
        pages = torch.from_numpy(np.ascontiguousarray(dst_spec.pages[:, self.rank]))
        ids = self._blocks(src_spec, len(pages))
        ok = host is not None and ids is not None
        if ok:
            for t, off, sz in zip(self.tensors, self.offsets, self.sizes):
                src = t.index_select(0, ids.to(t.device)).view(len(pages), self.k, sz)
                host[:, :, off:off + sz].index_copy_(0, pages, src.to("cpu"))
        self._done.append(TransferResult(job_id, ok, len(pages) * self.k * self.block_bytes))
        return True

    def submit_load(self, job_id: int, src_spec: LoadStoreSpec, dst_spec: GPULoadStoreSpec,
                    expedited: bool = False) -> bool:
        host = self._host()
        pages = torch.from_numpy(np.ascontiguousarray(src_spec.pages[:, self.rank]))
        ids = self._blocks(dst_spec, len(pages))
        ok = host is not None and ids is not None and len(pages) > 0
        if ok:
            for t, off, sz in zip(self.tensors, self.offsets, self.sizes):
                src = host.index_select(0, pages)[:, :, off:off + sz].reshape(-1, sz)
                t.index_copy_(0, ids.to(t.device), src.to(t.device, non_blocking=True))
            if self.cuda:
                torch.cuda.current_stream().synchronize()
        self._done.append(TransferResult(job_id, ok, len(pages) * self.k * self.block_bytes))
        return True

    def get_finished(self) -> list[TransferResult]:
        done, self._done = self._done, []
        return done

    def wait(self, job_ids: set[int]) -> None:
        return

    def shutdown(self) -> None:
        self.link.close()
