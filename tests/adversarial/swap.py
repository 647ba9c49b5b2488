"""What the swap-race tests share: a child process that, for a few seconds, swaps a
directory below a root for a symlink to a directory outside it and back (a rename dance),
an outside directory seeded with sentinel files, and the loop that drives the code under
test meanwhile, keeping every error it raised.

Real processes and files, no mocks: the swapper runs on its own core, so the swap lands
between any two system calls of the code under test.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from ckptstore.errors import CkptStoreError

__all__ = ["SENTINEL", "Escaped", "Swapper", "seed_outside", "snapshot", "hammer"]

#: The swapper: until ``end``, rename ``dir`` away, put a link to ``outside`` in its place,
#: then put the directory back; every step tolerates what the code under test did
#: meanwhile (it may have made ``dir`` again, or left it empty).
_SWAP = r"""
import os, sys, time
d, outside, end = sys.argv[1], sys.argv[2], float(sys.argv[3])
n = 0
while time.time() < end:
    held = f"{d}.held.{n}"
    n += 1
    try:
        os.rename(d, held)
    except OSError:
        held = None
    try:
        os.symlink(outside, d)
    except OSError:
        pass
    for _ in range(200):  # the link stays a little while: a few of the victim's calls
        pass
    try:
        if os.path.islink(d):
            os.unlink(d)
    except OSError:
        pass
    if held is not None:
        try:
            os.rename(held, d)
        except OSError:
            pass
print(n)
"""


class Swapper:
    """The child process swapping ``directory`` for a link to ``outside`` for ``seconds``."""

    def __init__(self, directory: Path, outside: Path, seconds: float) -> None:
        self.end = time.time() + seconds
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _SWAP, str(directory), str(outside), str(self.end)],
            stdout=subprocess.PIPE,
            text=True,
        )

    def running(self) -> bool:
        return time.time() < self.end and self.proc.poll() is None

    def join(self) -> int:
        """How many swaps it made."""
        out, _ = self.proc.communicate(timeout=30)
        assert self.proc.returncode == 0
        return int(out.strip() or 0)


#: What a sentinel file holds: bytes the code under test never writes.
SENTINEL = b"sentinel "


def seed_outside(outside: Path, names: list[str]) -> dict[str, bytes]:
    """Sentinel files at ``names`` below ``outside`` (an empty directory for a name
    ending in "/"); returns what ``snapshot`` gives."""
    for name in names:
        path = outside / name
        if name.endswith("/"):
            path.mkdir(parents=True, exist_ok=True)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(SENTINEL + name.encode())
    return snapshot(outside)


class Escaped(AssertionError):
    """The code under test read or listed something that is only outside the root."""


def snapshot(top: Path) -> dict[str, bytes]:
    """Every entry below ``top``: a file's bytes, ``b"<dir>"`` for a directory."""
    out: dict[str, bytes] = {}
    for d, dirs, files in os.walk(top):
        for name in dirs:
            out[os.path.relpath(os.path.join(d, name), top)] = b"<dir>"
        for name in files:
            with open(os.path.join(d, name), "rb") as f:
                out[os.path.relpath(os.path.join(d, name), top)] = f.read()
    return out


def hammer(
    swapper: Swapper, ops: list[Callable[[], object]], errnos: tuple[int, ...] = ()
) -> tuple[int, list[BaseException]]:
    """Run ``ops`` round and round while ``swapper`` runs; returns how many calls were
    made and every error that is not a ckptstore error nor an ``OSError`` whose errno is
    one of ``errnos`` (an API that documents those for an occupied or missing name):
    each one a bug."""
    calls = 0
    foreign: list[BaseException] = []
    while swapper.running():
        for op in ops:
            calls += 1
            try:
                op()
            except Escaped:
                raise
            except CkptStoreError:
                pass  # refused (a link on the way) or not there (the directory moved)
            except OSError as exc:
                if exc.errno not in errnos:
                    foreign.append(exc)
            except Exception as exc:  # noqa: BLE001 - collected and asserted on
                foreign.append(exc)
    return calls, foreign
