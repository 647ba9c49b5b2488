"""A node-local tier shared by jobs (``tier.jobs``, ``tier.rules``): each job's
copies in a directory of its own, used only once its stamp proves it the job's.

The library level: two jobs (two roots, or one root and two runs) in one tier never share
a step directory; a job directory whose stamp is planted or forged (a symlink, a FIFO, an
oversized or garbage file, a directory, another job's stamp, none while the directory
holds files) or that is itself a link or a file is refused with ``TierStampError`` naming
it, and nothing in it is read, written or deleted; the trim and the eviction act in the
job's own directory alone, and count what else the tier holds without deleting it.
"""

from __future__ import annotations

import json
import os
import threading

import pytest

from ckptstore.engine.names import JOB_STAMP, RUN_STAMP, step_name
from ckptstore.errors import ConfigError, TierStampError
from ckptstore.stores.local import LocalStore
from ckptstore.tier.jobs import (
    MAX_STAMP_BYTES,
    TierJob,
    open_job,
    parse_stamp,
    survey,
)
from ckptstore.tier.rules import evict_for, keep_newest, trim_local_tier
from tests.tier_dirs import PLANTED, plant_stamp

A = TierJob("/data/ckpt/a", "run-1")
B = TierJob("/data/ckpt/b", "run-1")  # another root, the same run
A2 = TierJob("/data/ckpt/a", "run-2")  # the same root, another run


def fill(job_dir: LocalStore, step: int, size: int = 1000) -> None:
    """A step directory of ``job_dir`` with one shard file of ``size`` bytes."""
    job_dir.child(step_name(step)).put("__0_0.distcp", b"x" * size)


def test_jobs_that_differ_in_root_or_run_get_directories_of_their_own(tmp_path) -> None:
    assert len({A.key, B.key, A2.key}) == 3
    assert A.key == TierJob("/data/ckpt/a", "run-1").key  # the same job, every time
    tier = LocalStore(str(tmp_path))
    assert open_job(tier, A) is None  # nothing made unless asked
    assert os.listdir(tmp_path) == []
    made = open_job(tier, A, create=True)
    assert made is not None and made.url == str(tmp_path / A.key)
    assert os.listdir(made.url) == [JOB_STAMP]
    assert parse_stamp(made.get(JOB_STAMP), "x") == A
    again = open_job(tier, A)
    assert again is not None and again.url == made.url


@pytest.mark.parametrize(
    ("root", "run"),
    [("", "r"), ("/x\n/y", "r"), ("/x", "has space"), ("/x", ""), ("/" * 5000, "r")],
)
def test_an_identity_a_stamp_could_not_hold_is_refused(root, run) -> None:
    with pytest.raises(ConfigError):
        TierJob(root, run)


@pytest.mark.parametrize("what", PLANTED)
@pytest.mark.timeout(20)  # a FIFO read that waited for a writer would hang here
def test_a_planted_stamp_is_refused_and_nothing_in_the_directory_is_touched(tmp_path, what) -> None:
    tier = LocalStore(str(tmp_path))
    d = tmp_path / A.key
    d.mkdir()
    (d / step_name(3)).mkdir()
    (d / step_name(3) / "__0_0.distcp").write_bytes(b"theirs")
    plant_stamp(str(d / JOB_STAMP), what, A2)
    for create in (False, True):
        with pytest.raises(TierStampError) as caught:
            open_job(tier, A, create=create)
        message = str(caught.value)
        assert str(d) in message and "local_tier_dir" in message and "ls --local-tier" in message
    assert (d / step_name(3) / "__0_0.distcp").read_bytes() == b"theirs"
    assert sorted(os.listdir(d)) == sorted([JOB_STAMP, step_name(3)])
    with pytest.raises(TierStampError):
        evict_for(tier, A, 9, 10, 20)  # would evict step 3, were the directory A's
    assert (d / step_name(3) / "__0_0.distcp").exists()
    (entry,) = survey(tier)
    assert entry.kind == "job" and entry.root is None and entry.problem and entry.steps == (3,)


