"""kvpool.sglang: a SGLang HiCache storage backend over kvpool's hash-keyed host pages, and
(kvpool.sglang.KvpoolLinker, from kvpool.sglang_linker) the external cache linker that makes
kvpool's host tier every instance's L2.

Engine instances on one node that attach the same kvpool pool share one L3 tier: pages one
instance backs up are found and read by every other. Start SGLang with::

    --enable-hierarchical-cache --hicache-storage-backend dynamic
    --hicache-storage-backend-extra-config '{"backend_name": "kvpool",
        "module_path": "kvpool.sglang", "class_name": "KvpoolStorage", "interface_v1": 1,
        "pool": "llama-8b", "socket": "/run/kvpool/kvpoold.sock"}'

Extra config keys: pool (required), socket (default: kvpool.default_socket()), namespace (int,
default 0), timeout_ms (per call, default 5000), max_keys_per_call (default 4096).

Keys, as SGLang's own storage backends name them: MHA stores a page's K and V as two keys,
"<hash>_<tp rank>_k" and "_v" ("<tp rank>_<pp rank>" with pipeline parallelism); MLA (K and V
are one latent, the same on every TP rank) one key "<hash>_<pp rank or nothing>_k". SGLang's
page hash (get_hash_str: 64 hex digits) travels as its 32 bytes; the chain of a batch is its
pages' keys in order (K then V for MHA), so a page is a hit when all its keys are.

Pool geometry: one kvpool host page holds one key's component of one SGLang page, [layers,
page_size, heads, head_dim] (MHA, per TP rank) or [layers, page_size, 1, kv_lora_rank +
qk_rope_head_dim] (MLA), of the host pool's dtype. A pool with the model's layers, kv_heads
(per rank; 1 for MLA), page_tokens = --page-size and head_dim halved (MHA: head_dim / 2; MLA:
(kv_lora_rank + qk_rope_head_dim) / 2) has exactly those page bytes; the check is on page
bytes and dtype (GeometryMismatch).

Host layouts: layer_first ([layers, tokens, ...]) and page_first_direct ([pages, layers,
page_size, ...]) copy a component page as layers runs of page_size rows; page_first ([tokens,
layers, ...]) needs a per-token gather (layers x page_size runs of one row). Every layout is
one strided torch copy per component for a batch when the host indices or kvpool's pages form
one run, else a gather first.

Tiers below host: pages kvpoold's disk tier (or remote tier) holds after the local ones are
hits too: batch_exists counts them (one MatchKeys without a lock per call of keys) and
batch_get_v1 / get fetch them into host pages (FetchKeys, locked) before copying them. A fetch
that fails (kvpoold refuses it, a page fails its check on the disk) is counted and the pages
it did not read are misses. Counted: exists_hits_below, fetched_pages, fetch_missed_pages,
fetch_<error>.

kvpoold down or restarted: every call answers misses / False and counts it (get_stats); the
backend attaches again by itself after a bounded backoff. Pages that another client loaded to
the pool's device tier are misses here (this backend reads host pages).
"""
from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from typing import Any, List, Optional

import torch
from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, HiCacheStorageConfig

import kvpool
from kvpool._link import Link, geometry_mismatch, held_pages, match_or_fetch

__all__ = ["KvpoolStorage", "KvpoolLinker", "LAYOUTS"]


def __getattr__(name: str) -> Any:
    """KvpoolLinker (kvpool.sglang_linker), imported on first use: the storage backend alone
    does not import SGLang's radix cache."""
    if name == "KvpoolLinker":
        from kvpool.sglang_linker import KvpoolLinker
        return KvpoolLinker
    raise AttributeError(f"module 'kvpool.sglang' has no attribute {name!r}")

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


def _page_view(buf: torch.Tensor, layout: str, T: int) -> torch.Tensor:
    """One component buffer of SGLang's host pool as [pages, layers, page_size, h, d]."""
    if layout == "layer_first":  # [layers, tokens, h, d]
        return buf.unflatten(1, (-1, T)).permute(1, 0, 2, 3, 4)
    if layout == "page_first":  # [tokens, layers, h, d]
        return buf.unflatten(0, (-1, T)).permute(0, 2, 1, 3, 4)
    if layout == "page_first_direct":  # [pages, layers, page_size, h, d]
        return buf
    raise ValueError(f"kvpool.sglang: host layout {layout!r} is not supported "
                     f"(supported: {', '.join(LAYOUTS)})")


