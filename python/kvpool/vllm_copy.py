"""kvpool.vllm_copy: the byte layout of vLLM's offloaded chunks in kvpool's host pages, and the
copies between vLLM's block tensors and those pages without a staging buffer.

A page holds one worker's bytes of one offloaded chunk (one OffloadKey: a block hash of one KV
cache group), laid out as vLLM's own CPU offloading lays out a chunk: every canonical KV cache
tensor t has a region of blocks_per_chunk x page_t bytes at a fixed offset of the page (the
tensors in order), sub-block j of the chunk at j x page_t in it. A group copies only the tensors
its layers reference (ref.page_size_bytes of each sub-block: the page without padding), so the
groups of a hybrid model (full attention, sliding window, Mamba state, draft layers) share one
page geometry: blocks_per_chunk x the sum of the tensors' pages, which vLLM keeps within its
worker_kv_bytes_per_block (the shared allocation's stride).

A transfer is a list of (source address, destination address, bytes) runs computed with numpy
from the block ids and page ids (adjacent runs merged). On the CPU the whole list is one C
call (kvpool.copy_runs: a memcpy a run, non-temporal stores for 4 MiB or more) between vLLM's
tensors and the mapped pages; with CUDA block tensors the runs go to vLLM's own batched copy
(swap_blocks_batch: one cuMemcpyBatchAsync) when vLLM's kernels load, else to kvpool's
(kvpool.copy_runs_cuda: one cudaMemcpyBatchAsync) when kvpool was built with CUDA, else to one
cudaMemcpyAsync each, on a stream of their own, from and to the host mapping registered with
CUDA once.
"""
from __future__ import annotations

import ctypes
import ctypes.util
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np
import torch

import kvpool
from kvpool import copy_runs

__all__ = ["PageLayout", "GroupLayout", "HostPages", "Runs", "CpuCopier", "CudaCopier"]


@dataclass(frozen=True)
class GroupLayout:
    """What one KV cache group stores in a page: per reference (tensor index, offset of the
    tensor's region in the page, the tensor's block page, the bytes copied per block)."""

    group: int
    refs: tuple[tuple[int, int, int, int], ...]

    @property
    def bytes_per_block(self) -> int:
        return sum(r[3] for r in self.refs)

    def span(self, blocks_per_chunk: int) -> int:
        """The bytes of a page this group's chunks reach (end of its last region)."""
        return max((off + blocks_per_chunk * page for _, off, page, _ in self.refs), default=0)


