"""A failed save is never reported as success, and a foreign entry in the node-local tier
never changes what happens to ckptstore's own steps (trust rule 6).

- A root that is a file (or a typo, or unwritable): the first failed save raises at the
  next ``save`` / ``wait`` / ``close``, as an unwritable root does, and no message claims a
  previous checkpoint when there is none.
- After the manager committed a save, a failure is a warning naming the step that stays
  the newest, and training goes on.
- A symlinked or file-named step entry in ``local_tier_dir`` is skipped with one warning; every
  save commits, retention and the local-tier trim go on.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

from ckptstore.engine.catalog import SkippedEntryWarning, step_name
from ckptstore.engine.names import JOB_STAMP
from ckptstore.errors import StoreAccessError
from ckptstore.manager import CheckpointManager
from ckptstore.manager.retention import KeepLast
from ckptstore.stores.local import LocalStore
from ckptstore.testing.faults import Fault, FaultyStore
from tests.tier_dirs import make_job_dir


def state(v: float) -> dict:
    return {"w": torch.full((256,), v)}


def test_a_root_that_is_a_file_raises_at_the_first_save(tmp_path) -> None:
    root = tmp_path / "root"
    root.write_text("not a directory")
    with pytest.raises(StoreAccessError, match="not a directory") as caught:
        with CheckpointManager(str(root), background="thread") as mgr:
            mgr.save(1, state(1.0))
            mgr.save(2, state(2.0))  # never reached
    assert "stays the newest" not in str(caught.value)
    assert mgr.records[-1].status == "failed" and len(mgr.records) == 1


def test_a_typo_below_a_file_raises_once(tmp_path) -> None:
    (tmp_path / "file").write_text("x")
    mgr = CheckpointManager(str(tmp_path / "file" / "ckpt"), background="thread")
    with pytest.raises(StoreAccessError):
        mgr.save(1, state(1.0))
    mgr.close()  # that failure was raised already: not raised twice
    assert mgr.records[-1].status == "failed"


def test_an_unwritable_root_raises_at_the_next_call(tmp_path) -> None:
    denied = StoreAccessError("access denied (injected)")
    root = FaultyStore(
        LocalStore(str(tmp_path / "root")),
        [Fault(m, error=denied) for m in ("put", "put_part", "begin_multipart")],
    )
    mgr = CheckpointManager(root)
    assert mgr.save(1, state(1.0))  # the write fails in the background
    with pytest.raises(StoreAccessError, match="access denied"):
        mgr.wait()
    mgr.close()  # raised once, by wait
    assert mgr.records[-1].status == "failed"


def test_after_a_commit_a_failure_is_a_warning_naming_the_newest_step(tmp_path) -> None:
    faulty = FaultyStore(LocalStore(str(tmp_path / "root")))
    with CheckpointManager(faulty) as mgr:
        mgr.save(1, state(1.0))
        mgr.wait()
        faulty.faults.append(Fault("put_if_absent", error=StoreAccessError("injected")))
        mgr.save(2, state(2.0))  # its marker's create fails (step folders copy the faults)
        with pytest.warns(RuntimeWarning, match="step 1 stays the newest checkpoint"):
            mgr.wait()
        faulty.faults.clear()
        mgr.save(3, state(3.0))
        mgr.wait()
        assert [r.status for r in mgr.records] == ["committed", "failed", "committed"]


@pytest.mark.processes
def test_the_readme_pattern_with_a_file_root_exits_non_zero(tmp_path) -> None:
    (tmp_path / "root").write_text("x")
    script = textwrap.dedent(
        f"""
        import torch
        from ckptstore import CheckpointManager
        with CheckpointManager({str(tmp_path / "root")!r}) as mgr:
            state = {{"w": torch.zeros(4)}}
            start = (mgr.restore(state) or 0) + 1
            for step in range(start, start + 3):
                mgr.save(step, state)
        """
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert run.returncode != 0
    assert "StoreAccessError" in run.stderr and "not a directory" in run.stderr
    assert "stays the newest" not in run.stderr


@pytest.mark.parametrize("kind", ["symlink", "file"])
def test_a_foreign_step_entry_in_the_local_tier_changes_nothing(tmp_path, kind) -> None:
    """A symlinked or file-named ``step_*`` in the job's own directory of the tier (and one
    beside it, where the older layout kept steps) is warned about once and left alone."""
    staging, elsewhere = tmp_path / "nvme", tmp_path / "elsewhere"
    root = str(tmp_path / "root")
    job = Path(make_job_dir(str(staging), root, "foreign-entry"))  # as it left it earlier
    (elsewhere / step_name(1)).mkdir(parents=True)
    (elsewhere / step_name(1) / "precious.bin").write_text("not ckptstore's")
    strays = [job / step_name(1), staging / step_name(1)]
    for stray in strays:
        if kind == "symlink":
            stray.symlink_to(elsewhere / step_name(1), target_is_directory=True)
        else:
            stray.write_text("a file named like a step")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with CheckpointManager(
            root,
            local_tier_dir=str(staging),
            keep=KeepLast(2),
            background="thread",
            run_id="foreign-entry",
        ) as mgr:
            for step in range(2, 7):
                mgr.save(step, state(float(step)))
                mgr.wait()
    assert [r.status for r in mgr.records] == ["committed"] * 5
    assert all(not r.warnings for r in mgr.records)
    assert mgr.steps() == [5, 6]  # retention went on
    kept = sorted(n for n in os.listdir(job) if n not in (step_name(1), JOB_STAMP))
    assert kept == [step_name(6)]  # the local-tier trim went on
    assert all(os.path.lexists(s) for s in strays)  # the foreign entries are left alone ...
    assert (elsewhere / step_name(1) / "precious.bin").exists()  # ... and not followed
    skipped = [w for w in caught if issubclass(w.category, SkippedEntryWarning)]
    assert len({str(w.message) for w in skipped}) == 1  # one warning, not one per save


def test_a_failure_after_the_marker_is_a_warning_not_a_failed_save(tmp_path, monkeypatch):
    from ckptstore.tier.tier_writer import TierWriter

    def broken(self):
        raise OSError("injected: the local tier cannot be trimmed")

    monkeypatch.setattr(TierWriter, "_trim_local", broken)
    with CheckpointManager(  # the thread: the patch reaches no writer process
        str(tmp_path / "root"), local_tier_dir=str(tmp_path / "nvme"), background="thread"
    ) as mgr:
        mgr.save(1, state(1.0))
        mgr.wait()
        assert mgr.records[-1].status == "committed"
        assert any("cannot be trimmed" in w for w in mgr.records[-1].warnings)
        assert mgr.steps() == [1]


@pytest.mark.parametrize("how", ["plain", "through-torch"])
def test_ctrl_c_during_a_save_is_an_interrupt_that_says_the_step_is_lost(
    tmp_path, monkeypatch, caplog, how
) -> None:
    """Ctrl-C while ``save`` copies or serialises: ``KeyboardInterrupt`` (so Python exits as
    on SIGINT) and one line naming the step, never torch's "unexpected pos" error."""
    with CheckpointManager(str(tmp_path / "root"), background="thread") as mgr:
        mgr.save(1, state(1.0))
        mgr.wait()

        def interrupted(*args, **kwargs):
            if how == "plain":
                raise KeyboardInterrupt
            try:
                raise KeyboardInterrupt
            except KeyboardInterrupt:
                raise RuntimeError("[enforce fail at inline_container.cc:672] unexpected pos")  # noqa: B904 - as torch does

        monkeypatch.setattr(mgr._backend, "stage", interrupted)
        with pytest.raises(KeyboardInterrupt), caplog.at_level("WARNING", "ckptstore"):
            mgr.save(2, state(2.0))
        monkeypatch.undo()
        assert "interrupted (Ctrl-C): step 2 was not committed" in caplog.text
        assert mgr.steps() == [1]
        mgr.save(3, state(3.0))  # the manager still works
        mgr.wait()
        assert mgr.steps() == [1, 3]
