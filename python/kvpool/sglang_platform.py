"""kvpool.sglang_platform: SGLang's token slots leased from a kvpool pool's device tier.

A platform plugin (entry point "kvpool" of SGLang's sglang.srt.platforms group; SGLang documents
platform plugins as the way out-of-tree hardware platforms plug in). Selected with
SGLANG_PLATFORM=kvpool and KVPOOL_SGLANG_POOL=<pool> (socket: $KVPOOL_SOCKET, else kvpool's
default); activate() answers None otherwise, so installing kvpool changes nothing. The platform
subclasses the one SGLang would pick on this machine (CUDA, else CPU) and changes only two
classes:

- get_kv_pool_cls("mha"): KvpoolMHATokenToKVPool, an MHATokenToKVPool whose K and V buffers are
  views of the pool's device tier (layer-first [layer][k|v][slot][head][dim], the fused K/V
  halves SGLang's own NHD pool allocates). The pool's geometry must be the model's (layers,
  kv heads per TP rank, head_dim, dtype, page_tokens = --page-size): kvpool.GeometryMismatch
  otherwise, at construction. DSA pools, quantized (fp4, scale buffers), HND and
  post-capture layouts are refused at construction.
- get_kv_pool_cls("mla"): KvpoolMLATokenToKVPool, an MLATokenToKVPool whose latent buffers
  [slots, 1, kv_lora_rank + qk_rope_head_dim] are views of the tier: model layer m is the
  tier's K half of layer m // 2 for even m, its V half for odd m. The pool's geometry: layers
  ceil(model layers / 2), kv_heads 1, head_dim kv_lora_rank + qk_rope_head_dim, the model's
  dtype, page_tokens = --page-size. DSA's MLA pools are refused: their latent buffers could
  be such views, but each layer's index-K buffer (SGLang's IndexKeyCache: one contiguous
  [pages, 64 x (128 + 4)] uint8 tensor, reshaped with .view for its kernels) cannot. A
  contiguous view puts page p's index row inside another page of the tier, one that another
  instance may lease; a view that keeps it inside page p has the tier's page stride and is
  not contiguous. A tier page that holds the index row too (a second row width) would serve
  them.
- Page size 1 is refused at construction: SGLang then builds its TokenToKVPoolAllocator, which
  no platform hook replaces, and nothing would lease the slots of the tier.
- get_paged_allocator_cls(): KvpoolPagedAllocator, SGLang's PagedTokenToKVPoolAllocator whose
  free pages are kvpool device pages leased on demand and handed back as soon as SGLang frees
  them: several SGLang instances on one node share one device tier, and an instance holds only
  the pages of its requests in flight and of its radix cache (plus the padding page below).
  When the tier cannot give the pages a prefill or decode step needs, alloc_extend and
  alloc_decode raise kvpool.OutOfCapacity with kvpool's figures (requested, free, evictable,
  protected, leased tokens, and in the message what this instance and the other sessions
  hold) where SGLang would raise "Out of memory. Try to lower your batch size". alloc() answers
  None as SGLang's callers expect (a load-back that does not fit is a miss).


SGLang writes padded tokens' output to slot 0, so kvpool's device page 0 is every instance's
padding page: the allocator never hands it to SGLang (a lease that gets it keeps it). A pool
served through this plugin must not be shared with clients that lease device pages otherwise.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from typing import Optional

from sglang.srt.platforms.cpu import CpuSRTPlatform
from sglang.srt.platforms.cuda import CudaSRTPlatform

import kvpool
from kvpool._link import geometry_mismatch

__all__ = ["activate", "ENV_POOL", "Attachment", "KvpoolCudaPlatform", "KvpoolCpuPlatform"]

log = logging.getLogger("kvpool.sglang")

ENV_POOL = "KVPOOL_SGLANG_POOL"
PLATFORM_NAME = "kvpool"


def activate() -> Optional[str]:
    """SGLang's platform plugin entry: the platform class when SGLANG_PLATFORM=kvpool, else
    None (SGLang activates every installed platform plugin when SGLANG_PLATFORM is unset, and
    refuses to start when more than one answers)."""
    if os.environ.get("SGLANG_PLATFORM") != PLATFORM_NAME:
        return None
    if not os.environ.get(ENV_POOL):
        raise ValueError(f"kvpool.sglang: SGLANG_PLATFORM=kvpool needs {ENV_POOL}=<pool name>")
    import torch

    if torch.cuda.is_available() and torch.version.hip is None:
        return "kvpool.sglang_platform.KvpoolCudaPlatform"
    return "kvpool.sglang_platform.KvpoolCpuPlatform"


class Attachment:
    """This process's connection to the pool the platform serves (one per pool name)."""

    _lock = threading.Lock()
    _all: dict = {}

    def __init__(self, pool: str, socket: Optional[str]):
        self.client = kvpool.connect(socket, name=f"sglang-platform-{os.getpid()}",
                                     reconnect_ms=4294967295)
        try:
            self.pool = self.client.attach(pool)
        except BaseException:
            self.client.close()
            raise
        if not self.pool.tier_pages("device"):
            raise geometry_mismatch(pool, self.pool.geometry, self.pool.geometry,
                                    "the pool has no device tier")
        self._free_at = 0.0
        self._free = 0

    @classmethod
    def get(cls, pool: Optional[str] = None, socket: Optional[str] = None) -> "Attachment":
        pool = pool or os.environ.get(ENV_POOL)
        if not pool:
            raise ValueError(f"kvpool.sglang: the kvpool platform needs {ENV_POOL}=<pool name>")
        with cls._lock:
            a = cls._all.get(pool)
            if a is None or a.client.closed:
                a = cls._all[pool] = Attachment(pool, socket)
            return a

    def tier_room(self, max_age_s: float = 0.005) -> int:
        """Tokens the device tier could still give (free + evictable), at most max_age_s old;
        0 while kvpoold cannot be asked."""
        now = time.monotonic()
        if now - self._free_at > max_age_s:
            self._free_at = now
            try:
                for p in self.client.status()["pools"]:
                    if p["name"] == self.pool.name:
                        t = p["tiers"]["device"]
                        self._free = int(t["free_tokens"]) + int(t["evictable_tokens"])
                        break
            except kvpool.Error as e:
                log.warning("kvpool.sglang: status: %s", e)
                self._free = 0
        return self._free

    def close(self) -> None:
        with self._lock:
            if self._all.get(self.pool.name) is self:
                del self._all[self.pool.name]
        self.client.close()


class _KvpoolPlatformMixin:
    def get_kv_pool_cls(self, *, kind: str) -> Optional[type]:
        from kvpool.sglang_platform_pool import kv_pool_cls

        return kv_pool_cls(kind)

    def get_paged_allocator_cls(self) -> Optional[type]:
        from kvpool.sglang_platform_pool import KvpoolPagedAllocator

        return KvpoolPagedAllocator


class KvpoolCudaPlatform(_KvpoolPlatformMixin, CudaSRTPlatform):
    """SGLang's CUDA platform with its KV pool and paged allocator on kvpool."""


class KvpoolCpuPlatform(_KvpoolPlatformMixin, CpuSRTPlatform):
    """SGLang's CPU platform with its KV pool and paged allocator on kvpool (a sim device
    tier)."""
