"""Shared-memory segments in ``/dev/shm`` through which a node's ranks share a read-once part.

``dcp.shared_read`` keeps a part that several ranks of one node need in one segment: its
holder creates it (``create``: ``O_CREAT|O_EXCL|O_NOFOLLOW``, mode 0600, its size allocated
up front so that a full tmpfs is ``ENOSPC`` there, never a ``SIGBUS`` later), the others map
it read-only (``open_view``: opened ``O_NOFOLLOW|O_NONBLOCK``, so a FIFO put in its place
is refused at once, never waited on; then a regular file of this uid and the expected
size, else an error), and the holder unlinks it once all have mapped it. A segment is one
name directly in ``/dev/shm`` (no folder below it that could be swapped for a link), and
``/dev/shm`` is sticky (mode 1777): another uid can neither rename nor remove a file of
this one there. A segment's name holds the load's token, the creator's pid namespace and
pid; ``sweep`` removes those whose creator is gone (a ``SIGKILL``), never a file
ckptstore did not make or another uid's.
``node_key`` says which ranks share a node: one boot, one ``/dev/shm`` (a container with
its own ``/dev/shm`` has another device), one uid.
"""

from __future__ import annotations

import errno
import mmap
import os
import stat
from collections.abc import Hashable

import torch

from ckptstore.errors import CkptStoreError, StorageFullError

__all__ = [
    "SHM_DIR",
    "create",
    "creator",
    "free_bytes",
    "node_key",
    "open_view",
    "segment_name",
    "sweep",
    "unlink",
]

SHM_DIR = "/dev/shm"
PREFIX = "ckptstore-share-"
_ADVICE = (
    "free space in /dev/shm or make it larger (docker run --shm-size), or lower "
    "TransferConfig.memory_budget (a node holds two batches of it there)"
)


#: A view never follows a link, never waits on what it opens (a FIFO with no writer).
_VIEW = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


def node_key() -> Hashable | None:
    """Equal for the ranks that share this machine's ``/dev/shm`` as one uid; None if
    there is none (the rank then shares no segment)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        return boot, os.stat(SHM_DIR).st_dev, os.getuid()
    except OSError:
        return None


def free_bytes() -> int:
    """The bytes this rank may still put in ``/dev/shm`` (0 without one)."""
    try:
        st = os.statvfs(SHM_DIR)
    except OSError:
        return 0
    return st.f_bavail * st.f_frsize


def creator() -> str:
    """This process as a segment's name holds it: pid namespace and pid (a sweep in
    another pid namespace cannot tell whether a pid is alive, so it leaves the file)."""
    try:
        ns = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        ns = 0
    return f"{ns}-{os.getpid()}"


def segment_name(token: str, maker: str, batch: int, index: int) -> str:
    """The path of part ``index`` of ``batch`` of the load ``token``, made by ``maker``
    (the holder's ``creator()``, gathered)."""
    return os.path.join(SHM_DIR, f"{PREFIX}{token}-{maker}-{batch}-{index}")


def create(path: str, n: int) -> torch.Tensor:
    """A new segment of ``n`` bytes at ``path``, mapped read-write, as a uint8 tensor
    (unmapped when the tensor is freed); ``CkptStoreError`` if it cannot be made whole."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        raise CkptStoreError(
            f"could not create {path} ({exc.strerror}): /dev/shm must be writable by this "
            "user, and a file of that name (another load's, not removed) must not be there"
        ) from exc
    try:
        os.posix_fallocate(fd, 0, max(n, 1))  # a zero-length map is refused
        mem = mmap.mmap(fd, max(n, 1))
    except OSError as exc:
        os.close(fd)
        os.unlink(path)
        kind = StorageFullError if exc.errno == errno.ENOSPC else CkptStoreError
        raise kind(f"could not allocate {n} bytes in {path} ({exc.strerror}): {_ADVICE}") from exc
    os.close(fd)
    return torch.frombuffer(mem, dtype=torch.uint8)[:n]


def open_view(path: str, n: int) -> mmap.mmap:
    """The segment at ``path``, mapped read-only; ``CkptStoreError`` unless it is a regular
    file of this uid of ``max(n, 1)`` bytes (the holder's, not something put in its place)."""
    try:
        fd = os.open(path, _VIEW)
    except OSError as exc:
        raise CkptStoreError(f"could not open the shared part {path}: {exc.strerror}") from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_size != max(n, 1):
            raise CkptStoreError(
                f"{path} is not the shared part this rank expects (a regular file of uid "
                f"{os.getuid()} and {max(n, 1)} bytes); remove it and load again"
            )
        return mmap.mmap(fd, max(n, 1), prot=mmap.PROT_READ)
    finally:
        os.close(fd)


def sweep() -> list[str]:
    """Remove the segments of this uid and pid namespace whose creator is no longer alive;
    the paths removed. Anything else in ``/dev/shm`` is left alone."""
    ns = creator().split("-")[0]
    removed: list[str] = []
    try:
        entries = list(os.scandir(SHM_DIR))
    except OSError:
        return removed
    for entry in entries:
        fields = entry.name[len(PREFIX) :].split("-")
        if not entry.name.startswith(PREFIX) or len(fields) != 5 or fields[1] != ns:
            continue
        try:
            if not fields[2].isdigit() or _alive(int(fields[2])):
                continue
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid():
                os.unlink(entry.path)
                removed.append(entry.path)
        except OSError:  # gone meanwhile (another rank swept it): nothing to do
            continue
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another uid's process: alive
        return True
    return True


def unlink(path: str) -> None:
    """Remove a segment this rank made (gone already: nothing to do)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
