"""Tests of the remote tier from Python: Pool.fetch / fetch_keys, Match.remote_pages and
match(local_only=True), against two real kvpoold nodes sharing a real 3-master Redis Cluster
on loopback (started by tests/integration/redis_cluster.sh, as the C remote suite does;
skipped when redis-server is not installed). Node W writes through, node R reads; every byte
R fetches is checked against what W wrote."""
import os
import shutil
import subprocess
import tempfile
import time

import numpy
import pytest

import kvpool
from conftest import ROOT, Daemon

PT, NP = 4, 8
REDIS_SH = os.path.join(ROOT, "tests", "integration", "redis_cluster.sh")


@pytest.fixture(scope="module")
def ports():
    """The cluster's three ports while the module runs; stopped and removed after."""
    for prog in ("redis-server", "redis-cli"):
        if not shutil.which(prog):
            pytest.skip(f"{prog} not installed (Debian: redis-server redis-tools)")
    d = tempfile.mkdtemp(prefix="kvpool-pytest-redis-")
    hold = os.path.join(d, "hold.sh")
    with open(hold, "w") as f:
        f.write(f'#!/bin/sh\necho "$KVP_REDIS_PORTS" > {d}/ports.tmp && mv {d}/ports.tmp '
                f'{d}/ports\nwhile [ ! -e {d}/stop ]; do sleep 0.1; done\n')
    os.chmod(hold, 0o755)
    proc = subprocess.Popen(["bash", REDIS_SH, hold], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    end = time.monotonic() + 90
    while not os.path.exists(os.path.join(d, "ports")):
        if proc.poll() is not None or time.monotonic() > end:
            out = proc.stdout.read() if proc.poll() is not None else ""
            proc.kill()
            shutil.rmtree(d, ignore_errors=True)
            if proc.returncode == 77:
                pytest.skip(out.strip())
            pytest.fail(f"the Redis Cluster did not start: {out}")
        time.sleep(0.1)
    with open(os.path.join(d, "ports")) as f:
        yield f.read().strip().split(",")
    open(os.path.join(d, "stop"), "w").close()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
    shutil.rmtree(d, ignore_errors=True)


def secret_file():
    """The deployment's MAC secret: one file (mode 0600) both nodes of a test read."""
    path = os.path.join(tempfile.gettempdir(), f"kvp-py-secret-{os.getpid()}")
    if not os.path.exists(path):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, b"kvpool-python-test-secret-012345")
        os.close(fd)
    return path


def remote_section(ports):
    """The [remote] section of a node on the test's cluster."""
    seeds = ",".join(f"127.0.0.1:{p}" for p in ports)
    return (f"[remote]\nseeds = {seeds}\nconnect_timeout_ms = 300\ncommand_timeout_ms = 1000\n"
            f"match_timeout_ms = 1000\nsecret = file:{secret_file()}\n")


def connected(d):
    """Waits until node d is connected to the cluster's three masters."""
    for _ in range(300):
        if counter(d, "remote_connects") >= 3:
            break
        time.sleep(0.01)
    assert counter(d, "remote_connects") >= 3


def node_conf(ports, mode):
    return "[daemon]\nkeepalive_ms = 120000\n" + remote_section(ports) + f"""[pool.r]
layers = 2
kv_heads = 2
head_dim = 8
dtype = fp16
page_tokens = {PT}
host_capacity = 128t
mlock = off
remote = {mode}
"""


def counter(d, name):
    return d.status()["counters"].get(name, -1)


def settle(d):
    """Waits until node d has nothing in flight to the cluster."""
    for _ in range(500):
        if counter(d, "remote_inflight_ops") == 0:
            return
        time.sleep(0.01)


@pytest.fixture(scope="module")
def nodes(ports):
    w = Daemon(node_conf(ports, "write-through"))
    r = Daemon(node_conf(ports, "spill"))
    try:
        for d in (w, r):
            connected(d)
        cw = kvpool.connect(w.sock, name="node-w")
        cr = kvpool.connect(r.sock, name="node-r")
        yield w, r, cw.attach("r"), cr.attach("r")
        cw.close()
        cr.close()
    finally:
        w.stop()
        r.stop()


