"""Lightning ``CkptStoreIO`` on a node-local tier shared by two jobs (trust rule 9).

Two IOs with their own roots and runs save the same step numbers into one
``local_tier_dir``: each loads its own values, its trims never touch the other's copies,
and a job whose directory of the tier holds another job's stamp refuses to save there
(``TierStampError`` naming it) while its loads read the root.
"""

import logging
import os
import shutil

import pytest

pytest.importorskip("lightning")

from test_lightning import checkpoint  # noqa: E402

from ckptstore.errors import TierStampError  # noqa: E402
from ckptstore_lightning import CkptStoreIO  # noqa: E402
from tests.tier_dirs import job_dir  # noqa: E402


def snapshot(d: str) -> dict[str, bytes]:
    out = {}
    for dirpath, _, names in os.walk(d):
        for n in names:
            with open(os.path.join(dirpath, n), "rb") as f:
                out[os.path.relpath(os.path.join(dirpath, n), d)] = f.read()
    return out


def weight(ckpt: dict) -> float:
    return float(ckpt["state_dict"]["layer.weight"][0, 0])


def test_two_jobs_sharing_a_local_tier_keep_their_copies_apart(tmp_path, caplog) -> None:
    tier = str(tmp_path / "nvme")
    roots = {run: str(tmp_path / run) for run in ("a", "b")}
    names = {run: tmp_path / f"names-{run}" for run in ("a", "b")}

    def io(run: str) -> CkptStoreIO:
        return CkptStoreIO(roots[run], local_tier_dir=tier, run_id=run, async_save=False)

    a = io("a")
    a.save_checkpoint(checkpoint(2, 2.0), names["a"] / "last.ckpt")
    a.teardown()
    a_dir = job_dir(tier, roots["a"], "a")
    before = snapshot(a_dir)
    b = io("b")
    b.save_checkpoint(checkpoint(2, 20.0), names["b"] / "last.ckpt")  # the same step number
    assert weight(b.load_checkpoint(names["b"] / "last.ckpt")) == 20.0
    b.save_checkpoint(checkpoint(4, 40.0), names["b"] / "last.ckpt")  # b trims its own 2
    b.teardown()
    assert snapshot(a_dir) == before  # not a byte of a's copies changed, none deleted
    b_dir = job_dir(tier, roots["b"], "b")
    assert sorted(n for n in os.listdir(b_dir) if n.startswith("step_")) == ["step_000000004"]
    caplog.set_level(logging.INFO, logger="ckptstore")
    a = io("a")
    assert weight(a.load_checkpoint(names["a"] / "last.ckpt")) == 2.0
    assert "restoring step 2 from the tier copy" in caplog.text
    a.teardown()
    # a's stamp copied into b's directory: b can no longer show the directory its own
    shutil.copy(
        os.path.join(a_dir, "ckptstore.job.json"), os.path.join(b_dir, "ckptstore.job.json")
    )
    caplog.clear()
    b = io("b")
    assert weight(b.load_checkpoint(names["b"] / "last.ckpt")) == 40.0  # from b's root
    assert "the local tier is not used" in caplog.text
    with pytest.raises(TierStampError, match="cannot be shown to be this job's") as refused:
        b.save_checkpoint(checkpoint(6, 60.0), names["b"] / "last.ckpt")
    assert b_dir in str(refused.value)
    b.teardown()
    assert snapshot(a_dir) == before
