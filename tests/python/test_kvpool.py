"""Tests of the kvpool package against a real kvpoold: the client surface, typed errors,
zero-copy views (numpy, torch when installed, another process), thread misuse and leaks."""
import array
import gc
import hashlib
import os
import signal
import subprocess
import sys
import threading
import time

import numpy
import pytest

import kvpool

PT = 4  # page_tokens of every test pool


def rss_kib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def project_version():
    """The version meson.build declares (the package and kvpoold both carry it)."""
    import re
    root = os.path.join(os.path.dirname(__file__), "..", "..")
    with open(os.path.join(root, "meson.build")) as f:
        return re.search(r"version:\s*'([^']+)'", f.read()).group(1)


def test_version_and_names():
    assert kvpool.__version__ == project_version()
    assert kvpool.PROTOCOL_VERSION == 1
    assert issubclass(kvpool.OutOfCapacity, kvpool.Error)
    assert kvpool.OutOfCapacity.code == 1 and kvpool.TransportError.code == 101
    for name in kvpool.__all__:
        obj = getattr(kvpool, name)
        if callable(obj) and name != "__version__":
            assert obj.__doc__, name


def test_connect_no_daemon(tmp_path):
    with pytest.raises(kvpool.NoDaemon) as ei:
        kvpool.connect(str(tmp_path / "none.sock"))
    e = ei.value
    assert e.code == 100 and e.name == "NO_DAEMON" and e.errno != 0
    assert isinstance(e.message, str) and e.message


def test_message_not_utf8_is_still_typed(tmp_path, monkeypatch):
    """A message with bytes that are not UTF-8 (here the socket path from $KVPOOL_SOCKET)
    still raises its typed error, the bytes replaced."""
    path = os.fsencode(str(tmp_path)) + b"/no\xffsuch.sock"
    monkeypatch.setenv("KVPOOL_SOCKET", os.fsdecode(path))
    with pytest.raises(kvpool.NoDaemon) as ei:
        kvpool.connect()
    assert "no\ufffdsuch.sock" in ei.value.message and ei.value.name == "NO_DAEMON"


def test_event_fd_and_events(own_daemon):
    """kvpoold pushes no event yet: the fd exists and polls not readable, the queue is empty;
    a lost connection makes it readable and next_event() raise TransportError."""
    import select

    c = kvpool.connect(own_daemon.sock, name="events")
    fd = c.event_fd()
    assert isinstance(fd, int) and fd >= 0 and c.event_fd() == fd
    os.fstat(fd)
    c.ping()
    c.attach("c").alloc(1).free()
    p = select.poll()
    p.register(fd, select.POLLIN)
    assert p.poll(50) == []
    assert c.next_event() is None
    assert list(c.events()) == []
    own_daemon.proc.kill()
    own_daemon.proc.wait()
    assert p.poll(5000) != []                     # the daemon's end of the socket closed
    with pytest.raises(kvpool.TransportError):
        c.next_event()
    with pytest.raises(kvpool.TransportError):
        list(c.events())
    assert kvpool.Event.n_fields == 6 and kvpool.Event.__name__ == "Event"
    c.close()
    with pytest.raises(ValueError):
        c.event_fd()
    with pytest.raises(ValueError):
        c.next_event()
    with pytest.raises(ValueError):
        c.events()


def test_connect_ping_status(daemon):
    with kvpool.connect(daemon.sock, name="pytest") as c:
        assert not c.closed
        c.ping()
        assert c.daemon_version == project_version()
        st = c.status()
        names = [p["name"] for p in st["pools"]]
        assert names == ["c", "f32", "small", "bf16", "llama", "fp8"]
        p = st["pools"][0]
        assert p["geometry"] == kvpool.Geometry((2, 2, 8, "fp16", 4))
        assert p["tiers"]["device"]["total_tokens"] == 256
        assert p["tiers"]["device"]["backend"] == "sim"
        assert "host" not in st["pools"][2]["tiers"]
    assert c.closed
    with pytest.raises(ValueError):
        c.ping()


def test_attach_geometry(client):
    pool = client.attach("c")
    g = pool.geometry
    assert (g.layers, g.kv_heads, g.head_dim, g.dtype, g.page_tokens) == (2, 2, 8, "fp16", 4)
    assert pool.tier_pages("device") == 64 and pool.tier_pages("host") == 64
    assert pool.tier_backend("device") == "sim" and pool.tier_backend("host") == "memfd"
    assert pool.tier_cuda_device("device") == -1
    assert pool.row_bytes == 2 * 8 * 2
    assert pool.pages_for(9) == 3
    # one attachment per session and pool: the same object again
    assert client.attach("c", expect=g) is pool
    assert client.attach("c", expect={"layers": 2, "dtype": "fp16"}) is pool
    with pytest.raises(kvpool.GeometryMismatch) as ei:
        client.attach("c", expect={"head_dim": 16})
    assert ei.value.expected.head_dim == 16 and ei.value.actual == g
    pool.detach()
    again = client.attach("c")
    assert again is not pool and not again.detached
    again.detach()
    assert pool.detached
    with pytest.raises(ValueError):
        pool.tier_pages("device")


