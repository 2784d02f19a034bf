"""One SGLang instance's cache on the CPU for the KvpoolLinker tests and benchmarks: SGLang's
own MHATokenToKVPool (or MLATokenToKVPool), its paged allocator, UnifiedRadixCache and the
linker built by SGLang's create_unified_cache_linker from the dynamic backend's JSON config,
wired as SGLang's registry wires them (the KV pool waits on the linker's layer counter). The
methods drive the cache as SGLang's scheduler does: insert a computed prefix (write-through to
the linker), poll check_hicache_events, match a new request, init_load_back,
ready_to_load_host_cache, the forward reading each layer, finish_external_linker_loads."""
import time
from array import array

import torch


def linker_config(sock, pool, **extra):
    e = {"pool": pool, "socket": sock}
    e.update(extra)
    return {"linker": "KvpoolLinker", "linker_module_path": "kvpool.sglang",
            "linker_extra_config": e}


class Instance:
    def __init__(self, sock, pool, layers=2, heads=2, dim=8, page=4, slots=256,
                 dtype=torch.float16, mla=False, config=None, components=None, swa=None,
                 device="cpu", mamba=None):
        """swa: (sliding window tokens, the sliding-window layers' ids): SGLang's SWAKVPool
        and SWATokenToKVPoolAllocator, tree components Full and SWA. mamba: the Mamba
        layers' ids: SGLang's HybridReqToTokenPool (a Mamba2 state pool, the sizes of SGLang's
        own unified radix cache test kit) and HybridLinearKVPool, tree components Full and
        Mamba (page size 1: SGLang's Mamba cache needs its extra buffer for larger pages).
        device: where the KV pool and the allocator live (cuda on a GPU,
        test_sglang_cuda.py)."""
        from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
        from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        from sglang.srt.mem_cache.memory_pool import (MHATokenToKVPool, MLATokenToKVPool,
                                                      ReqToTokenPool)
        from sglang.srt.mem_cache.unified_cache.components import ComponentType
        from sglang.srt.mem_cache.unified_cache.linker_factory import (
            create_unified_cache_linker)
        from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
        from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

        self.server_args = ServerArgs(model_path="dummy", page_size=page)
        set_global_server_args_for_scheduler(self.server_args)
        self.page, self.layers, self.mla = page, layers, mla
        self.r2t = ReqToTokenPool(size=16, max_context_len=4096, device=device,
                                  enable_memory_saver=False)
        self.swa, self.mamba = swa, mamba
        if mamba:
            from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateShape
            from sglang.srt.environ import envs
            from sglang.srt.mem_cache.memory_pool import (HybridLinearKVPool,
                                                          HybridReqToTokenPool)

            self.server_args._mamba_cache_chunk_size = 64
            with envs.SGLANG_MAMBA_SSM_DTYPE.override("bfloat16"):
                shape = Mamba2StateShape.create(tp_world_size=1, intermediate_size=256,
                                                n_groups=1, num_heads=2, head_dim=16,
                                                state_size=16, conv_kernel=4)
                cache_params = Mamba2CacheParams(shape=shape, layers=list(mamba))
            self.r2t = HybridReqToTokenPool(
                size=16, mamba_size=20, mamba_spec_state_size=16, max_context_len=4096,
                device=device, enable_memory_saver=False, cache_params=cache_params,
                mamba_layer_ids=list(mamba), enable_mamba_extra_buffer=False,
                speculative_num_draft_tokens=3)
            full_ids = [i for i in range(layers) if i not in mamba]
            self.kv = HybridLinearKVPool(size=slots, dtype=dtype, page_size=page,
                                         head_num=heads, head_dim=dim,
                                         full_attention_layer_ids=full_ids, device=device,
                                         enable_memory_saver=False,
                                         mamba_pool=self.r2t.mamba_pool)
            self.alloc = TokenToKVPoolAllocator(size=slots, dtype=dtype, device=device,
                                                kvcache=self.kv, need_sort=False)
            self.full_layers = full_ids
            comps = (ComponentType.FULL, ComponentType.MAMBA)
        elif swa:
            from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator
            from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool

            window, swa_ids = swa
            full_ids = [i for i in range(layers) if i not in swa_ids]
            self.kv = SWAKVPool(size=slots, size_swa=slots, page_size=page, dtype=dtype,
                                head_num=heads, head_dim=dim, swa_attention_layer_ids=swa_ids,
                                full_attention_layer_ids=full_ids, device=device)
            self.alloc = SWATokenToKVPoolAllocator(size=slots, size_swa=slots, page_size=page,
                                                   dtype=dtype, device=device, kvcache=self.kv,
                                                   need_sort=False)
            self.full_layers = full_ids
            comps = (ComponentType.FULL, ComponentType.SWA)
        elif mla:
            self.kv = MLATokenToKVPool(size=slots, page_size=page, dtype=dtype,
                                       kv_lora_rank=dim - dim // 4, qk_rope_head_dim=dim // 4,
                                       layer_num=layers, device=device,
                                       enable_memory_saver=False)
        else:
            self.kv = MHATokenToKVPool(size=slots, page_size=page, dtype=dtype, head_num=heads,
                                       head_dim=dim, layer_num=layers, device=device,
                                       enable_memory_saver=False)
        if not swa and not mamba:
            cls = PagedTokenToKVPoolAllocator if page > 1 else TokenToKVPoolAllocator
            kw = {"page_size": page} if page > 1 else {}
            self.alloc = cls(size=slots, dtype=dtype, device=device, kvcache=self.kv,
                             need_sort=False, **kw)
            self.full_layers = list(range(layers))
            comps = (ComponentType.FULL,)
        self.params = CacheInitParams(
            req_to_token_pool=self.r2t, token_to_kv_pool_allocator=self.alloc, page_size=page,
            disable=False, tree_components=comps,
            sliding_window_size=swa[0] if swa else None)
        self.cache = UnifiedRadixCache(self.params)
        self.linker = create_unified_cache_linker(
            self.server_args, self.params, backend="dynamic",
            config=config if config is not None else linker_config(sock, pool),
            components=components if components is not None else set(self.cache.components),
            forward_stream=None)
        self.cache.init_cache_linker(self.linker)
        self.counter = self.cache.linker.layer_done_counter
        self.kv.register_layer_transfer_counter(self.counter)
        self.nreq = 0

    # -- the device pool's bytes --
    def bufs(self, layer):
        """The buffers of full-attention layer (global id) layer."""
        kv = self.kv
        if self.swa:
            kv, layer = kv.full_kv_pool, kv.layers_mapping[layer][0]
        elif self.mamba:
            kv, layer = kv.full_kv_pool, kv.full_attention_layer_id_mapping[layer]
        return (kv.kv_buffer[layer],) if self.mla else (kv.k_buffer[layer], kv.v_buffer[layer])

    def write(self, slots, seed):
        """Random KV into slots of every full-attention layer (what a forward computes)."""
        g = torch.Generator().manual_seed(seed)
        for layer in self.full_layers:
            for b in self.bufs(layer):
                b[slots] = torch.randn((len(slots),) + tuple(b.shape[1:]),
                                       generator=g).to(b.device, b.dtype)

    def read(self, slots):
        """The KV of slots, every layer, through the pool's getters (they wait on the
        linker's layer counter, as attention does)."""
        out = []
        for layer in self.full_layers:
            if self.mla:
                out.append(self.kv.get_key_buffer(layer)[slots].clone())
            else:
                out.append(self.kv.get_key_buffer(layer)[slots].clone())
                out.append(self.kv.get_value_buffer(layer)[slots].clone())
        return out

    # -- the scheduler's calls --
    def compute(self, tokens, seed):
        """A prefill that computed tokens: slots, KV written, inserted into the tree; the
        write-through hands the new nodes to the linker. Returns the slots."""
        from sglang.srt.mem_cache.base_prefix_cache import InsertParams
        from sglang.srt.mem_cache.radix_cache import RadixKey

        slots = self.alloc.alloc(len(tokens))
        assert slots is not None, "device pool full"
        self.write(slots, seed)
        state = None
        if self.mamba:  # the state the forward left in a Mamba slot, kept by the node
            state = self.r2t.mamba_allocator.alloc(1)
            assert state is not None, "Mamba pool full"
            self.write_state(state, seed)
        self.cache.insert(InsertParams(key=RadixKey(array("q", tokens)), value=slots,
                                       mamba_value=state))
        self.last_state = state
        return slots

    def mamba_tensors(self):
        """Every Mamba state tensor of the pool ([mamba layers, slots, ...] each)."""
        c = self.r2t.mamba_pool.mamba_cache
        return list(c.conv) + [c.temporal]

    def write_state(self, index, seed):
        """Random conv and temporal states into the Mamba slot index, every Mamba layer."""
        g = torch.Generator().manual_seed(seed + 1000)
        for t in self.mamba_tensors():
            t[:, index] = torch.randn(t[:, index].shape, generator=g).to(t.dtype)

    def read_state(self, index):
        """The Mamba slot index's states, every tensor (after the Mamba layers' turns on the
        linker's layer counter, as the Mamba layers read them)."""
        for layer in self.mamba:
            self.r2t.mamba2_layer_index(layer)
        return [t[:, index].clone() for t in self.mamba_tensors()]

    def drain(self, timeout=30):
        """check_hicache_events until every offload in flight is committed."""
        end = time.monotonic() + timeout
        while self.cache.linker.pending_offloads:
            self.cache.check_hicache_events()
            if not self.cache.linker.pending_offloads:
                break
            assert time.monotonic() < end, "offloads did not complete"
            time.sleep(0.002)

    def request(self, tokens):
        from sglang.srt.managers.schedule_batch import Req
        from sglang.srt.sampling.sampling_params import SamplingParams

        self.nreq += 1
        return Req(f"r{self.nreq}", "", array("q", tokens), SamplingParams(max_new_tokens=1))

    def _fetch(self, tokens):
        from sglang.srt.mem_cache.base_prefix_cache import (InitLoadBackParams,
                                                            MatchPrefixParams)
        from sglang.srt.mem_cache.radix_cache import RadixKey

        req = self.request(tokens)
        m = self.cache.match_prefix(MatchPrefixParams(key=RadixKey(array("q", tokens)),
                                                      req=req))
        req.last_node = m.last_device_node
        if m.host_hit_length == 0:
            return req, m, None, False
        n, _ = self.cache.init_load_back(InitLoadBackParams(
            best_match_node=m.last_host_node, host_hit_length=m.host_hit_length, req=req))
        if n == 0:
            return req, m, None, False
        slots = self.cache.linker.private_load_indices[req.rid]
        index = self.cache.ready_to_load_host_cache()
        self.counter.set_consumer(index)
        data = self.read(slots)
        failed = self.cache.finish_external_linker_loads([req])
        return req, m, (slots, data), bool(failed)

    def fetch(self, tokens):
        """A new request's match and load-back as the scheduler runs them, then its forward
        reading every layer. Returns (device prefix tokens, (loaded slots, their KV) or None,
        failed)."""
        _, m, got, failed = self._fetch(tokens)
        return m.device_prefix_len, got, failed

    def serve(self, tokens, seed):
        """A request served as the scheduler serves it: match, load-back of an L2 hit, the
        rest computed, the insert after the forward (write-through to the linker). Returns
        the tokens not computed."""
        from sglang.srt.mem_cache.base_prefix_cache import InsertParams
        from sglang.srt.mem_cache.radix_cache import RadixKey

        req, m, got, failed = self._fetch(tokens)
        root = self.cache.root_node_handle(None)
        have = self.cache.tree_core.collect_full_device_indices(req.last_node, root)
        have = have[:m.device_prefix_len].to(torch.int64)
        if got is not None and not failed:
            have = torch.cat([have, got[0].to(torch.int64)])
        rest = len(tokens) - len(have)
        if rest:
            new = self.alloc.alloc(rest)
            assert new is not None, "device pool full"
            self.write(new, seed)
            value = torch.cat([have, new.to(torch.int64)])
        else:
            value = have
        r = self.cache.insert(InsertParams(key=RadixKey(array("q", tokens)), value=value))
        if r.prefix_len > m.device_prefix_len:  # slots the tree holds already
            self.alloc.free(value[m.device_prefix_len:r.prefix_len])
        self.drain()
        return len(tokens) - rest

    def close(self):
        self.cache.linker.close()
