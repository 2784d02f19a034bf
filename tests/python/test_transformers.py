"""Tests of kvpool.transformers: a random-weight Llama across processes reuses a published
prefix from kvpool pages and gets the logits and tokens of a full recompute."""
import os
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (scripts/pytest.sh "
                            "installs it unless KVP_PY_TORCH=0)")
pytest.importorskip("transformers", reason="transformers is not installed")

import kvpool  # noqa: E402
from kvpool.transformers import KvpoolCache  # noqa: E402

import hf_model  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))

PUBLISHER = r"""
import sys, torch, kvpool, hf_model
from kvpool.transformers import KvpoolCache
model = hf_model.build_model()
ids = hf_model.system_prompt()
with kvpool.connect(sys.argv[1], name="publisher") as c:
    pool = c.attach("llama")
    with torch.no_grad(), KvpoolCache(pool, model.config) as cache:
        reused = cache.reuse(ids)
        model(ids[:, reused:], past_key_values=cache)
        print(reused, cache.publish(ids))
    pool.detach()
"""


def publish_in_other_process(sock):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([HERE] + sys.path))
    out = subprocess.run([sys.executable, "-c", PUBLISHER, sock], capture_output=True,
                         text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr
    return [int(x) for x in out.stdout.split()]


@pytest.fixture(scope="module")
def model():
    return hf_model.build_model()


@pytest.fixture
def pool(daemon):
    c = kvpool.connect(daemon.sock, name="pytest-hf")
    c.flush("llama")
    p = c.attach("llama")
    yield p
    p.detach()
    c.flush("llama")
    c.close()


def suffix_logits(model, pool, ids):
    with torch.no_grad(), KvpoolCache(pool, model.config) as cache:
        reused = cache.reuse(ids)
        out = model(ids[:, reused:], past_key_values=cache).logits
        assert out.shape[1] == ids.shape[1] - reused  # only the rest was computed
    return reused, out


def check_against_full(model, ids, reused, out):
    with torch.no_grad():
        full = model(ids, use_cache=False).logits[:, reused:]
    assert (out - full).abs().max().item() <= 1e-5
    assert torch.equal(out.argmax(-1), full.argmax(-1))


def test_reuse_across_processes_matches_full_recompute(daemon, model, pool):
    assert publish_in_other_process(daemon.sock) == [0, 36]  # 9 whole pages of 4
    ids = hf_model.user_prompt()
    reused, out = suffix_logits(model, pool, ids)
    assert reused == 36
    check_against_full(model, ids, reused, out)
    # a second engine publishing the same prefix adds nothing new
    assert publish_in_other_process(daemon.sock) == [36, 0]


def test_reuse_after_device_tier_evicted(daemon, model, pool):
    publish_in_other_process(daemon.sock)
    assert pool.client.evict("llama", 1 << 20, tier="device") >= 36
    books = daemon.pool_books("llama")
    assert books["device"]["cached_tokens"] == 0 and books["host"]["cached_tokens"] >= 36
    with pool.match(hf_model.system_prompt()[0]) as m:
        assert len(m.device_pages) == 0 and len(m.host_pages) == 9
    ids = hf_model.user_prompt(seed=12)
    reused, out = suffix_logits(model, pool, ids)  # loaded from the host pages
    assert reused == 36
    check_against_full(model, ids, reused, out)


def test_generate_16_tokens_same_as_without_kvpool(daemon, model, pool):
    publish_in_other_process(daemon.sock)
    ids = hf_model.user_prompt(seed=13)
    kw = dict(attention_mask=torch.ones_like(ids), max_new_tokens=16, do_sample=False,
              pad_token_id=0)
    with torch.no_grad():
        ref = model.generate(ids, **kw)
        with KvpoolCache(pool, model.config) as cache:
            assert cache.reuse(ids) == 36
            out = model.generate(ids, past_key_values=cache, **kw)
            assert cache.get_seq_length() == ids.shape[1] + 15
            # the prompt and the generated tokens' whole pages go into the cache
            assert cache.publish(out) == (ids.shape[1] + 15) // 4 * 4 - 36
    assert out.shape[1] == ids.shape[1] + 16
    assert torch.equal(out, ref)


def test_geometry_checked_against_model(model, pool):
    from transformers import LlamaConfig

    cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
                      num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2)
    with pytest.raises(kvpool.GeometryMismatch) as ei:
        KvpoolCache(pool, cfg)
    assert ei.value.expected.layers == 3 and ei.value.actual.layers == 2
    assert isinstance(ei.value, kvpool.Error)


