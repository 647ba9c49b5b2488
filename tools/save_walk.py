"""How many ckptstore modules a save and a restore run code in (issue 59's walk figure).

    .venv/bin/python tools/save_walk.py [-v]

One process, the thread backend, a 256 KiB state on a temporary volume root: the second of
two saves and then a restore are traced (``sys.setprofile`` / ``threading.setprofile``: a
module counts when a function of it is called), without and with a local tier. ``-v``
lists the modules. A dev tool, not part of the library: fewer modules on these paths means
fewer places a reader of a save has to open (docs/ARCHITECTURE.md, "A save").
"""

from __future__ import annotations

import sys
import tempfile
import threading
from typing import Any

import torch

from ckptstore import CheckpointManager

_seen: set[str] = set()
_on = [False]


def _profile(frame: Any, event: str, arg: Any) -> None:
    if _on[0] and event == "call":
        name = frame.f_code.co_filename
        if "/ckptstore/" in name and "site-packages" not in name:
            _seen.add(name.rsplit("/ckptstore/", 1)[1])


def _walks(tier: bool) -> tuple[list[str], list[str]]:
    root = tempfile.mkdtemp(prefix="walk-root-")
    keywords: dict[str, Any] = {"background": "thread"}
    if tier:
        keywords["local_tier_dir"] = tempfile.mkdtemp(prefix="walk-tier-")
    state = {"w": torch.randn(256, 256), "n": 1}
    with CheckpointManager(root, **keywords) as mgr:
        mgr.save(1, state)
        mgr.wait()
        _seen.clear()
        _on[0] = True
        mgr.save(2, state)
        mgr.wait()
        _on[0] = False
    save = sorted(_seen)
    _seen.clear()
    with CheckpointManager(root, **keywords) as mgr:
        _on[0] = True
        mgr.restore(state)
        _on[0] = False
    return save, sorted(_seen)


def main() -> int:
    sys.setprofile(_profile)
    threading.setprofile(_profile)
    for tier in (False, True):
        save, restore = _walks(tier)
        label = "with a local tier" if tier else "without a local tier"
        print(f"{label}: a save runs code in {len(save)} modules, a restore in {len(restore)}")
        if "-v" in sys.argv:
            print("  save:    " + " ".join(save))
            print("  restore: " + " ".join(restore))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