def _component_views(host: Any, mla: bool) -> list[torch.Tensor]:
    """SGLang's host pool as one [pages, layers, page_size, h, d] view per key component:
    K and V (MHA), the latent (MLA)."""
    if mla:
        return [_page_view(host.kv_buffer, host.layout, host.page_size)]
    return [_page_view(host.k_buffer, host.layout, host.page_size),
            _page_view(host.v_buffer, host.layout, host.page_size)]


def _row(host: Any, mla: bool) -> tuple[int, int]:
    """(h, d) of one token's row of one component."""
    return (1, host.kv_cache_dim) if mla else (host.head_num, host.head_dim)


def _flat_to_components(host: Any, mla: bool, flat: torch.Tensor) -> list[torch.Tensor]:
    """SGLang's flat data page (get_data_page) as [layers, page_size, h, d] per component."""
    L, T = host.layer_num, host.page_size
    h, d = _row(host, mla)
    n = 1 if mla else 2
    if host.layout == "page_first":
        x = flat.view(n, T, L, h, d)
        return [x[j].transpose(0, 1) for j in range(n)]
    x = flat.view(n, L, T, h, d)
    return [x[j] for j in range(n)]


def _components_to_flat(host: Any, comps: list[torch.Tensor]) -> torch.Tensor:
    """Components [layers, page_size, h, d] as SGLang's flat data page."""
    if host.layout == "page_first":
        comps = [c.transpose(0, 1) for c in comps]
    return torch.stack(comps).reshape(-1)