def test_geometry_mismatch(client):
    with pytest.raises(kvpool.GeometryMismatch) as ei:
        client.attach("c", expect=kvpool.Geometry((3, 2, 8, "fp16", 4)))
    e = ei.value
    assert e.code == 5
    assert e.expected.layers == 3 and e.actual.layers == 2
    assert e.actual == kvpool.Geometry((2, 2, 8, "fp16", 4))
    with pytest.raises(ValueError, match="expect.dtype"):
        client.attach("c", expect={"dtype": "int4"})
    with pytest.raises(kvpool.NoSuchPool):
        client.attach("nope")


def test_bad_argument_types(client):
    pool = client.attach("c")
    with pytest.raises(ValueError, match="tier"):
        pool.alloc(1, tier="disk")
    with pytest.raises(TypeError, match="npages"):
        pool.alloc("1")
    with pytest.raises(ValueError, match="npages"):
        pool.alloc(-1)
    with pytest.raises(TypeError, match="tokens"):
        pool.match([1.5, 2])
    with pytest.raises(TypeError, match="tokens"):
        pool.match(numpy.zeros(4, dtype=numpy.float32))
    with pytest.raises(ValueError, match="tokens"):
        pool.match([1, -2])
    with pytest.raises(ValueError, match="tokens"):
        pool.match(numpy.array([1, 2**33]))
    with pytest.raises(ValueError, match="one-dimensional"):
        pool.match(numpy.zeros((2, 4), dtype=numpy.int64))
    with pytest.raises(TypeError, match="tokens"):
        pool.match("abcd")
    with pytest.raises(TypeError, match="lease"):
        pool.insert(None, [1, 2, 3, 4])
    for args, name in [(("device", "0", 0, 0), "layer"), (("device", 0, 1.0, 0), "kv"),
                       (("device", 0, 0, "3"), "page"), (("device", 0, 0, 0, None), "tok")]:
        with pytest.raises(TypeError, match=name):
            pool.slot_address(*args)
    for args, name in [(("device", -1, 0, 0), "layer"), (("device", 0, 0, 2**32), "page"),
                       (("device", 0, 0, 0, -3), "tok")]:
        with pytest.raises(ValueError, match=name):
            pool.slot_address(*args)
    with pytest.raises(TypeError, match="layer"):
        pool.kv("device", 0.5, 0)
    with pytest.raises(ValueError, match="kv"):
        pool.kv("device", 0, -1)

    class Index:  # an __index__ giving a fresh int: the message shows it
        def __index__(self):
            return 2**40 + 12345

    with pytest.raises(ValueError, match=str(2**40 + 12345)):
        pool.alloc(Index())
    pool.detach()


def test_lease_alloc_extend_free(daemon, client):
    pool = client.attach("c")
    lease = pool.alloc(3)
    assert lease.id > 0 and lease.tier == "device"
    pages = lease.pages
    assert isinstance(pages, numpy.ndarray) and pages.dtype == numpy.uint32
    assert len(pages) == 3 and len(set(pages.tolist())) == 3
    new = lease.extend(2)
    assert len(new) == 2 and lease.pages.tolist() == pages.tolist() + new.tolist()
    assert daemon.pool_books("c")["device"]["leased_tokens"] == 5 * PT
    assert lease.free(new[:1]) == 4
    assert lease.pages.tolist() == pages.tolist() + new.tolist()[1:]
    with pytest.raises(kvpool.NotFound):
        lease.free([new[0]])
    assert lease.free() == 0 and lease.ended
    assert daemon.pool_books("c")["device"]["leased_tokens"] == 0
    with pool.alloc(2, tier="host") as l2:
        assert l2.tier == "host"
        assert daemon.pool_books("c")["host"]["leased_tokens"] == 2 * PT
    assert l2.ended
    assert daemon.pool_books("c")["host"]["leased_tokens"] == 0
    pool.detach()


