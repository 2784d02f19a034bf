"""kvpool.vllm_connector: KvpoolConnector, vLLM's OffloadingConnector whose worker also takes
vLLM's GPU KV cache memory from a kvpool pool's cuda device tier.

vLLM loads it by kv_connector_module_path; its offloading is kvpool.vllm's KvpoolOffloadingSpec
(or any spec the extra config names). With "kv_memory_pool" in kv_connector_extra_config, the
worker attaches that pool at construction and get_mem_pool_context() returns
torch.cuda.use_mem_pool of a MemPool whose allocator is kvpool.vllm_mem.DeviceRuns: vLLM's
allocate_kv_cache (one buffer for every KV cache tensor) then leases a run of the pool's device
pages and gets them mapped as that buffer. The lease is the worker's session's: kvpoold takes it
back when the engine exits or dies, and the node's vLLM instances share the one pool's GPU
memory. A pool without a cuda device tier is refused when the connector is built, with
GeometryMismatch saying so; without "kv_memory_pool" the connector is OffloadingConnector.

    --kv-transfer-config '{"kv_connector": "KvpoolConnector",
        "kv_connector_module_path": "kvpool.vllm_connector", "kv_role": "kv_both",
        "kv_connector_extra_config": {"spec_name": "KvpoolOffloadingSpec",
            "spec_module_path": "kvpool.vllm", "pool": "llama-8b",
            "kv_memory_pool": "llama-8b-kv", "socket": "/run/kvpool/kvpoold.sock"}}'
"""
from __future__ import annotations

import logging
from typing import Any, Optional

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import (
    OffloadingConnector,
)

import kvpool
from kvpool.vllm_mem import DeviceRuns, torch_mem_pool

__all__ = ["KvpoolConnector"]

log = logging.getLogger("kvpool.vllm_connector")


class KvpoolConnector(OffloadingConnector):
    """OffloadingConnector plus vLLM's KV cache memory from a pool's cuda device tier."""

    # the backends of a device tier that can hold vLLM's KV cache (tests widen it to "sim",
    # which holds the same layout in shared memory, to run the mapping on the CPU)
    KV_MEMORY_BACKENDS: tuple = ("cuda",)

    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any = None):
        super().__init__(vllm_config, role, kv_cache_config)
        extra = vllm_config.kv_transfer_config.kv_connector_extra_config or {}
        self.kv_memory_pool: Optional[str] = extra.get("kv_memory_pool")
        self.runs: Optional[DeviceRuns] = None
        self._mem_pool: Any = None
        self._client: Any = None
        if role != KVConnectorRole.WORKER or not self.kv_memory_pool:
            return
        self._client = kvpool.connect(extra.get("socket"), name="vllm-kv-memory")
        try:
            self._client.set_timeout(int(extra.get("timeout_ms", 5000)))
            pool = self._client.attach(str(self.kv_memory_pool))
            self.runs = DeviceRuns(pool, self.KV_MEMORY_BACKENDS)
        except BaseException:
            self._client.close()
            self._client = None
            raise

    def get_mem_pool_context(self) -> Any:
        """torch.cuda.use_mem_pool of the pool-backed MemPool (built once), or None without
        kv_memory_pool."""
        if self.runs is None:
            return None
        import torch
        if self._mem_pool is None:
            self._mem_pool = torch_mem_pool(self.runs)
        return torch.cuda.use_mem_pool(self._mem_pool)

    def shutdown(self) -> None:
        try:
            super().shutdown()
        finally:
            # the KV cache buffer stays while the engine runs; kvpoold takes the lease back
            # with the session when the client closes
            if self._client is not None and self._mem_pool is None and self.runs is not None:
                self.runs.close()
            if self._client is not None and self._mem_pool is None:
                self._client.close()
                self._client = None
