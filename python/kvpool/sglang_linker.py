"""kvpool.sglang_linker: SGLang's external cache linker over a kvpool pool's host tier.

With KvpoolLinker, every SGLang instance on a node uses the node's kvpool host tier as its L2:
SGLang allocates no host pool of its own. Offload copies device pages straight into leased
kvpool host pages and publishes them under SGLang's page keys; lookup and load find the pages
any instance published and copy them back into the request's device slots layer by layer,
completing each layer on SGLang's layer_done_counter only after its copies landed. Start SGLang
with::

    --enable-unified-cache-external-linker --unified-cache-external-linker-backend dynamic
    --unified-cache-external-linker-config '{"linker": "KvpoolLinker",
        "linker_module_path": "kvpool.sglang",
        "linker_extra_config": {"pool": "llama-8b", "socket": "/run/kvpool/kvpoold.sock"}}'

Extra config keys: pool (required), socket (default: kvpool.default_socket()), namespace (int,
default 0), timeout_ms (per call, default 5000), max_keys_per_call (default 4096), copy_threads
(threads of the CPU copies, default torch's threads, at most 4). Any other key is refused at
construction.

Copies: on CPU device pools, an offload is one kvpool._kvpool.copy_buffer_runs call for every page of
every layer, and a load one call too (every layer's pages of every request, a group a layer,
each layer completed on SGLang's counter as it lands while the threads copy the next), the GIL
released, over copy_threads threads, with streaming stores for transfers larger than the
caches; CUDA pools copy a run of consecutive pages at a time with torch, a layer at a time.

Device pools served: MHATokenToKVPool (NHD: K and V [slots, heads, head_dim] per layer) and
MLATokenToKVPool (the latent [slots, 1, kv_lora_rank + qk_rope_head_dim] per layer), i.e. the
Full tree component, also as the full-attention pool of SGLang's SWAKVPool. SWA models: the
sliding-window layers' pages of each offloaded node are stored too (PoolName.SWA in the
linker's pools, keys "<key>_swa<part>"): an SGLang page of those layers takes ceil(SWA layers /
full layers) pool pages, SWA layer j in pool page j // layers at layer slot j % layers (their
rows must be the full layers'; else no SWA pages are held and SGLang keeps a restored tail's
window evicted and computes it). A lookup then answers the longest prefix whose full pages
and whose last window of sliding-window pages are all stored, and a load copies the window
into SGLang's SWA slots on the sliding-window layers' turns of the layer counter. Mamba models
(HybridLinearKVPool, HybridReqToTokenPool): the full-attention layers' pages as for any model,
and the Mamba state SGLang hands with each offloaded node (PoolName.MAMBA: one state per node,
valid at its last page; every Mamba layer's conv and temporal states of the node's slot) in
mamba_parts pool pages under "<key>_mamba<part>" of the node's last page key; a lookup answers
the longest prefix whose pages are stored and whose state is stored at its end, and a load
writes the state into the request's Mamba slot on the Mamba layers' turns of the layer
counter. Other tree components and device pool classes are refused at construction.

Pool geometry: one kvpool host page holds one SGLang page of every layer. MHA: the pool's
layers, kv_heads, head_dim, dtype and page_tokens are the device pool's layer_num, head_num
(per TP rank), head_dim, dtype and page_size. MLA: kv_heads 1 and head_dim (kv_lora_rank +
qk_rope_head_dim) / 2 (the page's K and V halves hold the latent). Anything else is refused
with kvpool.GeometryMismatch naming both geometries, at construction.

Keys: SGLang's page hash (64 hex digits) as its 32 bytes plus "_tp<rank>" for MHA (each TP
rank holds its heads) or "_mla" for MLA (the latent is the same on every TP rank: rank 0
stores it, every rank reads it), then "_pp<rank>" with pipeline parallelism.

Tiers below host: pages kvpoold's disk tier (or remote tier) holds after the local ones are
hits too: a lookup counts them (one MatchKeys without a lock per call of keys) and a load
fetches them into host pages (FetchKeys, locked) when SGLang queues it; a fetch that fails
(kvpoold refuses it, a page fails its check on the disk) is counted and the load refused
(SGLang computes the prefix). Counted: lookup_hit_pages_below, fetched_pages,
fetch_missed_pages, fetch_<error>.

kvpoold down or restarted: lookups miss, loads are refused (SGLang computes the prefix) and
offloads are dropped, each counted (stats()); nothing raises into the scheduler. The linker
attaches again by itself after a bounded backoff. An offload that finds the host tier full
(OutOfCapacity, QuotaExceeded, HostBudgetExceeded) is dropped and counted too.
"""
from __future__ import annotations

import logging
import threading
from collections import Counter
from queue import Empty, Queue
from typing import Any, Callable, Optional

import numpy
import torch
from sglang.srt.mem_cache.hicache_storage import PoolName, PoolTransfer
from sglang.srt.mem_cache.unified_cache.components import ComponentType
from sglang.srt.mem_cache.unified_cache.unified_cache_linker import (
    LayerWiseLoadCounter,
    UnifiedCacheLinker,
)
from sglang.srt.utils import get_device_module

import kvpool
from kvpool._kvpool import copy_buffer_runs
from kvpool._link import RECONNECT_MS, Link, geometry_mismatch, held_pages, match_or_fetch

__all__ = ["KvpoolLinker", "EXTRA_CONFIG_KEYS"]

log = logging.getLogger("kvpool.sglang")

EXTRA_CONFIG_KEYS = ("pool", "socket", "namespace", "timeout_ms", "max_keys_per_call",
                     "copy_threads")
_DTYPES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32",
           torch.uint8: "fp8"}
for _n in ("float8_e4m3fn", "float8_e5m2"):
    if hasattr(torch, _n):
        _DTYPES[getattr(torch, _n)] = "fp8"
# a page list in more runs than this is copied with one gather instead of a copy per run
_MAX_RUNS = 32
# a lookup looks for a Mamba state at this many prefix lengths at most, the longest first
_MAMBA_TRIES = 32


