"""disk_util: what the plug-in tests of the tiers below host need: a folder for a pool's disk
tier file on a filesystem with direct I/O, the pool's config lines, and kvpoold's disk tier
counters, and
flipping bytes of a disk tier's file."""
import errno
import os
import shutil
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def _direct_io(folder):
    """True when a file in folder opens with O_DIRECT (tmpfs refuses it)."""
    path = os.path.join(folder, "odirect-probe")
    try:
        fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_DIRECT | os.O_CLOEXEC, 0o600)
    except OSError as e:
        if e.errno in (errno.EINVAL, errno.EOPNOTSUPP):
            return False
        raise
    os.close(fd)
    os.unlink(path)
    return True


def disk_folder():
    """A new folder for disk tier files: under the temporary folder when its filesystem has
    direct I/O, else beside the tests. The caller removes it (remove_folder)."""
    base = tempfile.gettempdir()
    d = tempfile.mkdtemp(prefix="kvpool-disk-", dir=base)
    if _direct_io(d):
        return d
    os.rmdir(d)
    return tempfile.mkdtemp(prefix="kvpool-disk-", dir=HERE)


def remove_folder(d):
    shutil.rmtree(d, ignore_errors=True)


def disk_lines(folder, name, capacity):
    """A pool's disk tier config lines: write-back to <folder>/<name>.disk of capacity."""
    return (f"disk = write-back\ndisk_path = {os.path.join(folder, name + '.disk')}\n"
            f"disk_capacity = {capacity}\n")


def flip_disk_bytes(path, at):
    """Flips byte `at` of every 4 KiB block of a disk tier's file past its first (the store's
    slots: a page's header or bytes, depending on at and the page size)."""
    with open(path, "r+b") as f:
        size = f.seek(0, 2)
        for off in range(4096 + at, size, 4096):
            f.seek(off)
            b = f.read(1)
            f.seek(off)
            f.write(bytes([b[0] ^ 0x5A]))
        f.flush()


def disk_counters(daemon):
    """kvpoold's disk tier counters (disk_*: all its pools' together)."""
    return {k: v for k, v in daemon.status()["counters"].items() if k.startswith("disk_")}

