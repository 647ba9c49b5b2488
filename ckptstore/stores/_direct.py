"""Direct I/O for the volume store's large part writes (``local_durable.write_part``).

A part's page-aligned middle is written with ``O_DIRECT``: to the device, with no page-cache
pages to allocate and fill and none left dirty for the fsync (on a 2-core VM a 512 MiB
buffered write + fsync took 0.27-2.9 s in fresh processes, the same bytes direct 0.22-0.28
s). Straight from the part's memory where that memory's address agrees with the file offset
modulo ``ALIGN`` (the DCP writer pads a file before a large tensor's bytes so that it does:
``FileWriter.align``), else copied, a chunk at a time, into a reused page-aligned buffer of
the writing thread first (a copy held under the GIL: 0.10 s a GiB here). The unaligned head
and tail of a part (under a page each) are left to the caller's buffered writes, and the
caller's fsync of the whole file is still what makes it durable. Only local-disk file
systems (``LOCAL_DISK_FS``) get direct writes; ``CKPTSTORE_DIRECT_WRITES=0`` turns them off
(every byte buffered and kept in the page cache, so a load on the same node right after the
save reads memory, not the disk). A file system that refuses ``O_DIRECT`` (``EINVAL``) gets
nothing written here and is remembered (``st_dev``), so it is not tried again.
"""

from __future__ import annotations

import errno
import mmap
import os
import threading

import numpy as np

from ckptstore.stores._posix import NOFOLLOW

__all__ = [
    "ALIGN",
    "CHUNK",
    "DIRECT_MIN",
    "ENV",
    "LOCAL_DISK_FS",
    "alignment",
    "fs_type",
    "write_aligned",
]

#: Alignment of the file offsets, lengths and memory of a direct write: the page size,
#: a multiple of every device's logical block size ckptstore expects (512 or 4096).
ALIGN = 4096
#: Bytes written per direct ``pwrite``, and the size of each thread's buffer where they
#: are copied first (kept for reuse: resident for as long as the I/O thread lives). 1, 2
#: and 4 MiB chunks wrote 256 MiB direct + fsync equally fast here (0.12-0.15 s each); at
#: 4 MiB the 8 I/O threads' buffers held ~18 MiB more RSS than a stock async save after a
#: save of a 37 MiB state.
CHUNK = 1024 * 1024
#: Parts smaller than this are written buffered only (a direct write waits for the device).
DIRECT_MIN = 1024 * 1024
#: The environment variable that turns direct writes off when it is "0".
ENV = "CKPTSTORE_DIRECT_WRITES"

#: File systems on a local block device where direct writes were measured or are known to
#: behave (a network or FUSE file system keeps buffered writes: its write-behind is how
#: it hides round trips, which a synchronous direct write would expose).
LOCAL_DISK_FS = frozenset({"ext4", "xfs", "btrfs"})

_O_DIRECT = getattr(os, "O_DIRECT", 0)
_refused: set[int] = set()  # st_dev of file systems that refused O_DIRECT
_kinds: dict[int, str] = {}  # st_dev -> file system type, from /proc/self/mountinfo
_local = threading.local()


def alignment() -> int:
    """What a part's memory address and file offset must agree on (modulo) to be written
    from that memory without a copy: ``ALIGN``, or 0 where the platform has no
    ``O_DIRECT``."""
    return ALIGN if _O_DIRECT else 0


def fs_type(dev: int) -> str:
    """The type of the file system mounted as device ``dev`` ("" where unknown)."""
    kind = _kinds.get(dev)
    if kind is None:
        want = f"{os.major(dev)}:{os.minor(dev)}"
        kind = ""
        try:
            with open("/proc/self/mountinfo") as f:
                for line in f:
                    fields = line.split()
                    if len(fields) > 2 and fields[2] == want and " - " in line:
                        kind = line.split(" - ", 1)[1].split()[0]
                        break
        except OSError:
            pass
        _kinds[dev] = kind
    return kind


def _buffer() -> memoryview:
    """This thread's page-aligned ``CHUNK``-byte buffer (anonymous ``mmap``: page-aligned,
    which ``bytearray`` is not)."""
    buf = getattr(_local, "buf", None)
    if buf is None:
        buf = _local.buf = memoryview(mmap.mmap(-1, CHUNK))
    return buf


def write_aligned(
    dir_fd: int, name: str, fd: int, offset: int, view: memoryview
) -> tuple[int, int]:
    """Write the page-aligned middle of ``view`` (the bytes of file ``name`` in directory
    ``dir_fd``, from ``offset`` on) with ``O_DIRECT``; returns the file range ``(lo, hi)``
    written (``lo == hi``: none).

    The caller writes the rest (``[offset, lo)`` and ``[hi, offset + len(view))``)
    buffered, through ``fd`` (``name`` open for writing). ``name`` is opened again
    relative to ``dir_fd``, never through a link, as every volume path is (``_dirfd``).
    Nothing is written where the platform lacks ``O_DIRECT``, the part is under
    ``DIRECT_MIN``, or the file system refuses it; a refusal after some chunks were
    written leaves ``hi`` where they end. Other errors (a full volume) raise ``OSError``.
    """
    lo = -(-offset // ALIGN) * ALIGN
    hi = (offset + len(view)) // ALIGN * ALIGN
    if not _O_DIRECT or len(view) < DIRECT_MIN or hi <= lo or os.environ.get(ENV) == "0":
        return offset, offset
    dev = os.fstat(fd).st_dev
    if dev in _refused or fs_type(dev) not in LOCAL_DISK_FS:
        return offset, offset
    try:
        dfd = os.open(name, os.O_WRONLY | _O_DIRECT | NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
        _refused.add(dev)
        return offset, offset
    # The name is opened again (O_DIRECT on ``fd`` would make its buffered writes direct
    # too): a file put in its place since gets nothing; ``fd``'s buffered writes take all.
    mine, reopened = os.fstat(fd), os.fstat(dfd)
    if (mine.st_dev, mine.st_ino) != (reopened.st_dev, reopened.st_ino):
        os.close(dfd)
        return offset, offset
    # Memory at a page boundary where the file is: written from it, else from a copy.
    inplace = (np.frombuffer(view, np.uint8).ctypes.data + lo - offset) % ALIGN == 0
    buf = None if inplace else _buffer()
    pos = lo
    try:
        while pos < hi:
            n = min(CHUNK, hi - pos)
            src = view[pos - offset : pos - offset + n]
            if buf is not None:
                buf[:n] = src
                src = buf[:n]
            try:
                written = os.pwrite(dfd, src, pos)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                _refused.add(dev)
                break
            pos += written
            if written < n:  # short (the caller writes the rest buffered)
                break
    finally:
        os.close(dfd)
    return (lo, pos) if pos > lo else (offset, offset)
