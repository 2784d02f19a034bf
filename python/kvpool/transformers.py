"""kvpool.transformers: a Hugging Face transformers Cache whose K/V live in kvpool pages.

KvpoolCache keeps every layer's K and V in device-tier pages of an attached pool (the sim
tier on a machine without a GPU, the cuda tier on one), so prefixes computed by one process
are reused by every other process serving the same model::

    cache = KvpoolCache(pool, model.config)
    reused = cache.reuse(input_ids)                 # matched, locked, loaded from host pages
    out = model(input_ids[:, reused:], past_key_values=cache)   # computes only the rest
    cache.publish(input_ids)                        # the whole pages go into the shared cache
    cache.close()                                   # locks and leased pages go back

model.generate(input_ids, past_key_values=cache, ...) after reuse() works the same way.
Pages of the prefix that kvpoold moved to a tier below host (disk, remote) are reused too:
reuse() fetches them into host pages (Pool.fetch, locked) and loads them to the device tier.

If an admin (or the daemon, under pressure) evicts one of the sequence's pages between
publish()'s insert and its lock, publish() raises PrefixEvicted (a kvpool.NotFound): the cache
then holds only the tokens before that page (e.kept_tokens, also get_seq_length()), and the
caller computes the rest again, model(input_ids[:, e.kept_tokens:], past_key_values=cache).
One sequence per cache (batch size 1). Tested with transformers 4.57.1 and 5.19.0 and torch
2.15.0 (scripts/pytest.sh pins them): the layer answers both releases' cache layer interface
(5.x: lazy_initialization of K and V, get_mask_sizes of a query length, get_max_length, crop
of the tokens to remove; 4.x: of the cache positions, get_max_cache_shape, crop to a length).
"""
from __future__ import annotations

from collections import Counter
from typing import Any, Optional

import numpy
import torch
from transformers.cache_utils import Cache, CacheLayerMixin

import kvpool

try:
    from transformers import __version__ as _TRANSFORMERS_VERSION
except ImportError:  # pragma: no cover - every release names its version
    _TRANSFORMERS_VERSION = "0"

# transformers 5 changed the layer interface (see the module's docstring)
_V5 = int(_TRANSFORMERS_VERSION.split(".")[0]) >= 5

__all__ = ["KvpoolCache", "KvpoolLayer", "PrefixEvicted", "expected_geometry"]

_TORCH_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
_POOL_DTYPES = {v: k for k, v in _TORCH_DTYPES.items()}


class PrefixEvicted(kvpool.NotFound):
    """publish(): a page of the sequence left the cache between insert and lock. The cache
    keeps the tokens before it (kept_tokens); compute input_ids[:, kept_tokens:] again."""

    def __init__(self, message: str, kept_tokens: int):
        super().__init__(message)
        self.message, self.name, self.kept_tokens = message, "NOT_FOUND", kept_tokens


def expected_geometry(config: Any, dtype: Optional[torch.dtype] = None) -> kvpool.Geometry:
    """The pool geometry a model config needs (page_tokens 0: any). The dtype is the one
    given, else config.dtype (or torch_dtype), else torch.get_default_dtype(): the dtype the
    model computes K/V in when its config names none."""
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    if dtype is None:
        dtype = getattr(config, "dtype", None)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, None) if dtype != "auto" else None
    if dtype is None:
        dtype = torch.get_default_dtype()
    return kvpool.Geometry((config.num_hidden_layers, kv_heads, head_dim,
                            _POOL_DTYPES.get(dtype, ""), 0))


def _check_geometry(pool: kvpool.Pool, want: kvpool.Geometry) -> None:
    have = pool.geometry
    bad = [f for f in ("layers", "kv_heads", "head_dim", "dtype")
           if getattr(want, f) and getattr(want, f) != getattr(have, f)]
    if bad:
        _raise_mismatch(pool, want, have, bad, "the model's")


def _raise_mismatch(pool: kvpool.Pool, want: Any, have: Any, bad: list, whose: str) -> None:
    e = kvpool.GeometryMismatch(
        f"pool {pool.name}: {', '.join(bad)} differ from {whose} "
        f"(model {tuple(want)}, pool {tuple(have)})")
    e.expected, e.actual, e.message, e.name = want, have, str(e), "GEOMETRY_MISMATCH"
    raise e


def _token_list(input_ids: Any) -> numpy.ndarray:
    if isinstance(input_ids, torch.Tensor):
        if input_ids.dim() == 2:
            if input_ids.shape[0] != 1:
                raise ValueError("input_ids: KvpoolCache holds one sequence (batch size 1)")
            input_ids = input_ids[0]
        return input_ids.detach().to("cpu", torch.int64).numpy()
    return numpy.asarray(input_ids, dtype=numpy.int64).reshape(-1)


