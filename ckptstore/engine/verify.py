"""Re-read a committed checkpoint and check every byte against its manifest.

    report = verify_checkpoint(store, engine, on_bytes=progress.update)
    if not report.ok:
        for f in report.bad_files: print(f.name, f.problem, f.bad_ranges)

Every file the manifest lists is read as parallel ranged GETs (windows of
``TransferConfig.part_size``) on the engine's pool, with at most ``2 * concurrency`` windows
in memory. Each window's CRC32C and the CRC32C of every stored item range it overlaps are
computed in the worker; they are folded together with ``crc32c_combine``, so each byte is
read once and nothing needs the whole file in memory. A damaged file is reported with the
item ranges whose bytes changed (or lie beyond a truncated end), so the caller can name them.

A name in the manifest that would leave the checkpoint (``../x``, ``/x``: ``engine.paths``)
is never read: it is reported as a bad file ("unsafe name"), so the checkpoint fails.

The canonical manifest and ``.metadata`` are checked too: ``open_committed`` silently falls
back to the attempt's own copies when a canonical copy is damaged, but stock DCP readers read
the canonical ``.metadata``, so a damaged one is reported here.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

from ckptstore.engine.checksum import crc32c, crc32c_combine, format_crc
from ckptstore.engine.committed import Committed, open_committed
from ckptstore.engine.manifest import MANIFEST_NAME, MARKER_NAME, FileEntry, RangeEntry
from ckptstore.engine.paths import check_name
from ckptstore.engine.store import Store
from ckptstore.engine.transfer import TransferEngine, split_ranges
from ckptstore.errors import StoreNotFoundError, UnsafePathError

__all__ = ["BadRange", "FileCheck", "VerifyReport", "verify_checkpoint", "verify_files"]


@dataclass(frozen=True)
class BadRange:
    """One stored item whose bytes do not match the manifest."""

    file: str
    offset: int
    length: int
    key: str
    problem: str  # "checksum mismatch" | "beyond the end of the file"


@dataclass
class FileCheck:
    """What verification found for one file."""

    name: str
    expected_size: int
    expected_crc32c: int
    size: int | None = None  # None: the file is missing
    crc32c: int | None = None  # of the bytes read (up to the expected size)
    bad_ranges: list[BadRange] = field(default_factory=list)
    unsafe: str = ""  # why the name was refused (never read), '' for a safe name

    @property
    def ok(self) -> bool:
        """True when the name is safe and the size, CRC32C and every item range match."""
        return (
            not self.unsafe
            and self.size == self.expected_size
            and self.crc32c == self.expected_crc32c
            and not self.bad_ranges
        )

    @property
    def problem(self) -> str:
        """One line saying what is wrong ('' when the file is fine)."""
        if self.unsafe:
            return f"unsafe name, not read: {self.unsafe}"
        if self.size is None:
            return "missing"
        out = []
        if self.size != self.expected_size:
            kind = "truncated" if self.size < self.expected_size else "too long"
            out.append(f"{kind}: {self.size} bytes, the manifest says {self.expected_size}")
        if self.crc32c != self.expected_crc32c and self.size >= self.expected_size:
            out.append(
                f"checksum mismatch: crc32c {format_crc(self.crc32c or 0)}, the manifest says "
                f"{format_crc(self.expected_crc32c)}"
            )
        return "; ".join(out)


@dataclass
class VerifyReport:
    """Every checked file, in name order."""

    url: str
    files: list[FileCheck]
    bytes_read: int

    @property
    def ok(self) -> bool:
        """True when every file is ``ok``."""
        return all(f.ok for f in self.files)

    @property
    def bad_files(self) -> list[FileCheck]:
        """The files that are not ``ok``, in name order."""
        return [f for f in self.files if not f.ok]


@dataclass
class _Window:
    file: str
    start: int
    end: int
    ranges: list[tuple[int, RangeEntry]]  # (index into the file's ranges, entry) overlapping


def _window_task(
    engine: TransferEngine, store: Store, w: _Window
) -> tuple[int, int, list[tuple[int, int, int]]]:
    """Read one window: (bytes got, its CRC, [(range index, overlap CRC, overlap length)])."""
    data = engine.retry(
        lambda: store.get(w.file, w.start, w.end), f"read of {store.describe(w.file)}"
    )
    view = memoryview(data)
    overlaps = []
    for idx, r in w.ranges:
        lo, hi = max(r.offset, w.start), min(r.offset + r.length, w.end)
        overlap = view[lo - w.start : hi - w.start]
        overlaps.append((idx, crc32c(overlap), len(overlap)))
    return len(view), crc32c(view), overlaps


def verify_files(
    store: Store,
    engine: TransferEngine,
    files: dict[str, FileEntry],
    ranges: Sequence[RangeEntry] = (),
    *,
    on_bytes: Callable[[int], None] | None = None,
) -> tuple[list[FileCheck], int]:
    """Check ``files`` (name -> expected size and CRC) and their item ``ranges`` on ``store``.

    Returns the checks in name order and the number of bytes read.
    """
    by_file: dict[str, list[RangeEntry]] = {}
    for r in ranges:
        by_file.setdefault(r.file, []).append(r)
    checks = {name: FileCheck(name, e.size, e.crc32c) for name, e in files.items()}
    for name, check in checks.items():
        try:
            check_name(name, store.url)
        except UnsafePathError as exc:
            check.unsafe = str(exc)
    files = {n: e for n, e in files.items() if not checks[n].unsafe}

    def stat(name: str) -> int | None:
        try:
            return engine.retry(lambda: store.size(name), f"stat of {store.describe(name)}")
        except StoreNotFoundError:
            return None

    sizes = {n: f.result() for n, f in [(n, engine.pool.submit(stat, n)) for n in files]}
    slots = threading.BoundedSemaphore(2 * engine.config.concurrency)
    futures: dict[str, list[tuple[_Window, Future]]] = {}
    try:
        for name in sorted(files):
            check = checks[name]
            check.size = sizes[name]
            if check.size is None:
                continue
            file_ranges = sorted(by_file.get(name, []), key=lambda r: r.offset)
            limit = min(check.size, check.expected_size)
            futures[name] = []
            for start, end in split_ranges(0, limit, engine.config.part_size):
                hit = [
                    (i, r)
                    for i, r in enumerate(file_ranges)
                    if r.offset < end and r.offset + r.length > start
                ]
                w = _Window(name, start, end, hit)
                slots.acquire()
                fut = engine.pool.submit(_window_task, engine, store, w)

                def done(f: Future, n: int = end - start) -> None:
                    slots.release()
                    if on_bytes is not None and not f.cancelled() and f.exception() is None:
                        on_bytes(n)

                fut.add_done_callback(done)
                futures[name].append((w, fut))
        total = 0
        for name, windows in futures.items():
            total += _fold(
                checks[name], sorted(by_file.get(name, []), key=lambda r: r.offset), windows
            )
    except BaseException:
        for windows in futures.values():
            for _, f in windows:
                f.cancel()
        raise
    return [checks[n] for n in sorted(checks)], total


def _fold(check: FileCheck, file_ranges: list[RangeEntry], windows: list) -> int:
    """Combine the windows of one file into its CRC and its ranges' CRCs; returns bytes read."""
    file_crc, got = 0, 0
    range_crc = [0] * len(file_ranges)
    range_len = [0] * len(file_ranges)
    for _w, fut in windows:
        try:
            n, crc, overlaps = fut.result()
        except StoreNotFoundError:
            check.size = None
            return got
        file_crc = crc32c_combine(file_crc, crc, n)
        got += n
        for idx, pcrc, plen in overlaps:
            range_crc[idx] = crc32c_combine(range_crc[idx], pcrc, plen)
            range_len[idx] += plen
    check.crc32c = file_crc
    if got < min(check.size or 0, check.expected_size):
        check.size = got  # it shrank while we read it
    for i, r in enumerate(file_ranges):
        if range_len[i] < r.length:
            check.bad_ranges.append(
                BadRange(r.file, r.offset, r.length, r.key, "beyond the end of the file")
            )
        elif range_crc[i] != r.crc32c:
            check.bad_ranges.append(
                BadRange(r.file, r.offset, r.length, r.key, "checksum mismatch")
            )
    return got


