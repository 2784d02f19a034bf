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

Every KV cache group vLLM offloads (full attention, sliding window, Mamba state, EAGLE/MTP
draft layers) is kept: a page holds one worker's bytes of one chunk of one group, laid out as
vLLM's CPU offloading lays out a chunk (kvpool.vllm_copy.PageLayout); a pool whose pages cannot
hold the layout is refused with GeometryMismatch naming the bytes each group needs.

The scheduler side (KvpoolOffloadingManager) answers lookup from the pool's hash-keyed pages
and leases host pages for stores; it finds a load's lock and a store's pages by the keys
themselves, whatever container or order vLLM passes back, and inserts each group's keys as a
chain in their order in the request (chained to the request's previous chunk of that group).
The worker side (KvpoolOffloadingWorker) copies between vLLM's canonical block tensors and
the host pages directly (no staging buffer; kvpool.vllm_copy). Keys: vLLM's OffloadKey (block
hash + group index) followed by the worker rank: every worker's shard of a block is one page,
and a block is a hit only when every rank's page is cached.

Tiers below host: blocks kvpoold's disk tier (or remote tier) holds are hits too; the load
fetches them into host pages (FetchKeys, locked) before the worker copies them into vLLM's
blocks. Counted: lookup_hits_below, fetched_pages, fetch_missed_pages.

kvpoold unreachable: lookup answers MISS, prepare_store None (vLLM counts an allocation
failure), loads fail; nothing raises into the engine, and both sides attach again by
themselves.

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
    get_offload_group_idx,
)
from vllm.v1.kv_offload.config import OffloadingConfig

import kvpool
from kvpool._link import Link, geometry_mismatch, held_pages, match_or_fetch
from kvpool.vllm_copy import CpuCopier, CudaCopier, HostPages, PageLayout

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

    def group_kinds(self) -> list[str]:
        """Each offloaded group's kind as vLLM's config states it."""
        out = []
        for g in self.config.groups:
            w = g.sliding_window_size_in_chunks
            out.append(f"vLLM group {g.group_id}, " + (
                "full" if w is None else f"sliding window of {w} chunks"))
        return out

    def check_pool(self, pool: kvpool.Pool, layout: Optional[PageLayout] = None) -> None:
        """GeometryMismatch unless the pool has host pages of one worker's chunk bytes (and,
        given the worker's layout, pages every group's chunk fits in)."""
        pool.client.set_timeout(self.timeout_ms)
        g = pool.geometry
        if not pool.tier_pages("host"):
            raise geometry_mismatch(pool.name, g, g, "the pool has no host tier")
        if pool.page_bytes != self.chunk_bytes:
            raise geometry_mismatch(
                pool.name, g, g, f"page_bytes {pool.page_bytes} != vLLM's "
                f"{self.config.worker_kv_bytes_per_block} bytes per block x "
                f"{self.blocks_per_chunk} blocks per chunk")
        if layout is not None and layout.page_bytes > pool.page_bytes:
            raise geometry_mismatch(
                pool.name, g, g, f"vLLM's KV cache layout needs pages of {layout.page_bytes} "
                f"bytes ({layout.describe(self.group_kinds())}), the pool's hold "
                f"{pool.page_bytes}")

    def get_manager(self) -> OffloadingManager:
        if self._manager is None:
            self._manager = KvpoolOffloadingManager(self)
        return self._manager

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        return KvpoolOffloadingWorker(self, kv_caches)


def _refuse_at_start(link: Link, mismatch: list) -> None:
    """Raises the GeometryMismatch of the first attach (kvpoold reachable, pool refused): a
    pool that cannot hold the layout is refused when the engine starts. Later attaches that
    meet one count it and answer misses."""
    if link.pool is None and mismatch:
        raise mismatch[0]


