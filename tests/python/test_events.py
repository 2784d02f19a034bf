"""kvpoold's KV events ([events]) as routers read them: every batch decoded by the pinned vLLM's
own KVEventBatch msgspec decoder, the stream replayed into a model of the node's cache that must
equal `kvpoolctl cache --json`, replay of a missed range and snapshots, a subscriber that never
reads (bounded memory, drops counted), and the sequence rules across a kvpoold restart.

Needs vllm (its kv_events module) and pyzmq: run in the engine venv, skipped elsewhere."""
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

from conftest import DEFAULT_CONF, KVPOOLCTL, Daemon, pool_section
from test_remote import ports  # noqa: F401 (the Redis Cluster fixture)

kv_events = pytest.importorskip("vllm.distributed.kv_events",
                                reason="vllm is not installed (engine venv only)")
zmq = pytest.importorskip("zmq", reason="pyzmq is not installed (comes with vllm)")
msgspec = pytest.importorskip("msgspec", reason="msgspec is not installed (comes with vllm)")

END_SEQ = b"\xff" * 8
PAGE_TOKENS = 4
IPC_DIR = tempfile.mkdtemp(prefix="kvpool-events-")


def events_conf(tag, extra_events="", extra_pool="", hwm=10000):
    """DEFAULT_CONF's [daemon] and pools plus [events] on ipc endpoints of tag, and pool "e"
    (16 device pages, 16 host pages of 4 tokens) and pool "quiet" (events = off)."""
    return DEFAULT_CONF + f"""
[events]
endpoint = ipc://{IPC_DIR}/{tag}.pub
replay_endpoint = ipc://{IPC_DIR}/{tag}.replay
topic = kvpool
source = node-test
hwm = {hwm}
{extra_events}
""" + pool_section("e", device_capacity="64t", host_capacity="64t", extra=extra_pool) + \
        pool_section("quiet", device_capacity="64t", host_capacity="64t", extra="events = off\n")


class Subscriber:
    """A router's view: SUB on the PUB endpoint, DEALER on the replay endpoint, vLLM's
    decoder."""

    def __init__(self, tag, rcvhwm=None):
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        if rcvhwm is not None:
            self.sub.setsockopt(zmq.RCVHWM, rcvhwm)
            self.sub.setsockopt(zmq.RCVBUF, 4096)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"kvpool")
        self.sub.connect(f"ipc://{IPC_DIR}/{tag}.pub")
        self.replay_ep = f"ipc://{IPC_DIR}/{tag}.replay"
        self.decoder = msgspec.msgpack.Decoder(kv_events.KVEventBatch)
        self.batches = {}  # seq -> KVEventBatch

    def close(self):
        self.ctx.destroy(linger=0)

    def drain(self, idle=0.7, limit=30.0):
        """Receives live batches until none came for idle seconds."""
        end = time.monotonic() + limit
        while time.monotonic() < end and self.sub.poll(int(idle * 1000)):
            topic, seq, payload = self.sub.recv_multipart()
            assert topic == b"kvpool" and len(seq) == 8
            self.batches[int.from_bytes(seq, "big")] = self.decoder.decode(payload)

    def request(self, body):
        """Sends a replay request (8 bytes) and returns [(seq, batch)] up to the end marker."""
        d = self.ctx.socket(zmq.DEALER)
        d.connect(self.replay_ep)
        d.send_multipart([b"", body])
        out = []
        try:
            while True:
                assert d.poll(10000), "no answer from the replay socket"
                parts = d.recv_multipart()
                assert parts[0] == b"" and len(parts) == 4
                if parts[2] == END_SEQ:
                    assert parts[1] == b"" and parts[3] == b""
                    return out
                assert parts[1] == b"kvpool"
                out.append((int.from_bytes(parts[2], "big"), self.decoder.decode(parts[3])))
        finally:
            d.close(linger=0)

    def replay(self, start=0):
        got = self.request(start.to_bytes(8, "big"))
        for seq, b in got:
            self.batches[seq] = b
        return got

    def snapshot(self):
        got = self.request(b"SNAPSHOT")
        assert len(got) == 1
        return got[0]