def test_forked_child_refused_parent_lease_kept(daemon, client):
    """A forked child's calls on its parent's client raise Forked and send nothing: its
    garbage (a Lease, a Pool) does not free the parent's lease; its own client works."""
    pool = client.attach("c")
    lease = pool.alloc(2)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        out = []
        try:
            for call in (client.ping, lambda: pool.alloc(1), lease.free):
                try:
                    call()
                    out.append("ok")
                except kvpool.Forked:
                    out.append("forked")
                except Exception as e:  # noqa: BLE001 - reported to the parent
                    out.append(type(e).__name__)
            del call, lease  # the child's copy: its dealloc must not free the parent's lease
            gc.collect()
            own = kvpool.connect(daemon.sock, name="child")
            own.ping()
            own.close()
            out.append("own")
        finally:
            os.write(w, ",".join(out).encode())
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        said = f.read().decode()
    assert os.waitpid(pid, 0)[1] == 0
    assert said == "forked,forked,forked,own"
    client.ping()
    assert daemon.pool_books("c")["device"]["leased_tokens"] == 2 * PT
    assert lease.free() == 0
    pool.detach()


@pytest.mark.parametrize("kind", ["list", "tuple", "array_I", "array_q", "numpy_i64",
                                  "numpy_u32", "numpy_u16", "memoryview"])
def test_tokens_any_buffer(client, kind):
    pool = client.attach("c")
    base = [kind_id * 7 + 1 for kind_id in range(8)]
    base[0] = 1000 + sum(map(ord, kind))  # a sequence of the test's own
    make = {
        "list": list, "tuple": tuple,
        "array_I": lambda v: array.array("I", v), "array_q": lambda v: array.array("q", v),
        "numpy_i64": lambda v: numpy.array(v, dtype=numpy.int64),
        "numpy_u32": lambda v: numpy.array(v, dtype=numpy.uint32),
        "numpy_u16": lambda v: numpy.array(v, dtype=numpy.uint16),
        "memoryview": lambda v: memoryview(array.array("I", v)),
    }[kind]
    with pool.alloc(2) as lease:
        assert pool.insert(lease, make(base)) == 8
    with pool.match(make(base + [5, 6])) as m:
        assert m.tokens == 8
        assert len(m.device_pages) == 2
    # a strided numpy view is refused, not silently copied wrong
    with pytest.raises(ValueError, match="contiguous"):
        pool.match(numpy.arange(16, dtype=numpy.int64)[::2])
    pool.detach()


def test_tokens_torch_tensor(client):
    torch = pytest.importorskip("torch", reason="torch is not installed (see scripts/pytest.sh)")
    pool = client.attach("c")
    t = torch.tensor([901, 902, 903, 904], dtype=torch.int64)
    with pool.alloc(1) as lease:
        assert pool.insert(lease, t) == 4
    with pool.match(t) as m:
        assert m.tokens == 4
    pool.detach()


def test_insert_match_evict_load(daemon, client):
    pool = client.attach("c")
    toks = list(range(5000, 5010))  # 2 whole pages + 2 tokens
    lease = pool.alloc(3)
    pages = lease.pages.tolist()
    assert pool.insert(lease, toks) == 8
    assert lease.pages.tolist() == pages[2:]  # the tail page stays leased
    lease.free()
    with pool.match(toks + [1, 2, 3]) as m:
        assert m.tokens == 8 and m.lock_id > 0
        assert m.device_pages.tolist() == pages[:2]
        assert len(m.host_pages) == 0
    assert m.lock_id == 0
    m2 = pool.match(toks, lock=False)
    assert m2.tokens == 8 and m2.lock_id == 0
    # evict the device tier: the pages go to the host tier, load brings them back
    assert client.evict("c", 1 << 20, tier="device") >= 8
    with pool.match(toks) as m:
        assert m.tokens == 8
        assert len(m.device_pages) == 0 and len(m.host_pages) == 2
        dev = m.load()
        assert len(dev) == 2 and m.device_pages.tolist() == dev.tolist()
        assert len(m.host_pages) == 0
    m = pool.match(toks, lock=False)
    with pytest.raises(ValueError, match="locked"):
        m.load()
    assert client.flush("c") >= 8
    pool.detach()


def test_insert_given_pages_leave_the_lease(client):
    pool = client.attach("c")
    toks = list(range(7000, 7010))  # 2 whole pages + 2 tokens
    with pool.alloc(3) as lease:
        p0, p1, p2 = lease.pages.tolist()
        # pages in another order than leased: p2 holds tokens 0..3, p0 4..7, p1 the tail
        assert pool.insert(lease, toks, pages=[p2, p0, p1]) == 8
        assert lease.pages.tolist() == [p1]
        with pool.match(toks) as m:
            assert m.device_pages.tolist() == [p2, p0]
        lease.extend(1)
        assert len(lease.pages) == 2 and lease.pages[0] == p1
    client.flush("c")
    pool.detach()