class KvpoolOffloadingManager(OffloadingManager):
    """Scheduler side: lookups, locks for loads and leases for stores in the pool."""

    MAX_TAILS = 65536  # (request, group) chain tails kept

    def __init__(self, spec: KvpoolOffloadingSpec):
        self.spec = spec
        self.world = spec.world
        self.ns = spec.namespace
        mismatch: list = []

        def check(pool: kvpool.Pool) -> None:
            try:
                spec.check_pool(pool)
            except kvpool.GeometryMismatch as e:
                mismatch.append(e)
                raise

        self.link = Link(spec.pool_name, spec.socket, name="vllm-scheduler", check=check)
        self.link.connect_now()
        _refuse_at_start(self.link, mismatch)
        mismatch.clear()
        # locks of prepared loads by their keys' set (complete_load gets the keys back in
        # another container and order)
        self._loads: dict[frozenset, list[Any]] = {}
        # prepared stores: key -> (lease, row, order of preparation)
        self._stores: dict[OffloadKey, tuple[Any, int, int]] = {}
        self._order = 0
        self._rows: dict[int, np.ndarray] = {}               # lease id -> pages [n, world]
        # (request, group) -> (the last key inserted, its position): the next chunks chain on
        self._tails: dict[tuple[str, int], tuple[OffloadKey, int]] = {}
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
        """HIT when every rank's page is held: in host (or device) pages, or, after them, in
        the tiers below host (disk, remote; prepare_load fetches those). One MatchKeys without
        a lock: kvpoold counts the disk tier's pages from its key map and asks the remote tier
        only when the pool has one and the local pages fall short."""
        r = self.link.call("lookup", lambda p, s: held_pages(p, self._kk([key]), self.ns))
        self.link.stats["lookups"] += 1
        if r is not None and r[0] + r[1] >= self.world:
            self.link.stats["lookup_hits"] += 1
            if r[0] < self.world:
                self.link.stats["lookup_hits_below"] += 1
            return LookupResult.HIT
        return LookupResult.MISS

    def _count(self, what: str, n: int = 1) -> None:
        self.link.stats[what] += n

    def prepare_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> LoadStoreSpec:
        keys = list(keys)
        m = self.link.call("load", lambda p, s: match_or_fetch(p, self._kk(keys), self.ns,
                                                                self._count))
        pages = np.zeros((0, self.world), dtype=np.int64)
        if m is not None:
            n = len(m.host_pages) // self.world if not len(m.device_pages) else 0
            pages = np.asarray(m.host_pages[:n * self.world], dtype=np.int64).reshape(
                n, self.world)
            self._loads.setdefault(frozenset(keys), []).append(m)
        return KvpoolLoadStoreSpec(pages, self.world)

    def complete_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        fs = frozenset(keys)
        ms = self._loads.get(fs)
        if not ms:
            return
        m = ms.pop(0)
        if not ms:
            del self._loads[fs]
        self.link.call("release", lambda p, s: m.release())

    def locks_held(self) -> int:
        """Loads prepared and not completed yet."""
        return sum(len(v) for v in self._loads.values())

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
                self._stores[k] = (lease, i, self._order)
                self._order += 1
            return PrepareStoreOutput(todo, KvpoolLoadStoreSpec(rows, self.world), [])

        return self.link.call("store", go)

    def _chains(self, items: list, req_context: ReqContext) -> list[list]:
        """A lease's completed keys as one chain per group, each in the request's order (the
        key's position when the scheduler recorded it, else the order of preparation)."""
        by_group: dict[int, list] = {}
        for it in items:
            by_group.setdefault(get_offload_group_idx(it[0]), []).append(it)
        out = []
        for g in sorted(by_group):
            def pos(it, _rc=req_context):
                p = _rc.get_offload_key_position(it[0]) if _rc is not None else None
                return (0, p, it[2]) if p is not None else (1, 0, it[2])
            out.append(sorted(by_group[g], key=pos))
        return out

    def _insert_chain(self, p: kvpool.Pool, lease: Any, chain: list, rows: np.ndarray,
                      req_context: ReqContext) -> int:
        """Inserts one group's chain, after the request's previous key of that group when it
        is still cached; the chunks inserted."""
        g = get_offload_group_idx(chain[0][0])
        rid = getattr(req_context, "req_id", None)
        first = req_context.get_offload_key_position(chain[0][0]) if rid is not None else None
        tail = self._tails.get((rid, g)) if rid is not None else None
        pages = np.concatenate([rows[i] for _, i, _ in chain]).astype(np.uint32)
        kk = self._kk([k for k, _, _ in chain])
        done = 0
        if tail is not None and (first is None or tail[1] < first):
            r = p.insert_keys(lease, self._kk([tail[0]]) + kk, cached_keys=self.world,
                              namespace=self.ns, pages=pages)
            done = max(0, r["done_keys"] - self.world) // self.world
            if r["done_keys"] < self.world:  # the parent left the cache: a chain of its own
                tail = None
        if tail is None:
            r = p.insert_keys(lease, kk, namespace=self.ns, pages=pages)
            done = r["done_keys"] // self.world
        if rid is not None and done:
            last = chain[done - 1][0]
            lp = req_context.get_offload_key_position(last)
            self._tails.pop((rid, g), None)
            self._tails[(rid, g)] = (last, lp if lp is not None else -1)
            # a store completed after its request finished leaves its tail: the oldest go
            while len(self._tails) > self.MAX_TAILS:
                del self._tails[next(iter(self._tails))]
        return done

    def complete_store(self, keys: Collection[OffloadKey], req_context: ReqContext,
                       success: bool = True) -> None:
        by_lease: dict[int, tuple[Any, list[tuple[OffloadKey, int, int]]]] = {}
        for k in keys:
            ent = self._stores.pop(k, None)
            if ent is not None:
                by_lease.setdefault(ent[0].id, (ent[0], []))[1].append((k, ent[1], ent[2]))
        for lid, (lease, items) in by_lease.items():
            rows = self._rows[lid]
            stored: list[OffloadKey] = []
            if success:
                for chain in self._chains(items, req_context):
                    done = self.link.call("store", lambda p, s, c=chain: self._insert_chain(
                        p, lease, c, rows, req_context)) or 0
                    stored += [k for k, _, _ in chain[:done]]
            if stored and self._events_on:
                self._events.append(OffloadingEvent(keys=stored, medium=Medium.CPU,
                                                    removed=False))
                self._stored.update(dict.fromkeys(stored))
            if not any(ent[0].id == lid for ent in self._stores.values()):
                del self._rows[lid]
                self.link.call("free", lambda p, s, lease=lease: (
                    lease.free() if not lease.ended and len(lease.pages) else None))

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def on_request_finished(self, req_context: ReqContext) -> None:
        rid = req_context.req_id
        for key in [t for t in self._tails if t[0] == rid]:
            del self._tails[key]

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
        for ms in self._loads.values():
            for m in ms:
                self.link.call("release", lambda p, s, m=m: m.release())
        self._loads.clear()
        self.link.close()


