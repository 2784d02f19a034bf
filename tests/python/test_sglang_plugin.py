"""kvpool.sglang_plugin against SGLang 0.5.23: its general plugin loaded by SGLang's own
load_plugins() (the installed entry point), its hook applied by SGLang's HookRegistry, and
SGLang's real host pools (MHATokenToKVPoolHost, MLATokenToKVPoolHost on the CPU) built through
it in subprocesses: their buffers are leased kvpool host pages, an oversized pool fails with
kvpool.HostBudgetExceeded naming the limit that binds (the tier's host_capacity, or the node's
limit kvpoold reads when even the node could not hold it), two instances' pools come out of the
one host tier; the DeepSeek V4 paged and state host pools too."""
import json
import os
import subprocess
import sys

import pytest

from conftest import DEFAULT_CONF, pool_section
from engine_util import import_sglang

import_sglang()
pytest.importorskip("torch")

HERE = os.path.dirname(os.path.abspath(__file__))
# a host tier of 256 pages of 512 bytes (2 layers x 2 heads x 8, fp16, 4-token pages): SGLang's
# MHA host pool of the same geometry takes 128 bytes a token, one pool page per SGLang page
CONF = DEFAULT_CONF + pool_section("hp", host_capacity="1024t")

CHILD = r"""
import json, os, sys
sys.path.insert(0, {here!r})
import torch
from sglang.srt.plugins import load_plugins
from sglang.srt.plugins.hook_registry import HookRegistry
from kvpool import sglang_plugin
load_plugins()
out = {{"hooked": sglang_plugin.TARGET in HookRegistry._hooks}}
from engine_util import HostPool
pools = []
try:
    for layout, mla, pages in {spec!r}:
        h = HostPool(layout, 2, 2, 16 if mla else 8, 4, pages, torch.float16, mla=mla)
        pools.append(h)
        r = h.real
        buf = r.kv_buffer
        x = h.fill(3, 33)
        p = {{"roundtrip": bool(torch.equal(h.page(3), x)), "in_mapping": False,
              "leased": hasattr(r, "kvpool_lease")}}
        if os.environ.get("KVPOOL_SGLANG_HOST_POOL"):
            att = sglang_plugin.HostAttachment.get()
            base = att.pages.data_ptr()
            end = base + att.pages.numel()
            lease = sorted(int(q) for q in r.kvpool_lease.pages)
            p.update(in_mapping=base <= buf.data_ptr() and
                     buf.data_ptr() + buf.numel() * 2 <= end,
                     at_lease=buf.data_ptr() == base + lease[0] * att.pool.page_bytes,
                     pages=len(lease))
        out.setdefault("pools", []).append(p)
except Exception as e:
    out["error"] = type(e).__name__
    for k in ("requested_bytes", "available_bytes", "limit", "pool"):
        out[k] = getattr(e, k, None)
    out["message"] = str(e)
print(json.dumps(out), flush=True)
if {wait!r}:
    sys.stdin.readline()
"""


def child(sock, spec, env_pool="hp", wait=False):
    env = dict(os.environ, PYTHONWARNINGS="ignore", KVPOOL_SOCKET=sock)
    env.pop("KVPOOL_SGLANG_HOST_POOL", None)
    if env_pool:
        env["KVPOOL_SGLANG_HOST_POOL"] = env_pool
    code = CHILD.format(here=HERE, spec=spec, wait=wait)
    return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def result(p, wait=False):
    if wait:
        line = p.stdout.readline()
        assert line, p.stderr.read()[-3000:]
        return json.loads(line)
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def test_off_unless_switched_on(daemon):
    r = result(child(daemon.sock, [("layer_first", False, 8)], env_pool=None))
    assert r["hooked"] is False and "error" not in r, r
    assert r["pools"][0]["roundtrip"] and r["pools"][0]["leased"] is False
    assert daemon.pool_books("hp")["host"]["leased_tokens"] == 0