class Model:
    """The node's cache as the events tell it: (block hash, medium) -> pages."""

    def __init__(self):
        self.pages = collections.Counter()
        self.stores = self.removes = 0

    def held(self, h):
        return any(self.pages[(h, m)] for m in ("GPU", "CPU"))

    def apply(self, batch):
        for ev in batch.events:
            if isinstance(ev, kv_events.AllBlocksCleared):
                self.pages.clear()
            elif isinstance(ev, kv_events.BlockStored):
                assert ev.medium in ("GPU", "CPU") and ev.locality == "LOCAL"
                assert ev.ownership == "node-test" and ev.block_size == PAGE_TOKENS
                assert ev.lora_id is None and ev.lora_name is None
                assert len(ev.token_ids) in (0, PAGE_TOKENS * len(ev.block_hashes))
                # a chain's pages are stored after their parent, which the node still holds
                assert ev.parent_block_hash is None or self.held(ev.parent_block_hash)
                for h in ev.block_hashes:
                    assert isinstance(h, bytes) and 1 <= len(h) <= 64
                    self.pages[(h, ev.medium)] += 1
                self.stores += 1
            else:
                assert isinstance(ev, kv_events.BlockRemoved)
                assert ev.medium in ("GPU", "CPU") and ev.ownership == "node-test"
                for h in ev.block_hashes:
                    assert self.pages[(h, ev.medium)] > 0, "removed a page not held"
                    self.pages[(h, ev.medium)] -= 1
                self.removes += 1

    def count(self, medium):
        return sum(n for (h, m), n in self.pages.items() if m == medium)


def model_of(batches):
    """Applies batches {seq: batch} in order; they must be contiguous from 0."""
    seqs = sorted(batches)
    assert seqs == list(range(len(seqs))), f"sequence gaps: {seqs[:5]}..{seqs[-5:]}"
    assert isinstance(batches[0].events[0], kv_events.AllBlocksCleared)
    m = Model()
    for s in seqs:
        m.apply(batches[s])
    return m


def cache_json(daemon, pool):
    out = subprocess.run([KVPOOLCTL, "--socket", daemon.sock, "--json", "cache", pool],
                         check=True, capture_output=True, text=True, timeout=10).stdout
    for p in json.loads(out)["pools"]:
        if p["name"] == pool:
            return p
    raise KeyError(pool)


def assert_model_is_cache(m, daemon):
    p = cache_json(daemon, "e")
    tiers = {t["tier"]: t for t in p["tiers"]}
    assert m.count("GPU") * PAGE_TOKENS == tiers["device"]["cached_tokens"]
    assert m.count("CPU") * PAGE_TOKENS == tiers["host"]["cached_tokens"]
    assert m.count("GPU") + m.count("CPU") == p["cache"]["nodes"]


def counters(daemon):
    return daemon.status()["counters"]


ENGINE = r"""
import sys, hashlib, kvpool
sock, who, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
c = kvpool.connect(sock, name="engine-" + who)
p = c.attach("e")
q = c.attach("quiet")
base = 1000 if who == "a" else 50000
for r in range(rounds):
    # token calls: prompts of 3 pages, the first page shared by every prompt of this engine
    toks = [base + i for i in range(4)] + [base + 100 * (r + 1) + i for i in range(8)]
    m = p.match(toks, lock=False)
    cached = m.tokens // 4
    with p.alloc(3 - cached) as l:
        p.insert(l, toks, cached_pages=cached)
    with q.alloc(1) as l:
        q.insert(l, toks[:4])
    # key calls: chains of 2 keys (the engine's block hashes), in namespace 7
    keys = [hashlib.sha256(f"{who}-{r}-{i}".encode()).digest()[:16] for i in range(2)]
    with p.alloc(2) as l:
        p.insert_keys(l, keys, namespace=7)
    with p.match_keys(keys, namespace=7) as m:
        assert m.tokens >= 0
    # the other engine's prompts: matches only
    other = 50000 if who == "a" else 1000
    p.match([other + i for i in range(4)], lock=False)
c.close()
print("ok")
"""