def test_example_hf_shared_prefix_runs():
    from conftest import KVPOOLD, ROOT

    out = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "hf_shared_prefix.py"),
                          "--kvpoold", KVPOOLD, "--procs", "2", "--prompts", "2",
                          "--system-tokens", "64", "--user-tokens", "8"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 4
    assert lines[0].startswith("process 0 prompt 0: 0 tokens reused, 72 computed")
    for line in lines[1:]:
        assert ": 64 tokens reused, 8 computed; prefill" in line, line


def test_publish_after_eviction_drops_the_lost_pages(daemon, model, pool):
    """A page evicted between publish()'s insert and its lock: the cache keeps only what it
    still holds, says so (PrefixEvicted), and computing the rest again gives a full
    recompute's logits."""
    from kvpool.transformers import PrefixEvicted

    ids = hf_model.user_prompt(seed=14)
    with torch.no_grad(), KvpoolCache(pool, model.config) as cache:
        assert cache.reuse(ids) == 0
        model(ids, past_key_values=cache)
        lock = cache._lock

        def evict_then_lock(tokens):
            assert pool.client.flush("llama") >= 48  # all of the just-inserted pages
            return lock(tokens)

        cache._lock = evict_then_lock
        with pytest.raises(PrefixEvicted) as ei:
            cache.publish(ids)
        del cache._lock
        assert isinstance(ei.value, kvpool.NotFound) and ei.value.kept_tokens == 0
        assert cache.get_seq_length() == 0 and cache._pages == []
        # the pages handed to insert() are not written again: the recompute leases its own
        books = daemon.pool_books("llama")["device"]
        assert books["cached_tokens"] == 0
        out = model(ids, past_key_values=cache).logits
        assert cache.publish(ids) == 48
    check_against_full(model, ids, 0, out)


def test_model_dtype_other_than_pool_is_refused(model, pool):
    """The pool is fp32: a config naming no dtype under a bf16 default, and K/V of another
    dtype at the first update, raise GeometryMismatch rather than casting."""
    import copy

    cfg = copy.deepcopy(model.config)
    cfg.dtype = None
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float16)
    try:
        with pytest.raises(kvpool.GeometryMismatch, match="dtype"):
            KvpoolCache(pool, cfg)
    finally:
        torch.set_default_dtype(old)
    KvpoolCache(pool, cfg).close()  # fp32 by default: the pool's
    with KvpoolCache(pool) as cache:  # no config: checked at the first K/V
        k = torch.zeros(1, 2, 3, 16, dtype=torch.bfloat16)
        with pytest.raises(kvpool.GeometryMismatch, match="dtype") as ei:
            cache.update(k, k, 0)
        assert ei.value.actual.dtype == "fp32" and ei.value.expected.dtype == "bf16"
        assert cache.get_seq_length() == 0


def test_books_clean_after_close(daemon, model, pool):
    """After close() the daemon holds no leased or protected tokens for the cache's
    session: its lease and its lock are gone, the published pages stay cached."""
    ids = hf_model.user_prompt(seed=15, n=13)  # 12 whole pages and a leased tail
    with torch.no_grad():
        cache = KvpoolCache(pool, model.config)
        cache.reuse(ids)
        model(ids, past_key_values=cache)
        assert cache.publish(ids) == 48
        books = daemon.pool_books("llama")["device"]
        assert books["leased_tokens"] > 0 and books["protected_tokens"] >= 48
        cache.close()
    books = daemon.pool_books("llama")
    for tier in books.values():
        assert tier["leased_tokens"] == 0 and tier["protected_tokens"] == 0, tier
    assert books["device"]["cached_tokens"] >= 48


def test_example_exits_when_an_engine_process_dies(tmp_path):
    """An engine process that fails (here: no daemon on the socket) makes the example exit
    with an error naming it, instead of waiting for its result forever."""
    from conftest import ROOT

    out = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "hf_shared_prefix.py"),
                          "--socket", str(tmp_path / "none.sock"), "--procs", "2",
                          "--prompts", "1", "--system-tokens", "8", "--user-tokens", "4"],
                         capture_output=True, text=True, timeout=240)
    assert out.returncode != 0
    assert "failed (exit code 1)" in out.stderr, out.stderr


