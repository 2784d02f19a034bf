"""kvpool.sglang: a SGLang HiCache storage backend over kvpool's hash-keyed host pages.

Engine instances on one node that attach the same kvpool pool share one L3 tier: pages one
instance backs up are found and read by every other. Start SGLang with::

    --enable-hierarchical-cache --hicache-storage-backend dynamic
    --hicache-storage-backend-extra-config '{"backend_name": "kvpool",
        "module_path": "kvpool.sglang", "class_name": "KvpoolStorage", "interface_v1": 1,
        "pool": "llama-8b", "socket": "/run/kvpool/kvpoold.sock"}'

Extra config keys: pool (required; its geometry must be the host pool's per-rank geometry:
layers, kv_heads = heads of one TP rank, head_dim, dtype, page_tokens = --page-size),
socket (default: kvpool.default_socket()), namespace (int, default 0), timeout_ms (per call,
default 5000), max_keys_per_call (default 4096).

Keys: SGLang's page hash (get_hash_str: 64 hex digits) as its 32 bytes, then the TP rank
(and PP rank) and "kv": one kvpool page holds a page's K and V of every layer, so the two
components of SGLang's own MHA backends ("<hash>_<rank>_k", "_v") are one key here.

Host layouts: kvpool's host page is [layers, 2 (K, V), page_tokens, kv_heads, head_dim];
SGLang's layer_first ([2, layers, tokens, heads, dim]) and page_first_direct ([2, pages,
layers, page_tokens, heads, dim]) copy a page as 2 x layers runs of page_tokens rows;
page_first ([2, tokens, layers, heads, dim]) needs a per-token gather (2 x layers x page_tokens
runs of one row each). Every layout is a strided copy: one torch copy of K and V together for
a batch when the host indices or kvpool's pages form one run, else a gather first.

kvpoold down or restarted: every call answers misses / False and counts it (get_stats); the
backend attaches again by itself after a bounded backoff. MLA models are refused (kvpool
pages hold K and V planes of kv_heads heads).
"""
from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from typing import Any, List, Optional

import torch
from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, HiCacheStorageConfig

import kvpool
from kvpool._link import Link, geometry_mismatch

__all__ = ["KvpoolStorage", "LAYOUTS"]

log = logging.getLogger("kvpool.sglang")

LAYOUTS = ("layer_first", "page_first", "page_first_direct")
_TORCH_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32,
                 "fp8": torch.uint8}


@dataclass
class _Metrics:
    """The fields of SGLang's StorageMetrics, when that module does not import."""
    prefetch_pgs: List[int] = field(default_factory=list)
    backup_pgs: List[int] = field(default_factory=list)
    prefetch_bandwidth: List[float] = field(default_factory=list)
    backup_bandwidth: List[float] = field(default_factory=list)


def _run(idx: torch.Tensor) -> Optional[tuple[int, int]]:
    """(start, n) when idx is one ascending run of consecutive values."""
    n = idx.numel()
    if n == 0:
        return None
    a, b = int(idx[0]), int(idx[-1])
    if b - a + 1 != n:
        return None
    if n > 2 and not bool((idx[1:] - idx[:-1] == 1).all()):
        return None
    return a, n


