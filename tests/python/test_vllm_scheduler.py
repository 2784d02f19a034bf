"""kvpool.vllm.KvpoolOffloadingSpec driven by vLLM 0.33.0's own Scheduler and OffloadingConnector
(scheduler and worker sides) on CPU block tensors, as an engine step runs them: schedule,
the worker connector's transfers, a stand-in model that writes each computed token's K/V
bytes, update_from_output. Layouts: one full-attention group, a sliding-window group next to
a full one (overlaying the same tensors, as vLLM's hybrid allocator places them), a draft
(EAGLE) group of one layer, and Mamba state (padded to the attention page) next to full
attention. Loads of 1, 2 and 64 chunks, preemption, every loaded byte equal
to what was stored, no lock nor lease left in kvpoold when every request has finished."""

import pytest

from conftest import DEFAULT_CONF, pool_section
from engine_util import llama_dir

torch = pytest.importorskip("torch")
try:
    from vllm.config import (CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig,
                             SchedulerConfig, VllmConfig)
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import (
        OffloadingConnector)
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core import kv_cache_utils
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_offload import base as vbase
    from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec,
                                            KVCacheTensor, MambaSpec, SlidingWindowSpec)
    from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
    from vllm.v1.request import Request
    from vllm.v1.structured_output import StructuredOutputManager
except Exception as e:  # noqa: BLE001 - any import failure is the skip reason
    from engine_util import ENGINE_VENV_HINT
    pytest.skip(f"vLLM's scheduler does not import here: {type(e).__name__}: {e}; "
                f"{ENGINE_VENV_HINT}", allow_module_level=True)
import kvpool  # noqa: E402

BS = 16          # tokens per block
HEADS, DIM = 2, 16
PAGE = 2 * BS * HEADS * DIM * 2   # one layer's block: K and V, fp16 (2,048 bytes)
SLOT = PAGE // BS                 # the stand-in model's bytes of one token in a layer's block
NBLOCKS = 160
# pools whose page holds one worker's chunk: 2 layers' blocks (4,096 bytes), and 1 (2,048)
CONF = (DEFAULT_CONF + pool_section("v2", layers=2, head_dim=DIM, host_capacity="4096t")
        .replace("page_tokens = 4", f"page_tokens = {BS}")
        + pool_section("v1", layers=1, head_dim=DIM, host_capacity="4096t")
        .replace("page_tokens = 4", f"page_tokens = {BS}"))


