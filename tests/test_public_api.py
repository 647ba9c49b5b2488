"""The top-level ``ckptstore`` names: all resolve, and the exported errors are one list."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys

import pytest

import ckptstore
from ckptstore import errors

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_name_in_all_resolves() -> None:
    assert [n for n in ckptstore.__all__ if not hasattr(ckptstore, n)] == []
    assert len(set(ckptstore.__all__)) == len(ckptstore.__all__)
    assert set(ckptstore.__all__) <= set(dir(ckptstore))


def test_exported_errors_are_errors_checkpoint_errors() -> None:
    exported = [n for n in ckptstore.__all__ if n.endswith("Error")]
    assert exported == errors.CHECKPOINT_ERRORS
    for name in exported:
        assert getattr(ckptstore, name) is getattr(errors, name)
        assert issubclass(getattr(errors, name), errors.CkptStoreError)
    assert not hasattr(ckptstore, "CacheTooSmallError")  # the data layer's stay in errors


#: The torch-free names for working with a root without DCP, and where each lives.
ROOT_TOOLS = {
    "Store": "ckptstore.engine.store",
    "open_store": "ckptstore.stores",
    "TransferEngine": "ckptstore.engine.transfer",
    "open_committed": "ckptstore.engine.committed",
    "checkpoint_status": "ckptstore.engine.committed",
    "committed_steps": "ckptstore.engine.catalog",
    "list_steps": "ckptstore.engine.catalog",
    "verify_checkpoint": "ckptstore.engine.verify",
    "copy_checkpoint": "ckptstore.engine.copy",
    "plan_prune": "ckptstore.manager.prune",
    "apply_prune": "ckptstore.manager.prune",
}


def test_root_tools_are_public_and_the_library_objects() -> None:
    for name, module in ROOT_TOOLS.items():
        assert name in ckptstore.__all__
        assert getattr(ckptstore, name) is getattr(importlib.import_module(module), name)
        assert getattr(ckptstore, name).__doc__


@pytest.mark.processes
def test_import_ckptstore_and_its_root_tools_import_no_torch() -> None:
    names = ", ".join(repr(n) for n in ROOT_TOOLS)
    code = (
        "import json, sys, ckptstore\n"
        "before = 'torch' in sys.modules\n"
        f"for name in ({names}):\n"
        "    getattr(ckptstore, name)\n"
        "print(json.dumps([before, 'torch' in sys.modules]))\n"
    )
    env = {**os.environ, "PYTHONPATH": REPO}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [False, False]


def test_root_tools_on_a_local_root(tmp_path) -> None:
    """The documented sequence on an empty root: nothing committed, nothing to prune."""
    root = ckptstore.open_store(str(tmp_path))
    assert isinstance(root, ckptstore.Store)
    assert list(ckptstore.committed_steps(root)) == []
    assert ckptstore.checkpoint_status(root.child("step_000000001")) == "incomplete"
    plan = ckptstore.plan_prune(root, ckptstore.KeepLast(1))
    assert plan.steps == [] and plan.uploads == []
    ckptstore.apply_prune(root, plan)
    assert list(tmp_path.iterdir()) == []


def test_format_names_resolve_to_the_library_objects() -> None:
    """``ckptstore.format``: every name in ``__all__`` resolves to the object its module
    defines, and the module docstring (the format's reference) names each one."""
    from ckptstore import format as fmt

    assert len(set(fmt.__all__)) == len(fmt.__all__)
    assert set(fmt.__all__) == set(fmt._LAZY) | {"open_local_tier"}
    assert set(fmt.__all__) <= set(dir(fmt))
    for name, (module, attr) in fmt._LAZY.items():
        assert getattr(fmt, name) is getattr(importlib.import_module(module), attr), name
    assert fmt.CheckpointStatus is ckptstore.CheckpointStatus
    assert fmt.open_committed is ckptstore.open_committed
    doc = fmt.__doc__ or ""
    assert [n for n in fmt.__all__ if f"``{n}``" not in doc and f"``{n}(" not in doc] == []
    with pytest.raises(AttributeError):
        fmt.no_such_name  # noqa: B018


@pytest.mark.processes
def test_format_without_its_dcp_names_imports_no_torch() -> None:
    """Reading a root through ``ckptstore.format`` (all but its ``.metadata`` and shard
    names) never imports torch, so ``ckptstore-tool ls / gc / cp / verify`` start fast."""
    code = (
        "import json, sys\n"
        "from ckptstore import format as fmt\n"
        "for name, (module, _) in fmt._LAZY.items():\n"
        "    if not module.startswith('ckptstore.dcp.'):\n"
        "        getattr(fmt, name)\n"
        "print(json.dumps('torch' in sys.modules))\n"
    )
    env = {**os.environ, "PYTHONPATH": REPO}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) is False


def test_format_reads_a_local_tier(tmp_path) -> None:
    """``open_local_tier``: a tier directory as a store; an empty one holds no job."""
    from ckptstore import format as fmt

    tier = fmt.open_local_tier(str(tmp_path))
    assert isinstance(tier, ckptstore.Store)
    assert fmt.survey_tier(tier) == []
    assert fmt.open_tier_job(tier, fmt.TierJob(str(tmp_path / "root"), "run-1")) is None