def test_another_jobs_stamp_is_named_in_the_refusal(tmp_path) -> None:
    d = tmp_path / A.key
    d.mkdir()
    (d / JOB_STAMP).write_bytes(B.stamp())
    with pytest.raises(TierStampError, match="the stamp of run run-1 of root /data/ckpt/b"):
        open_job(LocalStore(str(tmp_path)), A)


def test_no_stamp_in_a_directory_that_holds_files_is_refused_an_empty_one_is_taken(
    tmp_path,
) -> None:
    tier = LocalStore(str(tmp_path))
    d = tmp_path / A.key
    d.mkdir()  # as a job killed between making its directory and writing its stamp left it
    (d / (JOB_STAMP + ".ckptstore-tmp-0123abcd")).write_bytes(b"{")
    assert open_job(tier, A) is None
    assert open_job(tier, A, create=True) is not None
    assert parse_stamp((d / JOB_STAMP).read_bytes(), "x") == A
    (d / JOB_STAMP).unlink()
    fill(LocalStore(str(d)), 1)
    with pytest.raises(TierStampError, match="is missing, and the directory holds 1 entries"):
        open_job(tier, A, create=True)
    assert not (d / JOB_STAMP).exists()  # never stamped over someone's files


@pytest.mark.parametrize("what", ["symlink", "file", "fifo"])
def test_a_job_directory_that_is_not_a_directory_is_refused_never_followed(tmp_path, what) -> None:
    tier_dir, outside = tmp_path / "tier", tmp_path / "outside"
    tier_dir.mkdir()
    outside.mkdir()
    (outside / JOB_STAMP).write_bytes(A.stamp())  # a valid stamp, behind a link
    path = tier_dir / A.key
    if what == "symlink":
        path.symlink_to(outside)
    elif what == "file":
        path.write_bytes(A.stamp())
    else:
        os.mkfifo(path)
    for create in (False, True):
        with pytest.raises(TierStampError, match="cannot be shown to be this job's"):
            open_job(LocalStore(str(tier_dir)), A, create=create)
    assert os.listdir(outside) == [JOB_STAMP]


def test_ranks_of_one_node_making_the_directory_at_once_agree(tmp_path) -> None:
    tier = LocalStore(str(tmp_path))
    got: list[str] = []
    errors: list[BaseException] = []

    def make() -> None:
        try:
            d = open_job(tier, A, create=True)
            assert d is not None
            got.append(d.url)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=make) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(set(got)) == 1 and len(got) == 8


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"null",
        b"[]",
        b'{"ckptstore_tier_job": 2, "root": "/x", "run": "r"}',
        b'{"ckptstore_tier_job": true, "root": "/x", "run": "r"}',
        b'{"ckptstore_tier_job": 1, "root": "/x"}',
        b'{"ckptstore_tier_job": 1, "root": "/x\\u001b[31m", "run": "r"}',
        b'{"ckptstore_tier_job": 1, "root": "/x", "run": "two words"}',
        b"\xff\xfe",
        b" " * (MAX_STAMP_BYTES + 1),
    ],
)
def test_a_stamp_that_is_not_one_is_a_tier_stamp_error(data) -> None:
    with pytest.raises(TierStampError):
        parse_stamp(data, "the stamp")


def test_the_trim_acts_in_the_jobs_directory_alone(tmp_path) -> None:
    tier = LocalStore(str(tmp_path))
    a, b = open_job(tier, A, create=True), open_job(tier, B, create=True)
    assert a is not None and b is not None
    for s in (1, 2, 3):
        fill(a, s)
    fill(b, 1)
    fill(b, 2)
    assert trim_local_tier(a, {3}) == [step_name(1), step_name(2)]
    assert keep_newest(a, 1) == []
    assert sorted(os.listdir(b.url)) == [JOB_STAMP, step_name(1), step_name(2)]
    assert keep_newest(b, 1) == [step_name(1)]
    assert sorted(os.listdir(a.url)) == [JOB_STAMP, step_name(3)]