class PageLayout:
    """The page layout of vLLM's CanonicalKVCaches for chunks of blocks_per_chunk blocks."""

    def __init__(self, tensors: Sequence[Any], group_refs: Sequence[Sequence[Any]],
                 blocks_per_chunk: int):
        self.k = int(blocks_per_chunk)
        self.tensors: list[torch.Tensor] = []
        self.pages: list[int] = []    # each tensor's block page (bytes)
        self.strides: list[int] = []  # bytes between two blocks of each tensor
        self.offsets: list[int] = []  # each tensor's region in a page
        off = 0
        for ct in tensors:
            t = ct.tensor
            esz = t.element_size()
            self.tensors.append(t)
            self.pages.append(int(ct.page_size_bytes))
            self.strides.append(int(t.stride(0)) * esz)
            self.offsets.append(off)
            off += self.k * int(ct.page_size_bytes)
        self.page_bytes = off  # bytes of a page the layout needs
        self.groups = [GroupLayout(g, tuple(
            (r.tensor_idx, self.offsets[r.tensor_idx], self.pages[r.tensor_idx],
             int(r.page_size_bytes)) for r in refs)) for g, refs in enumerate(group_refs)]
        self.cuda = any(t.is_cuda for t in self.tensors)
        self.device = self.tensors[0].device if self.tensors else torch.device("cpu")

    def describe(self, kinds: Optional[Sequence[str]] = None) -> str:
        """The page geometry per group, e.g. "group 0 (full): 2 tensors, 512 bytes per block,
        pages of 512 bytes at least"."""
        out = []
        for gl in self.groups:
            kind = f" ({kinds[gl.group]})" if kinds and gl.group < len(kinds) else ""
            out.append(f"group {gl.group}{kind}: {len(gl.refs)} tensors, {gl.bytes_per_block} "
                       f"bytes per block, {gl.span(self.k)} bytes of a page")
        return "; ".join(out)

    def check(self) -> Optional[str]:
        """Why vLLM's tensors cannot be copied by this layout, or None."""
        for i, (page, t) in enumerate(zip(self.pages, self.tensors)):
            if t.dim() < 1 or t.numel() and t[0].numel() * t.element_size() < page:
                return f"tensor {i}: a block row of {page} bytes is past the tensor's row"
        for gl in self.groups:
            for ti, _, page, n in gl.refs:
                if n > page:
                    return (f"group {gl.group}: {n} bytes per block of tensor {ti}, past its "
                            f"{page}-byte page")
        return None

    def runs(self, gpu: Any, pages: np.ndarray, host: "HostPages",
             to_host: bool) -> Optional["Runs"]:
        """The copy runs of one transfer between vLLM's blocks and the pages of its chunks.
        gpu: vLLM's GPULoadStoreSpec (block ids ordered by group, group_sizes, block_indices;
        vLLM 0.33) or DevicePointers (each group's refs' block addresses; vLLM 0.34 on).
        pages: the chunks' pages in the same group order, cdiv(skip + blocks, k) per group
        (skip = block_indices[g] % k). None when they do not fit: group or ref counts, pages
        or block ids out of range."""
        k = self.k
        ptrs = None
        if hasattr(gpu, "ptrs"):
            group_sizes, block_indices = gpu.group_block_counts, gpu.block_indices
            if tuple(gpu.group_data_ref_counts) != tuple(len(g.refs) for g in self.groups):
                return None
            ptrs = np.asarray(gpu.ptrs, dtype=np.uint64)
            block_ids = np.zeros(0, dtype=np.int64)
        else:
            group_sizes, block_indices = gpu.group_sizes, gpu.block_indices
            block_ids = np.asarray(gpu.block_ids)
        if len(group_sizes) != len(self.groups) or len(block_indices) != len(group_sizes):
            return None
        srcs, dsts, sizes = [], [], []
        boff = poff = doff = 0
        for gl, gs, bi in zip(self.groups, group_sizes, block_indices):
            gs = int(gs)
            if gs == 0:
                continue
            skip = int(bi) % k
            nch = -(-(gs + skip) // k)
            if poff + nch > len(pages):
                return None
            if ptrs is None:
                if boff + gs > len(block_ids):
                    return None
                blocks = block_ids[boff:boff + gs].astype(np.uint64)
                boff += gs
            elif doff + gs * len(gl.refs) > len(ptrs):
                return None
            gpages = pages[poff:poff + nch].astype(np.uint64)
            poff += nch
            s = np.arange(skip, skip + gs, dtype=np.uint64)
            hbase = host.ptr + gpages[s // np.uint64(k)] * np.uint64(host.page_bytes)
            sub = s % np.uint64(k)
            for ti, off, page, n in gl.refs:
                if ptrs is not None:
                    dev = ptrs[doff:doff + gs]
                    doff += gs
                else:
                    if int(blocks.max()) >= self.tensors[ti].shape[0]:
                        return None
                    dev = np.uint64(self.tensors[ti].data_ptr()) + blocks * np.uint64(
                        self.strides[ti])
                hp = hbase + np.uint64(off) + sub * np.uint64(page)
                srcs.append(dev if to_host else hp)
                dsts.append(hp if to_host else dev)
                sizes.append(np.full(gs, n, dtype=np.uint64))
        if boff != len(block_ids) or poff != len(pages) or (ptrs is not None and
                                                            doff != len(ptrs)):
            return None
        if not srcs:
            return Runs(np.zeros(0, np.uint64), np.zeros(0, np.uint64), np.zeros(0, np.uint64))
        return Runs.merged(np.concatenate(srcs), np.concatenate(dsts), np.concatenate(sizes))


@dataclass
class Runs:
    """Copies of one transfer: src[i] -> dst[i], size[i] bytes (addresses)."""

    src: np.ndarray
    dst: np.ndarray
    size: np.ndarray

    @staticmethod
    def merged(src: np.ndarray, dst: np.ndarray, size: np.ndarray) -> "Runs":
        """Adjacent runs (each one starting where the one before ends, on both sides) as one."""
        if len(src) < 2:
            return Runs(src, dst, size)
        brk = np.ones(len(src), dtype=bool)
        brk[1:] = (src[1:] != src[:-1] + size[:-1]) | (dst[1:] != dst[:-1] + size[:-1])
        starts = np.flatnonzero(brk)
        csum = np.concatenate([[0], np.cumsum(size, dtype=np.uint64)])
        ends = np.concatenate([starts[1:], [len(src)]])
        return Runs(src[starts], dst[starts], (csum[ends] - csum[starts]).astype(np.uint64))

    @property
    def nbytes(self) -> int:
        return int(self.size.sum()) if len(self.size) else 0


class HostPages:
    """The pool's host pages as mapped in this process: base address, page bytes, count."""

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor  # keeps the mapping's DLPack owner alive
        self.ptr = int(tensor.data_ptr())
        self.npages = int(tensor.shape[0])
        self.page_bytes = int(tensor.shape[1]) if tensor.dim() > 1 else 0
        self.registered = False

    def register_cuda(self) -> bool:
        """cudaHostRegister of the whole mapping, once (DMA from and to the pages)."""
        if self.registered:
            return True
        n = self.npages * self.page_bytes
        rc = torch.cuda.cudart().cudaHostRegister(self.ptr, n, 0)
        self.registered = int(rc) == 0
        return self.registered

    def unregister_cuda(self) -> None:
        if self.registered:
            torch.cuda.cudart().cudaHostUnregister(self.ptr)
            self.registered = False


class CpuCopier:
    """Runs on the CPU between vLLM's tensors and the mapped pages: one kvpool.copy_runs call a
    transfer (a C loop with the GIL released; a transfer of 4 MiB or more is written with
    non-temporal stores, as one large memcpy writes)."""

    def copy(self, runs: Runs) -> None:
        copy_runs(runs.dst, runs.src, runs.size)

    def pending(self) -> bool:
        return False


_CUDART: Any = None


def _cudart() -> Any:
    """libcudart through ctypes (cudaMemcpyAsync), the one torch loaded when it did."""
    global _CUDART
    if _CUDART is None:
        names = [ctypes.util.find_library("cudart"), "libcudart.so.13", "libcudart.so.12",
                 "libcudart.so"]
        for n in names:
            if not n:
                continue
            try:
                lib = ctypes.CDLL(n)
            except OSError:
                continue
            lib.cudaMemcpyAsync.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                            ctypes.c_int, ctypes.c_void_p]
            lib.cudaMemcpyAsync.restype = ctypes.c_int
            _CUDART = lib
            break
        else:
            _CUDART = False
    return _CUDART


def _swap_blocks_batch() -> Any:
    """vLLM's batched copy (vllm._custom_ops.swap_blocks_batch: one cuMemcpyBatchAsync), or
    None when vLLM or its kernels do not load here."""
    try:
        from vllm import _custom_ops as ops  # loads vllm._C, registering the ops
        if not hasattr(torch.ops._C_cache_ops, "swap_blocks_batch"):
            return None
        return ops.swap_blocks_batch
    except Exception:  # noqa: BLE001 - no kernels: the cudaMemcpyAsync path
        return None


class CudaCopier:
    """Runs between CUDA block tensors and registered host pages on a stream of their own,
    ordered after the current stream (stores read what the model wrote); each transfer's end
    is an event that get_finished queries."""

    def __init__(self, device: torch.device):
        self.device = device
        self.stream = torch.cuda.Stream(device=device)
        self.batch = _swap_blocks_batch()
        # kvpool's own batched copy (kvpool.copy_runs_cuda: one cudaMemcpyBatchAsync) where
        # vLLM's kernels do not load and kvpool was built with CUDA
        self.runs_cuda = kvpool.copy_runs_cuda if self.batch is None and kvpool.HAVE_CUDA \
            else None
        self.lib = None if self.batch is not None or self.runs_cuda else _cudart()
        if self.batch is None and not self.runs_cuda and not self.lib:
            raise RuntimeError("kvpool.vllm: neither vLLM's swap_blocks_batch, kvpool's CUDA "
                               "build nor libcudart loads: no copy path for CUDA block tensors")

    @property
    def path(self) -> str:
        """Which copy the runs take."""
        return ("swap_blocks_batch" if self.batch is not None else
                "kvpool.copy_runs_cuda" if self.runs_cuda else "cudaMemcpyAsync")

    def copy(self, runs: Runs) -> torch.cuda.Event:
        ev = torch.cuda.Event()
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            if len(runs.size):
                if self.batch is not None:
                    self.batch(torch.from_numpy(runs.src.view(np.int64)),
                               torch.from_numpy(runs.dst.view(np.int64)),
                               torch.from_numpy(runs.size.view(np.int64)))
                elif self.runs_cuda:
                    self.runs_cuda(runs.dst, runs.src, runs.size, self.stream.cuda_stream)
                else:
                    h = ctypes.c_void_p(self.stream.cuda_stream)
                    mc = self.lib.cudaMemcpyAsync
                    for d, s, n in zip(runs.dst.tolist(), runs.src.tolist(),
                                       runs.size.tolist()):
                        rc = mc(d, s, n, 4, h)  # cudaMemcpyDefault: unified addressing
                        if rc:
                            raise RuntimeError(f"kvpool.vllm: cudaMemcpyAsync: error {rc}")
            ev.record(self.stream)
        return ev