def _runs(a: torch.Tensor, b: torch.Tensor) -> list[tuple[int, int, int]]:
    """(a0, b0, n) for each stretch where a and b both ascend by one."""
    n = a.numel()
    if n == 0:
        return []
    brk = ((a[1:] - a[:-1]) != 1) | ((b[1:] - b[:-1]) != 1)
    starts = [0] + (torch.nonzero(brk).flatten() + 1).tolist()
    ends = starts[1:] + [n]
    a0, b0 = a[starts].tolist(), b[starts].tolist()
    return [(a0[i], b0[i], ends[i] - starts[i]) for i in range(len(starts))]


def _copy_pages(dst: torch.Tensor, dp: torch.Tensor, src: torch.Tensor, sp: torch.Tensor,
                runs: list, pairs: list) -> None:
    """dst[dp] = src[sp] along dim 0 (pages): one copy per run, added to pairs for the
    copier, or a gather done here when the pages form too many runs."""
    if len(runs) <= _MAX_RUNS:
        for d0, s0, n in runs:
            pairs.append((dst.narrow(0, d0, n), src.narrow(0, s0, n)))
        return
    dpi, spi = dp.to(dst.device), sp.to(src.device)
    dst.index_copy_(0, dpi, src.index_select(0, spi).to(dst.device))


def _merged(rows: numpy.ndarray) -> numpy.ndarray:
    """copy_buffer_runs rows with each row that continues the one before (same buffers, both offsets
    right after it) folded into it."""
    if len(rows) < 2:
        return rows
    a, b = rows[:-1], rows[1:]
    cont = (b[:, 0] == a[:, 0]) & (b[:, 2] == a[:, 2]) & (b[:, 1] == a[:, 1] + a[:, 4]) & \
        (b[:, 3] == a[:, 3] + a[:, 4])
    starts = numpy.flatnonzero(numpy.concatenate(([True], ~cont)))
    out = rows[starts].copy()
    out[:, 4] = numpy.add.reduceat(rows[:, 4], starts)
    return out


class _Copier:
    """Page copies between the device pool's buffers and the pool's host pages.

    CPU buffers: every run of a transfer (one per page, layer and K/V: the host layout holds a
    page of every layer together) goes to one kvpool._kvpool.copy_buffer_runs call, which copies them
    with the GIL released over a few threads, with streaming stores for transfers larger than
    the caches. Other devices: one torch copy per run of consecutive pages."""

    def __init__(self, threads: int):
        self.n = max(1, min(16, threads))

    def runs(self, dev_bufs: list, host: int, dev_pages: numpy.ndarray,
             host_pages: numpy.ndarray, chunk: int, per_page: int, first: int,
             to_host: bool) -> numpy.ndarray:
        """Rows for copy_buffer_runs between page dev_pages[i] of each device buffer k
        (dev_bufs[k]: its index in the call's device list) and the k-th chunk from `first` of
        host page host_pages[i]; dst first (host when to_host)."""
        k = numpy.arange(len(dev_bufs), dtype=numpy.int64)[:, None]
        rows = numpy.empty((len(dev_bufs), len(dev_pages), 5), numpy.int64)
        d, h = (2, 0) if to_host else (0, 2)  # the columns of the device and host sides
        rows[:, :, d] = numpy.asarray(dev_bufs, numpy.int64)[:, None]
        rows[:, :, d + 1] = dev_pages[None, :] * chunk
        rows[:, :, h] = host
        rows[:, :, h + 1] = (host_pages[None, :] * per_page + first + k) * chunk
        rows[:, :, 4] = chunk
        return _merged(rows.reshape(-1, 5))

    def copy(self, dst: list, src: list, rows: numpy.ndarray) -> None:
        if len(rows):
            copy_buffer_runs(dst, src, numpy.ascontiguousarray(rows), self.n)

    @staticmethod
    def run_torch(pairs: list) -> None:
        for d, s in pairs:
            d.copy_(s, non_blocking=True)


class _MambaState:
    """SGLang's Mamba state pool (the HybridReqToTokenPool's MambaPool) as, for each Mamba
    layer in the pool's order, its state tensors (every conv state, then the temporal state) of
    [slots, ...]: a request's state is its slot's row of each, what SGLang's own host copy of a
    slot holds (MambaPool.get_cpu_copy; the speculative and replay scratch are not a cached
    state). Stored as nbytes bytes in the layers' order, each layer's tensors in turn."""

    def __init__(self, r2t: Any, start_layer: int):
        pool = r2t.mamba_pool
        cache = pool.mamba_cache
        siblings = getattr(pool, "_slot_siblings", ())
        if siblings:
            raise ValueError(f"kvpool.sglang: KvpoolLinker holds a Mamba slot's conv and "
                             f"temporal states; this pool's slots also carry "
                             f"{', '.join(type(x).__name__ for x in siblings)}")
        self.r2t = r2t
        ids = list(pool.mamba_layer_ids)
        self.layers = [[c[i] for c in cache.conv] + [cache.temporal[i]]
                       for i in range(len(ids))]
        self.counter_of = [g - start_layer for g in ids]
        self.layer_bytes = [sum(t[0].numel() * t.element_size() for t in ts)
                            for ts in self.layers]
        self.nbytes = sum(self.layer_bytes)

    def slot(self, index: torch.Tensor) -> int:
        """The pool slot of a request's Mamba index (SGLang's unified pool translates)."""
        return int(self.r2t.translate_mamba_indices(index.flatten()[:1])[0])

    def read(self, slot: int) -> torch.Tensor:
        """The slot's state: nbytes bytes on the CPU."""
        return torch.cat([t[slot].contiguous().view(torch.uint8).reshape(-1).cpu()
                          for ts in self.layers for t in ts])

    def write_layer(self, j: int, slot: int, data: torch.Tensor) -> None:
        """Mamba layer j's part of the state bytes data into the slot."""
        off = sum(self.layer_bytes[:j])
        for t in self.layers[j]:
            n = t[0].numel() * t.element_size()
            row = data[off:off + n].clone().view(t.dtype).view(t.shape[1:])
            t[slot].copy_(row.to(t.device))
            off += n