class KvpoolStorage(HiCacheStorage):
    """HiCache storage in a kvpool pool's hash-keyed host pages, shared across instances."""

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: Optional[dict] = None):
        extra = dict(storage_config.extra_config or {}) if storage_config else {}
        if "pool" not in extra:
            raise ValueError("kvpool.sglang: the extra config needs \"pool\" (a kvpool pool name)")
        self.storage_config = storage_config
        self.kwargs = kwargs or {}
        self.namespace = int(extra.get("namespace", 0))
        self.timeout_ms = int(extra.get("timeout_ms", 5000))
        self.mla = bool(storage_config.is_mla_model)
        # the key components of a page: K and V (MHA), one (MLA); SGLang's own suffixes
        pp = f"{storage_config.pp_rank}" if storage_config.pp_size > 1 else ""
        if self.mla:
            tag = pp
        else:
            tag = f"{storage_config.tp_rank}" + (f"_{pp}" if pp else "")
        if storage_config.attn_cp_size > 1:
            tag += f"_cp{storage_config.attn_cp_rank}"
        self.suffixes = [f"_{tag}_k".encode()] if self.mla else \
            [f"_{tag}_k".encode(), f"_{tag}_v".encode()]
        self.ncomp = len(self.suffixes)
        # whole pages per call: every component key of a page in the same call
        self.max_pages = max(1, int(extra.get("max_keys_per_call", 4096)) // self.ncomp)
        self.mem_pool_host: Any = None
        self._comps: list[torch.Tensor] = []
        self.link = Link(str(extra["pool"]), extra.get("socket"),
                         name=f"sglang-{storage_config.tp_rank}", check=self._check,
                         setup=self._setup)
        self.link.connect_now()
        self.metrics = _Metrics()

    # -- pool and layout --
    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        """Takes SGLang's host pool (MHATokenToKVPoolHost or MLATokenToKVPoolHost, any of
        LAYOUTS) and checks it against the kvpool pool (GeometryMismatch)."""
        if getattr(mem_pool_host, "layout", None) not in LAYOUTS:
            raise ValueError(f"kvpool.sglang: host layout {mem_pool_host.layout!r} is not "
                             f"supported (supported: {', '.join(LAYOUTS)})")
        if self.mla != hasattr(mem_pool_host, "kv_cache_dim"):
            raise ValueError("kvpool.sglang: is_mla_model does not match the host pool's class "
                             f"{type(mem_pool_host).__name__}")
        super().register_mem_pool_host(mem_pool_host)
        self._comps = _component_views(mem_pool_host, self.mla)
        with self.link.lock:
            pool, self.link.state = self.link.pool, None
            if pool is not None:
                self._check(pool)  # raises into the engine's start-up: a wrong pool
                self.link.state = self._setup(pool)

    def _want(self) -> tuple[kvpool.Geometry, int]:
        """The pool geometry suggested for the host pool and the page bytes it must have."""
        h = self.mem_pool_host
        dt = {v: k for k, v in _TORCH_DTYPES.items()}.get(h.dtype, str(h.dtype))
        if h.dtype in (getattr(torch, "float8_e4m3fn", None), getattr(torch, "float8_e5m2", None)):
            dt = "fp8"
        rh, rd = _row(h, self.mla)
        size = h.layer_num * h.page_size * rh * rd * h.dtype.itemsize
        return kvpool.Geometry((h.layer_num, rh, max(1, rd // 2), dt, h.page_size)), size

    def _check(self, pool: kvpool.Pool) -> None:
        pool.client.set_timeout(self.timeout_ms)
        if not pool.tier_pages("host"):
            raise geometry_mismatch(pool.name, pool.geometry, pool.geometry,
                                    "the pool has no host tier")
        if self.mem_pool_host is None:
            return
        (want, size), have = self._want(), pool.geometry
        if not self.mla and self.mem_pool_host.v_head_dim != self.mem_pool_host.head_dim:
            raise geometry_mismatch(pool.name, want, have, "v_head_dim differs from head_dim")
        if pool.page_bytes != size or have.dtype != want.dtype:
            what = "K or V" if not self.mla else "the latent"
            raise geometry_mismatch(
                pool.name, want, have, f"a pool page ({pool.page_bytes} bytes, {have.dtype}) "
                f"must hold {what} of one SGLang page ({size} bytes, {want.dtype})")

    def _setup(self, pool: kvpool.Pool) -> Any:
        if self.mem_pool_host is None:
            return None
        host = torch.from_dlpack(pool.host_pages_view())
        dt = self.mem_pool_host.dtype
        if host.dtype != dt:
            host = host.view(dt)
        h = self.mem_pool_host
        rh, rd = _row(h, self.mla)
        return host.view(host.shape[0], h.layer_num, h.page_size, rh, rd)

    # -- keys --
    def _keys(self, keys: List[str]) -> list[bytes]:
        """The kvpool keys of SGLang's page keys: every component of each page, in order."""
        out = []
        for key in keys:
            b = None
            if len(key) == 64:
                try:
                    b = bytes.fromhex(key)
                except ValueError:
                    pass
            if b is None:
                b = key.encode()
                if len(b) + len(self.suffixes[0]) > 64:
                    b = hashlib.sha256(b).digest()
            out += [b + sfx for sfx in self.suffixes]
        return out

    def _pidx(self, host_indices: torch.Tensor, n: int) -> torch.Tensor:
        T = self.mem_pool_host.page_size
        idx = host_indices.reshape(-1)[::T][:n]
        return (idx.to(torch.int64) // T).cpu()

    # -- the v1 batch interface (what the cache controller calls) --
    def batch_exists(self, keys: List[str], extra_info: Any = None) -> int:
        """Count of leading pages whose every key is stored: in host pages or, after them, in
        the tiers below host (batch_get_v1 fetches those)."""
        if not keys:
            return 0
        kk, c = self._keys(keys), self.ncomp

        def go(pool, state):
            hit = below = 0
            for i in range(0, len(keys), self.max_pages):
                part = kk[i * c:(i + self.max_pages) * c]
                local, low = held_pages(pool, part, self.namespace)
                n = (local + low) // c
                hit += n
                below += n - min(n, local // c)
                if n * c < len(part):
                    break
            return hit, below

        r = self.link.call("exists", go)
        hit, below = r if r is not None else (0, 0)
        self.link.stats["exists_keys"] += len(keys)
        self.link.stats["exists_hits"] += hit
        if below:
            self.link.stats["exists_hits_below"] += below
        return hit

    def _batch_args(self, call, keys, host_indices):
        """The kvpool keys of keys and their host pool pages, for a batch call of n > 0 keys."""
        if self.mem_pool_host is None:
            raise RuntimeError(f"kvpool.sglang: {call} before register_mem_pool_host")
        return self._keys(keys), self._pidx(host_indices, len(keys))

    def batch_set_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Any = None) -> List[bool]:
        """Stores the pages at host_indices (page_size token slots per key) under keys."""
        n = len(keys)
        if n == 0:
            return []
        kk, pidx = self._batch_args("batch_set_v1", keys, host_indices)
        c, anchor = self.ncomp, None
        prefix = getattr(extra_info, "prefix_keys", None) if extra_info is not None else None
        if prefix:
            anchor = self._keys(prefix[-1:])[-1]

        def go(pool, state):
            done, prev = 0, anchor
            for i in range(0, n, self.max_pages):
                part = kk[i * c:(i + self.max_pages) * c]
                d = self._set_run(pool, state, prev, part, pidx[i:i + len(part) // c])
                done += d
                if d * c < len(part):
                    break
                prev = part[-1]
            return done

        done = self.link.call("set", go) or 0
        self.link.stats["set_pages"] += done
        self.link.stats["set_failed_pages"] += n - done
        self.metrics.backup_pgs.append(done)
        return [i < done for i in range(n)]

    def _set_run(self, pool, state, anchor, part, pidx) -> int:
        """Stores the pages pidx under part (their component keys); returns whole pages
        stored."""
        ns, c = self.namespace, self.ncomp
        chain = [anchor] + part if anchor is not None else part
        have = pool.exists_keys(chain, namespace=ns)
        if anchor is not None:
            if have == 0:  # the parent is gone: a run of its own
                chain, have = part, pool.exists_keys(part, namespace=ns)
            else:
                have -= 1
        lead = len(chain) - len(part)
        cp = have // c  # whole pages stored; a page missing a component is stored again
        if cp * c == len(part):
            return cp
        n = len(part) // c - cp
        lease = pool.alloc(n * c, tier="host")
        try:
            # component j of the pages in the j-th n of the lease's pages, sorted (one run
            # each when the lease is one, ascending or not), handed to the keys interleaved as
            # the chain names them
            kp = torch.from_numpy(lease.pages.astype("int64")).sort().values.view(c, n)
            src = pidx[cp:]
            for j, comp in enumerate(self._comps):
                _move(state, kp[j], comp, src)
            r = pool.insert_keys(lease, chain, cached_keys=lead + cp * c, namespace=ns,
                                 pages=kp.t().reshape(-1).numpy().astype("uint32"))
        finally:
            if not lease.ended and len(lease.pages):
                lease.free()
        return max(0, r["done_keys"] - lead) // c

    def batch_get_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Any = None) -> List[bool]:
        """Reads the leading stored pages of keys into host_indices; never None."""
        n = len(keys)
        if n == 0:
            return []
        kk, pidx = self._batch_args("batch_get_v1", keys, host_indices)
        c = self.ncomp

        def go(pool, state):
            got = 0
            for i in range(0, n, self.max_pages):
                part = kk[i * c:(i + self.max_pages) * c]
                g = self._get_run(pool, state, part, pidx[i:i + len(part) // c])
                got += g
                if g * c < len(part):
                    break
            return got

        got = self.link.call("get", go) or 0
        self.link.stats["get_pages"] += got
        self.link.stats["get_missed_pages"] += n - got
        self.metrics.prefetch_pgs.append(got)
        return [i < got for i in range(n)]

    def _count(self, what: str, n: int) -> None:
        self.link.stats[what] += n  # under the Link's lock (called from its calls)

    def _get_run(self, pool, state, part, pidx) -> int:
        """Reads the leading held pages of part (their component keys) into host pool pages
        pidx, those below host fetched into kvpool host pages first; returns the pages read."""
        c = self.ncomp
        m = match_or_fetch(pool, part, self.namespace, self._count)
        try:
            if len(m.device_pages):
                return 0  # loaded to the device tier by another client: not read here
            n = len(m.host_pages) // c
            if n:
                hp = torch.from_numpy(m.host_pages[:n * c].astype("int64")).view(n, c)
                for j, comp in enumerate(self._comps):
                    _move(comp, pidx[:n], state, hp[:, j])
            return n
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
        kk = self._keys([key])

        def go(pool, state):
            m = match_or_fetch(pool, kk, self.namespace, self._count)
            try:
                if len(m.device_pages) or len(m.host_pages) < self.ncomp:
                    return None
                comps = [state[int(p)] for p in m.host_pages]
                return _components_to_flat(self.mem_pool_host, comps)
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
        comps = _flat_to_components(self.mem_pool_host, self.mla, src.reshape(-1))
        kk = self._keys([key])

        def go(pool, state):
            if pool.exists_keys(kk, namespace=self.namespace) == len(kk):
                return True
            with pool.alloc(len(kk), tier="host") as lease:
                for p, comp in zip(lease.pages, comps):
                    state[int(p)].copy_(comp)
                r = pool.insert_keys(lease, kk, namespace=self.namespace)
            return r["done_keys"] == len(kk)

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