def pattern(seed):
    """NP pages of host-layout values (layer, k|v, token, head, dim) for seed."""
    n = NP * 2 * 2 * PT * 2 * 8
    return (numpy.arange(n, dtype=numpy.float32) % 251 + seed).astype(numpy.float16).reshape(
        NP, 2, 2, PT, 2, 8)


def publish(pool, seed, tokens=None, keys=None, namespace=0):
    """W writes pattern(seed) into NP host pages and inserts them (written through)."""
    host = numpy.from_dlpack(pool.host_pages_view())
    with pool.alloc(NP, tier="host") as lease:
        pages = [int(p) for p in lease.pages]
        host[pages] = pattern(seed)
        if keys is not None:
            pool.insert_keys(lease, keys, namespace=namespace)
        else:
            pool.insert(lease, tokens, namespace=namespace)


def tokens_of(seed):
    return numpy.arange(NP * PT, dtype=numpy.uint32) + (seed << 12)


def same_bytes(pool, m, seed):
    host = numpy.from_dlpack(pool.host_pages_view())
    got = host[[int(p) for p in m.host_pages]]
    return got.shape == (NP, 2, 2, PT, 2, 8) and numpy.array_equal(got, pattern(seed))


def test_match_reports_remote_pages_and_local_only_asks_nothing(nodes):
    w, r, pw, pr = nodes
    t = tokens_of(1)
    publish(pw, 1, tokens=t)
    settle(w)
    q = counter(r, "remote_match_queries")
    m = pr.match(t, local_only=True, lock=False)
    assert m.tokens == 0 and m.remote_pages == 0
    assert counter(r, "remote_match_queries") == q
    m = pr.match(t, lock=False)
    assert m.tokens == 0 and m.remote_pages == NP
    assert counter(r, "remote_match_queries") == q + 1


def test_fetch_brings_the_writers_bytes(nodes):
    w, r, pw, pr = nodes
    t = tokens_of(2)
    publish(pw, 2, tokens=t)
    settle(w)
    with pr.fetch(t) as m:
        assert isinstance(m, kvpool.Match)
        assert m.fetched_pages == NP and m.missed_pages == 0
        assert m.lock_id != 0 and m.tokens == NP * PT
        assert len(m.device_pages) == 0 and same_bytes(pr, m, 2)
    # cached on R now: a local hit, nothing remote after it, nothing fetched again
    m = pr.match(t, lock=False)
    assert m.tokens == NP * PT and m.remote_pages == 0
    m = pr.fetch(t, lock=False)
    assert m.fetched_pages == 0 and m.lock_id == 0 and m.tokens == NP * PT


def test_fetch_keys_brings_hash_keyed_pages(nodes):
    w, r, pw, pr = nodes
    keys = [bytes([3, i]) * 10 for i in range(NP)]
    publish(pw, 3, keys=keys, namespace=9)
    settle(w)
    m = pr.match_keys(keys, namespace=9, lock=False)
    assert m.tokens == 0 and m.remote_pages == NP
    assert pr.match_keys(keys, namespace=9, lock=False, local_only=True).remote_pages == 0
    with pr.fetch_keys(keys, namespace=9) as m:
        assert m.fetched_pages == NP and m.missed_pages == 0
        assert m.tokens == NP * PT and same_bytes(pr, m, 3)


def test_fetch_of_what_no_node_has_is_a_miss(nodes):
    w, r, pw, pr = nodes
    m = pr.fetch(tokens_of(4), lock=False)
    assert m.tokens == 0 and m.fetched_pages == 0 and m.missed_pages == NP


def test_fetch_errors_are_typed(nodes):
    w, r, pw, pr = nodes
    with pytest.raises(kvpool.InvalidArgument):
        pr.fetch([])                      # neither tokens nor keys
    with pytest.raises(kvpool.InvalidArgument):
        pr.fetch_keys([b""])              # an empty key
    with pytest.raises(kvpool.LimitExceeded):
        pr.fetch_keys([b"x" * 65])        # past the library's 64 bytes a key
    m = pr.fetch(tokens_of(2), namespace=9, lock=False)  # token pages beside keyed ones
    assert m.tokens == 0 and m.fetched_pages == 0
    with pytest.raises(TypeError):
        pr.fetch(tokens_of(2), local_only=True)