def _take(t: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """t[idx] along dim 0: a view when idx is a run, else a gather."""
    r = _run(idx)
    return t.narrow(0, r[0], r[1]) if r else t.index_select(0, idx)


def _put(t: torch.Tensor, idx: torch.Tensor, value: torch.Tensor) -> None:
    """t[idx] = value along dim 0."""
    r = _run(idx)
    if r:
        t.narrow(0, r[0], r[1]).copy_(value)
    else:
        t.index_copy_(0, idx, value)


def _move(dst: torch.Tensor, di: torch.Tensor, src: torch.Tensor, si: torch.Tensor) -> None:
    """dst[di] = src[si] along dim 0, in one pass over the bytes unless neither side's pages
    are a run and the destination run is not contiguous."""
    rd, rs = _run(di), _run(si)
    if rs:
        _put(dst, di, src.narrow(0, rs[0], rs[1]))
    elif rd and dst.narrow(0, rd[0], rd[1]).is_contiguous():
        torch.index_select(src, 0, si, out=dst.narrow(0, rd[0], rd[1]))
    else:
        _put(dst, di, src.index_select(0, si))


def _sgl_page_views(host: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of SGLang's host pool as [pages, layers, page_tokens, heads, dim] views."""
    layout, T = host.layout, host.page_size
    k, v = host.k_buffer, host.v_buffer
    if layout == "layer_first":  # [layers, tokens, heads, dim]
        f = lambda b: b.unflatten(1, (-1, T)).permute(1, 0, 2, 3, 4)  # noqa: E731
    elif layout == "page_first":  # [tokens, layers, heads, dim]
        f = lambda b: b.unflatten(0, (-1, T)).permute(0, 2, 1, 3, 4)  # noqa: E731
    elif layout == "page_first_direct":  # [pages, layers, page_tokens, heads, dim]
        f = lambda b: b  # noqa: E731
    else:
        raise ValueError(f"kvpool.sglang: host layout {layout!r} is not supported "
                         f"(supported: {', '.join(LAYOUTS)})")
    return f(k), f(v)


def _sgl_kv_view(host: Any) -> Optional[torch.Tensor]:
    """SGLang's host K/V as one [pages, layers, 2, page_tokens, heads, dim] view (kvpool's
    host page order), or None when the pool has no kv_buffer of both."""
    kv, T = getattr(host, "kv_buffer", None), host.page_size
    if not isinstance(kv, torch.Tensor) or kv.shape[0] != 2:
        return None
    if host.layout == "layer_first":  # [2, layers, tokens, heads, dim]
        return kv.unflatten(2, (-1, T)).permute(2, 1, 0, 3, 4, 5)
    if host.layout == "page_first":  # [2, tokens, layers, heads, dim]
        return kv.unflatten(1, (-1, T)).permute(1, 3, 0, 2, 4, 5)
    return kv.permute(1, 2, 0, 3, 4, 5)  # page_first_direct [2, pages, layers, T, heads, dim]


def _flat_to_pages(host: Any, flat: torch.Tensor) -> torch.Tensor:
    """SGLang's flat data page (get_data_page) as [1, layers, 2, T, heads, dim]."""
    L, T, H, D = host.layer_num, host.page_size, host.head_num, host.head_dim
    if host.layout == "page_first":
        return flat.view(2, T, L, H, D).permute(2, 0, 1, 3, 4).unsqueeze(0)
    return flat.view(2, L, T, H, D).permute(1, 0, 2, 3, 4).unsqueeze(0)


def _pages_to_flat(host: Any, page: torch.Tensor) -> torch.Tensor:
    """A [layers, 2, T, heads, dim] page as SGLang's flat data page."""
    if host.layout == "page_first":
        return page.permute(1, 2, 0, 3, 4).reshape(-1)
    return page.permute(1, 0, 2, 3, 4).reshape(-1)


class KvpoolStorage(HiCacheStorage):
    """HiCache storage in a kvpool pool's hash-keyed host pages, shared across instances."""

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: Optional[dict] = None):
        extra = dict(storage_config.extra_config or {}) if storage_config else {}
        if "pool" not in extra:
            raise ValueError("kvpool.sglang: the extra config needs \"pool\" (a kvpool pool name)")
        if storage_config.is_mla_model:
            raise ValueError("kvpool.sglang: MLA models are not supported (kvpool pages hold "
                             "K and V planes)")
        self.storage_config = storage_config
        self.kwargs = kwargs or {}
        self.namespace = int(extra.get("namespace", 0))
        self.max_keys = max(1, int(extra.get("max_keys_per_call", 4096)))
        self.timeout_ms = int(extra.get("timeout_ms", 5000))
        tag = f"tp{storage_config.tp_rank}"
        if storage_config.pp_size > 1:
            tag += f"pp{storage_config.pp_rank}"
        if storage_config.attn_cp_size > 1:
            tag += f"cp{storage_config.attn_cp_rank}"
        self.key_suffix = b"\x00" + tag.encode() + b"kv"
        self.mem_pool_host: Any = None
        self.link = Link(str(extra["pool"]), extra.get("socket"),
                         name=f"sglang-{storage_config.tp_rank}", check=self._check,
                         setup=self._setup)
        self.link.connect_now()
        self.metrics = _Metrics()

    # -- pool and layout --
    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        """Takes SGLang's host pool (any of LAYOUTS) and checks it against the kvpool pool
        (GeometryMismatch)."""
        if getattr(mem_pool_host, "layout", None) not in LAYOUTS:
            raise ValueError(f"kvpool.sglang: host layout {mem_pool_host.layout!r} is not "
                             f"supported (supported: {', '.join(LAYOUTS)})")
        super().register_mem_pool_host(mem_pool_host)
        self._sgl_k, self._sgl_v = _sgl_page_views(mem_pool_host)
        self._sgl_kv = _sgl_kv_view(mem_pool_host)
        with self.link.lock:
            pool, self.link.state = self.link.pool, None
            if pool is not None:
                self._check(pool)  # raises into the engine's start-up: a wrong pool
                self.link.state = self._setup(pool)

    def _want(self) -> kvpool.Geometry:
        h = self.mem_pool_host
        dt = {v: k for k, v in _TORCH_DTYPES.items()}.get(h.dtype, str(h.dtype))
        if h.dtype in (getattr(torch, "float8_e4m3fn", None), getattr(torch, "float8_e5m2", None)):
            dt = "fp8"
        return kvpool.Geometry((h.layer_num, h.head_num, h.head_dim, dt, h.page_size))

    def _check(self, pool: kvpool.Pool) -> None:
        pool.client.set_timeout(self.timeout_ms)
        if not pool.tier_pages("host"):
            raise geometry_mismatch(pool.name, pool.geometry, pool.geometry,
                                    "the pool has no host tier")
        if self.mem_pool_host is None:
            return
        want, have = self._want(), pool.geometry
        if getattr(self.mem_pool_host, "v_head_dim", want.head_dim) != want.head_dim:
            raise geometry_mismatch(pool.name, want, have, "v_head_dim differs from head_dim")
        bad = [f for f in ("layers", "kv_heads", "head_dim", "dtype", "page_tokens") if getattr(want, f) != getattr(have, f)]
        if bad:
            raise geometry_mismatch(pool.name, want, have,
                                    f"{', '.join(bad)} differ from SGLang's host pool")

    def _setup(self, pool: kvpool.Pool) -> Any:
        if self.mem_pool_host is None:
            return None
        host = torch.from_dlpack(pool.host_pages_view())
        dt = self.mem_pool_host.dtype
        if host.dtype != dt:
            host = host.view(dt)
        planes = [None, None, None, None]
        if pool.tier_pages("device") and pool.tier_backend("device") in ("sim", "cuda"):
            try:
                g = pool.geometry
                planes = [[torch.from_dlpack(pool.kv("device", l, kv)).view(
                    -1, g.page_tokens, g.kv_heads, g.head_dim) for l in range(g.layers)]
                    for kv in (0, 1)]
            except ValueError:
                planes = [None, None]
        return {"kv": host, "k": host[:, :, 0], "v": host[:, :, 1], "dk": planes[0],
                "dv": planes[1]}

    # -- keys --
    def _key(self, key: str) -> bytes:
        if len(key) == 64:
            try:
                return bytes.fromhex(key) + self.key_suffix
            except ValueError:
                pass
        b = key.encode()
        if len(b) + len(self.key_suffix) > 64:
            b = hashlib.sha256(b).digest()
        return b + self.key_suffix

    def _pidx(self, host_indices: torch.Tensor, n: int) -> torch.Tensor:
        T = self.mem_pool_host.page_size
        idx = host_indices.reshape(-1)[::T][:n]
        return (idx.to(torch.int64) // T).cpu()

    # -- the v1 batch interface (what the cache controller calls) --
    def batch_exists(self, keys: List[str], extra_info: Any = None) -> int:
        """Count of leading keys stored."""
        if not keys:
            return 0
        kk = [self._key(k) for k in keys]

        def go(pool, state):
            hit = 0
            for i in range(0, len(kk), self.max_keys):
                part = kk[i:i + self.max_keys]
                c = pool.exists_keys(part, namespace=self.namespace)
                hit += c
                if c < len(part):
                    break
            return hit

        r = self.link.call("exists", go)
        self.link.stats["exists_keys"] += len(keys)
        self.link.stats["exists_hits"] += r or 0
        return r or 0

    def _batch_args(self, call, keys, host_indices):
        """The kvpool keys of keys and their host pool pages, for a batch call of n > 0 keys."""
        if self.mem_pool_host is None:
            raise RuntimeError(f"kvpool.sglang: {call} before register_mem_pool_host")
        return [self._key(k) for k in keys], self._pidx(host_indices, len(keys))

    def batch_set_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Any = None) -> List[bool]:
        """Stores the pages at host_indices (page_size token slots per key) under keys."""
        n = len(keys)
        if n == 0:
            return []
        kk, pidx = self._batch_args("batch_set_v1", keys, host_indices)
        anchor = None
        prefix = getattr(extra_info, "prefix_keys", None) if extra_info is not None else None
        if prefix:
            anchor = self._key(prefix[-1])

        def go(pool, state):
            done, prev = 0, anchor
            for i in range(0, n, self.max_keys):
                part = kk[i:i + self.max_keys]
                d = self._set_run(pool, state, prev, part, pidx[i:i + len(part)])
                done += d
                if d < len(part):
                    break
                prev = part[-1]
            return done

        done = self.link.call("set", go) or 0
        self.link.stats["set_pages"] += done
        self.link.stats["set_failed_pages"] += n - done
        self.metrics.backup_pgs.append(done)
        return [i < done for i in range(n)]

    def _set_run(self, pool, state, anchor, part, pidx) -> int:
        ns = self.namespace
        chain = [anchor] + part if anchor is not None else part
        c = pool.exists_keys(chain, namespace=ns)
        if anchor is not None:
            if c == 0:  # the parent is gone: a run of its own
                chain, c = part, pool.exists_keys(part, namespace=ns)
            else:
                c -= 1
        lead = len(chain) - len(part)
        if c == len(part):
            return c
        lease = pool.alloc(len(part) - c, tier="host")
        try:
            kp = torch.from_numpy(lease.pages.astype("int64"))
            src = pidx[c:]
            if self._sgl_kv is not None:
                _move(state["kv"], kp, self._sgl_kv, src)
            else:
                _move(state["k"], kp, self._sgl_k, src)
                _move(state["v"], kp, self._sgl_v, src)
            r = pool.insert_keys(lease, chain, cached_keys=lead + c, namespace=ns)
        finally:
            if not lease.ended and len(lease.pages):
                lease.free()
        return max(0, r["done_keys"] - lead)

    def batch_get_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Any = None) -> List[bool]:
        """Reads the leading stored pages of keys into host_indices; never None."""
        n = len(keys)
        if n == 0:
            return []
        kk, pidx = self._batch_args("batch_get_v1", keys, host_indices)

        def go(pool, state):
            got = 0
            for i in range(0, n, self.max_keys):
                part = kk[i:i + self.max_keys]
                g = self._get_run(pool, state, part, pidx[i:i + len(part)])
                got += g
                if g < len(part):
                    break
            return got

        got = self.link.call("get", go) or 0
        self.link.stats["get_pages"] += got
        self.link.stats["get_missed_pages"] += n - got
        self.metrics.prefetch_pgs.append(got)
        return [i < got for i in range(n)]

    def _get_run(self, pool, state, part, pidx) -> int:
        m = pool.match_keys(part, namespace=self.namespace, lock=True)
        try:
            nd, nh = len(m.device_pages), len(m.host_pages)
            if nd and state["dk"] is None:
                return 0  # device-resident pages not mapped here: a miss
            if nd:
                dp = torch.from_numpy(m.device_pages.astype("int64"))
                dst = pidx[:nd]
                for layer in range(len(state["dk"])):
                    _put(self._sgl_k[:, layer], dst, _take(state["dk"][layer], dp))
                    _put(self._sgl_v[:, layer], dst, _take(state["dv"][layer], dp))
            if nh:
                hp = torch.from_numpy(m.host_pages.astype("int64"))
                dst = pidx[nd:nd + nh]
                if self._sgl_kv is not None:
                    _move(self._sgl_kv, dst, state["kv"], hp)
                else:
                    _move(self._sgl_k, dst, state["k"], hp)
                    _move(self._sgl_v, dst, state["v"], hp)
            return nd + nh
        finally:
            m.release()

    # -- the single-key and legacy interface --
    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    def get(self, key: str, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> Optional[torch.Tensor]:
        """The page stored under key as SGLang's flat data page (into target_location when
        given), or None."""
        if self.mem_pool_host is None:
            return None
        k = self._key(key)

        def go(pool, state):
            m = pool.match_keys([k], namespace=self.namespace, lock=True)
            try:
                if len(m.host_pages):
                    p = int(m.host_pages[0])
                    page = torch.stack([state["k"][p], state["v"][p]], dim=1)
                elif len(m.device_pages) and state["dk"] is not None:
                    p = int(m.device_pages[0])
                    page = torch.stack([torch.stack([state["dk"][i][p], state["dv"][i][p]])
                                        for i in range(len(state["dk"]))])
                else:
                    return None
                return _pages_to_flat(self.mem_pool_host, page)
            finally:
                m.release()

        flat = self.link.call("get", go)
        if flat is None:
            return None
        if target_location is not None:
            target_location.view(-1).copy_(flat.view(target_location.dtype).view(-1)
                                           if flat.dtype != target_location.dtype else flat)
            return target_location
        return flat

    def batch_get(self, keys: List[str], target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> List[Optional[torch.Tensor]]:
        locs = target_locations if target_locations is not None else [None] * len(keys)
        return [self.get(k, t) for k, t in zip(keys, locs)]

    def set(self, key: str, value: Optional[Any] = None, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> bool:
        """Stores SGLang's flat data page value (or target_location) under key."""
        src = value if value is not None else target_location
        if src is None or self.mem_pool_host is None:
            return False
        page = _flat_to_pages(self.mem_pool_host, src.reshape(-1))
        k = self._key(key)

        def go(pool, state):
            if pool.exists_keys([k], namespace=self.namespace):
                return True
            with pool.alloc(1, tier="host") as lease:
                p = int(lease.pages[0])
                state["k"][p].copy_(page[0, :, 0])
                state["v"][p].copy_(page[0, :, 1])
                r = pool.insert_keys(lease, [k], namespace=self.namespace)
            return r["done_keys"] == 1

        return bool(self.link.call("set", go))

    def batch_set(self, keys: List[str], values: Optional[Any] = None,
                  target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> bool:
        vals = values if values is not None else target_locations
        if vals is None:
            return False
        return all([self.set(k, v) for k, v in zip(keys, vals)])

    def clear(self) -> None:
        """Evicts the pool's unlocked cached pages (every instance's: the tier is shared)."""
        self.link.call("clear", lambda pool, state: pool.client.flush(pool.name))

    def get_stats(self) -> Any:
        """SGLang's StorageMetrics of the calls since the last get_stats; .kvpool holds the
        backend's counters (hits, misses, calls answered while kvpoold was unreachable)."""
        try:
            from sglang.srt.observability.metrics_collector import StorageMetrics
            out = StorageMetrics(prefetch_pgs=self.metrics.prefetch_pgs,
                                 backup_pgs=self.metrics.backup_pgs)
        except Exception:  # its module needs prometheus_client
            out = _Metrics(prefetch_pgs=self.metrics.prefetch_pgs,
                           backup_pgs=self.metrics.backup_pgs)
        self.metrics = _Metrics()
        out.kvpool = self.stats()
        return out

    def stats(self) -> dict:
        """The backend's counters."""
        return dict(self.link.stats)

    def close(self) -> None:
        self.link.close()
