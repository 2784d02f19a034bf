"""kvpool.sglang_platform_pool: the KV pool and paged allocator of the kvpool platform plugin
for SGLang (kvpool.sglang_platform says what they do): the KV pool whose buffers are views of a
kvpool pool's device tier, and the paged allocator that leases its pages from it. Imported when
SGLang asks the platform for them, not when it resolves the platform (SGLang resolves it while
its own utilities are still importing)."""
from __future__ import annotations

import logging
from typing import Any, Optional

import torch
from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator, get_num_new_pages
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool

import kvpool
from kvpool._link import geometry_mismatch
from kvpool.sglang_platform import Attachment

__all__ = ["KvpoolMHATokenToKVPool", "KvpoolMLATokenToKVPool", "KvpoolPagedAllocator", "kv_pool_cls"]

log = logging.getLogger("kvpool.sglang")

_DTYPES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32",
           torch.uint8: "fp8"}
for _n in ("float8_e4m3fn", "float8_e5m2"):
    if hasattr(torch, _n):
        _DTYPES[getattr(torch, _n)] = "fp8"


def _refuse(what: str) -> None:
    raise ValueError(f"kvpool.sglang: the kvpool platform serves plain MHA (NHD, not "
                     f"quantized) and MLA KV pools of page size 2 or more; {what} is not "
                     f"served: unset SGLANG_PLATFORM or use another pool kind")


def _attach_tier(kv: Any, want: tuple, what: str) -> Any:
    """The platform's pool for KV pool kv (geometry want): checked against the model and kv's
    device, kv.size set to the tier's slots less SGLang's padding page (the tier's page 0),
    kv.kvpool_attachment / kvpool_pages set. Returns the kvpool.Pool."""
    if kv.page_size < 2:
        _refuse("page size 1 (SGLang builds its TokenToKVPoolAllocator for it, which no "
                "platform hook replaces, so nothing would lease the slots: start with "
                "--page-size 2 or more)")
    att = Attachment.get()
    pool = att.pool
    want = kvpool.Geometry(want)
    if tuple(want) != tuple(pool.geometry):
        raise geometry_mismatch(pool.name, want, pool.geometry,
                                f"the device tier must hold this model's KV ({what})")
    backend = pool.tier_backend("device")
    dev = torch.device(kv.device)
    if (backend == "cuda") != (dev.type == "cuda"):
        raise geometry_mismatch(pool.name, want, pool.geometry,
                                f"a {backend} device tier for a KV pool on {dev}")
    # the tier's pages are the pool's slots; page 0 is SGLang's padding page
    kv.size = pool.tier_pages("device") * kv.page_size - kv.page_size
    kv.kvpool_attachment = att
    kv.kvpool_pages = pool.tier_pages("device")
    log.info("kvpool.sglang: %s KV pool on pool %s's %s device tier (%d pages of %d tokens)",
             what, pool.name, backend, kv.kvpool_pages, kv.page_size)
    return pool


class KvpoolMHATokenToKVPool(MHATokenToKVPool):
    """SGLang's MHA KV pool over a kvpool pool's device tier: K and V of layer l are the tier's
    [slots, heads, head_dim] rows of (l, K) and (l, V), fused as SGLang's own pool fuses them."""

    def _create_buffers_normal(self) -> None:
        if self.use_hnd or getattr(self, "kv_cache_layout", "nhd") not in (None, "nhd", "NHD"):
            _refuse(f"the {self.kv_cache_layout} layout")
        if self.v_head_dim != self.head_dim:
            _refuse(f"v_head_dim {self.v_head_dim} != head_dim {self.head_dim}")
        pool = _attach_tier(self, (self.layer_num, self.head_num, self.head_dim,
                                   _DTYPES.get(self.store_dtype, str(self.store_dtype)),
                                   self.page_size), "MHA")
        k, v = [], []
        for layer in range(self.layer_num):
            k.append(torch.from_dlpack(pool.kv("device", layer, 0)).view(self.store_dtype))
            v.append(torch.from_dlpack(pool.kv("device", layer, 1)).view(self.store_dtype))
        self.k_buffer, self.v_buffer = k, v

    def _create_quantized_buffers(self) -> None:
        _refuse("a quantized KV cache")

    def _alloc_post_capture_buffers(self) -> None:
        _refuse("post-capture KV backing")