class KvpoolLayer(CacheLayerMixin):
    """One layer of a KvpoolCache: writes K/V into the pool's pages and reads them back."""

    is_sliding = False

    def __init__(self, cache: "KvpoolCache", layer_idx: int):
        super().__init__()
        self._cache = cache
        self._idx = layer_idx
        self.length = 0

    def lazy_initialization(self, key_states: torch.Tensor,
                            value_states: Optional[torch.Tensor] = None) -> None:
        """Takes dtype and device from the first K/V given; K/V of another dtype than the
        pool's raise GeometryMismatch (no silent cast)."""
        plane = self._cache._planes[self._idx][0]
        if key_states.dtype != plane.dtype:
            pool = self._cache.pool
            want = pool.geometry
            got = kvpool.Geometry((want.layers, want.kv_heads, want.head_dim,
                                   _POOL_DTYPES.get(key_states.dtype, str(key_states.dtype)),
                                   want.page_tokens))
            _raise_mismatch(pool, got, want, ["dtype"], "the model's K/V")
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Stores the new K/V [1, kv_heads, T, head_dim] and returns all of the sequence's."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if key_states.shape[0] != 1:
            raise ValueError("KvpoolCache holds one sequence (batch size 1)")
        start, t = self.length, key_states.shape[-2]
        slots = self._cache._slots(start + t)
        kplane, vplane = self._cache._planes[self._idx]
        kplane[slots[start:]] = key_states[0].transpose(0, 1).to(kplane.dtype)
        vplane[slots[start:]] = value_states[0].transpose(0, 1).to(vplane.dtype)
        self.length = start + t
        self.keys = kplane[slots].transpose(0, 1).unsqueeze(0).to(key_states.dtype)
        self.values = vplane[slots].transpose(0, 1).unsqueeze(0).to(value_states.dtype)
        return self.keys, self.values

    def get_mask_sizes(self, query: Any) -> tuple[int, int]:
        """(kv_length, kv_offset) of the attention mask: the held tokens and the new ones
        (query: the new tokens' count in 5.x, their cache positions in 4.x)."""
        n = query if isinstance(query, int) else int(query.shape[0])
        return self.length + n, 0

    def get_seq_length(self) -> int:
        """Tokens whose K/V this layer holds."""
        return self.length

    def get_max_length(self) -> int:
        """-1: the sequence grows as pages are leased."""
        return -1

    def get_max_cache_shape(self) -> int:
        """-1 (transformers 4.x's name of get_max_length)."""
        return -1

    def reset(self) -> None:
        """Forgets the held tokens (the pages stay with the cache)."""
        self.length = 0

    def crop(self, n: int) -> None:
        """Drops -n tokens from the end when n is negative; n >= 0 keeps the first n tokens,
        except 0 in transformers 5 (no token to remove: the cache is kept)."""
        if n < 0:
            n = self.length + n
        elif n == 0 and _V5:
            return
        self.length = max(0, min(self.length, n))