class KvpoolOffloadingWorker(OffloadingWorker):
    """Worker side: copies this rank's blocks between vLLM's canonical KV tensors and the
    pool's host pages, directly (kvpool.vllm_copy): synchronously on the CPU, on a copy stream
    of its own with CUDA block tensors (finished jobs are reported by get_finished)."""

    PING_S = 1.0  # how often a transfer first checks kvpoold is still the one mapped

    def __init__(self, spec: KvpoolOffloadingSpec, kv_caches: CanonicalKVCaches):
        self.spec = spec
        self.rank = spec.rank
        self.k = spec.blocks_per_chunk
        self.kv_caches = kv_caches
        self.layout = PageLayout(kv_caches.tensors, kv_caches.group_data_refs, self.k)
        why = self.layout.check()
        if why is not None:
            raise ValueError(f"kvpool.vllm: vLLM's KV cache tensors: {why}")
        self.cuda = self.layout.cuda
        self.copier: Any = CudaCopier(self.layout.device) if self.cuda else CpuCopier()
        mismatch: list = []

        def check(pool: kvpool.Pool) -> None:
            try:
                spec.check_pool(pool, self.layout)
            except kvpool.GeometryMismatch as e:
                mismatch.append(e)
                raise

        self._mapped: Optional[HostPages] = None
        self.link = Link(spec.pool_name, spec.socket, name=f"vllm-worker-{self.rank}",
                         check=check, setup=self._setup)
        self.link.connect_now()
        _refuse_at_start(self.link, mismatch)
        self._last_ping = time.monotonic()
        self._done: list[TransferResult] = []
        # (job, CUDA event, bytes, the host mapping the copy uses)
        self._inflight: list[tuple[int, Any, int, HostPages]] = []

    def _setup(self, pool: kvpool.Pool) -> HostPages:
        host = torch.from_dlpack(pool.host_pages_view())
        host = HostPages(host.view(host.shape[0], -1).view(torch.int8))
        if self.cuda and not host.register_cuda():
            log.warning("kvpool.vllm: cudaHostRegister of the host pages failed: copies "
                        "from and to them are not DMA")
        return host

    def _host(self) -> Optional[HostPages]:
        now = time.monotonic()
        if now - self._last_ping >= self.PING_S and self.link.pool is not None:
            self._last_ping = now
            self.link.call("ping", lambda p, s: p.client.ping())
        host = self.link.call("map", lambda p, s: s)
        if host is not None and host is not self._mapped:
            # mapped anew (kvpoold restarted): the old mapping's registration goes once the
            # copies using it are done
            old, self._mapped = self._mapped, host
            if old is not None and old.registered:
                for _, ev, _, h in self._inflight:
                    if h is old:
                        ev.synchronize()
                old.unregister_cuda()
        return host

    def _transfer(self, job_id: int, gpu: Any, pages_spec: Any, to_host: bool) -> bool:
        """gpu: vLLM's GPULoadStoreSpec (0.33) or DevicePointers (0.34 on)."""
        host = self._host()
        pages = np.asarray(getattr(pages_spec, "pages", np.zeros((0, 1))))
        pages = pages[:, self.rank] if pages.ndim == 2 and len(pages) else np.zeros(0, np.int64)
        runs = None
        if host is not None and len(pages) and int(pages.max()) < host.npages:
            runs = self.layout.runs(gpu, pages, host, to_host)
        if runs is None:
            self._done.append(TransferResult(job_id, False, 0))
            return True
        if self.cuda:  # the mapping stays while the copy uses it (held by the entry)
            self._inflight.append((job_id, self.copier.copy(runs), runs.nbytes, host))
        else:
            t0 = time.perf_counter()
            self.copier.copy(runs)
            self._done.append(TransferResult(job_id, True, runs.nbytes,
                                             time.perf_counter() - t0))
        return True

    def submit_store(self, job_id: int, src_spec: Any, dst_spec: LoadStoreSpec) -> bool:
        """src_spec: the blocks (GPULoadStoreSpec; DevicePointers from vLLM 0.34 on)."""
        return self._transfer(job_id, src_spec, dst_spec, True)

    def submit_load(self, job_id: int, src_spec: LoadStoreSpec, dst_spec: Any,
                    expedited: bool = False) -> bool:
        """dst_spec: the blocks (GPULoadStoreSpec; DevicePointers from vLLM 0.34 on)."""
        return self._transfer(job_id, dst_spec, src_spec, False)

    def get_finished(self) -> list[TransferResult]:
        while self._inflight and self._inflight[0][1].query():
            job, _, n, _ = self._inflight.pop(0)
            self._done.append(TransferResult(job, True, n))
        done, self._done = self._done, []
        return done

    def wait(self, job_ids: set[int]) -> None:
        for job, ev, _, _ in self._inflight:
            if job in job_ids:
                ev.synchronize()

    def shutdown(self) -> None:
        for _, ev, _, _ in self._inflight:
            ev.synchronize()
        for host in (self.link.state, self._mapped):
            if isinstance(host, HostPages):
                host.unregister_cuda()
        self.link.close()
