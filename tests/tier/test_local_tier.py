"""``LocalTier``: the local tier as one object, built once from the manager's options.

Without a directory every call says "no tier" (None, nothing trimmed, no peers); a
directory that overlaps the root is refused when the tier is built; the cadences and the
keep rule are the tier's; its ``spec`` is what crosses into a writer process (it
pickles, and opens this job's stamped directory there); the trim acts in that directory
alone.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Iterator

import pytest

from ckptstore.engine.names import JOB_STAMP, step_name
from ckptstore.engine.transfer import TransferEngine
from ckptstore.errors import ConfigError
from ckptstore.manager.options import ManagerOptions
from ckptstore.tier.jobs import TierJob, TierSpec
from ckptstore.tier.local_tier import LocalTier


@pytest.fixture
def engine() -> Iterator[TransferEngine]:
    engine = TransferEngine()
    yield engine
    engine.close()


def tier_of(engine: TransferEngine, root: str, **options: object) -> LocalTier:
    return LocalTier.of(ManagerOptions(**options), root, "run-1", engine=engine)  # type: ignore[arg-type]


def test_without_a_directory_every_call_says_no_tier(tmp_path, engine) -> None:
    tier = tier_of(engine, str(tmp_path / "root"))
    assert tier.spec is None and tier.path is None and tier.job is None
    assert tier.open(create=True) is None and tier.usable() is None and tier.step(1) is None
    assert tier.after_save({1}) == [] and not tier.peers.active
    assert tier.newest_local_only(None) is None
    assert tier.where(1) == "root"  # every save goes to the root


@pytest.mark.parametrize("where", ["root", "root/tier", "."])
def test_a_directory_overlapping_the_root_is_refused_when_built(tmp_path, engine, where) -> None:
    root = tmp_path / "root"
    with pytest.raises(ConfigError, match="local_tier_dir .* the local tier must be a directory"):
        tier_of(engine, str(root), local_tier_dir=os.path.normpath(str(tmp_path / where)))


def test_the_cadences_and_the_keep_rule_are_the_tiers(tmp_path, engine) -> None:
    tier = tier_of(
        engine,
        str(tmp_path / "root"),
        local_tier_dir=str(tmp_path / "tier"),
        local_every=2,
        root_every=4,
        keep_local=2,
    )
    assert [tier.where(s) for s in range(1, 9)] == [
        None, "local", None, "root", None, "local", None, "root",
    ]  # fmt: skip
    assert tier.keeps([1, 5, 3]) == {3, 5}


def test_the_spec_pickles_and_opens_this_jobs_directory(tmp_path, engine) -> None:
    root = str(tmp_path / "root")
    tier = tier_of(engine, root, local_tier_dir=str(tmp_path / "tier"))
    assert tier.spec == TierSpec(str(tmp_path / "tier"), TierJob(root, "run-1"))
    spec = pickle.loads(pickle.dumps(tier.spec))  # what the writer process gets
    assert spec == tier.spec
    job = spec.open(create=True)
    assert job is not None and os.path.basename(job.url.rstrip("/")) == tier.spec.job.key
    assert JOB_STAMP in os.listdir(tmp_path / "tier" / tier.spec.job.key)
    step = tier.step(5)
    assert step is not None and step.url.rstrip("/").endswith(f"{tier.spec.job.key}/{step_name(5)}")


def test_after_save_trims_this_jobs_directory_alone(tmp_path, engine) -> None:
    tier = tier_of(engine, str(tmp_path / "root"), local_tier_dir=str(tmp_path / "tier"))
    other = TierSpec(str(tmp_path / "tier"), TierJob(str(tmp_path / "other"), "run-1"))
    for spec in (tier.spec, other):
        assert spec is not None
        job = spec.open(create=True)
        assert job is not None
        for s in (1, 2, 3):
            job.child(step_name(s)).put("__0_0.distcp", b"x" * 10)
    assert tier.after_save(None) == []  # rank 0's save failed: nothing is trimmed
    assert tier.after_save({3}) == [step_name(1), step_name(2)]
    assert tier.spec is not None
    assert sorted(os.listdir(tmp_path / "tier" / tier.spec.job.key)) == [JOB_STAMP, step_name(3)]
    assert len(os.listdir(tmp_path / "tier" / other.job.key)) == 4  # another job's: untouched