def test_out_of_capacity_every_field(daemon):
    """16 device pages, no host tier: 12 pages leased, 4 cached and locked, none free."""
    with kvpool.connect(daemon.sock) as c:
        pool = c.attach("small")
        a = pool.alloc(8)
        toks = list(range(7000, 7016))
        assert pool.insert(a, toks) == 16      # 4 pages move into the cache
        m = pool.match(toks)                   # and are locked: protected
        assert m.tokens == 16
        b = pool.alloc(8)
        books = daemon.pool_books("small")["device"]
        assert books["free_tokens"] == 0
        with pytest.raises(kvpool.OutOfCapacity) as ei:
            pool.alloc(2)
        e = ei.value
        assert e.code == 1 and e.name == "OUT_OF_CAPACITY"
        assert e.tier == "device"
        assert e.requested_tokens == 2 * PT
        assert e.free_tokens == 0
        assert e.evictable_tokens == 0
        assert e.protected_tokens == 16
        assert e.leased_tokens == 48
        assert e.total_tokens == 64
        assert (e.leased_tokens, e.protected_tokens) == (books["leased_tokens"],
                                                         books["protected_tokens"])
        # unlocked, the cached pages are evictable and the same alloc succeeds
        m.release()
        with pool.alloc(2) as l3:
            assert len(l3.pages) == 2
        b.free()
        a.free()
        pool.detach()


def test_quota_and_errors_are_not_runtime_errors(client):
    pool = client.attach("c")
    with pytest.raises(kvpool.Error) as ei:
        pool.alloc(10**6)
    assert not type(ei.value) is RuntimeError
    assert isinstance(ei.value, (kvpool.OutOfCapacity, kvpool.InvalidArgument,
                                 kvpool.LimitExceeded))
    pool.detach()


def test_numpy_view_zero_copy(client):
    pool = client.attach("c")
    v = pool.kv("device", 1, 1)
    assert v.shape == (64 * PT, 2, 8) and v.dtype == "fp16" and v.tier == "device"
    assert v.__dlpack_device__() == (1, 0)
    a = numpy.from_dlpack(v)
    assert a.dtype == numpy.float16 and a.shape == v.shape
    assert a.ctypes.data == pool.slot_address("device", 1, 1, 0, 0) == v.data_ptr
    assert numpy.from_dlpack(pool.kv("device", 0, 1)).ctypes.data == \
        pool.slot_address("device", 0, 1, 0)
    # slot = page * page_tokens + offset
    assert a[5 * PT + 3].ctypes.data == pool.slot_address("device", 1, 1, 5, 3)
    b = numpy.asarray(memoryview(v))       # the buffer protocol, no copy either
    assert b.ctypes.data == a.ctypes.data and b.dtype == numpy.float16
    a[7] = 3.5
    assert b[7, 1, 4] == 3.5
    assert "dltensor" in repr(v.__dlpack__()) and "versioned" not in repr(v.__dlpack__())
    assert "dltensor_versioned" in repr(v.__dlpack__(max_version=(1, 0)))
    with pytest.raises(BufferError):
        v.__dlpack__(copy=True)
    with pytest.raises(BufferError):
        v.__dlpack__(dl_device=(2, 0))
    with pytest.raises(ValueError, match="host_pages_view"):
        pool.kv("host", 0, 0)
    with pytest.raises(ValueError, match="layer"):
        pool.kv("device", 2, 0)
    del a, b, v
    pool.detach()


def test_host_pages_view_layout(client):
    pool = client.attach("c")
    h = pool.host_pages_view()
    assert h.shape == (64, 2, 2, PT, 2, 8)
    a = numpy.from_dlpack(h)
    assert a.ctypes.data == pool.slot_address("host", 0, 0, 0, 0)
    for layer, kv, page, tok in [(1, 0, 3, 2), (0, 1, 63, 3), (1, 1, 10, 0)]:
        assert a[page, layer, kv, tok].ctypes.data == \
            pool.slot_address("host", layer, kv, page, tok)
    pool.detach()


