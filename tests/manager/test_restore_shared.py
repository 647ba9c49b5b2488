"""A restore reads each step's small objects once in total, not once per rank, and only
for the steps it gets to.

Real gloo groups (2 and 3 ranks), a volume root and SeaweedFS S3. Every rank wraps the root
in a counting view; the parent sums the counts over ranks: the restored step's marker,
manifest and ``.metadata`` are read exactly once per restore (by rank 0, which broadcasts
them), the root is listed only by rank 0, the state comes back bitwise, and a step whose
marker or manifest rank 0 finds bad makes every rank fall back to the older one together.
With five committed steps, a restore opens the newest only; an older step is opened (once)
only when every newer one failed, to open or to load, and one older than the step loaded
is never read at all.
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

import pytest
import torch

from ckptstore.dcp.reader import CkptReader
from ckptstore.engine.committed import METADATA_NAME, Committed, open_committed
from ckptstore.engine.manifest import MANIFEST_NAME, MARKER_NAME, Marker
from ckptstore.engine.names import step_name
from ckptstore.engine.store import Entry, Store
from ckptstore.errors import CorruptCheckpointError, NoLoadableCheckpointError
from ckptstore.manager import CheckpointManager
from ckptstore.manager.retention import KeepAll
from ckptstore.stores import open_store
from ckptstore.stores.local import LocalStore
from ckptstore.testing.faults import FaultyStore
from harness.dist import run_distributed

pytestmark = [
    pytest.mark.distributed,
    pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning"),
]

SMALL = (MARKER_NAME, MANIFEST_NAME, METADATA_NAME)


class CountingStore(FaultyStore):
    """Passes every call through; counts reads by full URL and listings, in ``log``
    (shared with its children)."""

    def __init__(self, inner: Store, log: Counter[tuple[str, str]] | None = None) -> None:
        super().__init__(inner)
        self.log: Counter[tuple[str, str]] = Counter() if log is None else log

    def child(self, prefix: str) -> CountingStore:
        return CountingStore(self.inner.child(prefix), self.log)

    def _count(self, what: str, path: str) -> None:
        self.log[what, self.inner.describe(path)] += 1

    def get(self, path: str, start: int = 0, end: int | None = None) -> bytes:
        self._count("read", path)
        return super().get(path, start, end)

    def get_into(self, path: str, start: int, buf: memoryview) -> int:
        self._count("read", path)
        return super().get_into(path, start, buf)

    def exists(self, path: str) -> bool:
        self._count("read", path)
        return self.inner.exists(path)

    def size(self, path: str) -> int:
        self._count("read", path)
        return super().size(path)

    def find(self, prefix: str = "") -> list[str]:
        self._count("list", prefix)
        return super().find(prefix)

    def listdir(self, prefix: str = "") -> list[str]:
        self._count("list", prefix)
        return super().listdir(prefix)

    def scan(self, prefix: str = "") -> list[Entry]:
        self._count("list", prefix)
        return super().scan(prefix)


def make_state(rank: int, step: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return {
        f"own{rank}": torch.randn(3000, generator=g),  # each rank's own item
        "shared": torch.arange(500, dtype=torch.float64) * step,  # replicated
        "meta": {"step": step},
    }


def zeros(rank: int) -> dict[str, Any]:
    s = make_state(rank, 0)
    return {
        k: torch.zeros_like(v) if isinstance(v, torch.Tensor) else {"step": -1}
        for k, v in s.items()
    }


def bitwise(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a.keys() == b.keys() and all(
        torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k] for k in a
    )


def _small_reads(log: Counter[tuple[str, str]], step_url: str) -> dict[str, int]:
    return {name: log["read", f"{step_url}/{name}"] for name in SMALL}


def _data_reads(log: Counter[tuple[str, str]], step_url: str) -> int:
    """Reads of ``step_url``'s data files in ``log`` (not its marker, manifests or
    .metadata copies: a marker naming an attempt sends the open to that attempt's own)."""
    control = (MARKER_NAME, "ckptstore.manifest", METADATA_NAME)
    return sum(
        n
        for (op, path), n in log.items()
        if op == "read"
        and path.startswith(f"{step_url}/")
        and not path[len(step_url) + 1 :].startswith(control)
    )