@pytest.fixture(scope="module", autouse=True)
def ipc_dir():
    """The folder of the tests' ipc endpoints, removed at the end."""
    yield IPC_DIR
    shutil.rmtree(IPC_DIR, ignore_errors=True)


@pytest.fixture(scope="module")
def evd():
    d = Daemon(events_conf("m"))
    yield d
    d.stop()


def run_engines(sock, rounds):
    procs = [subprocess.Popen([sys.executable, "-c", ENGINE, sock, who, str(rounds)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for who in ("a", "b")]
    for pr in procs:
        out, err = pr.communicate(timeout=120)
        assert pr.returncode == 0 and out.strip() == "ok", err


def test_stream_decodes_and_equals_cache(evd):
    """Two engine processes insert, match, demote (device full), drop host pages (host full);
    kvpoolctl demotes and evicts the rest: every batch decodes with vLLM's decoder and the
    events, replayed, are what the pool holds."""
    s = Subscriber("m")
    try:
        time.sleep(0.3)  # the subscription reaches kvpoold
        s.replay(0)  # what was published before it joined: the start batch
        run_engines(evd.sock, 12)
        s.drain()
        m = model_of(s.batches)
        assert m.stores > 16 and m.removes > 0  # more than the device tier holds
        assert m.count("GPU") > 0 and m.count("CPU") > 0
        assert_model_is_cache(m, evd)
        # the admin's moves: demote the device tier, then evict half the host tier
        import kvpool
        with kvpool.connect(evd.sock) as c:
            assert c.evict("e", 1 << 20, tier="device") > 0
            s.drain()
            m = model_of(s.batches)
            assert m.count("GPU") == 0
            assert_model_is_cache(m, evd)
            assert c.evict("e", 8 * PAGE_TOKENS, tier="host") > 0
            s.drain()
            assert_model_is_cache(model_of(s.batches), evd)
        # the pool with events = off published nothing: every page of the model is pool e's
        st = counters(evd)
        assert st["events_batches"] == max(s.batches) + 1
        assert st["events_published"] == sum(len(b.events) for b in s.batches.values())
        assert st["events_dropped"] == 0
    finally:
        s.close()


def test_late_subscriber_replay_and_snapshot(evd):
    """A subscriber joining now asks for everything from seq 0 (the ring holds it all) and gets
    the same model; a snapshot is the state at the last published sequence."""
    import kvpool
    with kvpool.connect(evd.sock) as c:  # something to hold whatever ran before
        p = c.attach("e")
        with p.alloc(2) as l:
            p.insert(l, list(range(900, 908)))
    s = Subscriber("m")
    try:
        time.sleep(0.3)
        got = s.replay(0)
        assert [seq for seq, _ in got] == list(range(len(got)))
        m = model_of(dict(got))
        assert_model_is_cache(m, evd)
        # a range from the middle: exactly the batches from there on
        mid = len(got) // 2
        assert [seq for seq, _ in s.replay(mid)] == list(range(mid, len(got)))
        seq, snap = s.snapshot()
        assert seq == len(got) - 1
        assert isinstance(snap.events[0], kv_events.AllBlocksCleared)
        sm = Model()
        sm.apply(snap)
        assert sm.pages == +m.pages
        before = counters(evd)
        assert before["events_snapshots"] >= 1 and before["events_replays"] >= 2
        # a change after the snapshot arrives live with the next sequence
        with kvpool.connect(evd.sock) as c:
            c.flush("e")
        s.drain()
        assert max(s.batches) == seq + 1
        sm.apply(s.batches[seq + 1])
        assert sm.count("GPU") + sm.count("CPU") == 0
        assert cache_json(evd, "e")["cache"]["nodes"] == 0
    finally:
        s.close()


def vm_rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def test_subscriber_that_never_reads():
    """A subscriber that never reads costs at most hwm batches: kvpoold goes on, counts the
    batches it could not send, its memory stays bounded, and a reader that missed them gets
    them back by replay."""
    d = Daemon(events_conf("slow", hwm=4, extra_events="buffer_steps = 64\nbuffer_bytes = 64K\n"
                                                   "batch_us = 0\n"))
    stuck = Subscriber("slow", rcvhwm=1)
    try:
        import kvpool
        time.sleep(0.3)
        toks = list(range(64))
        with kvpool.connect(d.sock) as c:
            p = c.attach("e")
            for i in range(200):  # a batch of 16 stores then one of 16 removals, 200 times
                with p.alloc(16) as l:
                    p.insert(l, toks)
                c.flush("e")
                if i == 20:
                    rss0 = vm_rss_kib(d.proc.pid)
        st = counters(d)
        assert st["events_dropped"] > 0
        assert st["events_batches"] >= 400
        assert vm_rss_kib(d.proc.pid) - rss0 < 32 * 1024
        # the ring is bounded too: a replay from 0 gives at most buffer_steps batches, the
        # newest, contiguous up to the last
        late = Subscriber("slow")
        try:
            got = late.replay(0)
            assert 0 < len(got) <= 64
            seqs = [seq for seq, _ in got]
            assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
            assert seqs[-1] == st["events_batches"] - 1
            assert seqs[0] > 0  # the oldest are gone: a reader that far behind asks a snapshot
            _, snap = late.snapshot()
            assert [type(e).__name__ for e in snap.events] == ["AllBlocksCleared"]
        finally:
            late.close()
    finally:
        stuck.close()
        d.stop()


def test_restart_starts_at_seq_0_with_all_blocks_cleared():
    """Sequence rule: each kvpoold start publishes seq 0 = [AllBlocksCleared, BlockStored of every
    page it holds]; a subscriber that sees the sequence go back clears its view of the node."""
    import kvpool
    d = Daemon(events_conf("rs"))
    try:
        with kvpool.connect(d.sock) as c:
            p = c.attach("e")
            with p.alloc(2) as l:
                p.insert(l, list(range(8)))
        s = Subscriber("rs")
        try:
            time.sleep(0.3)
            first = s.replay(0)
            assert len(first) >= 1  # the start batch, and the Insert (maybe in it)
            assert model_of(dict(first)).count("GPU") == 2
        finally:
            s.close()
    finally:
        d.stop()
    d = Daemon(events_conf("rs"))
    try:
        s = Subscriber("rs")
        try:
            time.sleep(0.3)
            again = s.replay(0)
            assert [seq for seq, _ in again] == [0]
            assert [type(e).__name__ for e in again[0][1].events] == ["AllBlocksCleared"]
            assert_model_is_cache(model_of(dict(again)), d)
        finally:
            s.close()
    finally:
        d.stop()


def storage_events(batches):
    """The STORAGE pages the batches {seq: batch} leave (hash -> count), the hashes stored in
    the CPU tier, and the count of STORAGE removals."""
    held, cpu, removed = collections.Counter(), set(), 0
    for seq in sorted(batches):
        for ev in batches[seq].events:
            if isinstance(ev, kv_events.AllBlocksCleared):
                held.clear()
            elif ev.medium == "CPU" and isinstance(ev, kv_events.BlockStored):
                cpu.update(ev.block_hashes)
            elif ev.medium == "STORAGE":
                assert ev.ownership == "node-test"
                for h in ev.block_hashes:
                    if isinstance(ev, kv_events.BlockStored):
                        assert ev.block_size == PAGE_TOKENS and ev.parent_block_hash is None
                        held[h] += 1
                    else:
                        assert held[h] > 0, "removed a disk page not held"
                        held[h] -= 1
                        removed += 1
    return +held, cpu, removed


def test_disk_tier_pages_are_storage_events():
    """Host pages a pool's disk tier takes are BlockStored with medium STORAGE under the same
    page keys as in the host tier; pages written over on the disk are BlockRemoved there; the
    STORAGE pages of the stream are the disk's; a kvpoold started again without the fd store
    adopts the disk and its first batch names every page on it."""
    import kvpool
    here = os.path.dirname(os.path.abspath(__file__))  # a filesystem with direct I/O
    ddir = tempfile.mkdtemp(prefix="kvpool-events-disk-", dir=here)
    conf = events_conf("dk", extra_pool=f"disk = write-back\ndisk_path = {ddir}/e.disk\n"
                       "disk_capacity = 48t\n")
    try:
        d = Daemon(conf)
        try:
            s = Subscriber("dk")
            try:
                time.sleep(0.3)
                s.replay(0)
                with kvpool.connect(d.sock) as c:
                    p = c.attach("e")
                    for r in range(30):  # 60 host pages through a 16-page host tier
                        with p.alloc(2, tier="host") as l:
                            p.insert(l, [10000 * (r + 1) + i for i in range(8)])
                for _ in range(50):  # the disk's writes land
                    s.drain(idle=0.3)
                    held, cpu, removed = storage_events(s.batches)
                    if sum(held.values()) == counters(d)["disk_pages"]:
                        break
                held, cpu, removed = storage_events(s.batches)
                pages = counters(d)["disk_pages"]
                assert pages == 12  # 48 tokens of 4-token pages, all written over since
                assert sum(held.values()) == pages and removed > 0
                assert set(held) <= cpu  # the page keys of the host tier's events
                snap_seq, snap = s.snapshot()
                assert storage_events({0: snap})[0] == held
            finally:
                s.close()
        finally:
            d.stop()
        d = Daemon(conf)  # no fd store: the disk is adopted
        try:
            s = Subscriber("dk")
            try:
                time.sleep(0.3)
                first = dict(s.replay(0))
                assert storage_events({0: first[0]})[0] == held
                assert counters(d)["disk_pages"] == pages
            finally:
                s.close()
        finally:
            d.stop()
    finally:
        shutil.rmtree(ddir, ignore_errors=True)


def test_large_snapshot_comes_in_bounded_batches():
    """A snapshot of more pages than one batch holds (1024 events) comes as several batches:
    AllBlocksCleared first, at most 1024 events each, every one with the sequence of the last
    published batch; together they are the node's pages."""
    import kvpool
    n = 2500
    d = Daemon(DEFAULT_CONF + f"""
[events]
endpoint = ipc://{IPC_DIR}/big.pub
replay_endpoint = ipc://{IPC_DIR}/big.replay
topic = kvpool
source = node-test
""" + pool_section("e", host_capacity=f"{4 * n}t"))
    s = Subscriber("big")
    try:
        time.sleep(0.3)
        keys = [i.to_bytes(4, "big") * 4 for i in range(n)]
        with kvpool.connect(d.sock) as c:
            p = c.attach("e")
            for at in range(0, n, 500):
                with p.alloc(500, tier="host") as l:
                    p.insert_keys(l, keys[at:at + 500], namespace=3)
        s.drain()
        last = max(s.batches)
        got = s.request(b"SNAPSHOT")
        assert len(got) == 3  # 1 + 2500 events in batches of 1024
        assert all(seq == last for seq, _ in got)
        assert [len(b.events) for _, b in got] == [1024, 1024, 453]
        kinds = [type(e).__name__ for _, b in got for e in b.events]
        assert kinds[0] == "AllBlocksCleared" and kinds.count("AllBlocksCleared") == 1
        m = Model()
        for _, b in got:
            m.apply(b)
        assert m.count("CPU") == n and m.count("GPU") == 0
        assert {h for (h, med), k in m.pages.items() if k} == set(keys)
        assert cache_json(d, "e")["cache"]["nodes"] == n
        assert counters(d)["events_snapshots"] == 1
        # the live stream goes on from the sequence after the snapshot's
        with kvpool.connect(d.sock) as c:
            c.flush("e")
        s.drain()
        assert max(s.batches) == last + 1
    finally:
        s.close()
        d.stop()


def redis_keys(ports):
    """Every kvpool value's key in the cluster, with the port of the master that holds it."""
    out = []
    for port in ports:
        r = subprocess.run(["redis-cli", "-p", port, "--scan", "--pattern", "kvp:*"],
                           check=True, capture_output=True, text=True, timeout=10)
        out += [(port, k) for k in r.stdout.split()]
    return out


def remote_events(batches):
    """The REMOTE events of batches {seq: batch}: (stored hashes, removed hashes), in order."""
    stored, removed = [], []
    for seq in sorted(batches):
        for ev in batches[seq].events:
            if getattr(ev, "medium", None) != "REMOTE":
                continue
            assert ev.locality == "REMOTE" and ev.ownership == "node-test"
            if isinstance(ev, kv_events.BlockStored):
                assert ev.parent_block_hash is None and list(ev.token_ids) == []
                assert ev.block_size == PAGE_TOKENS
                stored += ev.block_hashes
            else:
                removed += ev.block_hashes
    return stored, removed


def test_remote_tier_pages_are_remote_events(ports):
    """Pages written through to a real Redis Cluster are BlockStored with medium REMOTE under the
    block hashes they have in the host tier (the engine's keys, token pages' page keys) once the
    cluster took them; values the node finds bad on a Fetch are deleted and BlockRemoved."""
    import kvpool
    from test_remote import connected, remote_section
    d = Daemon(events_conf("rt", extra_pool="remote = write-through\n") + "\n" +
               remote_section(ports))
    s = Subscriber("rt")
    try:
        connected(d)
        time.sleep(0.3)
        s.replay(0)
        keys = [bytes([7, i]) * 8 for i in range(4)]
        toks = list(range(5000, 5016))
        with kvpool.connect(d.sock) as c:
            p = c.attach("e")
            with p.alloc(4, tier="host") as l:
                p.insert_keys(l, keys, namespace=5)
            with p.alloc(4, tier="host") as l:
                p.insert(l, toks)
            for _ in range(500):
                if counters(d)["remote_inflight_ops"] == 0:
                    break
                time.sleep(0.01)
            s.drain()
            cpu = [h for seq in sorted(s.batches) for ev in s.batches[seq].events
                   if isinstance(ev, kv_events.BlockStored) and ev.medium == "CPU"
                   for h in ev.block_hashes]
            stored, removed = remote_events(s.batches)
            assert len(cpu) == 8 and sorted(stored) == sorted(cpu) and removed == []
            assert set(keys) <= set(stored)
            assert counters(d)["remote_written_pages"] == 8
            # the values spoiled in the cluster, the node's own pages dropped (a flush does not
            # spill): a Fetch finds them there, refuses and deletes them, and says they are gone
            held = redis_keys(ports)
            assert len(held) == 8
            for port, k in held:
                subprocess.run(["redis-cli", "-p", port, "SET", k, "spoiled"], check=True,
                               capture_output=True, timeout=10)
            c.flush("e")
            m = p.fetch_keys(keys, namespace=5, lock=False)
            assert m.fetched_pages == 0 and m.tokens == 0
            s.drain()
            stored2, removed = remote_events(s.batches)
            assert stored2 == stored and sorted(removed) == sorted(keys)
            assert len(redis_keys(ports)) == 4  # the token pages' values are still there
    finally:
        s.close()
        d.stop()


def test_bind_failure_refuses_to_start(tmp_path):
    """An endpoint that cannot be bound stops kvpoold at start with the reason (exit 2)."""
    conf = events_conf("bad").replace(f"ipc://{IPC_DIR}/bad.pub",
                                      f"ipc://{tmp_path}/no/such/dir/pub")
    with pytest.raises(RuntimeError, match="(?s)exited with 2.*events: endpoint ipc://.*No such file"):
        Daemon(conf)


def test_kvpoolctl_events_and_top(evd):
    """kvpoolctl events prints what a router decodes (a snapshot as JSON lines: the model of the
    cache; from seq 0 readable lines); kvpoolctl top prints one screen when not on a terminal."""
    import kvpool
    with kvpool.connect(evd.sock) as c:
        p = c.attach("e")
        with p.alloc(3) as l:
            p.insert(l, list(range(700, 712)))
    ctl = [KVPOOLCTL, "events", f"ipc://{IPC_DIR}/m.pub", "--topic", "kvpool",
           "--replay", f"ipc://{IPC_DIR}/m.replay", "--count", "1", "--timeout", "10000"]
    out = subprocess.run(ctl + ["--snapshot", "--json"], check=True, capture_output=True,
                         text=True, timeout=30).stdout
    lines = [json.loads(x) for x in out.splitlines()]
    assert lines[0]["type"] == "AllBlocksCleared"
    held = collections.Counter((x["block_hashes"][0], x["medium"]) for x in lines[1:])
    assert all(x["type"] == "BlockStored" and x["ownership"] == "node-test" for x in lines[1:])
    s = Subscriber("m")
    try:
        _, snap = s.snapshot()
        m = Model()
        m.apply(snap)
        assert held == collections.Counter({(h.hex(), md): n for (h, md), n in m.pages.items()
                                            if n})
        assert_model_is_cache(m, evd)
    finally:
        s.close()
    out = subprocess.run(ctl + ["--from", "0"], check=True, capture_output=True, text=True,
                         timeout=30).stdout
    assert out.startswith("#0 ") and "AllBlocksCleared" in out.splitlines()[0]
    # bad use is a usage error
    r = subprocess.run([KVPOOLCTL, "events", f"ipc://{IPC_DIR}/m.pub", "--snapshot"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "usage: kvpoolctl events" in r.stderr

    top = subprocess.run([KVPOOLCTL, "--socket", evd.sock, "top"], check=True,
                         capture_output=True, text=True, timeout=30).stdout
    assert "\033[" not in top  # not a terminal: no escapes, one screen
    assert top.count("kvpoold ") == 1 and "events: " in top and " dropped" in top
    rows = [x.split() for x in top.splitlines()]
    assert any(r[:2] == ["e", "device"] for r in rows)
    assert any(r[:1] == ["host"] for r in rows)
    two = subprocess.run([KVPOOLCTL, "--socket", evd.sock, "top", "--count", "2", "--interval",
                          "100"], check=True, capture_output=True, text=True, timeout=30).stdout
    assert two.count("kvpoold ") == 2


def test_reload_changing_events_is_refused():
    """[events] is read at start: a reload that changes it is refused whole, with the reason."""
    d = Daemon(events_conf("rl"))
    try:
        with open(d.conf, "w") as f:
            f.write(events_conf("rl", hwm=5))
        r = subprocess.run([KVPOOLCTL, "--socket", d.sock, "reload"], capture_output=True,
                           text=True, timeout=30)
        assert r.returncode == 1
        assert "[events] section or a pool's events key changes" in r.stdout + r.stderr
        with open(d.conf, "w") as f:
            f.write(events_conf("rl"))
        r = subprocess.run([KVPOOLCTL, "--socket", d.sock, "reload"], capture_output=True,
                           text=True, timeout=30)
        assert r.returncode == 0, r.stdout + r.stderr
    finally:
        d.stop()