def test_dtype_codes(client):
    import ctypes

    class DLTensor(ctypes.Structure):
        _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32),
                    ("device_id", ctypes.c_int32), ("ndim", ctypes.c_int32),
                    ("code", ctypes.c_uint8), ("bits", ctypes.c_uint8),
                    ("lanes", ctypes.c_uint16), ("shape", ctypes.c_void_p),
                    ("strides", ctypes.c_void_p), ("byte_offset", ctypes.c_uint64)]

    class Versioned(ctypes.Structure):
        _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32),
                    ("ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p),
                    ("flags", ctypes.c_uint64), ("t", DLTensor)]

    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype = ctypes.c_void_p
    get.argtypes = [ctypes.py_object, ctypes.c_char_p]

    def codes(view, **kw):
        cap = view.__dlpack__(**kw)
        if "max_version" in kw:
            m = Versioned.from_address(get(cap, b"dltensor_versioned"))
            return (m.major, m.minor, m.t.code, m.t.bits, m.t.ndim)
        t = DLTensor.from_address(get(cap, b"dltensor"))
        return (0, 0, t.code, t.bits, t.ndim)

    want = {"c": (2, 16), "f32": (2, 32), "bf16": (4, 16)}
    for name, (code, bits) in want.items():
        pool = client.attach(name)
        assert codes(pool.kv(0, 0, 0))[2:4] == (code, bits)
        assert codes(pool.kv(0, 0, 0), max_version=(1, 0))[:4] == (1, 0, code, bits)
        pool.detach()
    pool = client.attach("fp8")
    v = pool.kv("device", 0, 0)
    assert codes(v) == (0, 0, 1, 8, 3)                             # uint8 for DLPack 0.x
    assert codes(v, max_version=(1, 0)) == (1, 0, 1, 8, 3)         # and 1.0
    assert codes(v, max_version=(1, 1)) == (1, 1, 10, 8, 3)        # kDLFloat8_e4m3fn
    assert codes(v, max_version=(1, 5)) == (1, 1, 10, 8, 3)        # a later 1.x
    assert codes(v, max_version=(2, 0)) == (1, 1, 10, 8, 3)        # and 2.x read 1.1
    assert memoryview(v).format == "B" and memoryview(v).itemsize == 1
    pool.detach()
    pool = client.attach("bf16")
    mv = memoryview(pool.kv("device", 0, 0))
    assert mv.format == "H" and mv.shape == (64, 1, 8)
    del mv
    # consumers without PyBUF_ND get the flat bytes (itemsize 1), not a shapeless 3-d buffer
    v = pool.kv("device", 0, 0)
    arr = numpy.asarray(v)  # uint16 words ("H")
    arr[...] = numpy.arange(arr.size, dtype=numpy.uint16).reshape(arr.shape)
    raw = arr.tobytes()
    assert bytes(v) == raw and hashlib.sha256(v).digest() == hashlib.sha256(raw).digest()
    flat = memoryview(v).cast("B")
    assert flat.nbytes == len(raw) and flat.itemsize == 1 and flat.tobytes() == raw
    del flat, arr
    arr = numpy.frombuffer(v, dtype=numpy.uint8)  # a PyBUF_SIMPLE request
    assert arr.size == len(raw) and arr.tobytes() == raw
    del arr
    pool.detach()
    pool = client.attach("f32")
    assert numpy.from_dlpack(pool.kv(0, 1, 0)).dtype == numpy.float32
    pool.detach()


def test_torch_view_zero_copy(client):
    torch = pytest.importorskip("torch", reason="torch is not installed (see scripts/pytest.sh)")
    pool = client.attach("f32")
    v = pool.kv("device", 1, 0)
    t = torch.from_dlpack(v)
    assert t.data_ptr() == pool.slot_address("device", 1, 0, 0, 0)
    assert t.dtype == torch.float32 and tuple(t.shape) == v.shape
    t[3] = 2.0
    assert numpy.from_dlpack(v)[3, 0, 0] == 2.0
    del t, v
    pool.detach()


CHILD = r"""
import sys, numpy, kvpool
sock, mode, page = sys.argv[1], sys.argv[2], int(sys.argv[3])
with kvpool.connect(sock, name="child") as c:
    pool = c.attach("f32")
    a = numpy.from_dlpack(pool.kv("device", 1, 0))
    row = a[page * 4 + 1]
    if mode == "read":
        print(" ".join(repr(float(x)) for x in row.ravel()))
    else:
        row[...] = numpy.arange(row.size, dtype=numpy.float32).reshape(row.shape) * -1.0
        print("written")
    del a, row
    pool.detach()
"""


@pytest.mark.parametrize("writer", ["numpy", "torch"])
def test_write_seen_by_other_process(daemon, client, writer):
    pool = client.attach("f32")
    with pool.alloc(1) as lease:
        page = int(lease.pages[0])
        a = numpy.from_dlpack(pool.kv("device", 1, 0))
        want = numpy.arange(16, dtype=numpy.float32).reshape(2, 8) + 0.25
        if writer == "torch":
            torch = pytest.importorskip("torch", reason="torch is not installed "
                                        "(see scripts/pytest.sh)")
            t = torch.from_dlpack(pool.kv("device", 1, 0))
            t[page * PT + 1] = torch.from_numpy(want)
            del t
        else:
            a[page * PT + 1] = want
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
        out = subprocess.run([sys.executable, "-c", CHILD, daemon.sock, "read", str(page)],
                             capture_output=True, text=True, timeout=60, env=env)
        assert out.returncode == 0, out.stderr
        assert [float(x) for x in out.stdout.split()] == want.ravel().tolist()
        out = subprocess.run([sys.executable, "-c", CHILD, daemon.sock, "write", str(page)],
                             capture_output=True, text=True, timeout=60, env=env)
        assert out.returncode == 0 and out.stdout.strip() == "written", out.stderr
        assert a[page * PT + 1].ravel().tolist() == [-float(i) for i in range(16)]
        del a
    pool.detach()