def test_host_pools_on_leased_pages(daemon):
    spec = [("layer_first", False, 16), ("page_first", False, 8),
            ("page_first_direct", True, 8)]
    r = result(child(daemon.sock, spec))
    assert r["hooked"] is True and "error" not in r, r
    for p in r["pools"]:
        assert p["in_mapping"] and p["at_lease"] and p["roundtrip"] and p["leased"], r
    # MHA: 128 bytes a token (512 a page), MLA (one latent of 16): 64, plus the alignment
    # slack, in 512-byte pool pages
    assert [p["pages"] for p in r["pools"]] == [(16 * 512 + 2048) // 512,
                                                (8 * 512 + 2048) // 512,
                                                -(-(8 * 256 + 2048) // 512)]
    # the child is gone: its session's leases went with it
    assert daemon.pool_books("hp")["host"]["leased_tokens"] == 0


def test_oversized_pool_is_host_budget_exceeded(daemon):
    r = result(child(daemon.sock, [("layer_first", False, 400)]))
    assert r["error"] == "HostBudgetExceeded", r
    assert r["requested_bytes"] >= 400 * 512 and r["available_bytes"] == 256 * 512
    assert r["limit"] == "host_capacity" and r["pool"] == "hp"
    assert "host_capacity" in r["message"]
    assert r["available_bytes"] == 256 * 512


def test_pool_past_the_node_names_the_node_limit(daemon):
    """A host pool larger than the tier's room plus all the node still has: the node's limit
    that binds (as kvpoold reads it for the tier) is named, not host_capacity."""
    import kvpool
    c = kvpool.connect(daemon.sock)
    st = {p["name"]: p for p in c.status()["pools"]}["hp"]
    c.close()
    node_room, node_limit = st["counters"]["host_room_bytes"], st["counters"]["host_room_limit"]
    assert node_limit in ("MemAvailable", "NUMA node free memory", "cgroup memory.max",
                          "RLIMIT_MEMLOCK", "free huge pages"), st["counters"]
    # twice what the node has (its free memory moves while the test runs; 512 bytes a page)
    pages = 2 * (node_room + 256 * 512) // 512
    r = result(child(daemon.sock, [("layer_first", False, pages)]))
    assert r["error"] == "HostBudgetExceeded", r
    assert r["requested_bytes"] >= pages * 512 and r["limit"] == node_limit, r
    # what the tier had free plus the node's room at the moment of the error
    assert 256 * 512 < r["available_bytes"] < r["requested_bytes"], r
    assert node_limit in r["message"] and r["pool"] == "hp"


def test_two_instances_share_the_node_budget(daemon):
    """Two instances (processes) take 40% of the tier each; a third 40% does not fit: the
    node's host tier is counted once, whatever the ranks or instances."""
    a = child(daemon.sock, [("layer_first", False, 100)], wait=True)
    b = child(daemon.sock, [("page_first", False, 100)], wait=True)
    try:
        ra, rb = result(a, wait=True), result(b, wait=True)
        assert "error" not in ra and "error" not in rb, (ra, rb)
        held = daemon.pool_books("hp")["host"]["leased_tokens"]
        assert held == 4 * (ra["pools"][0]["pages"] + rb["pools"][0]["pages"])
        c = result(child(daemon.sock, [("layer_first", False, 100)]))
        assert c["error"] == "HostBudgetExceeded"
        assert c["available_bytes"] == (1024 - held) // 4 * 512
    finally:
        for p in (a, b):
            p.kill()
            p.wait()


CHILD_V4 = r"""
import json, sys, types
import torch
from sglang.srt.plugins import load_plugins
load_plugins()
from sglang.srt.mem_cache.memory_pool_host import (DeepSeekV4PagedHostPool,
                                                   DeepSeekV4StateHostPool)
from kvpool import sglang_plugin
out = {{"pools": []}}
try:
    for kind, layout, pages in {spec!r}:
        if kind == "paged":
            dev = [torch.randint(0, 255, (8, 96), dtype=torch.uint8) for _ in range(3)]
            h = DeepSeekV4PagedHostPool("c4", dev, 96, pages, 4, layout=layout, device="cpu",
                                        pin_memory=False)
        else:
            # the device side of a state pool as the host pool reads it: a ring of state
            # slots per layer (kv_score_buffer.kv_score, ring_size)
            dev = [types.SimpleNamespace(
                ring_size=4, kv_score_buffer=types.SimpleNamespace(
                    kv_score=torch.zeros(16, 2, 8, dtype=torch.float16))) for _ in range(2)]
            h = DeepSeekV4StateHostPool("state", dev, pages, 4, layout=layout, device="cpu",
                                        pin_memory=False)
        bufs = h.kv_buffer if isinstance(h.kv_buffer, list) else [h.kv_buffer]
        att = sglang_plugin.HostAttachment.get()
        base, end = att.pages.data_ptr(), att.pages.data_ptr() + att.pages.numel()
        for b in bufs:
            b.fill_(7)
        out["pools"].append({{
            "leased": hasattr(h, "kvpool_lease"),
            "in_mapping": all(base <= b.data_ptr() and b.data_ptr() + b.numel() <= end
                              for b in bufs),
            "bytes": sum(b.numel() for b in bufs),
            "pages": len(h.kvpool_lease.pages) if hasattr(h, "kvpool_lease") else 0}})
except Exception as e:
    out["error"] = type(e).__name__
    for k in ("requested_bytes", "available_bytes", "limit", "pool"):
        out[k] = getattr(e, k, None)
print(json.dumps(out), flush=True)
"""


def test_v4_paged_and_state_pools_on_leased_pages(daemon):
    """SGLang's DeepSeek V4 paged and state host pools (built on the CPU) take their buffers
    from leased host pages through the budget hook; one past the tier is HostBudgetExceeded
    instead of SGLang's psutil ValueError."""
    spec = [("paged", "layer_first", 64), ("paged", "page_first", 32),
            ("state", "layer_first", 16), ("state", "page_first", 16)]
    env = dict(os.environ, PYTHONWARNINGS="ignore", KVPOOL_SOCKET=daemon.sock,
               KVPOOL_SGLANG_HOST_POOL="hp")
    p = subprocess.run([sys.executable, "-c", CHILD_V4.format(spec=spec)], env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert "error" not in r, r
    # paged: 3 layers x pages x 96 bytes; state: 2 layers x pages x (4 slots x 32 bytes)
    assert [q["bytes"] for q in r["pools"]] == [3 * 64 * 96, 3 * 32 * 96, 2 * 16 * 128,
                                                2 * 16 * 128]
    for q in r["pools"]:
        assert q["leased"] and q["in_mapping"] and q["pages"] >= q["bytes"] // 512, r
    assert daemon.pool_books("hp")["host"]["leased_tokens"] == 0  # the child is gone
    p = subprocess.run([sys.executable, "-c", CHILD_V4.format(
        spec=[("paged", "layer_first", 4096)])], env=env, capture_output=True, text=True,
        timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert r["error"] == "HostBudgetExceeded" and r["limit"] == "host_capacity", r
    assert r["requested_bytes"] >= 3 * 4096 * 96 and r["available_bytes"] == 256 * 512, r
