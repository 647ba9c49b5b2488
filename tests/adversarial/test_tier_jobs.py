"""Trust rule 9: a tier copy is used only by the job (root and run) that made it.

Attacked through the manager on real gloo ranks and through ``ckptstore-tool``: two jobs
(two roots, or one root and two runs) share each node's ``local_tier_dir``; job B never
restores job A's local-only step (A's newest) nor reads A's local copies, never trims or
evicts them while it fills the tier under ``tier_limit``, and A then restores its newest
from the tier. A planted or forged stamp in a job's directory (a symlink, a FIFO, an
oversized or garbage file, another job's stamp) refuses that job's save on every rank
with ``TierStampError`` naming the directory, and its restore reads the root instead;
nothing in the directory is read, written or deleted. ``ls --local-tier`` says whose
copies a tier holds.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from ckptstore.engine.names import JOB_STAMP, step_name
from ckptstore.errors import TierStampError
from ckptstore.manager import CheckpointManager
from ckptstore.tier.jobs import TierJob
from harness.dist import run_distributed
from tests.adversarial.clirun import run_cli
from tests.tier_dirs import PLANTED, job_dir, plant_stamp

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


def state(rank: int, v: float) -> dict[str, Any]:
    """A replicated tensor and one of the rank's own (each node writes a shard)."""
    return {"w": torch.arange(20_000.0) * v, f"own{rank}": torch.full((10_000,), rank + v)}