def test_eviction_counts_everything_else_and_deletes_only_the_jobs_older_steps(tmp_path) -> None:
    tier = LocalStore(str(tmp_path))
    a, b = open_job(tier, A, create=True), open_job(tier, B, create=True)
    assert a is not None and b is not None
    for s in (1, 2, 3):
        fill(a, s)  # 1000 bytes each
    fill(b, 7, 3000)  # another job's newest: counted, never evicted
    legacy = LocalStore(str(tmp_path / step_name(4)))
    legacy.put("__0_0.distcp", b"y" * 2000)  # the older layout: counted, never evicted
    stamps = sum(os.path.getsize(os.path.join(d, JOB_STAMP)) for d in (a.url, b.url))
    # room for step 3 (1000 bytes, in ``need``) and one older step beside 5000 + stamps
    evicted = evict_for(tier, A, 3, need=1000, limit=7000 + stamps)
    assert evicted == [step_name(1)]
    assert sorted(os.listdir(a.url)) == [JOB_STAMP, step_name(2), step_name(3)]
    # less room than anything else takes: every older step goes, never step 3, nothing else
    assert evict_for(tier, A, 3, need=1000, limit=100) == [step_name(2)]
    assert sorted(os.listdir(a.url)) == [JOB_STAMP, step_name(3)]
    assert os.path.getsize(tmp_path / B.key / step_name(7) / "__0_0.distcp") == 3000
    assert os.path.getsize(tmp_path / step_name(4) / "__0_0.distcp") == 2000
    assert evict_for(tier, A2, 3, need=1000, limit=100) == []  # no directory: nothing


def test_eviction_never_counts_or_follows_a_link(tmp_path) -> None:
    tier_dir, outside = tmp_path / "tier", tmp_path / "outside"
    outside.mkdir()
    (outside / "big").write_bytes(b"z" * 100_000)
    tier = LocalStore(str(tier_dir))
    a = open_job(tier, A, create=True)
    assert a is not None
    fill(a, 1)
    fill(a, 2)
    (tier_dir / "link").symlink_to(outside)
    os.symlink(outside, tier_dir / A.key / step_name(5))  # a linked step: never a step
    with pytest.warns(UserWarning, match="symlink"):
        assert evict_for(tier, A, 2, need=1000, limit=5000) == []
    assert (outside / "big").exists()


def test_survey_says_whose_copies_a_tier_holds(tmp_path) -> None:
    tier = LocalStore(str(tmp_path))
    a = open_job(tier, A, create=True)
    assert a is not None
    fill(a, 5)
    fill(a, 6)
    old = LocalStore(str(tmp_path / step_name(4)))
    old.put("__0_0.distcp", b"y" * 10)
    old.put(RUN_STAMP, json.dumps({"run": "old-run"}).encode())
    (tmp_path / "notes.txt").write_text("mine")
    stray = tmp_path / "job-0123456789abcdef0123456789abcdef"  # no stamp: refused
    stray.mkdir()
    (stray / "x").write_text("?")
    by_name = {e.name: e for e in survey(tier)}
    job = by_name[A.key]
    assert (job.kind, job.root, job.run, job.steps) == ("job", A.root, A.run, (5, 6))
    assert job.problem == ""
    assert job.bytes == 2000 + os.path.getsize(os.path.join(a.url, JOB_STAMP))
    assert by_name[step_name(4)].kind == "legacy" and by_name[step_name(4)].run == "old-run"
    assert by_name["notes.txt"].kind == "other" and by_name["notes.txt"].bytes == 4
    assert by_name[stray.name].problem.endswith("is missing")
    moved = tmp_path / B.key
    moved.mkdir()
    (moved / JOB_STAMP).write_bytes(A.stamp())  # A's stamp in B's directory
    assert "whose directory is" in {e.name: e for e in survey(tier)}[B.key].problem
