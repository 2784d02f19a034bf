"""kvpool.Restarted: a call in flight when kvpoold restarts raises it; the client has reconnected
by itself by then, so the retried call goes on (here without an fd store: the new kvpoold starts
empty and the pool is mapped anew)."""
import signal
import subprocess

import kvpool
from conftest import KVPOOLD, Daemon, wait_socket


def restart(d):
    """Stops d's kvpoold (SIGTERM) and starts another on the same socket and config."""
    d.proc.send_signal(signal.SIGTERM)
    d.proc.wait(10)
    d.proc = subprocess.Popen([KVPOOLD, "--socket", d.sock, "--config", d.conf],
                              stdout=d.log, stderr=d.log)
    if not wait_socket(d.sock):
        raise RuntimeError("kvpoold did not come back")


def test_restarted_is_an_error_of_its_own():
    assert issubclass(kvpool.Restarted, kvpool.Error)
    assert kvpool.Restarted is not kvpool.TransportError
    assert "Restarted" in kvpool.__all__


def test_call_across_a_restart_raises_restarted_then_goes_on():
    d = Daemon()
    try:
        c = kvpool.connect(d.sock, name="py-restart")
        pool = c.attach("c")
        restart(d)
        try:
            pool.alloc(1)
            raised = None
        except kvpool.Error as e:
            raised = e
        assert isinstance(raised, kvpool.Restarted), raised
        assert raised.code == 15 and raised.name == "RESTARTED"
        lease = pool.alloc(2)  # the retry goes on, on the new kvpoold
        assert len(lease.pages) == 2
        d.log.flush()
        assert open(d.log.name).read().count("hello from 'py-restart'") == 2
        lease.free()
        c.close()
    finally:
        d.stop()