def mapping_of(addr):
    """The /proc/self/maps entry (start, end, inode, path) that holds addr, None when none."""
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            if lo <= addr < hi:
                return lo, hi, parts[4], parts[5].strip() if len(parts) > 5 else ""
    return None


def wait_for(pred, seconds=5):
    end = time.monotonic() + seconds
    while not pred() and time.monotonic() < end:
        time.sleep(0.02)
    return pred()


def test_view_outlives_detach_and_close(daemon):
    c = kvpool.connect(daemon.sock, name="outlive")
    sessions = daemon.status()["sessions"]
    pool = c.attach("c")
    lease = pool.alloc(2)
    v = pool.kv("device", 0, 0)
    a = numpy.from_dlpack(v)
    hv = pool.host_pages_view()
    cap = hv.__dlpack__()                         # an unconsumed capsule holds it too
    dev_map, host_map = mapping_of(v.data_ptr), mapping_of(hv.data_ptr)
    assert dev_map and host_map and dev_map != host_map
    del hv
    a[:] = 1.5
    addr = a.ctypes.data
    del v
    pool.detach()
    # the detach is real at once: the session's leases are gone from the daemon's books
    assert daemon.pool_books("c")["device"]["leased_tokens"] == 0
    assert lease.free() == 0 and lease.ended
    c.close()
    assert c.closed and pool.detached
    with pytest.raises(ValueError):
        pool.alloc(1)
    with pytest.raises(ValueError):
        c.ping()
    # and so is the close: the session ended though views live
    assert wait_for(lambda: daemon.status()["sessions"] == sessions - 1)
    # the memory is still mapped and holds what was written
    assert a.ctypes.data == addr and float(a.sum()) == 1.5 * a.size
    a[0, 0, 0] = 2.5
    assert a[0, 0, 0] == 2.5
    assert mapping_of(addr) == dev_map and mapping_of(host_map[0]) == host_map
    # the last array over the device plane goes: its mapping goes; the capsule keeps the host's
    del a
    gc.collect()
    assert mapping_of(dev_map[0]) != dev_map
    assert mapping_of(host_map[0]) == host_map
    del cap
    gc.collect()
    assert mapping_of(host_map[0]) != host_map


def test_detach_with_live_views(daemon, client):
    """Pool.detach() with a live view frees the leases at once, seen from another client."""
    pool = client.attach("c")
    lease = pool.alloc(3)
    v = pool.kv("device", 0, 1)
    t = numpy.from_dlpack(v)
    t[:] = 0.25
    with kvpool.connect(daemon.sock, name="watcher") as other:
        def leased():
            for p in other.status()["pools"]:
                if p["name"] == "c":
                    return p["tiers"]["device"]["leased_tokens"]
        assert leased() == 3 * PT
        pool.detach()
        assert pool.detached and leased() == 0
    with pytest.raises(ValueError):
        lease.extend(1)
    assert lease.free() == 0 and lease.ended   # it went with the pool
    # the view still reads and writes the memory
    assert float(t.sum()) == 0.25 * t.size
    t[-1] = 4.0
    assert float(t[-1].sum()) == 4.0 * t[-1].size
    assert mapping_of(v.data_ptr) is not None
    client.ping()
    # a fresh attachment sees the same memory (the pages are the daemon's, not the view's)
    again = client.attach("c")
    assert numpy.from_dlpack(again.kv("device", 0, 1))[-1].ravel()[0] == 4.0
    again.detach()