def _restore_and_count(rank: int, mgr: CheckpointManager, store: CountingStore) -> tuple:
    import torch.distributed as dist

    dist.barrier()
    store.log.clear()
    out = zeros(rank)
    try:
        got = mgr.restore(out)
    except NoLoadableCheckpointError as exc:  # committed steps, none loadable: no fresh start
        got = ("refused", [step for step, _ in exc.refused])
    counts = dict(store.log)
    return got, counts, out


STEPS = (1, 2, 3, 5, 7)
INVERT = bytes(range(255, -1, -1))
FULL, REFUSED, NOTHING = "opened (then loaded or not)", "refused when opened", "nothing"
#: What rank 0 reads of each step in each restore (on an object store ``open_committed``
#: reads the marker, manifest and .metadata at once, one GET each, so a step refused at its
#: marker costs the same three reads but none of its data; on a volume it reads them one
#: after another, and a refused step's .metadata not at all): the newest step alone while
#: it loads; after 7's marker is broken and 5's data files damaged, 7 is refused (its
#: marker does not match a manifest), 5 is opened (then fails to load) and 3 opened (it
#: loads); steps 1 and 2 stay unread. Once 1, 2 and 3 lose their manifests, each step is
#: tried once, and none loads.
OPENED = {
    "first": {7: FULL, 5: NOTHING, 3: NOTHING, 2: NOTHING, 1: NOTHING},
    "fallback": {7: REFUSED, 5: FULL, 3: FULL, 2: NOTHING, 1: NOTHING},
    "none": {7: REFUSED, 5: FULL, 3: REFUSED, 2: REFUSED, 1: REFUSED},
}


def _invert_data_files(step: Store) -> None:
    """Damage every byte of each data file of ``step`` (sizes unchanged)."""
    for name in open_committed(step).manifest.files:
        if name != METADATA_NAME:
            step.put(name, step.get(name).translate(INVERT))


def body(rank: int, world: int, url: str, options: dict, staging: str | None) -> dict:
    """Save steps 1, 2, 3, 5 and 7; restore (7); break step 7's marker and step 5's data
    files, restore (3); break steps 1-3's manifest copies: no step is left, and the restore
    raises naming each. What each restore read, and whether it was right."""
    import torch.distributed as dist

    store = CountingStore(open_store(url, options))
    node_staging = os.path.join(staging, f"node{rank}") if staging else None
    result: dict[str, Any] = {"url": store.url}
    mgr = CheckpointManager(store, local_tier_dir=node_staging, async_save=False, keep=KeepAll())
    with mgr:
        for step in STEPS:
            mgr.save(step, make_state(rank, step))
        got, counts, out = _restore_and_count(rank, mgr, store)
        result["first"] = (got, counts, bitwise(out, make_state(rank, 7)))
        dist.barrier()
        if rank == 0:  # a marker naming another manifest: rank 0 finds step 7 corrupt
            s7 = store.inner.child(step_name(7))
            m = Marker.from_bytes(s7.get(MARKER_NAME), "marker")
            bad = Marker(m.manifest_crc32c ^ 1, m.manifest_size, m.step, m.attempt)
            s7.put(MARKER_NAME, bad.to_bytes())
            _invert_data_files(store.inner.child(step_name(5)))  # 5 opens, then fails to load
        got, counts, out = _restore_and_count(rank, mgr, store)
        result["fallback"] = (got, counts, bitwise(out, make_state(rank, 3)))
        dist.barrier()
        if rank == 0:  # every copy of steps 1-3's manifests damaged: no step is left
            for step in (1, 2, 3):
                s = store.inner.child(step_name(step))
                for name in s.find():
                    if name.startswith("ckptstore.manifest"):
                        s.put(name, b"{not json")
        got, counts, out = _restore_and_count(rank, mgr, store)
        result["none"] = (got, counts, bitwise(out, zeros(rank)))
    return result


