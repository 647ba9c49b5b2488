"""Audit every checkpoint under a root after a chaos run: committed ones verify and hold
exactly the state that was saved; torn ones are reported.

    audit = audit_root(root, expected={12: "a1b2c3d4", ...}, crc=tensor_crc, key=("app", "model"))
    assert audit.ok, audit.problems

For each ``step_*`` entry: a committed one is re-read byte by byte against its manifest
(``engine.verify.verify_checkpoint``, what ``ckptstore-tool verify`` runs), then loaded in
full through ckptstore's verifying reader (DCP with an empty-state planner, as
``ckptstore-tool convert`` does); the sub-dict at ``key`` must hash (``crc``: the checksum
the job logged its saves with) to ``expected[step]`` when given. Entries that are not
committed are listed as torn (or as empty, when the listing shows a prefix that holds no
object): the manager never restores them (the restore check in ``runlog`` proves that).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ckptstore.engine.catalog import list_steps
from ckptstore.engine.store import Store
from ckptstore.engine.transfer import TransferEngine
from ckptstore.engine.verify import verify_checkpoint
from ckptstore.stores import open_store

__all__ = ["Audit", "audit_root", "load_full"]


@dataclass
class Audit:
    committed: list[int] = field(default_factory=list)
    torn: list[tuple[int, str]] = field(default_factory=list)  # (step, status)
    empty: list[int] = field(default_factory=list)  # listed prefixes holding no object
    bytes_verified: int = 0
    matched: list[int] = field(default_factory=list)  # steps whose content matched expected
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def load_full(store: Store, engine: TransferEngine | None = None) -> dict[str, Any]:
    """Every entry of the committed checkpoint at ``store``, nested as saved, verified."""
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    from ckptstore.api import unwrap_checkpoint_exception
    from ckptstore.dcp.reader import CkptReader

    state: dict[str, Any] = {}
    reader = CkptReader(store, engine=engine) if engine else CkptReader(store)
    try:
        _load_state_dict(
            state, storage_reader=reader, planner=_EmptyStateDictLoadPlanner(), no_dist=True
        )
    except CheckpointException as exc:
        raise unwrap_checkpoint_exception(exc) from exc
    return state


def audit_root(
    root: str | Store,
    *,
    storage_options: dict[str, Any] | None = None,
    expected: Mapping[int, str] | None = None,
    crc: Callable[[Any], str] | None = None,
    key: Sequence[str] = ("app", "model"),
) -> Audit:
    """Verify, load and compare every committed checkpoint under ``root`` (module doc)."""
    if expected is not None and crc is None:
        raise ValueError("audit_root(expected=...) needs crc=, the checksum the job logged")
    store = open_store(root, storage_options)
    engine = TransferEngine()
    audit = Audit()
    try:
        for entry in list_steps(store):
            if entry.status != "committed":
                if store.child(entry.name).find(""):
                    audit.torn.append((entry.step, entry.status))
                else:  # some S3 servers (SeaweedFS) keep listing a prefix emptied by a delete
                    audit.empty.append(entry.step)
                continue
            audit.committed.append(entry.step)
            child = store.child(entry.name)
            report = verify_checkpoint(child, engine)
            audit.bytes_verified += report.bytes_read
            if not report.ok:
                bad = ", ".join(f"{f.name}: {f.problem}" for f in report.bad_files)
                audit.problems.append(f"step {entry.step} fails verification: {bad}")
                continue
            try:
                state: Any = load_full(child, engine)
                for k in key:
                    state = state[k]
            except Exception as exc:  # noqa: BLE001 - reported, the audit goes on
                audit.problems.append(f"step {entry.step} does not load: {exc!r}")
                continue
            if expected is not None and crc is not None:
                want = expected.get(entry.step)
                got = crc(state)
                if want is None:
                    audit.problems.append(f"step {entry.step} is committed but was never saved")
                elif got != want:
                    audit.problems.append(
                        f"step {entry.step} holds state {got}, the job saved {want}"
                    )
                else:
                    audit.matched.append(entry.step)
    finally:
        engine.close()
    return audit