def test_layer_interface_of_this_release(model, pool):
    """The cache answers the installed release's layer interface (transformers 5: mask sizes
    of a query length, get_max_length, crop of the tokens to remove, crop(0) keeping them;
    4.x: mask sizes of the cache positions, get_max_cache_shape, crop to a length)."""
    import transformers

    v5 = int(transformers.__version__.split(".")[0]) >= 5
    ids = hf_model.user_prompt(seed=21)
    with torch.no_grad(), KvpoolCache(pool, model.config) as cache:
        model(ids, past_key_values=cache)
        n = ids.shape[1]
        assert cache.get_seq_length() == n
        layer = cache.layers[0]
        if v5:
            assert cache.get_max_length() == -1
            assert cache.get_mask_sizes(3, 0) == (n + 3, 0)
            cache.crop(0)
            assert cache.get_seq_length() == n
        else:
            assert layer.get_max_cache_shape() == -1
            assert layer.get_mask_sizes(torch.arange(n, n + 3)) == (n + 3, 0)
        cache.crop(-2)
        assert cache.get_seq_length() == n - 2
        cache.crop(n - 4)
        assert cache.get_seq_length() == n - 4
        # what the cache still holds computes the same next logits as a full recompute
        out = model(ids[:, n - 4:], past_key_values=cache).logits
        check_against_full(model, ids, n - 4, out)


def test_reuse_of_a_prefix_on_the_disk_tier(model):
    """A prefix one process published, whose pages other traffic pushed out of the device
    tier, then out of the host tier onto the pool's disk tier, is reused by a second process:
    reuse() fetches them into host pages (Pool.fetch) and loads them; the logits are a full
    recompute's. A Fetch refused (the session's quota held) is a counted miss."""
    import numpy

    from conftest import Daemon, pool_section
    from disk_util import disk_counters, disk_folder, disk_lines, remove_folder

    folder = disk_folder()
    conf = "[daemon]\n" + pool_section("llama", head_dim=16, device_capacity="64t",
                                       host_capacity="64t",
                                       extra=disk_lines(folder, "llama", "1024t")
                                       + "session_quota = 64t\n")
    d = Daemon(conf.replace("dtype = fp16", "dtype = fp32"))
    try:
        assert publish_in_other_process(d.sock) == [0, 36]
        sp = hf_model.system_prompt()[0]
        with kvpool.connect(d.sock, name="pytest-hf-disk") as c:
            pool = c.attach("llama")
            # other traffic: 128 pages of other prefixes through 16 device and 16 host pages
            for i in range(8):
                with pool.alloc(16, tier="device") as lease:
                    pool.insert(lease, numpy.arange(64, dtype=numpy.uint32) + 1000 * (i + 1))
            for _ in range(500):  # the disk tier writes behind the evictions
                m = pool.match(sp, lock=False)
                if m.remote_pages == 9:
                    break
                time.sleep(0.02)
            assert (len(m.device_pages), len(m.host_pages), m.remote_pages) == (0, 0, 9)
            ids = hf_model.user_prompt(seed=16)
            # the session's quota all leased: the Fetch is refused, reuse() counts it and
            # reuses nothing (no error); the model computes the whole prompt
            with pool.alloc(16, tier="host"), torch.no_grad(), \
                    KvpoolCache(pool, model.config) as cache:
                assert cache.reuse(ids) == 0
                assert cache.stats["fetch_QuotaExceeded"] == 1
                assert cache.stats["fetched_pages"] == 0
            read0 = disk_counters(d).get("disk_read_pages", 0)
            with torch.no_grad(), KvpoolCache(pool, model.config) as cache:
                reused = cache.reuse(ids)
                out = model(ids[:, reused:], past_key_values=cache).logits
                assert reused == 36
                assert cache.stats["fetched_pages"] == 9
            assert disk_counters(d)["disk_read_pages"] - read0 == 9
            check_against_full(model, ids, reused, out)
            books = d.pool_books("llama")
            for tier in books.values():
                assert tier["leased_tokens"] == 0 and tier["protected_tokens"] == 0, tier
            pool.detach()
    finally:
        d.stop()
        remove_folder(folder)
