"""kvpool: Python client of kvpoold, the node-local KV-cache memory service.

Connect to the daemon, attach to a pool, lease pages, publish and match cached prefixes, and
view the tier memory without copies (DLPack and the buffer protocol)::

    import kvpool, numpy
    with kvpool.connect() as client:
        pool = client.attach("llama-8b")
        with pool.alloc(4) as lease:
            k0 = numpy.from_dlpack(pool.kv("device", 0, 0))   # [slots, kv_heads, head_dim]

Every failure raises a subclass of kvpool.Error carrying the daemon's typed detail
(kvpool.OutOfCapacity.free_tokens, ...). A Client is not thread-safe: use one per thread; a
second thread entering a client that is in a call gets kvpool.ClientBusy.

The extension links the system's protobuf-c runtime, which the wheel does not carry: install
libprotobuf-c.so.1 first (Debian/Ubuntu: apt-get install libprotobuf-c1; Fedora/RHEL:
dnf install protobuf-c), or `import kvpool` fails with "libprotobuf-c.so.1: cannot open
shared object file".
"""
from ._kvpool import (
    PROTOCOL_VERSION,
    HAVE_CUDA,
    EVENT_PRESSURE,
    __version__,
    connect,
    decode_pressure,
    default_socket,
    copy_runs,
    copy_runs_cuda,
    set_torch_allocator,
    Client,
    Pool,
    Lease,
    Match,
    View,
    Geometry,
    Event,
    PressureNotice,
    Error,
    ClientBusy,
    OutOfCapacity,
    HostBudgetExceeded,
    QuotaExceeded,
    NoSuchPool,
    GeometryMismatch,
    NotFound,
    InvalidArgument,
    PermissionDenied,
    ProtocolError,
    VersionMismatch,
    ShuttingDown,
    LimitExceeded,
    Unavailable,
    Internal,
    Restarted,
    NoDaemon,
    TransportError,
    OutOfMemory,
    MapError,
    BufferTooSmall,
    Forked,
)

__all__ = [
    "PROTOCOL_VERSION", "HAVE_CUDA", "__version__", "connect", "default_socket", "Client",
    "Pool", "Lease", "Match", "View", "Geometry", "Event", "Error", "ClientBusy",
    "OutOfCapacity", "HostBudgetExceeded", "QuotaExceeded", "NoSuchPool", "GeometryMismatch", "NotFound",
    "InvalidArgument", "PermissionDenied", "ProtocolError", "VersionMismatch", "ShuttingDown",
    "LimitExceeded", "Unavailable", "Internal", "Restarted", "NoDaemon", "TransportError", "OutOfMemory",
    "MapError", "BufferTooSmall", "Forked",
    "EVENT_PRESSURE", "decode_pressure", "PressureNotice", "copy_runs",
    "copy_runs_cuda", "set_torch_allocator",
]