def equal(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return all(torch.equal(a[k], b[k]) for k in b)


def files(d: str) -> dict[str, int]:
    """Every file under ``d`` with its size (what a job's directory holds)."""
    out = {}
    for dirpath, _, names in os.walk(d):
        for n in names:
            p = os.path.join(dirpath, n)
            out[os.path.relpath(p, d)] = os.path.getsize(p)
    return out


def _two_jobs(rank: int, world: int, tmp: str, same_root: bool) -> dict[str, Any]:
    """Rank r is node r (its own local tier directory, shared by both jobs). Job A saves
    step 2 to its root and step 3 to the tiers alone; job B restores, then fills the tier
    with local-only steps 5-9 under a ``tier_limit`` that A's copies crowd; A restores."""
    import torch.distributed as dist

    tier = os.path.join(tmp, f"node{rank}")
    root_a = os.path.join(tmp, "root-a")
    root_b = root_a if same_root else os.path.join(tmp, "root-b")

    def manager(root: str, run: str, **kw: Any) -> CheckpointManager:
        return CheckpointManager(
            root, local_tier_dir=tier, run_id=run, background="thread", local_every=1, **kw
        )

    with manager(root_a, "job-a", root_every=2, keep_local=2) as a:
        for s in (2, 3):
            a.save(s, state(rank, float(s)))
            a.wait()
    a_dir = job_dir(tier, root_a, "job-a")
    a_files = files(a_dir)
    a_bytes = sum(a_files.values())
    dist.barrier()
    # B's budget: A's copies, B's peak (a step with its replica, plus the next save's own
    # shards) and about one step more; keep_local=4 would hold four.
    limit = a_bytes + (a_bytes // 2) * 5 // 2
    with manager(root_b, "job-b", root_every=100, keep_local=4, tier_limit=limit) as b:
        out = state(rank, 0.0)
        got_b = b.restore(out)
        b_source = b._loader.source
        b_equal = got_b is not None and equal(out, state(rank, float(got_b)))
        for s in (5, 6, 7, 8, 9):
            b.save(s, state(rank, float(s)))
            b.wait()
        b_records = [(str(r.status), r.warnings) for r in b.records]
    b_steps = steps_in_job(tier, root_b, "job-b")
    dist.barrier()
    with manager(root_a, "job-a", root_every=2, keep_local=2) as a:
        out = state(rank, 0.0)
        got_a = a.restore(out)
        a_source = a._loader.source
        a_equal = equal(out, state(rank, 3.0))
    return {
        "b": (got_b, b_source, b_equal),
        "b_records": b_records,
        "b_steps": b_steps,
        "a_kept": files(a_dir) == a_files,
        "a": (got_a, a_source, a_equal),
    }


def steps_in_job(tier: str, root: str, run: str) -> list[str]:
    return sorted(n for n in os.listdir(job_dir(tier, root, run)) if n.startswith("step_"))


@pytest.mark.distributed
@pytest.mark.parametrize("same_root", [False, True], ids=["two-roots", "one-root-two-runs"])
def test_two_jobs_sharing_a_tier_never_restore_trim_or_evict_each_others_copies(
    tmp_path, same_root
) -> None:
    tmp = str(tmp_path)
    results = run_distributed(_two_jobs, 2, tmp, same_root, timeout=240)
    for rank, r in enumerate(results):
        got_b, b_source, b_equal = r["b"]
        if same_root:  # A's durable step 2 from the root, never A's local step 3 or copies
            assert got_b == 2 and b_equal, (rank, r["b"])
            assert b_source.startswith("the root "), b_source
        else:  # a root of its own, empty: a fresh start, never A's newest
            assert got_b is None, (rank, r["b"])
        assert r["b_records"] == [("committed", [])] * 5, r["b_records"]
        # B evicted its own older steps to stay within tier_limit beside A's copies
        assert r["b_steps"][-1] == step_name(9) and len(r["b_steps"]) < 4, r["b_steps"]
        assert r["a_kept"], rank  # not one of A's files changed, its newest included
        got_a, a_source, a_equal = r["a"]
        assert got_a == 3 and a_equal, (rank, r["a"])
        assert "local-only step" in a_source, a_source
    for node in range(2):  # one directory per job on each node, nothing else
        tier = os.path.join(tmp, f"node{node}")
        roots = [
            os.path.join(tmp, "root-a"),
            os.path.join(tmp, "root-a" if same_root else "root-b"),
        ]
        want = {job_dir(tier, roots[0], "job-a"), job_dir(tier, roots[1], "job-b")}
        assert {os.path.join(tier, n) for n in os.listdir(tier)} == want


def _planted(rank: int, world: int, tmp: str, what: str) -> dict[str, Any]:
    """Both ranks save step 1; then node 1's stamp is replaced with ``what``; a new
    manager of the same job restores and saves step 2."""
    import torch.distributed as dist

    tier = os.path.join(tmp, f"node{rank}")
    root = os.path.join(tmp, "root")
    with CheckpointManager(root, local_tier_dir=tier, run_id="job", background="thread") as m:
        m.save(1, state(rank, 1.0))
    stamp = os.path.join(job_dir(tier, root, "job"), JOB_STAMP)
    if rank == 1:
        os.unlink(stamp)
        plant_stamp(stamp, what, TierJob(os.path.join(tmp, "other-root"), "job"))
    before = files(job_dir(tier, root, "job"))
    dist.barrier()
    out = state(rank, 0.0)
    with CheckpointManager(root, local_tier_dir=tier, run_id="job", background="thread") as m:
        got = m.restore(out)
        source = m._loader.source
        with pytest.raises(TierStampError) as refused:
            m.save(2, state(rank, 2.0))
    after = files(job_dir(tier, root, "job"))
    return {
        "restored": (got, equal(out, state(rank, 1.0)), source),
        "refused": str(refused.value),
        "untouched": after == before,
        "steps": m.steps(),
    }


@pytest.mark.distributed
@pytest.mark.parametrize("what", ["symlink", "fifo", "oversized", "another job's"])
def test_a_planted_stamp_refuses_the_save_on_every_rank_and_the_restore_reads_the_root(
    tmp_path, what
) -> None:
    tmp = str(tmp_path)
    results = run_distributed(_planted, 2, tmp, what, timeout=120)
    bad = job_dir(os.path.join(tmp, "node1"), os.path.join(tmp, "root"), "job")
    for rank, r in enumerate(results):
        got, ok, source = r["restored"]
        assert got == 1 and ok, (rank, r)
        # the restore agreed on no whole tier copy: rank 0 read its own, rank 1 the root
        assert "the tier copy" not in source or "the root " in source, source
        assert bad in r["refused"] and "local_tier_dir" in r["refused"], r["refused"]
        assert "Traceback" not in r["refused"]
        assert r["untouched"], rank
        assert r["steps"] == [1]  # nothing saved: the save was refused before any write
    assert "(rank 1)" in results[0]["refused"]  # rank 0 names the rank that refused


@pytest.mark.parametrize("what", PLANTED)
def test_a_planted_stamp_through_one_manager(tmp_path, what, caplog) -> None:
    """One process: a local-only newest step behind a planted stamp is never restored (the
    root's step is), the save raises ``TierStampError`` naming the directory, and the
    directory is left as it was."""
    root, tier = str(tmp_path / "root"), str(tmp_path / "nvme")
    kw: dict[str, Any] = dict(local_tier_dir=tier, run_id="job", background="thread")
    with CheckpointManager(root, local_every=1, root_every=2, keep_local=2, **kw) as m:
        for s in (2, 3):  # 3: the tiers alone
            m.save(s, {"w": torch.full((100,), float(s))})
            m.wait()
    d = job_dir(tier, root, "job")
    os.unlink(os.path.join(d, JOB_STAMP))
    plant_stamp(os.path.join(d, JOB_STAMP), what, TierJob(str(tmp_path / "elsewhere"), "job"))
    before = files(d) if what != "fifo" else sorted(os.listdir(d))
    out = {"w": torch.zeros(100)}
    caplog.set_level(logging.WARNING, logger="ckptstore")
    with CheckpointManager(root, **kw) as m:
        assert m.restore(out) == 2 and torch.equal(out["w"], torch.full((100,), 2.0))
        assert "the local tier is not used" in caplog.text and d in caplog.text
        with pytest.raises(TierStampError, match="cannot be shown to be this job's") as e:
            m.save(4, {"w": torch.ones(100)})
        assert d in str(e.value) and "ls --local-tier" in str(e.value)
    assert (files(d) if what != "fifo" else sorted(os.listdir(d))) == before


def test_ls_says_whose_copies_a_tier_holds(tmp_path, capsys) -> None:
    tier = str(tmp_path / "nvme")
    roots = {run: str(tmp_path / run) for run in ("job-a", "job-b")}
    for run, root in roots.items():
        with CheckpointManager(
            root,
            local_tier_dir=tier,
            run_id=run,
            background="thread",
            local_every=1,
            root_every=2,
            keep_local=2,
        ) as m:
            for s in (2, 3):  # 3: to the tier alone
                m.save(s, {"w": torch.ones(100)})
                m.wait()
    old = Path(tier) / step_name(7)  # an older ckptstore's layout
    old.mkdir()
    (old / "ckptstore.run.json").write_text('{"run": "old-run"}')
    (old / "__0_0.distcp").write_bytes(b"x" * 10)
    forged = Path(tier) / ("job-" + "0" * 32)
    forged.mkdir()
    (forged / JOB_STAMP).write_text(
        '{"ckptstore_tier_job": 1, "root": "/x\\u001b[2J", "run": "evil"}'
    )  # a root that would clear the screen: refused, and never printed raw
    rc, out, err = run_cli(capsys, ["ls", roots["job-a"], "--local-tier", tier])
    assert rc == 0, err
    lines = out.splitlines()
    assert f"local tier 1: {tier}" in out
    a = next(line for line in lines if roots["job-a"] in line and "job-" in line)
    assert "job-a" in a and "this root" in a and "2, 3" in a
    b = next(line for line in lines if roots["job-b"] in line)
    assert "job-b" in b and "this root" not in b
    assert any(step_name(7) in x and "old-run" in x and "older layout" in x for x in lines)
    assert forged.name in out and "refused" in out and "\x1b" not in out
    rc, out, err = run_cli(capsys, ["ls", roots["job-a"], "--local-tier", tier, "--json"])
    doc = json.loads(out)
    (report,) = doc["local_tiers"]
    by_name = {e["name"]: e for e in report["entries"]}
    mine = by_name[TierJob(roots["job-a"], "job-a").key]
    assert (mine["root"], mine["run"], mine["steps"]) == (roots["job-a"], "job-a", [2, 3])
    assert mine["this_root"] and mine["bytes"] > 0
    assert not by_name[TierJob(roots["job-b"], "job-b").key]["this_root"]
    assert by_name[step_name(7)]["kind"] == "legacy" and by_name[step_name(7)]["run"] == "old-run"
    assert by_name[forged.name]["problem"] and by_name[forged.name]["root"] is None
    # job-a's local-only step 3 is listed for its root (and no other job's)
    rows = {c["step"]: c for c in doc["checkpoints"]}
    assert rows[3]["durable"] is False and rows[3]["run"] == "job-a"
    assert rows[3]["tiers"] == [{"dir": tier, "files": 1, "of": 1}]
    rc, out, err = run_cli(capsys, ["ls", "--local-tier", tier])  # no ROOT: the report alone
    assert rc == 0 and roots["job-b"] in out and "this root" not in out, err
    rc, out, err = run_cli(capsys, ["ls"])
    assert rc == 2 and "--local-tier" in err and "Traceback" not in err