def verify_checkpoint(
    store: Store,
    engine: TransferEngine | None = None,
    *,
    committed: Committed | None = None,
    on_bytes: Callable[[int], None] | None = None,
) -> VerifyReport:
    """Verify the committed checkpoint at ``store`` (see the module docstring).

    Raises ``IncompleteCheckpointError`` (no marker) or ``CorruptCheckpointError`` (the
    marker matches no manifest) before reading any data.
    """
    committed = committed or open_committed(store)
    own = engine is None
    engine = engine or TransferEngine()
    try:
        checks, total = verify_files(
            store, engine, committed.manifest.files, committed.manifest.ranges, on_bytes=on_bytes
        )
        checks.append(_check_canonical_manifest(store, committed))
    finally:
        if own:
            engine.close()
    checks.sort(key=lambda c: c.name)
    return VerifyReport(store.url, checks, total)


def _check_canonical_manifest(store: Store, committed: Committed) -> FileCheck:
    """The canonical manifest must be the one ``COMMITTED`` names (humans and tools read it)."""
    m = committed.marker
    check = FileCheck(MANIFEST_NAME, m.manifest_size, m.manifest_crc32c)
    try:
        size = store.size(MANIFEST_NAME)
        # another size cannot match: not read (a planted 1 GiB manifest costs a stat)
        data = store.get(MANIFEST_NAME, 0, m.manifest_size + 1) if size == m.manifest_size else b""
    except StoreNotFoundError:
        return check
    if size != m.manifest_size:
        check.size = size
        check.bad_ranges.append(
            BadRange(
                MANIFEST_NAME,
                0,
                size,
                "",
                f"is {size} bytes; {MARKER_NAME} commits {m.manifest_size}: not read",
            )
        )
        return check
    check.size, check.crc32c = len(data), crc32c(data)
    if not m.matches(data):
        check.bad_ranges.append(
            BadRange(MANIFEST_NAME, 0, len(data), "", f"does not match {MARKER_NAME}")
        )
    return check