class KvpoolMLATokenToKVPool(MLATokenToKVPool):
    """SGLang's MLA KV pool over a kvpool pool's device tier. A layer's latent buffer
    [slots, 1, kv_cache_dim] is one half of a tier layer: model layer m is the tier's (m // 2,
    K) rows for even m and (m // 2, V) for odd m, so the pool has ceil(layers / 2) layers,
    1 kv head and head_dim kv_cache_dim (kv_lora_rank + qk_rope_head_dim), and no byte of it is
    unused but the V half of the last layer when the layer count is odd."""

    def _create_buffers(self) -> None:
        if self.use_dsa or self.dsa_kv_cache_store_fp8:
            _refuse("a DSA (NSA) MLA pool")
        pool = _attach_tier(self, ((self.layer_num + 1) // 2, 1, self.kv_cache_dim,
                                   _DTYPES.get(self.store_dtype, str(self.store_dtype)),
                                   self.page_size), "MLA")
        self.kv_buffer = [torch.from_dlpack(pool.kv("device", m // 2, m % 2))
                          .view(self.store_dtype) for m in range(self.layer_num)]


class KvpoolPagedAllocator(PagedTokenToKVPoolAllocator):
    """SGLang's paged allocator over pages leased from the kvpool device tier its KV pool
    views: pages are leased when SGLang needs more than it holds free and handed back when
    SGLang frees them."""

    def __init__(self, size: int, page_size: int, dtype: torch.dtype, device: str,
                 kvcache: Any, need_sort: bool, **kw: Any):
        att = getattr(kvcache, "kvpool_attachment", None)
        if att is None:
            raise ValueError(f"kvpool.sglang: KvpoolPagedAllocator needs the kvpool platform's "
                             f"KV pool, not {type(kvcache).__name__}")
        self._att = att
        self._lease: Optional[kvpool.Lease] = None
        self._padding = False  # this instance holds the tier's page 0
        super().__init__(size, page_size, dtype, device, kvcache, need_sort, **kw)

    # -- the lease --
    def held_pages(self) -> int:
        """Pages this instance holds leased in kvpool (in use, free here, padding)."""
        lease = self._lease
        return 0 if lease is None or lease.ended else len(lease.pages)

    def _lease_more(self, n: int) -> None:
        """Leases n more pages into free_pages (page 0 excepted); raises kvpool.OutOfCapacity
        (with what this instance and the others hold in its message) when the tier has not
        got them."""
        pool = self._att.pool
        while n > 0:
            try:
                if self._lease is None or self._lease.ended:
                    self._lease = pool.alloc(n, tier="device")
                    got = self._lease.pages
                else:
                    got = self._lease.extend(n)
            except kvpool.OutOfCapacity as e:
                mine = self.held_pages() * self.page_size
                e.held_tokens = mine
                e.other_sessions_tokens = max(0, e.leased_tokens - mine)
                e.message = (f"{e.message}; this SGLang instance holds {mine} tokens, other "
                             f"sessions {e.other_sessions_tokens}")
                e.args = (e.message,)
                raise
            pages = torch.as_tensor(got.astype("int64"))
            if bool((pages == 0).any()):
                self._padding = True  # SGLang's padding slot 0: kept, never handed out
                pages = pages[pages != 0]
            n -= pages.numel()
            self.free_pages = torch.cat((self.free_pages, pages.to(self.free_pages.device)))

    def _ensure(self, pages: int) -> None:
        if pages > len(self.free_pages):
            self.merge_and_sort_free()
        if pages > len(self.free_pages):
            self._lease_more(pages - len(self.free_pages))

    def _give_back(self) -> None:
        """Hands every free page back to kvpool."""
        self.merge_and_sort_free()
        if self._lease is None or self._lease.ended or not len(self.free_pages):
            return
        pages = self.free_pages.cpu().numpy().astype("uint32")
        try:
            self._lease.free(pages)
        except kvpool.Error as e:  # kvpoold gone: the session's pages went with it
            log.warning("kvpool.sglang: handing %d pages back: %s", len(pages), e)
        self.free_pages = self.free_pages[:0]

    # -- SGLang's allocator interface --
    def available_size(self) -> int:
        return (len(self.free_pages) + self.num_staged_pages) * self.page_size + \
            self._att.tier_room()

    def alloc(self, need_size: int) -> Optional[torch.Tensor]:
        try:
            self._ensure(need_size // self.page_size)
        except kvpool.Error as e:
            log.info("kvpool.sglang: alloc of %d tokens: %s", need_size, e)
            return None
        return super().alloc(need_size)

    def alloc_extend(self, prefix_lens, prefix_lens_cpu, seq_lens, seq_lens_cpu, last_loc,
                     extend_num_tokens, num_new_pages=None):
        if num_new_pages is None:
            num_new_pages = get_num_new_pages(seq_lens=seq_lens_cpu, page_size=self.page_size,
                                              prefix_lens=prefix_lens_cpu)
        self._ensure(int(num_new_pages))
        return super().alloc_extend(prefix_lens, prefix_lens_cpu, seq_lens, seq_lens_cpu,
                                    last_loc, extend_num_tokens, num_new_pages=num_new_pages)

    def alloc_decode(self, seq_lens, seq_lens_cpu, last_loc):
        self._ensure(int(get_num_new_pages(seq_lens=seq_lens_cpu, page_size=self.page_size,
                                           decode=True)))
        return super().alloc_decode(seq_lens, seq_lens_cpu, last_loc)

    def _release_page_ids(self, *page_ids: torch.Tensor) -> None:
        super()._release_page_ids(*page_ids)
        self._give_back()

    def clear(self) -> None:
        super().clear()
        # SGLang's clear() hands out every page of its pool; here they are kvpool's
        self.free_pages = self.free_pages[:0]
        if getattr(self, "_lease", None) is not None and not self._lease.ended:
            keep = [0] if self._padding else []
            pages = [int(p) for p in self._lease.pages if int(p) not in keep]
            if pages:
                try:
                    self._lease.free(pages)
                except kvpool.Error as e:
                    log.warning("kvpool.sglang: clear: %s", e)

    def debug_print(self) -> str:
        return (f"kvpool pool {self._att.pool.name}: {self.held_pages()} device pages leased "
                f"by this instance, {self._att.tier_room(0)} tokens free or evictable in the "
                f"tier")


def kv_pool_cls(kind: str) -> type:
    """The platform's KV pool class of kind ("mha", "mla", "dsa")."""
    if kind == "mha":
        return KvpoolMHATokenToKVPool
    return KvpoolMLATokenToKVPool if kind == "mla" else _refused_dsa()


def _refused_dsa() -> type:
    from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool

    class _RefusedDSA(DSATokenToKVPool):
        def __init__(self, *args: Any, **kwargs: Any):
            _refuse("a DSA KV pool")

    return _RefusedDSA