class _DevicePool:
    """SGLang's device KV pool as per-layer components of [slots, *row] tensors."""

    def __init__(self, kvcache: Any, page_size: int):
        self.kvcache = kvcache
        # SGLang's SWA pool: the full-attention layers' pool is the KV served here; the
        # layer counter counts the model's layers, full and sliding-window
        self.counter_layers: Optional[int] = None
        self.counter_of: Optional[list] = None
        # an SWA model's sliding-window layers: their (K, V) buffers in the SWA pool's order
        # and their counter layers; None when the model has none or their rows are not the
        # full-attention layers' (the window is then not stored)
        self.swa_layers: Optional[list] = None
        self.swa_counter_of: Optional[list] = None
        swa_pool = None
        # SGLang's HybridLinearKVPool (Mamba models): its full-attention layers' pool is the
        # KV served here; the Mamba layers' counter turns carry their states (_MambaState)
        self.mamba_layer_ids: Optional[list] = None
        if hasattr(kvcache, "full_kv_pool") and \
                hasattr(kvcache, "full_attention_layer_id_mapping"):
            start = int(getattr(kvcache, "start_layer", 0) or 0)
            full = sorted((i, g) for g, i in kvcache.full_attention_layer_id_mapping.items())
            self.counter_of = [g - start for _, g in full]
            mamba_pool = getattr(kvcache, "mamba_pool", None)
            self.mamba_layer_ids = list(getattr(mamba_pool, "mamba_layer_ids", None) or ())
            self.counter_layers = max([g for _, g in full] + self.mamba_layer_ids) + 1 - start
            kvcache = kvcache.full_kv_pool
        elif hasattr(kvcache, "full_kv_pool") and hasattr(kvcache, "layers_mapping"):
            full = sorted((i, g) for g, (i, swa) in kvcache.layers_mapping.items() if not swa)
            self.counter_of = [g - kvcache.start_layer for _, g in full]
            self.counter_layers = kvcache.layer_num
            sw = sorted((i, g) for g, (i, swa) in kvcache.layers_mapping.items() if swa)
            self.swa_counter_of = [g - kvcache.start_layer for _, g in sw]
            swa_pool = getattr(kvcache, "swa_kv_pool", None)
            kvcache = kvcache.full_kv_pool
        cls = type(kvcache).__name__
        self.T = page_size
        self.dtype = getattr(kvcache, "store_dtype", None) or kvcache.dtype
        if hasattr(kvcache, "k_buffer") and hasattr(kvcache, "v_buffer") and \
                not hasattr(kvcache, "kv_buffer"):
            self.mla = False
            if getattr(kvcache, "use_hnd", False) or \
                    getattr(kvcache, "kv_cache_layout", None) not in (None, "NHD", "nhd"):
                raise ValueError(f"kvpool.sglang: KvpoolLinker serves the NHD layout of "
                                 f"{cls} only")
            if kvcache.v_head_dim != kvcache.head_dim:
                raise ValueError(f"kvpool.sglang: KvpoolLinker needs v_head_dim == head_dim "
                                 f"({kvcache.v_head_dim} != {kvcache.head_dim})")
            self.layers = [(k, v) for k, v in zip(kvcache.k_buffer, kvcache.v_buffer)]
            self.row = (kvcache.head_num, kvcache.head_dim)
        elif hasattr(kvcache, "kv_buffer") and hasattr(kvcache, "kv_cache_dim"):
            self.mla = True
            if kvcache.kv_cache_dim % 2:
                raise ValueError(f"kvpool.sglang: MLA kv_cache_dim {kvcache.kv_cache_dim} is "
                                 f"odd; a pool page holds it as two halves")
            self.layers = [(b,) for b in kvcache.kv_buffer]
            self.row = (1, kvcache.kv_cache_dim)
        else:
            raise ValueError(f"kvpool.sglang: KvpoolLinker serves MHATokenToKVPool and "
                             f"MLATokenToKVPool device pools; this model's is {cls}")
        for comps in self.layers:
            for t in comps:
                if t.dim() != 3 or tuple(t.shape[1:]) != self.row:
                    raise ValueError(f"kvpool.sglang: {cls} buffer of shape {tuple(t.shape)}, "
                                     f"expected [slots, {self.row[0]}, {self.row[1]}]")
        self.nlayers = len(self.layers)
        self.ncomp = len(self.layers[0])
        self.device = self.layers[0][0].device
        # one page of one layer's K (or V, or the MLA latent) in bytes: a run of a copy
        self.chunk = self.T * self.row[0] * self.row[1] * self.layers[0][0].element_size()
        # the buffers as flat bytes for copy_buffer_runs (CPU only), layer by layer
        self.flat = [[t.view(torch.uint8).reshape(-1).numpy() for t in comps]
                     for comps in self.layers] if self.device.type == "cpu" else None
        # every layer's, in one list: layer l's component k is flat_all[l * ncomp + k]
        self.flat_all = [b for comps in self.flat for b in comps] if self.flat else None
        if self.counter_of is None:
            self.counter_of = list(range(self.nlayers))
            self.counter_layers = self.nlayers
        if swa_pool is not None and not self.mla and self.swa_counter_of and \
                hasattr(swa_pool, "k_buffer"):
            bufs = [(k, v) for k, v in zip(swa_pool.k_buffer, swa_pool.v_buffer)]
            if all(t.dim() == 3 and tuple(t.shape[1:]) == self.row and t.dtype ==
                   self.layers[0][0].dtype for kv in bufs for t in kv):
                self.swa_layers = bufs
            else:
                log.info("kvpool.sglang: the sliding-window layers' rows are not the full "
                         "layers'; their windows are not stored (SGLang computes them)")

    @property
    def swa_parts(self) -> int:
        """Pool pages per SGLang page of the sliding-window layers (a pool page holds as many
        layers as the full-attention pool has)."""
        return -(-len(self.swa_layers) // self.nlayers) if self.swa_layers else 0

    def geometry(self) -> kvpool.Geometry:
        dt = _DTYPES.get(self.dtype, str(self.dtype))
        if self.mla:
            return kvpool.Geometry((self.nlayers, 1, self.row[1] // 2, dt, self.T))
        return kvpool.Geometry((self.nlayers, self.row[0], self.row[1], dt, self.T))

    def host_view(self, pool: kvpool.Pool) -> "_Host":
        """The pool's host pages as [pages, layers, components, page_size, *row], and as
        flat bytes for copy_buffer_runs."""
        h = torch.from_dlpack(pool.host_pages_view())
        flat = h.view(torch.uint8).reshape(-1).numpy() if self.flat is not None else None
        u8 = h.view(torch.uint8).reshape(h.shape[0], -1)
        if h.dtype != self.dtype:
            h = h.view(self.dtype)
        host = _Host(h.reshape(h.shape[0], self.nlayers, self.ncomp, self.T, *self.row), flat)
        host.u8 = u8
        return host

    def pages_of(self, slots: torch.Tensor) -> Optional[torch.Tensor]:
        """The device pages of page-aligned token slots (every slot of each page, in
        order), None when the slots are not whole pages."""
        T = self.T
        if slots.numel() % T:
            return None
        v = slots.numpy().reshape(-1, T)  # CPU int64 slots (numpy: a tenth of torch's time)
        first = v[:, 0]
        if T > 1 and (bool((first % T).any()) or
                      bool((v - first[:, None] != numpy.arange(T)).any())):
            return None
        return torch.from_numpy(first // T)

    def page_view(self, t: torch.Tensor) -> torch.Tensor:
        """A device buffer [slots, *row] as [pages, page_size, *row]."""
        n = t.shape[0] // self.T
        return t[:n * self.T].view(n, self.T, *self.row)


class _Host:
    """The pool's host pages: t [pages, layers, components, page_size, *row], u8 [pages,
    page bytes] and, for CPU device pools, flat (the mapping's bytes)."""

    def __init__(self, t: torch.Tensor, flat: Any):
        self.t, self.flat = t, flat
        self.u8: Optional[torch.Tensor] = None


class _Load:
    """One request's queued load: pinned host pages, its device slots."""

    def __init__(self, match: Any, host: _Host, hp: torch.Tensor, slots: torch.Tensor):
        self.match, self.host, self.hp, self.slots = match, host, hp, slots
        # the sliding window: (its pinned match, host pages, SWA device slots), or None
        self.swa: Optional[tuple] = None
        # the Mamba state: (its pinned match, host pages, the request's Mamba slot), or None
        self.mamba: Optional[tuple] = None


class KvpoolLinker(UnifiedCacheLinker):
    """SGLang's UnifiedCacheLinker over a kvpool pool's host tier, shared by every instance
    of the node that attaches the same pool."""

    def __init__(self, server_args: Any, params: Any, *, components: Any,
                 extra_config: Optional[dict] = None, forward_stream: Any = None):
        extra = dict(extra_config or {})
        unknown = sorted(set(extra) - set(EXTRA_CONFIG_KEYS))
        if unknown:
            raise ValueError(f"kvpool.sglang: unknown linker_extra_config keys {unknown} "
                             f"(known: {', '.join(EXTRA_CONFIG_KEYS)})")
        if not isinstance(extra.get("pool"), str) or not extra["pool"]:
            raise ValueError("kvpool.sglang: linker_extra_config needs \"pool\" (a kvpool pool "
                             "name)")
        others = sorted(c.name for c in set(components)
                        if c not in (ComponentType.FULL, ComponentType.SWA,
                                     ComponentType.MAMBA))
        if others:
            raise ValueError(f"kvpool.sglang: KvpoolLinker serves the Full, SWA and Mamba "
                             f"components (MHA and MLA KV pools, SWA models' full-attention "
                             f"and sliding-window layers, Mamba models' states); this model "
                             f"also has {', '.join(others)}, whose state it does not hold")
        self.forward_stream = forward_stream
        self.page_size = int(params.page_size)
        self.dev = _DevicePool(params.token_to_kv_pool_allocator.get_kvcache(), self.page_size)
        self.pools = {PoolName.KV: self.dev.kvcache}
        # Mamba models: each offloaded node's state (SGLang hands one per node, at its last
        # page) in mamba_parts pool pages under "<key>_mamba<part>"
        self.mamba: Optional[_MambaState] = None
        if ComponentType.MAMBA in set(components):
            r2t = params.req_to_token_pool
            if self.dev.mamba_layer_ids is None or getattr(r2t, "mamba_pool", None) is None:
                raise ValueError(f"kvpool.sglang: a Mamba component needs SGLang's "
                                 f"HybridLinearKVPool and HybridReqToTokenPool; this model "
                                 f"has {type(self.dev.kvcache).__name__} and "
                                 f"{type(r2t).__name__}")
            self.mamba = _MambaState(r2t, int(getattr(r2t, "start_layer", 0) or 0))
            self.pools[PoolName.MAMBA] = r2t.mamba_pool
        # SWA models: the sliding-window layers' pages of a node's tail are stored too (each
        # SGLang page in dev.swa_parts pool pages), so a restored tail comes with its window.
        # Without PoolName.SWA (their rows differ from the full layers') SGLang keeps the
        # window as evicted and computes it, as for any store without SWA pages.
        window = getattr(params, "sliding_window_size", None)
        self.window_pages = -(-int(window) // self.page_size) if window else 0
        if self.dev.swa_layers and self.window_pages and \
                ComponentType.SWA in set(components):
            self.pools[PoolName.SWA] = self.dev.kvcache.swa_kv_pool
        else:
            self.dev.swa_layers = None
        self.num_layers = self.dev.counter_layers
        self.namespace = int(extra.get("namespace", 0))
        self.timeout_ms = int(extra.get("timeout_ms", 5000))
        self.max_keys = max(1, int(extra.get("max_keys_per_call", 4096)))
        tp_rank = 0
        group = getattr(params, "attn_tp_cache_group", None) or \
            getattr(params, "tp_cache_group", None)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            tp_rank = torch.distributed.get_rank(group=group)
        self.tp_rank = tp_rank
        # the MLA latent is the same on every TP rank: rank 0 stores it, every rank reads it
        self.offload_owner = not self.dev.mla or tp_rank == 0
        tag = "_mla" if self.dev.mla else f"_tp{tp_rank}"
        if int(getattr(params, "pp_size", 1) or 1) > 1:
            tag += f"_pp{params.pp_rank}"
        if int(getattr(params, "attn_cp_size", 1) or 1) > 1:
            tag += f"_cp{params.attn_cp_rank}"
        self.tag = tag.encode()
        self.socket = extra.get("socket")
        self.link = Link(extra["pool"], self.socket, name=f"sglang-linker-tp{tp_rank}",
                         check=self._check, setup=self.dev.host_view)
        self._probe()
        self.link.connect_now()

        self.layer_done_counter = LayerWiseLoadCounter(self.num_layers)
        if self.mamba is not None:  # the Mamba layers read their states through it
            params.req_to_token_pool.register_layer_transfer_counter(self.layer_done_counter)
        self.counts: Counter = Counter()
        self._counts_lock = threading.Lock()
        self._pending: dict[str, _Load] = {}
        self._load_queue: Queue = Queue()
        self._offload_queue: Queue = Queue()
        self._offload_results: Queue = Queue()
        self._closed = False
        threads = extra.get("copy_threads", min(4, torch.get_num_threads()))
        self._copier = _Copier(int(threads))
        self._load_thread = threading.Thread(target=self._load_loop, daemon=True,
                                             name=f"kvpool-load-tp{tp_rank}")
        self._offload_thread = threading.Thread(target=self._offload_loop, daemon=True,
                                                name=f"kvpool-offload-tp{tp_rank}")
        self._load_thread.start()
        self._offload_thread.start()
        log.info("kvpool.sglang: KvpoolLinker on pool %s (%s, %d layers, page %d, tag %s)",
                 extra["pool"], "MLA" if self.dev.mla else "MHA", self.num_layers,
                 self.page_size, tag)

    # -- the pool --
    def _probe(self) -> None:
        """Refuses, at construction, a pool of another geometry and a socket that answers but
        is not kvpoold; a kvpoold that is not there yet only means misses until it is."""
        try:
            client = kvpool.connect(self.socket, name=f"sglang-linker-tp{self.tp_rank}",
                                    reconnect_ms=RECONNECT_MS)
        except kvpool.NoDaemon as e:
            log.warning("kvpool.sglang: kvpoold not reachable (%s); lookups miss until it is", e)
            return
        try:
            self._check(client.attach(self.link.pool_name))
        finally:
            client.close()

    def _check(self, pool: kvpool.Pool) -> None:
        pool.client.set_timeout(self.timeout_ms)
        want, have = self.dev.geometry(), pool.geometry
        if tuple(want) != tuple(have):
            raise geometry_mismatch(pool.name, want, have,
                                    "a pool page must hold one SGLang page of every layer")
        if not pool.tier_pages("host"):
            raise geometry_mismatch(pool.name, want, have, "the pool has no host tier")

    def _count(self, what: str, n: int = 1) -> None:
        with self._counts_lock:
            self.counts[what] += n

    def _keys(self, hashes: list) -> list[bytes]:
        out = []
        for h in hashes:
            try:
                b = bytes.fromhex(h) if len(h) == 64 else None
            except ValueError:
                b = None
            if b is None:
                import hashlib
                b = hashlib.sha256(str(h).encode()).digest()
            out.append(b + self.tag)
        return out

    def _leading(self, pool: kvpool.Pool, keys: list[bytes]) -> tuple[int, int]:
        """(hit, below): the leading keys held in the pool, in host pages or after them in
        the tiers below host, and how many of them are below host."""
        hit = below = 0
        for i in range(0, len(keys), self.max_keys):
            part = keys[i:i + self.max_keys]
            local, low = held_pages(pool, part, self.namespace)
            n = min(len(part), local + low)
            hit += n
            below += n - min(n, local)
            if n < len(part):
                break
        return hit, below

    @staticmethod
    def _kv(transfers: list[PoolTransfer], name: Any = PoolName.KV) -> Optional[PoolTransfer]:
        for t in transfers:
            if t.name == name:
                return t
        return None

    def _swa_keys(self, keys: list[bytes]) -> list[bytes]:
        """The pool keys of the sliding-window pages of keys (swa_parts each)."""
        return [k + b"_swa%d" % i for k in keys for i in range(self.dev.swa_parts)]

    def _swa_restorable(self, pool: kvpool.Pool, keys: list[bytes], hit: int) -> int:
        """The longest prefix (pages) of at most hit whose sliding window (its last
        window_pages pages) has every sliding-window page in the pool; 0 when none."""
        parts, p = self.dev.swa_parts, hit
        for _ in range(8):
            if p <= 0:
                return 0
            lo = max(0, p - self.window_pages)
            want = self._swa_keys(keys[lo:p])
            n = min(len(want), sum(held_pages(pool, want, self.namespace)))
            if n >= len(want):
                return p
            p = lo + n // parts  # a window must end at or before the first missing page
        return 0

    @property
    def mamba_parts(self) -> int:
        """Pool pages per Mamba state."""
        page = self.dev.nlayers * self.dev.ncomp * self.dev.chunk
        return -(-self.mamba.nbytes // page) if self.mamba is not None else 0

    def _mamba_keys(self, key: bytes) -> list[bytes]:
        """The pool keys of the Mamba state stored at the page of key."""
        return [key + b"_mamba%d" % i for i in range(self.mamba_parts)]

    def _mamba_restorable(self, pool: kvpool.Pool, keys: list[bytes], hit: int) -> int:
        """The longest prefix (pages) of at most hit whose Mamba state (stored at its last
        page, where a node SGLang offloaded ends) is in the pool; 0 when none of the last
        _MAMBA_TRIES lengths has one."""
        for p in range(hit, max(0, hit - _MAMBA_TRIES), -1):
            want = self._mamba_keys(keys[p - 1])
            if min(len(want), sum(held_pages(pool, want, self.namespace))) >= len(want):
                return p
        return 0

    # -- lookup --
    def lookup(self, rid: str, transfers: list[PoolTransfer]) -> list[int]:
        """Every prefix length (pages) whose pages are all in the pool (in host pages or, after
        them, below host: load fetches those): 1 .. the leading run."""
        kv = self._kv(transfers)
        if kv is None or not kv.keys:
            return []
        keys = self._keys(list(kv.keys))
        swa = self.dev.swa_layers is not None and \
            self._kv(transfers, PoolName.SWA) is not None
        mamba = self.mamba is not None and self._kv(transfers, PoolName.MAMBA) is not None

        def find(pool, st):
            hit, below = self._leading(pool, keys)
            if swa and hit:
                hit = self._swa_restorable(pool, keys, hit)
            if mamba and hit:
                hit = self._mamba_restorable(pool, keys, hit)
            return hit, min(hit, below)

        hit, below = self.link.call("lookup", find) or (0, 0)
        self._count("lookup_pages", len(keys))
        self._count("lookup_hit_pages", hit)
        if below:
            self._count("lookup_hit_pages_below", below)
        if swa or mamba:  # a shorter prefix would need the window (the state) that ends there
            return [hit] if hit else []
        return list(range(1, hit + 1))

    # -- load --
    def load(self, rid: str, transfers: list[PoolTransfer]) -> bool:
        """Pins the pages of the request's keys (a lock in the pool; pages below host fetched
        into host pages first) and queues their copy into its device slots; False (SGLang
        computes the prefix) when they are not all there any more or kvpoold cannot be
        reached."""
        kv = self._kv(transfers)
        if kv is None or not kv.keys or kv.device_indices is None:
            return False
        if rid in self._pending:
            raise RuntimeError(f"kvpool.sglang: a load for {rid} is queued already")
        keys = self._keys(list(kv.keys))
        if len(keys) > self.max_keys:
            self._count("load_refused")
            return False
        slots = kv.device_indices.detach().to("cpu", torch.int64).flatten()
        sw = self._kv(transfers, PoolName.SWA) if self.dev.swa_layers is not None else None
        if sw is not None and (not sw.keys or sw.device_indices is None):
            return False
        swa_keys = self._swa_keys(self._keys(list(sw.keys))) if sw is not None else []
        mb = self._kv(transfers, PoolName.MAMBA) if self.mamba is not None else None
        if self.mamba is not None and (mb is None or not mb.keys or mb.device_indices is None):
            return False
        mamba_keys = self._mamba_keys(self._keys([mb.keys[-1]])[0]) if mb is not None else []
        ns = self.namespace

        def pin(pool, host):
            held: list = []

            def take(ks):
                """ks pinned in host pages (their ids), or None with every pin of this load
                released (a page now on the device, or not all of ks there any more)."""
                m = match_or_fetch(pool, ks, ns, self._count)
                held.append(m)
                if len(m.device_pages) or len(m.host_pages) < len(ks):
                    for x in held:
                        x.release()
                    return None
                return torch.from_numpy(m.host_pages.astype("int64"))

            hp = take(keys)
            if hp is None:
                return None
            job = _Load(held[0], host, hp, slots)
            if swa_keys:
                whp = take(swa_keys)
                if whp is None:
                    return None
                job.swa = (held[-1], whp,
                           sw.device_indices.detach().to("cpu", torch.int64).flatten())
            if mamba_keys:
                mhp = take(mamba_keys)
                if mhp is None:
                    return None
                job.mamba = (held[-1], mhp, self.mamba.slot(mb.device_indices))
            return job

        job = self.link.call("load", pin)
        if job is None:
            self._count("load_refused")
            return False
        self._pending[rid] = job
        return True

    def cancel_queued_load(self, rid: str) -> bool:
        job = self._pending.pop(rid, None)
        if job is None:
            return False
        self._release([job])
        return True

    def start_layer_wise_loading(self) -> int:
        if not self._pending:
            return -1
        jobs, self._pending = list(self._pending.values()), {}
        index = self.layer_done_counter.update_producer()
        ready = get_device_module().Event()
        ready.record()
        self._load_queue.put((index, jobs, ready))
        self._count("loads", len(jobs))
        return index

    def finish_layer_wise_loading(self, counter_index: int) -> bool:
        return self.layer_done_counter.finish(counter_index)

    def _load_loop(self) -> None:
        while True:
            task = self._load_queue.get()
            try:
                if task is None:
                    return
                self._run_load(*task)
            finally:
                self._load_queue.task_done()

    def _run_load(self, index: int, jobs: list[_Load], ready: Any) -> None:
        try:
            ready.synchronize()
            dev = self.dev
            plans = []
            for j in jobs:
                dp = dev.pages_of(j.slots)
                runs = _runs(dp, j.hp) if dp is not None and dev.flat is None else None
                plans.append((j, dp, runs))
            turn = self._load_turns(index, jobs, plans)
            grouped = self._load_rows(plans)
            done = 0  # the counter layers completed
            if grouped is not None:
                # CPU device pools: one copy_buffer_runs call for every full layer of every
                # page-aligned job, a group a layer in counter order; each group reported as it
                # lands completes the counter layers up to its own (those between: Mamba and
                # sliding-window turns, other jobs' copies) while the copy threads go on
                rows, ends, order = grouped

                def landed(g: int) -> None:
                    nonlocal done
                    while done <= dev.counter_of[order[g]]:
                        turn(done)
                        done += 1

                copy_buffer_runs(dev.flat_all, [j.host.flat for j in jobs], rows,
                                 self._copier.n, ends=ends, done=landed)
            while done < self.num_layers:
                turn(done)
                done += 1
        except BaseException as e:  # noqa: BLE001 - reported through the counter
            log.exception("kvpool.sglang: layer-wise load failed")
            self._count("load_failed")
            self.layer_done_counter.fail(index, e)
        finally:
            self._release(jobs)

    def _load_rows(self, plans: list) -> Optional[tuple]:
        """For CPU device pools, the copy_buffer_runs rows of every full layer of the
        page-aligned jobs (src i: job i's host mapping; dst: dev.flat_all), layer after layer
        in counter order, with each layer's group end and the layers in that order; None when no
        job is copied that way."""
        dev, cp = self.dev, self._copier
        if dev.flat is None:
            return None
        base = [cp.runs(list(range(dev.ncomp)), i, dp.numpy(), j.hp.numpy(), dev.chunk,
                        dev.nlayers * dev.ncomp, 0, False)
                for i, (j, dp, _) in enumerate(plans) if dp is not None]
        if not base:
            return None
        # each host page's runs of a layer in a row (its K and V side by side): the host pages
        # are read in order, a stream at a time
        base = numpy.concatenate(base)
        base = base[numpy.lexsort((base[:, 3], base[:, 2]))]
        order = sorted(range(dev.nlayers), key=lambda i: dev.counter_of[i])
        rows = numpy.repeat(base[None], dev.nlayers, axis=0)
        layer = numpy.asarray(order, numpy.int64)[:, None]
        rows[:, :, 0] += layer * dev.ncomp
        rows[:, :, 3] += layer * dev.ncomp * dev.chunk
        ends = [len(base) * (k + 1) for k in range(dev.nlayers)]
        return rows.reshape(-1, 5), ends, order

    def _load_turns(self, index: int, jobs: list[_Load], plans: list) -> Callable[[int], None]:
        """turn(c): what counter layer c of a load needs besides _load_rows' copies (a Mamba
        layer's states, a sliding-window layer's window, the copies of a full layer's pages
        that are not page-aligned or not on a CPU device), then c completed on the counter."""
        dev, cp = self.dev, self._copier
        cuda = dev.device.type == "cuda"
        local = {c: i for i, c in enumerate(dev.counter_of)}
        swa_local = {c: j for j, c in enumerate(dev.swa_counter_of or ())} \
            if dev.swa_layers is not None else {}
        mamba_local = {c: j for j, c in enumerate(self.mamba.counter_of)} \
            if self.mamba is not None else {}
        # each job's Mamba state bytes (its pages pinned), written a layer on its turn
        states = [(j.mamba[2], torch.cat([j.host.u8[p] for p in j.mamba[1].tolist()])
                   [:self.mamba.nbytes]) for j in jobs if j.mamba is not None]

        def turn(c: int) -> None:
            layer = local.get(c)
            if layer is None and c in mamba_local:  # a Mamba layer
                for slot, data in states:
                    self.mamba.write_layer(mamba_local[c], slot, data)
            elif layer is None:  # a sliding-window layer: its window, when stored
                j = swa_local.get(c)
                if j is not None:
                    for job in jobs:
                        if job.swa is not None:
                            self._load_swa(job, j)
            else:
                pairs: list = []
                for j, dp, runs in plans:
                    if dp is not None and dev.flat is not None:
                        continue  # in _load_rows' copy
                    for k, buf in enumerate(dev.layers[layer]):
                        src = j.host.t[:, layer, k]
                        if dp is not None:
                            _copy_pages(dev.page_view(buf), dp, src, j.hp, runs, pairs)
                        else:  # slots that are not whole pages: token by token
                            r = src.index_select(0, j.hp).reshape(-1, *dev.row)
                            buf.index_copy_(0, j.slots.to(buf.device), r.to(buf.device))
                cp.run_torch(pairs)
            if cuda:
                torch.cuda.current_stream(dev.device).synchronize()
            if c == self.num_layers - 1:  # counted before the load is seen finished
                self._count("load_pages", sum(len(j.hp) for j in jobs))
                if states:
                    self._count("load_mamba_states", len(states))
            self.layer_done_counter.complete(index, c)

        return turn

    def _load_swa(self, job: _Load, j: int) -> None:
        """Sliding-window layer j's pages of job's window into its SWA device slots."""
        dev = self.dev
        _, hp, slots = job.swa
        hp_j = hp.view(-1, dev.swa_parts)[:, j // dev.nlayers]
        dp = dev.pages_of(slots)
        for c, buf in enumerate(dev.swa_layers[j]):
            src = job.host.t[:, j % dev.nlayers, c].index_select(0, hp_j).to(buf.device)
            if dp is not None:
                dev.page_view(buf).index_copy_(0, dp.to(buf.device), src)
            else:
                buf.index_copy_(0, slots.to(buf.device), src.reshape(-1, *dev.row))

    def _release(self, jobs: list[_Load]) -> None:
        def rel(pool, st):
            for j in jobs:
                j.match.release()
                if j.swa is not None:
                    j.swa[0].release()
                if j.mamba is not None:
                    j.mamba[0].release()
            return True

        self.link.call("release", rel)

    # -- offload --
    def offload(self, transfers: list[PoolTransfer], session_id: Optional[str] = None) -> bool:
        """Queues the copy of the transfer's device pages into leased host pages and their
        publication under the transfer's keys; the result comes in submission order."""
        kv = self._kv(transfers)
        if kv is None or not kv.keys or kv.device_indices is None:
            return False
        if not self.offload_owner:
            self._offload_results.put(True)
            return True
        sw = self._kv(transfers, PoolName.SWA) if self.dev.swa_layers is not None else None
        swa = (sw.keys, sw.device_indices) \
            if sw is not None and sw.keys and sw.device_indices is not None else None
        mb = self._kv(transfers, PoolName.MAMBA) if self.mamba is not None else None
        mamba = (mb.keys[-1], mb.device_indices) \
            if mb is not None and mb.keys and mb.device_indices is not None else None
        self._offload_queue.put((kv.keys, kv.device_indices, self.record_offload_ready(), swa,
                                 mamba))
        return True

    def _offload_loop(self) -> None:
        while True:
            task = self._offload_queue.get()
            try:
                if task is None:
                    return
                ok = False
                try:
                    ok = self._run_offload(*task)
                except BaseException:  # noqa: BLE001 - an offload failure is a False result
                    log.exception("kvpool.sglang: offload failed")
                if not ok:
                    self._count("offload_dropped")
                self._offload_results.put(ok)
            finally:
                self._offload_queue.task_done()

    def _run_offload(self, hashes: list, slots: torch.Tensor, events: list,
                     swa: Optional[tuple] = None, mamba: Optional[tuple] = None) -> bool:
        for e in events:
            e.synchronize()
        keys = self._keys(list(hashes))
        slots = slots.detach().to("cpu", torch.int64).flatten()
        if len(keys) > self.max_keys or slots.numel() != len(keys) * self.page_size:
            return False
        dp = self.dev.pages_of(slots)
        ns = self.namespace

        def store(pool, host):
            ok = store_kv(pool, host)
            if ok and swa is not None:
                ok = self._store_swa(pool, host, *swa)
            if ok and mamba is not None:
                ok = self._store_mamba(pool, host, *mamba)
            return ok

        def store_kv(pool, host):
            have = pool.exists_keys(keys, namespace=ns)
            if have == len(keys):
                return True
            n = len(keys) - have
            lease = pool.alloc(n, tier="host")
            try:
                hp = torch.from_numpy(lease.pages.astype("int64")).sort().values
                dev, cp = self.dev, self._copier
                if dp is not None and dev.flat is not None:
                    # every page of every layer in one call
                    lc = dev.nlayers * dev.ncomp
                    rows = cp.runs(list(range(lc)), 0, dp[have:].numpy(), hp.numpy(),
                                   dev.chunk, lc, 0, True)
                    cp.copy([host.flat], dev.flat_all, rows)
                pairs: list = []
                if dp is not None and dev.flat is None:
                    sub = dp[have:]
                    runs = _runs(hp, sub)
                for layer in range(dev.nlayers if dev.flat is None or dp is None else 0):
                    for c, buf in enumerate(dev.layers[layer]):
                        dst = host.t[:, layer, c]
                        if dp is not None:
                            _copy_pages(dst, hp, dev.page_view(buf), sub, runs, pairs)
                        else:
                            rows = buf.index_select(0, slots[have * self.page_size:].to(
                                buf.device)).to("cpu")
                            dst.index_copy_(0, hp, rows.view(n, self.page_size, *dev.row))
                cp.run_torch(pairs)
                if self.dev.device.type == "cuda":
                    torch.cuda.current_stream(self.dev.device).synchronize()
                r = pool.insert_keys(lease, keys, cached_keys=have, namespace=ns,
                                     pages=hp.numpy().astype("uint32"))
            finally:
                if not lease.ended and len(lease.pages):
                    lease.free()
            self._count("offload_pages", n)
            return r["done_keys"] == len(keys)

        return bool(self.link.call("offload", store))

    def _store_swa(self, pool: kvpool.Pool, host: _Host, hashes: list,
                   slots: torch.Tensor) -> bool:
        """A node's sliding-window pages (its trailing pages' SWA slots) into leased host
        pages, published under their keys (swa_parts pool pages per SGLang page: layer j of
        the window in page j // layers at layer slot j % layers)."""
        dev, ns = self.dev, self.namespace
        keys = self._swa_keys(self._keys(list(hashes)))
        slots = slots.detach().to("cpu", torch.int64).flatten()
        if len(keys) > self.max_keys or \
                slots.numel() * dev.swa_parts != len(keys) * self.page_size:
            return False
        have = pool.exists_keys(keys, namespace=ns)
        parts = dev.swa_parts
        have -= have % parts  # whole SGLang pages only
        if have == len(keys):
            return True
        n = len(keys) - have
        first = have // parts  # the first SGLang page to store
        dp = dev.pages_of(slots)
        lease = pool.alloc(n, tier="host")
        try:
            hp = torch.from_numpy(lease.pages.astype("int64")).sort().values
            hp_pages = hp.view(-1, parts)
            for j, comps in enumerate(dev.swa_layers):
                dst_pages = hp_pages[:, j // dev.nlayers]
                for c, buf in enumerate(comps):
                    if dp is not None:
                        src = dev.page_view(buf).index_select(0, dp[first:].to(buf.device))
                    else:
                        src = buf.index_select(0, slots[first * self.page_size:].to(
                            buf.device)).view(-1, self.page_size, *dev.row)
                    host.t[:, j % dev.nlayers, c].index_copy_(0, dst_pages, src.to("cpu"))
            r = pool.insert_keys(lease, keys, cached_keys=have, namespace=ns,
                                 pages=hp.numpy().astype("uint32"))
        finally:
            if not lease.ended and len(lease.pages):
                lease.free()
        self._count("offload_swa_pages", n // parts)
        return r["done_keys"] == len(keys)

    def _store_mamba(self, pool: kvpool.Pool, host: _Host, h: str, index: torch.Tensor) -> bool:
        """A node's Mamba state (the slot index names) into leased host pages, published under
        the keys of its last page (mamba_parts pages, the state's bytes in order)."""
        ns = self.namespace
        keys = self._mamba_keys(self._keys([h])[0])
        have = pool.exists_keys(keys, namespace=ns)
        if have == len(keys):
            return True
        page = host.u8.shape[1]
        data = self.mamba.read(self.mamba.slot(index))
        full = torch.zeros(len(keys) * page, dtype=torch.uint8)
        full[:len(data)] = data
        lease = pool.alloc(len(keys) - have, tier="host")
        try:
            hp = torch.from_numpy(lease.pages.astype("int64")).sort().values
            host.u8.index_copy_(0, hp, full.view(len(keys), page)[have:])
            r = pool.insert_keys(lease, keys, cached_keys=have, namespace=ns,
                                 pages=hp.numpy().astype("uint32"))
        finally:
            if not lease.ended and len(lease.pages):
                lease.free()
        self._count("offload_mamba_states")
        return r["done_keys"] == len(keys)

    def num_completed_offloads(self) -> int:
        return self._offload_results.qsize()

    def pop_completed_offload(self) -> bool:
        return self._offload_results.get_nowait()

    # -- lifecycle --
    def stats(self) -> dict:
        """The linker's counters and its connection's (connects, calls answered while kvpoold
        was unreachable, errors by name)."""
        with self._counts_lock:
            out = dict(self.counts)
        out.update(self.link.stats)
        return out

    def reset(self) -> None:
        jobs, self._pending = list(self._pending.values()), {}
        if jobs:
            self._release(jobs)
        self._load_queue.join()
        self._offload_queue.join()
        while True:
            try:
                self._offload_results.get_nowait()
            except Empty:
                break
        self.layer_done_counter.reset()

    def close(self) -> None:
        if self._closed:
            return
        self.reset()
        for thread, queue in ((self._offload_thread, self._offload_queue),
                              (self._load_thread, self._load_queue)):
            if thread.is_alive():
                queue.put(None)
                thread.join()
        log.info("kvpool.sglang: KvpoolLinker stats %s", self.stats())
        self.link.close()
        self._closed = True