def wait_in_call(c, seconds=10):
    """Until another thread is inside a call on client c (c.next_event() never blocks and
    says ClientBusy then): no guess of how long a loaded machine takes to start a thread."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            c.next_event()
        except kvpool.ClientBusy:
            return
        time.sleep(0.005)
    pytest.fail(f"no thread entered a call on the client in {seconds} s")


def test_client_busy_and_gil_released(own_daemon):
    c = kvpool.connect(own_daemon.sock)
    own_daemon.signal(signal.SIGSTOP)
    box = {}

    def call():
        try:
            c.ping()
            box["ok"] = True
        except Exception as e:  # noqa: BLE001 - reported below
            box["err"] = e

    t = threading.Thread(target=call)
    t.start()
    wait_in_call(c)
    # the GIL is released while the call waits: this thread runs
    n = 0
    end = time.monotonic() + 0.2
    while time.monotonic() < end:
        n += 1
    assert n > 1000 and t.is_alive()
    with pytest.raises(kvpool.ClientBusy, match="thread"):
        c.ping()
    with pytest.raises(kvpool.ClientBusy):
        c.attach("c")
    own_daemon.signal(signal.SIGCONT)
    t.join(10)
    assert not t.is_alive() and box == {"ok": True}
    c.ping()
    c.close()


def test_daemon_killed_mid_call(own_daemon):
    c = kvpool.connect(own_daemon.sock)
    pool = c.attach("c")
    own_daemon.signal(signal.SIGSTOP)
    box = {}

    def call():
        try:
            pool.match(list(range(64)))
        except Exception as e:  # noqa: BLE001 - checked below
            box["err"] = e

    t = threading.Thread(target=call)
    t.start()
    wait_in_call(c)
    assert t.is_alive()
    own_daemon.proc.kill()
    own_daemon.proc.wait()
    t.join(10)
    assert not t.is_alive(), "the call hangs after the daemon died"
    assert isinstance(box.get("err"), kvpool.TransportError), box
    assert box["err"].code == 101
    with pytest.raises(kvpool.TransportError):
        c.ping()
    with pytest.raises(kvpool.TransportError):
        pool.detach()
    assert pool.detached
    c.close()


def test_no_leaks_10000_cycles(daemon):
    c = kvpool.connect(daemon.sock, name="leaks")
    sessions = daemon.status()["sessions"]
    pool = c.attach("c")
    toks = numpy.arange(9000, 9016, dtype=numpy.uint32)
    with pool.alloc(4) as lease:
        pool.insert(lease, toks)
    before_books = daemon.pool_books("c")

    def cycles(n):
        for _ in range(n):
            lease = pool.alloc(2)
            lease.pages
            lease.free()
            m = pool.match(toks)
            m.device_pages
            m.release()
            numpy.from_dlpack(pool.kv("device", 1, 0))[0, 0, 0]
            pool.host_pages_view().__dlpack__(max_version=(1, 0))

    cycles(500)
    gc.collect()
    rss0 = rss_kib()
    cycles(10000)
    gc.collect()
    rss1 = rss_kib()
    after_books = daemon.pool_books("c")
    for tier in ("device", "host"):
        for k in ("free_tokens", "leased_tokens", "cached_tokens", "protected_tokens"):
            assert after_books[tier][k] == before_books[tier][k], (tier, k)
    assert after_books["device"]["leased_tokens"] == 0
    assert after_books["device"]["protected_tokens"] == 0
    assert rss1 - rss0 < 1024, f"RSS grew by {rss1 - rss0} KiB over 10000 cycles"
    assert daemon.status()["sessions"] == sessions
    c.flush("c")
    pool.detach()
    c.close()


def test_page_lists_without_numpy(daemon):
    """Without numpy, page lists are array('I') and lists of ints still go in."""
    code = r"""
import sys
sys.modules["numpy"] = None          # numpy cannot be imported
import array, kvpool
with kvpool.connect(sys.argv[1]) as c:
    pool = c.attach("c")
    with pool.alloc(2) as lease:
        p = lease.pages
        assert isinstance(p, array.array) and p.typecode == "I" and len(p) == 2, p
        assert pool.insert(lease, [4242, 1, 2, 3, 4, 5, 6, 7]) == 8
    with pool.match(array.array("I", [4242, 1, 2, 3])) as m:
        assert m.tokens == 4 and isinstance(m.device_pages, array.array)
    try:
        pool.match(object())
    except TypeError as e:
        assert "tokens" in str(e)
    pool.detach()