class KvpoolCache(Cache):
    """A transformers Cache over leased device-tier pages of an attached kvpool Pool.

    pool: a kvpool.Pool whose geometry matches the model (GeometryMismatch otherwise).
    config: the model's config (checked against the pool's geometry when given).
    namespace: the prefix-cache namespace (e.g. one per LoRA adapter).
    """

    def __init__(self, pool: kvpool.Pool, config: Any = None, namespace: int = 0):
        g = pool.geometry
        if config is not None:
            _check_geometry(pool, expected_geometry(config))
        if g.dtype not in _TORCH_DTYPES:
            raise ValueError(f"pool {pool.name}: dtype {g.dtype} has no torch dtype here")
        super().__init__(layers=[KvpoolLayer(self, i) for i in range(g.layers)])
        self.pool = pool
        self.namespace = namespace
        self.page_tokens = g.page_tokens
        self._planes = [(torch.from_dlpack(pool.kv("device", i, 0)),
                         torch.from_dlpack(pool.kv("device", i, 1))) for i in range(g.layers)]
        self._pages: list[int] = []  # page of each page_tokens tokens of the sequence
        self._n_cached = 0           # leading pages that are the cache's (locked), not ours
        self._lease: Optional[kvpool.Lease] = None
        self._match: Optional[kvpool.Match] = None
        # fetches from the tiers below host: fetched_pages, fetch_missed_pages, fetch_<error>
        self.stats: Counter = Counter()

    # -- pages --
    def _slots(self, n: int) -> torch.Tensor:
        """Slots of tokens [0, n), leasing pages as the sequence grows."""
        need = -(-n // self.page_tokens) - len(self._pages)
        if need > 0:
            if self._lease is None or self._lease.ended:
                self._lease = self.pool.alloc(need)
                new = self._lease.pages
            else:
                new = self._lease.extend(need)
            self._pages.extend(int(p) for p in new)
        device = self._planes[0][0].device
        pages = torch.tensor(self._pages, dtype=torch.int64, device=device)
        pos = torch.arange(n, dtype=torch.int64, device=device)
        return pages[pos // self.page_tokens] * self.page_tokens + pos % self.page_tokens

    def _set_length(self, n: int) -> None:
        for layer in self.layers:
            layer.length = n

    def _lock(self, tokens: numpy.ndarray) -> kvpool.Match:
        m = self.pool.match(tokens, namespace=self.namespace, lock=True)
        if m.remote_pages:
            m = self._fetch(tokens, m)
        if len(m.host_pages):
            try:
                m.load()
            except kvpool.Unavailable:
                pass  # another session pins the host pages: use the device-resident part
        return m

    def _fetch(self, tokens: numpy.ndarray, m: kvpool.Match) -> kvpool.Match:
        """m's pages and those after them that the tiers below host (disk, remote) hold,
        read into host pages and locked (Fetch); a fetch that fails is counted in stats and
        m stands (a shorter prefix, computed again: never an error)."""
        try:
            f = self.pool.fetch(tokens, namespace=self.namespace, lock=True)
        except kvpool.Error as e:
            self.stats[f"fetch_{type(e).__name__}"] += 1
            return m
        m.release()
        self.stats["fetched_pages"] += f.fetched_pages
        self.stats["fetch_missed_pages"] += f.missed_pages
        return f

    # -- the kvpool side --
    def reuse(self, input_ids: Any) -> int:
        """Matches and locks the longest cached prefix of input_ids (loading host-resident
        pages to the device tier first) and returns the tokens reused; at least one token is
        left to compute. Call on an empty cache."""
        if self.get_seq_length() or self._pages:
            raise ValueError("reuse() needs an empty cache")
        tokens = _token_list(input_ids)
        m = self._lock(tokens)
        pt = self.page_tokens
        usable = min(len(m.device_pages), m.tokens // pt, (len(tokens) - 1) // pt)
        if usable <= 0:
            m.release()
            return 0
        self._match = m
        self._pages = [int(p) for p in m.device_pages[:usable]]
        self._n_cached = usable
        self._set_length(usable * pt)
        return usable * pt

    def publish(self, input_ids: Any) -> int:
        """Inserts the whole pages of the sequence this cache holds (the first
        get_seq_length() tokens of input_ids) into the shared prefix cache and keeps them
        locked for further use. Returns the newly cached tokens."""
        n = self.get_seq_length()
        tokens = _token_list(input_ids)
        if len(tokens) < n:
            raise ValueError(f"input_ids: {len(tokens)} tokens, the cache holds {n}")
        tokens = tokens[:n]
        if self._lease is None or self._lease.ended or n == 0:
            return 0
        if self._planes[0][0].device.type == "cuda":
            torch.cuda.synchronize(self._planes[0][0].device)
        new = self.pool.insert(self._lease, tokens, cached_pages=self._n_cached,
                               namespace=self.namespace, pages=self._pages[self._n_cached:])
        # the whole pages are the cache's now: lock them, as matched (duplicates resolve to
        # the pages another process cached first)
        m = self._lock(tokens)
        pt = self.page_tokens
        k = min(len(m.device_pages), n // pt)
        lost = k < n // pt
        if lost:
            # a page went between insert and lock: keep only the locked pages before it. The
            # pages from k on were given to insert() and may be the cache's (or freed) now:
            # none of them is written again (the lease keeps what stayed until close)
            self._set_length(k * pt)
            del self._pages[k:]
        self._pages[:k] = [int(p) for p in m.device_pages[:k]]
        self._n_cached = k
        if self._match is not None:
            self._match.release()
        self._match = m
        if lost:
            raise PrefixEvicted(
                f"pool {self.pool.name}: a page of the sequence was evicted during publish(); "
                f"the cache keeps {k * pt} of {n} tokens: compute the rest again", k * pt)
        return new

    def close(self) -> None:
        """Releases the lock and frees the leased pages."""
        if self._match is not None:
            self._match.release()
            self._match = None
        if self._lease is not None and not self._lease.ended:
            self._lease.free()
        self._lease = None
        self._pages = []
        self._n_cached = 0
        self._set_length(0)

    def __enter__(self) -> "KvpoolCache":
        """Returns the cache."""
        return self

    def __exit__(self, *exc: Any) -> None:
        """Closes the cache."""
        self.close()

    def reset(self) -> None:
        """Closes the cache: it is empty and may reuse() again."""
        self.close()