def check(results: list[dict], world: int, volume: bool) -> None:
    url = results[0]["url"]
    refused = {n: int(not volume or n != METADATA_NAME) for n in SMALL}
    for phase, want in (("first", 7), ("fallback", 3), ("none", ("refused", [7, 5, 3, 2, 1]))):
        per_rank = [r[phase] for r in results]
        assert [got for got, _, _ in per_rank] == [want] * world, phase
        assert all(ok for _, _, ok in per_rank), f"{phase}: state not restored bitwise"
        total: Counter[tuple[str, str]] = Counter()
        for _, counts, _ in per_rank:
            total.update(counts)
        for step, what in OPENED[phase].items():  # each step opened by rank 0 alone, once
            reads = _small_reads(total, f"{url}/{step_name(step)}")
            if what == FULL:
                assert reads == {n: 1 for n in SMALL}, (phase, step, reads)
            elif what == REFUSED:
                assert reads == refused, (phase, step, reads)
                assert _data_reads(total, f"{url}/{step_name(step)}") == 0, (phase, step)
            else:
                assert reads == {n: 0 for n in SMALL}, (phase, step, reads)
        for _, counts, _ in per_rank[1:]:  # other ranks: no listing, no small-object read
            assert not [k for k in counts if k[0] == "list"], (phase, counts)
            assert not [k for k in counts if k[1].rsplit("/", 1)[-1] in SMALL], (phase, counts)


def test_two_ranks_volume_root_with_node_local_tiers(tmp_path) -> None:
    root, staging = str(tmp_path / "root"), str(tmp_path / "nvme")
    results = run_distributed(body, 2, root, {}, staging, timeout=240)
    check(results, 2, volume=True)


@pytest.mark.server
@pytest.mark.slow  # three ranks' start-up alone is most of it on two cores
def test_three_ranks_seaweedfs_root(seaweedfs: Any) -> None:
    from tests.conftest import BUCKET
    from tests.stores.conftest import unique

    url = f"s3://{BUCKET}/{unique('shared-restore')}"
    results = run_distributed(body, 3, url, seaweedfs.storage_options, None, timeout=240)
    check(results, 3, volume=False)


# -- the reader's seam, one process ----------------------------------------------------
def _saved(tmp_path) -> tuple[LocalStore, Committed]:
    root = str(tmp_path / "root")
    with CheckpointManager(root, async_save=False) as mgr:
        mgr.save(1, make_state(0, 1))
    step = LocalStore(root).child(step_name(1))
    return step, open_committed(step)


def test_a_reader_handed_the_small_objects_reads_none_of_them(tmp_path) -> None:
    step, committed = _saved(tmp_path)
    counting = CountingStore(step)
    reader = CkptReader(counting, committed=committed)
    assert reader.manifest == committed.manifest
    assert not counting.log  # marker, manifest and .metadata were handed over
    out = zeros(0)
    import torch.distributed.checkpoint as dcp

    dcp.load(out, storage_reader=reader)
    assert bitwise(out, make_state(0, 1))
    assert not [k for k in counting.log if k[1].rsplit("/", 1)[-1] in SMALL]


@pytest.mark.parametrize("what", ["manifest", "metadata", "marker"])
def test_a_reader_refuses_handed_bytes_that_do_not_verify(tmp_path, what: str) -> None:
    step, c = _saved(tmp_path)
    if what == "manifest":
        bad = Committed(c.marker, c.manifest, c.metadata_bytes, c.manifest_bytes + b" ")
    elif what == "metadata":
        bad = Committed(c.marker, c.manifest, c.metadata_bytes[:-1] + b"\0", c.manifest_bytes)
    else:
        m = c.marker
        marker = Marker(m.manifest_crc32c ^ 1, m.manifest_size, m.step, m.attempt)
        bad = Committed(marker, c.manifest, c.metadata_bytes, c.manifest_bytes)
    with pytest.raises(CorruptCheckpointError, match="not verified"):
        CkptReader(step, committed=bad)


def test_a_restore_of_a_named_step_lists_nothing_and_opens_only_that_step(tmp_path) -> None:
    root = str(tmp_path / "root")
    with CheckpointManager(root, async_save=False, keep=KeepAll()) as mgr:
        for step in STEPS:
            mgr.save(step, make_state(0, step))
    store = CountingStore(LocalStore(root))
    out = zeros(0)
    with CheckpointManager(store, async_save=False) as mgr:
        store.log.clear()
        assert mgr.restore(out, step=3) == 3
        log = Counter(store.log)
    assert bitwise(out, make_state(0, 3))
    assert not [k for k in log if k[0] == "list"], log
    for step in STEPS:
        reads = _small_reads(log, f"{store.url}/{step_name(step)}")
        assert reads == {n: int(step == 3) for n in SMALL}, (step, reads)