print("ok")
"""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, "-c", code, daemon.sock], capture_output=True,
                         text=True, timeout=60, env=env)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_c_baselines_of_the_benchmarks(daemon, client):
    """bench_capi (bench_capi.c, built beside kvpoold) runs the C loops bench_kvpool.py sets
    against the Python calls, on a session of its own, and leaves nothing leased or locked."""
    from bench_kvpool import import_capi

    capi = import_capi()
    pool = client.attach("c")
    books = daemon.pool_books("c")["device"]
    assert capi.alloc_free(daemon.sock, "c", 50) > 0
    toks = numpy.arange(31000, 31008, dtype=numpy.uint32)
    with pool.alloc(2) as lease:
        pool.insert(lease, toks)
    secs, matched = capi.match(daemon.sock, "c", toks, 20)
    assert secs > 0 and matched == len(toks)
    after = daemon.pool_books("c")["device"]
    assert after["leased_tokens"] == books["leased_tokens"] == 0
    assert after["protected_tokens"] == 0
    with pytest.raises(TypeError):
        capi.match(daemon.sock, "c", [31000, 31001], 1)
    with pytest.raises(RuntimeError, match="NO_SUCH_POOL"):
        capi.alloc_free(daemon.sock, "nosuch", 1)
    client.flush("c")
    pool.detach()


def test_stubs_match_the_runtime():
    """Geometry and Event are struct sequences (one tuple argument, fields in order), not
    NamedTuples; a method the stub gives View exists at runtime on this Python."""
    import ast

    stub = os.path.join(os.path.dirname(kvpool.__file__), "_kvpool.pyi")
    tree = ast.parse(open(stub).read())
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    for name in ("Geometry", "Event"):
        cls, rt = classes[name], getattr(kvpool, name)
        assert "NamedTuple" not in ast.dump(cls), name
        props = [f.name for f in cls.body if isinstance(f, ast.FunctionDef)
                 and any(getattr(d, "id", "") == "property" for d in f.decorator_list)]
        assert tuple(props) == rt.__match_args__, name
        assert rt(tuple(range(rt.n_fields)))[0] == 0
    view = classes["View"]
    plain = [f.name for f in view.body if isinstance(f, ast.FunctionDef)]
    for name in plain:
        assert hasattr(kvpool.View, name), name


def test_copy_runs():
    """copy_runs copies every run (odd sizes and offsets, shuffled destinations, a list past the
    4 MiB streaming threshold too) and nothing between them; bad lists are typed errors."""
    rng = numpy.random.default_rng(5)
    for run, nruns in ((37, 64), (96 << 10, 48)):
        src = rng.integers(0, 255, nruns * run, dtype=numpy.uint8)
        dst = numpy.full(nruns * (run + 5), 0xA5, dtype=numpy.uint8)
        want = dst.copy()
        order = rng.permutation(nruns)
        s = src.ctypes.data + numpy.arange(nruns, dtype=numpy.uint64) * numpy.uint64(run)
        offs = order.astype(numpy.uint64) * numpy.uint64(run + 5) + numpy.uint64(3)
        for i, o in enumerate(offs.tolist()):
            want[o:o + run] = src[i * run:(i + 1) * run]
        sizes = numpy.full(nruns, run, dtype=numpy.uint64)
        assert kvpool.copy_runs(numpy.uint64(dst.ctypes.data) + offs, s, sizes) == nruns
        assert numpy.array_equal(dst, want)
    z = numpy.zeros(0, dtype=numpy.uint64)
    assert kvpool.copy_runs(z, z, z) == 0
    one = numpy.zeros(1, dtype=numpy.uint64)
    with pytest.raises(ValueError, match="differ in length"):
        kvpool.copy_runs(one, z, z)
    with pytest.raises(TypeError, match="64-bit integers"):
        kvpool.copy_runs(numpy.zeros(1, dtype=numpy.uint32), one, one)
    with pytest.raises(TypeError):
        kvpool.copy_runs([1], one, one)
    # the CUDA variant checks the same lists (and wants a stream of its own) before CUDA
    assert kvpool.copy_runs_cuda(z, z, z, 0) == 0
    with pytest.raises(ValueError, match="differ in length"):
        kvpool.copy_runs_cuda(one, z, z, 1)
    with pytest.raises(ValueError, match="stream of its own"):
        kvpool.copy_runs_cuda(one, one, one, 0)
    with pytest.raises(TypeError, match="64-bit integers"):
        kvpool.copy_runs_cuda(numpy.zeros(1, dtype=numpy.uint32), one, one, 1)


def test_alloc_run(client, daemon):
    """alloc(run_align=): consecutive pages from a multiple of the alignment, past busy pages;
    booked as leased; OutOfCapacity naming the run when no free run is left; the host tier
    too; typed refusals of bad arguments; the pages back when the session ends."""
    pool = client.attach("c")
    dev = pool.tier_pages("device")
    one = pool.alloc(1, "device")
    run = pool.alloc(8, "device", run_align=8)
    pages = [int(x) for x in run.pages]
    assert pages[0] % 8 == 0 and pages[0] > int(one.pages[0])
    assert pages == list(range(pages[0], pages[0] + 8))
    st = client.status()["pools"][0]["tiers"]["device"]
    assert st["leased_tokens"] == 9 * pool.geometry.page_tokens
    with pytest.raises(kvpool.OutOfCapacity, match="no run of"):
        pool.alloc(dev - 8, "device", run_align=1)
    with pytest.raises(kvpool.InvalidArgument):
        pool.alloc(0, "device", run_align=4)
    host = pool.alloc(4, "host", run_align=4)
    assert [int(x) for x in host.pages] == list(range(int(host.pages[0]),
                                                      int(host.pages[0]) + 4))
    other = kvpool.connect(daemon.sock)
    p2 = other.attach("c")
    r2 = p2.alloc(8, "device", run_align=8)
    assert int(r2.pages[0]) % 8 == 0 and int(r2.pages[0]) != pages[0]
    other.close()
    run.free(), one.free(), host.free()
    st = client.status()["pools"][0]["tiers"]["device"]
    assert st["leased_tokens"] == 0 and st["free_tokens"] == st["total_tokens"]
