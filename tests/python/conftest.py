"""Fixtures of the kvpool Python tests: a real kvpoold on a temporary socket.

kvpoold and kvpoolctl come from $KVPOOLD / $KVPOOLCTL, else from the build tree (build/).
"""
import json
import os
import signal
import socket
import subprocess
import tempfile
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KVPOOLD = os.environ.get("KVPOOLD", os.path.join(ROOT, "build", "daemon", "kvpoold"))
KVPOOLCTL = os.environ.get("KVPOOLCTL", os.path.join(ROOT, "build", "client", "kvpoolctl"))

# Pool "c": 64 device pages and 64 host pages of 4 tokens; "f32": the same in fp32; "small":
# 16 device pages and no host tier, for capacity errors; "bf16" and "fp8" for dtype mapping;
# "llama" for the random-weight model of test_transformers.py (fp32).
# [daemon] stays (empty) for the tests that add keys to it. A test's own client may sit idle for
# any time while another process imports torch or a model computes: kvpoold keeps a quiet
# session while its process lives (test_link.py).
DEFAULT_CONF = """
[daemon]

[pool.c]
layers = 2
kv_heads = 2
head_dim = 8
dtype = fp16
page_tokens = 4
device = sim
device_capacity = 256t
host_capacity = 256t
mlock = off

[pool.f32]
layers = 2
kv_heads = 2
head_dim = 8
dtype = fp32
page_tokens = 4
device = sim
device_capacity = 256t
host_capacity = 256t
mlock = off

[pool.small]
layers = 1
kv_heads = 1
head_dim = 8
dtype = fp16
page_tokens = 4
device = sim
device_capacity = 64t
host_capacity = 0
mlock = off

[pool.bf16]
layers = 1
kv_heads = 1
head_dim = 8
dtype = bf16
page_tokens = 4
device = sim
device_capacity = 64t
host_capacity = 64t
mlock = off

[pool.llama]
layers = 2
kv_heads = 2
head_dim = 16
dtype = fp32
page_tokens = 4
device = sim
device_capacity = 1024t
host_capacity = 1024t
mlock = off

[pool.fp8]
layers = 1
kv_heads = 1
head_dim = 8
dtype = fp8
page_tokens = 4
device = sim
device_capacity = 64t
host_capacity = 64t
mlock = off
"""


def pool_section(name, layers=2, kv_heads=2, head_dim=8, device_capacity=None,
                 host_capacity="256t", extra=""):
    """The section of an fp16 pool of 4-token pages that a test module adds to DEFAULT_CONF in
    its CONF: a simulated device tier of device_capacity (none when None), a host tier of
    host_capacity, then the lines of extra."""
    dev = "device = none"
    if device_capacity:
        dev = f"device = sim\ndevice_capacity = {device_capacity}"
    return f"""
[pool.{name}]
layers = {layers}
kv_heads = {kv_heads}
head_dim = {head_dim}
dtype = fp16
page_tokens = 4
{dev}
host_capacity = {host_capacity}
mlock = off
""" + extra


def host_pool(name, head_dim=8, capacity="256t"):
    """The section of a host-only pool (2 layers, 2 kv heads, fp16, 4-token pages)."""
    return pool_section(name, head_dim=head_dim, host_capacity=capacity)


def wait_socket(sock, proc=None, timeout=10):
    """True once a connect to the unix socket sock succeeds (the socket file exists from bind(),
    before listen()); False when proc (where given) exits first or timeout s pass."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc is not None and proc.poll() is not None:
            return False
        s = socket.socket(socket.AF_UNIX)
        try:
            s.connect(sock)
            return True
        except OSError:
            time.sleep(0.01)
        finally:
            s.close()
    return False


class Daemon:
    """One kvpoold process on a socket in its own temporary folder."""

    def __init__(self, conf=DEFAULT_CONF, env=None):
        if not os.access(KVPOOLD, os.X_OK):
            pytest.fail(f"kvpoold not built at {KVPOOLD} (set $KVPOOLD)")
        self.dir = tempfile.mkdtemp(prefix="kvpool-pytest-")
        self.sock = os.path.join(self.dir, "kvpoold.sock")
        self.conf = os.path.join(self.dir, "kvpoold.conf")
        with open(self.conf, "w") as f:
            f.write(conf)
        self.log = open(os.path.join(self.dir, "kvpoold.log"), "w")
        extra = env or {}
        env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "LISTEN_FDS")}
        env.update(extra)
        self.proc = subprocess.Popen(
            [KVPOOLD, "--socket", self.sock, "--config", self.conf, "--log-level", "info"],
            stdout=self.log, stderr=self.log, env=env)
        if wait_socket(self.sock, self.proc):
            return
        if self.proc.poll() is not None:
            raise RuntimeError(f"kvpoold exited with {self.proc.returncode}: "
                               + open(self.log.name).read())
        self.stop()
        raise RuntimeError("kvpoold did not come up in 10 s")

    def status(self):
        """kvpoolctl status --json: the daemon's books."""
        out = subprocess.run([KVPOOLCTL, "--socket", self.sock, "--json", "status"],
                             check=True, capture_output=True, text=True, timeout=10).stdout
        return json.loads(out)

    def pool_books(self, name):
        for p in self.status()["pools"]:
            if p["name"] == name:
                return {t["tier"]: t for t in p["tiers"]}
        raise KeyError(name)

    def signal(self, sig):
        self.proc.send_signal(sig)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        subprocess.run(["rm", "-rf", self.dir], check=False)


@pytest.fixture(scope="module")
def daemon(request):
    """A kvpoold shared by the tests of one module: of the module's CONF where it has one, else
    of DEFAULT_CONF (pools c, f32, small, bf16, llama, fp8)."""
    d = Daemon(getattr(request.module, "CONF", DEFAULT_CONF))
    yield d
    d.stop()


@pytest.fixture
def own_daemon():
    """A kvpoold of the test's own, for tests that stop or kill it."""
    d = Daemon()
    yield d
    d.stop()


@pytest.fixture
def client(daemon):
    import kvpool

    c = kvpool.connect(daemon.sock, name="pytest")
    yield c
    c.close()