def layouts():
    """(name, pool, KV cache groups, KVCacheTensors) of the tested layouts. Tensors place
    layer l of block b at offset + l * layer_stride + b * block_stride of one allocation."""
    full = FullAttentionSpec(block_size=BS, num_kv_heads=HEADS, head_size=DIM,
                             dtype=torch.float16)
    swa = SlidingWindowSpec(block_size=BS, num_kv_heads=HEADS, head_size=DIM,
                            dtype=torch.float16, sliding_window=2 * BS)
    size = 2 * NBLOCKS * PAGE
    two = KVCacheTensor(size=size, layers=["l0", "l1"], layer_stride=NBLOCKS * PAGE,
                        block_stride=PAGE)
    return {
        "full": ("v2", [KVCacheGroupSpec(["l0", "l1"], full)], [two]),
        # Gemma-like: a sliding-window layer and a full layer, overlaying the same bytes
        "hybrid": ("v1", [KVCacheGroupSpec(["f0"], full), KVCacheGroupSpec(["s0"], swa)],
                   [KVCacheTensor(size=NBLOCKS * PAGE, layers=["f0"], layer_stride=0,
                                  block_stride=PAGE),
                    KVCacheTensor(size=NBLOCKS * PAGE, layers=["s0"], layer_stride=0,
                                  block_stride=PAGE)]),
        # a draft layer in a group of its own, over the first target layer's bytes
        "draft": ("v2", [KVCacheGroupSpec(["l0", "l1"], full),
                         KVCacheGroupSpec(["d0"], full, is_eagle_group=True)],
                  [two, KVCacheTensor(size=size, layers=["d0"], layer_stride=0,
                                      block_stride=PAGE)]),
        # Mamba state next to full attention (state pages padded to the attention page)
        "mamba": ("v1", [KVCacheGroupSpec(["f0"], full),
                         KVCacheGroupSpec(["m0"], MambaSpec(
                             block_size=BS, shapes=((PAGE // 2,),), dtypes=(torch.int8,),
                             page_size_padded=PAGE, mamba_cache_mode="align"))],
                  [KVCacheTensor(size=NBLOCKS * PAGE, layers=["f0"], layer_stride=0,
                                 block_stride=PAGE),
                   KVCacheTensor(size=NBLOCKS * PAGE, layers=["m0"], layer_stride=0,
                                 block_stride=PAGE)]),
        # the one-group layout on a pool of one layer's pages: too small
        "full_on_v1": ("v1", [KVCacheGroupSpec(["l0", "l1"], full)], [two]),
    }


@pytest.fixture(scope="module")
def model_dir():
    return llama_dir(HEADS, DIM)


@pytest.fixture(scope="module")
def model_config(model_dir):
    return ModelConfig(model=model_dir, tokenizer=model_dir, skip_tokenizer_init=True,
                       dtype="float16", seed=0, max_model_len=2048)


class Engine:
    """vLLM's Scheduler (with its OffloadingConnector) and a worker-side OffloadingConnector
    over CPU block tensors, stepped as vLLM's engine core and model runner step them."""

    def __init__(self, model_config, sock, layout, max_tokens=512):
        pool, groups, tensors = layouts()[layout]
        self.pool = pool
        extra = {"spec_name": "KvpoolOffloadingSpec", "spec_module_path": "kvpool.vllm",
                 "pool": pool, "socket": sock}
        self.config = VllmConfig(
            model_config=model_config,
            cache_config=CacheConfig(block_size=BS, enable_prefix_caching=True,
                                     mamba_cache_mode="align" if layout == "mamba" else "none"),
            scheduler_config=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=max_tokens,
                                             max_model_len=2048, enable_chunked_prefill=True,
                                             is_encoder_decoder=False),
            kv_transfer_config=KVTransferConfig(kv_connector="OffloadingConnector",
                                                kv_role="kv_both",
                                                kv_connector_extra_config=extra),
            device_config=DeviceConfig("cpu"))
        self.kv_config = KVCacheConfig(num_blocks=NBLOCKS, kv_cache_tensors=tensors,
                                       kv_cache_groups=groups)
        self.groups = groups
        self.config.cache_config.num_gpu_blocks = NBLOCKS
        kv_cache_utils.init_none_hash(sha256)
        self.hasher = kv_cache_utils.get_request_block_hasher(BS, sha256)
        self.sched = Scheduler(self.config, self.kv_config, StructuredOutputManager(self.config),
                               block_size=BS)
        self.worker = OffloadingConnector(self.config, KVConnectorRole.WORKER, self.kv_config)
        self.buf = torch.zeros(tensors[0].size, dtype=torch.int8)
        self.views = {}
        for t in tensors:
            for i, name in enumerate(t.layers):
                self.views[name] = self.buf.as_strided(
                    (NBLOCKS, PAGE), (t.block_stride, 1), t.offset + i * t.layer_stride)
        self.worker.register_kv_caches(self.views)
        self.manager = self.sched.connector.connector_scheduler.manager
        self.tokens = {}
        self.next_id = 0
        self.preempted = 0

    def add(self, prompt, max_tokens=1):
        rid = f"r{self.next_id}"
        self.next_id += 1
        req = Request(rid, list(prompt), SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                      None, block_hasher=self.hasher)
        self.tokens[rid] = list(prompt)
        self.sched.add_request(req)
        return rid

    @staticmethod
    def pattern(pos, tok, layer):
        """The stand-in model's K/V bytes of one token of one layer."""
        g = torch.Generator().manual_seed(pos * 1_000_003 + tok * 7 + layer)
        return torch.randint(-128, 127, (SLOT,), dtype=torch.int8, generator=g)

    @staticmethod
    def state(pos, toks):
        """The stand-in model's Mamba state after token pos (of the prefix up to it)."""
        g = torch.Generator().manual_seed(hash(tuple(toks[:pos + 1])) & 0xFFFFFFFF)
        return torch.randint(-128, 127, (PAGE // 2,), dtype=torch.int8, generator=g)

    def _write(self, rid, start, end):
        ids = self.sched.kv_cache_manager.get_block_ids(rid)
        toks = self.tokens[rid]
        for g, group in enumerate(self.groups):
            mamba = isinstance(group.kv_cache_spec, MambaSpec)
            for p in range(start, end):
                b = ids[g][p // BS]
                if b == 0:
                    continue
                for li, name in enumerate(group.layer_names):
                    if mamba:  # the block's state: the one after its last token computed
                        self.views[name][b, :PAGE // 2] = self.state(p, toks)
                        continue
                    s = (p % BS) * SLOT
                    self.views[name][b, s:s + SLOT] = self.pattern(p, toks[p], li)

    def check(self, rid, upto):
        """Every non-null block of the request holds the bytes of its tokens [0, upto) (a
        Mamba group: its block of token upto - 1 holds the state after it)."""
        ids = self.sched.kv_cache_manager.get_block_ids(rid)
        toks = self.tokens[rid]
        checked = 0
        for g, group in enumerate(self.groups):
            if isinstance(group.kv_cache_spec, MambaSpec):
                b = ids[g][(upto - 1) // BS]
                for name in group.layer_names:
                    assert torch.equal(self.views[name][b, :PAGE // 2],
                                       self.state(upto - 1, toks)), (rid, g, upto, name)
                    checked += 1
                continue
            for p in range(upto):
                b = ids[g][p // BS]
                if b == 0:
                    continue
                for li, name in enumerate(group.layer_names):
                    s = (p % BS) * SLOT
                    assert torch.equal(self.views[name][b, s:s + SLOT],
                                       self.pattern(p, toks[p], li)), (rid, g, p, name)
                    checked += 1
        return checked

    def step(self, on_scheduled=None):
        out = self.sched.schedule()
        meta = out.kv_connector_metadata
        self.worker.bind_connector_metadata(meta)
        self.worker.handle_preemptions(meta)
        self.worker.start_load_kv(None)
        req_ids, sampled = [], []
        for rid, n in out.num_scheduled_tokens.items():
            req = self.sched.requests[rid]
            if on_scheduled:
                on_scheduled(rid, req.num_computed_tokens - n)
            end = req.num_computed_tokens
            self._write(rid, end - n, min(end, len(self.tokens[rid])))
            req_ids.append(rid)
            if end >= req.num_prompt_tokens:
                tok = (len(self.tokens[rid]) * 31) % 997
                self.tokens[rid].append(tok)
                sampled.append([tok])
            else:
                sampled.append([])
        self.worker.wait_for_save()
        sending, recving = self.worker.get_finished(out.finished_req_ids)
        wmeta = self.worker.build_connector_worker_meta()
        self.worker.clear_connector_metadata()
        kw = {}
        if "req_id_to_index" in ModelRunnerOutput.__dataclass_fields__:  # vLLM 0.33
            kw["req_id_to_index"] = {r: i for i, r in enumerate(req_ids)}
        mro = ModelRunnerOutput(req_ids=req_ids, sampled_token_ids=sampled,
                                kv_connector_output=KVConnectorOutput(
                                    finished_sending=sending or None,
                                    finished_recving=recving or None,
                                    kv_connector_worker_meta=wmeta), **kw)
        self.sched.update_from_output(out, mro)
        self.preempted += len(out.preempted_req_ids or ())
        return out

    def run(self, on_scheduled=None, limit=500):
        """Steps until every request finished and every transfer completed."""
        for _ in range(limit):
            self.step(on_scheduled)
            if not self.sched.has_requests() and not self.manager._stores:
                # two more steps: stores deferred to the next step's start complete there
                self.step(on_scheduled)
                self.step(on_scheduled)
                if not self.manager._stores:
                    return
        raise AssertionError(f"not done after {limit} steps")

    def forget_gpu(self):
        """vLLM's GPU prefix cache emptied and the block tensors zeroed: what a request
        finds now comes from kvpool."""
        assert self.sched.reset_prefix_cache()
        self.buf.zero_()

    def close(self):
        self.sched.shutdown()
        self.worker.shutdown()


def books(daemon, pool):
    h = daemon.pool_books(pool)["host"]
    return h["protected_tokens"], h["leased_tokens"]


@pytest.fixture
def engine(daemon, model_config, request):
    engines = []

    def make(layout, **kw):
        e = Engine(model_config, daemon.sock, layout, **kw)
        engines.append(e)
        return e

    yield make
    for e in engines:
        e.close()
    c = kvpool.connect(daemon.sock)
    for p in ("v1", "v2"):
        c.flush(p)
    c.close()


def prompt(n_blocks, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, 999, (n_blocks * BS + 1,), generator=g).tolist()


@pytest.mark.parametrize("chunks", [1, 2, 64])
def test_loads_release_their_lock(daemon, engine, chunks):
    """A request stores its prompt; after the GPU cache is emptied, a second request with the
    same prompt loads its chunks (one prepare_load of a list, one complete_load of a set):
    bytes equal, the lock released, nothing protected or leased afterwards."""
    e = engine("full", max_tokens=2048)
    p = prompt(chunks, seed=chunks)
    e.add(p)
    e.run()
    stats0 = e.manager.stats()
    assert books(daemon, e.pool) == (0, 0)
    e.forget_gpu()
    seen = {}
    rid = e.add(p)
    e.run(on_scheduled=lambda r, start: seen.setdefault(r, (start, e.check(r, start))))
    start, checked = seen[rid]
    assert start == chunks * BS and checked == chunks * BS * 2
    assert e.manager.stats()["lookup_hits"] - stats0.get("lookup_hits", 0) >= chunks
    assert books(daemon, e.pool) == (0, 0)
    assert e.manager.locks_held() == 0


@pytest.mark.parametrize("layout", ["hybrid", "draft", "mamba"])
def test_hybrid_layouts(daemon, engine, layout):
    """Two KV cache groups (sliding window + full; full + a draft layer; full + Mamba state):
    the engine starts, every group's chunks are stored and loaded back equal, no lock left."""
    e = engine(layout)
    loaded = []
    prep = e.manager.prepare_load

    def prepare_load(keys, ctx):
        loaded.extend(vbase.get_offload_group_idx(k) for k in keys)
        return prep(keys, ctx)

    e.manager.prepare_load = prepare_load
    p = prompt(6, seed=11)
    e.add(p)
    e.run()
    e.forget_gpu()
    seen = {}
    rid = e.add(p)
    e.run(on_scheduled=lambda r, start: seen.setdefault(r, (start, e.check(r, start))))
    start, checked = seen[rid]
    # vLLM drops the last block of a hit for an EAGLE group
    assert start == (5 if layout == "draft" else 6) * BS
    assert checked > 0
    # both groups' chunks came from kvpool: the sliding window's last ones (2 blocks)
    assert sorted(set(loaded)) == [0, 1], loaded
    if layout == "hybrid":
        assert loaded.count(0) == 6 and 1 <= loaded.count(1) <= 3
    if layout == "mamba":  # the state of the hit's last chunk
        assert loaded.count(0) == 6 and loaded.count(1) == 1
    assert books(daemon, e.pool) == (0, 0)
    assert e.manager.locks_held() == 0


def test_preemption_and_many_requests(daemon, engine):
    """More requests than the GPU blocks hold at once (vLLM preempts), half of them sharing
    prefixes stored by the others: every request finishes, loaded bytes equal, no lock or
    lease left."""
    e = engine("full", max_tokens=256)
    prompts = [prompt(38, seed=100 + i % 4) for i in range(8)]
    for p in prompts[:4]:
        e.add(p, max_tokens=40)
    e.run()
    e.forget_gpu()
    checked = []
    for p in prompts[4:]:
        e.add(p, max_tokens=40)
    e.run(on_scheduled=lambda r, start: checked.append(e.check(r, start)))
    assert sum(checked) > 0
    assert e.preempted > 0
    assert books(daemon, e.pool) == (0, 0)
    assert e.manager.locks_held() == 0


def test_pool_too_small_for_the_layout(daemon, model_config):
    """A pool whose pages cannot hold vLLM's chunk is refused when the engine starts, with
    GeometryMismatch naming the bytes needed."""
    with pytest.raises(kvpool.GeometryMismatch, match="page_bytes 2048 != vLLM's 4096"):
        Engine(model_config, daemon.sock, "full_on_v1")

